// Rotary position embedding, in place on [n_tokens × n_heads × head_dim] f32. The cos/sin of
// every (token, frequency) come from a table computed on the host in double precision with the
// model's frequency settings (base, linear scale, per-frequency factors), so this kernel only
// rotates. mode 0 ("normal") rotates pairs (2i, 2i+1); mode 1 ("neox") rotates (i, i + n_rot/2).
// Dimensions at and past n_rot are left untouched.

struct Params {
  n_heads: u32,
  head_dim: u32,
  n_rot: u32,     // rotated dimensions per head (even)
  n_tokens: u32,
  neox: u32,      // 0 normal, 1 neox
  wg_x: u32,      // workgroups along x
  x_offset: u32,  // elements: where token 0 starts in x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;  // [n_tokens × n_heads × head_dim]
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>; // [n_tokens × n_rot/2] (cos, sin)

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let half = p.n_rot / 2u;
  let idx = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (idx >= p.n_tokens * p.n_heads * half) {
    return;
  }
  let i = idx % half;
  let h = (idx / half) % p.n_heads;
  let t = idx / (half * p.n_heads);
  let base = p.x_offset + (t * p.n_heads + h) * p.head_dim;
  var a = base + 2u * i;
  var b = a + 1u;
  if (p.neox != 0u) {
    a = base + i;
    b = a + half;
  }
  let cs = table[t * half + i];
  let x0 = x[a];
  let x1 = x[b];
  x[a] = x0 * cs.x - x1 * cs.y;
  x[b] = x0 * cs.y + x1 * cs.x;
}
