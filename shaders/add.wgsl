// In-place add with broadcast: a[i] += b[i % nb]. nb = n is the residual add; nb = row length
// adds a bias to every row.

struct Params {
  n: u32,     // elements of a
  nb: u32,    // elements of b
  wg_x: u32,  // workgroups along x
  a_offset: u32, // elements: where a starts in its buffer
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>; // [a_offset + n]
@group(0) @binding(2) var<storage, read> b: array<f32>;       // [nb]

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n) {
    return;
  }
  a[p.a_offset + i] += b[i % p.nb];
}
