// Softmax over each row, in place: x[r, :] = exp(x - max) / sum(exp(x - max)).
// One workgroup per row (2-D dispatch past 65,535 rows); `workgroup_max` and `workgroup_sum`
// from shaders/reduce/shared.wgsl.

struct Params {
  n: u32,      // elements per row
  n_rows: u32,
  wg_x: u32,   // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>; // [n_rows × n]

const WG: u32 = 64u; // = the width workgroup_max/sum expect

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let r = wid.y * p.wg_x + wid.x;
  let live = r < p.n_rows;
  let base = r * p.n;
  var m = -3.0e38;
  if (live) {
    for (var i = lid; i < p.n; i += WG) {
      m = max(m, x[base + i]);
    }
  }
  m = workgroup_max(m, lid);
  var s = 0.0;
  if (live) {
    for (var i = lid; i < p.n; i += WG) {
      let e = exp(x[base + i] - m);
      x[base + i] = e;
      s += e;
    }
  }
  s = workgroup_sum(s, lid);
  if (live) {
    for (var i = lid; i < p.n; i += WG) {
      x[base + i] = x[base + i] / s;
    }
  }
}
