// Stores a batch's keys or values into one part of a KV cache split by heads: columns
// [col0, col0 + width) of each src row (token t) go to position pos0 + t of the part, as f32
// (`store_f32`) or as f16 pairs packed into u32 (`store_f16`, width even). An unsplit cache is written
// directly by the projections and pack_f16 instead.

struct Params {
  n_tokens: u32,
  width: u32,      // elements per position in the part (its heads × head_dim)
  src_stride: u32, // elements between src rows (n_head_kv × head_dim)
  col0: u32,       // first src column of the part
  pos0: u32,       // position of token 0
  wg_x: u32,       // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;         // [n_tokens × src_stride] f32
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;   // [capacity × width] f32 bits, or [capacity × width / 2] f16 pairs

const WG: u32 = 64u;

fn index(wid: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * p.wg_x + wid.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn store_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = index(wid, lid);
  if (i >= p.n_tokens * p.width) {
    return;
  }
  let t = i / p.width;
  let j = i % p.width;
  dst[(p.pos0 + t) * p.width + j] = bitcast<u32>(src[t * p.src_stride + p.col0 + j]);
}

@compute @workgroup_size(WG)
fn store_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = index(wid, lid);
  let half = p.width / 2u;
  if (i >= p.n_tokens * half) {
    return;
  }
  let t = i / half;
  let j = (i % half) * 2u;
  let s = t * p.src_stride + p.col0 + j;
  dst[((p.pos0 + t) * p.width + j) / 2u] = pack2x16float(vec2<f32>(src[s], src[s + 1u]));
}
