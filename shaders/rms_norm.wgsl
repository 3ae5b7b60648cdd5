// RMSNorm fused with its weight: out[r, i] = x[r, i] / sqrt(mean(x[r, :]²) + eps) * w[i].
// One workgroup per row (2-D dispatch past 65,535 rows); `workgroup_sum` from shaders/reduce/.

struct Params {
  n: u32,          // elements per row
  n_rows: u32,
  eps: f32,
  wg_x: u32,       // workgroups along x
  in_offset: u32,  // elements: start of row 0 in x
  in_stride: u32,  // elements between rows of x
  out_offset: u32, // elements: start of row 0 in out
  out_stride: u32, // elements between rows of out
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;           // [n] f32
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u; // = the width workgroup_sum expects

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let r = wid.y * p.wg_x + wid.x;
  let live = r < p.n_rows;
  let src = p.in_offset + r * p.in_stride;
  var sum = 0.0;
  if (live) {
    for (var i = lid; i < p.n; i += WG) {
      let v = x[src + i];
      sum += v * v;
    }
  }
  let total = workgroup_sum(sum, lid);
  if (!live) {
    return;
  }
  let scale = 1.0 / sqrt(total / f32(p.n) + p.eps);
  let dst = p.out_offset + r * p.out_stride;
  for (var i = lid; i < p.n; i += WG) {
    out[dst + i] = x[src + i] * scale * w[i];
  }
}
