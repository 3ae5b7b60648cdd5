// Attention of one query token over the session's KV cache, split-K ("flash-decoding"):
// `split` gives each (context chunk, head) its own workgroup, which scores CHUNK cached positions,
// takes their local max and exp-sum and the exp-weighted sum of their values; `combine` merges
// the chunks of each head with the usual max-rescaling. Grouped-query attention: head h reads
// KV head h / (n_head / n_head_kv). Supports head_dim up to any size (threads stride over it).
// A cache split by KV heads is attended part by part: `split` then covers the query heads
// [head0, head0 + gridDim.y) over a cache holding KV heads [kv_head0, kv_head0 + kv_heads).
// `workgroup_max` / `workgroup_sum` come from shaders/reduce/shared.wgsl.

struct Params {
  n_head: u32,
  n_head_kv: u32,
  head_dim: u32,
  n_kv: u32,      // cached positions to attend to (= position of the query + 1)
  n_chunks: u32,  // ceil(n_kv / CHUNK)
  scale: f32,     // 1 / sqrt(head_dim)
  q_offset: u32,  // elements: start of the query in q
  window: u32,    // sliding window: only the last `window` positions are attended to; 0 = all
  head0: u32,     // split: first query head of this dispatch
  kv_head0: u32,  // split: first KV head this cache part holds
  kv_heads: u32,  // split: KV heads this cache part holds (= n_head_kv unsplit)
  out_offset: u32, // combine: elements: where this query's output starts in out (a batch's row)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;               // [n_head × head_dim]
// bindings 2 and 3: the KV cache and its k_at / v_at readers, from shaders/kv/ (f32 or packed f16)
@group(0) @binding(4) var<storage, read_write> partial: array<f32>;   // [n_head × n_chunks × (head_dim + 2)]: o, max, sum
@group(0) @binding(5) var<storage, read_write> out: array<f32>;       // [n_head × head_dim] from out_offset

const CHUNK: u32 = 64u; // = workgroup size (the width of workgroup_max/sum): one cached position per thread
const NEG_BIG: f32 = -3.0e38;

var<workgroup> weight: array<f32, CHUNK>;

@compute @workgroup_size(CHUNK)
fn split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let c = wid.x;
  let h = p.head0 + wid.y;
  let hd = p.head_dim;
  let kvh = h / (p.n_head / p.n_head_kv) - p.kv_head0;
  let kv_stride = p.kv_heads * hd;
  let pos = c * CHUNK + lid;
  let lo = select(0u, p.n_kv - min(p.window, p.n_kv), p.window > 0u);
  let valid = pos < p.n_kv && pos >= lo;

  // score of this thread's position
  var s = NEG_BIG;
  if (valid) {
    let qb = p.q_offset + h * hd;
    let kb = pos * kv_stride + kvh * hd;
    var dot_qk = 0.0;
    for (var d = 0u; d < hd; d++) {
      dot_qk += q[qb + d] * k_at(kb + d);
    }
    s = dot_qk * p.scale;
  }
  let m = workgroup_max(s, lid);
  let e = select(0.0, exp(s - m), valid);
  weight[lid] = e;
  let sum = workgroup_sum(e, lid); // its barriers also publish `weight`

  // exp-weighted sum of this chunk's values, one output dimension per thread
  let n_here = min(CHUNK, p.n_kv - c * CHUNK);
  let dst = (h * p.n_chunks + c) * (hd + 2u);
  for (var d = lid; d < hd; d += CHUNK) {
    var acc = 0.0;
    for (var j = 0u; j < n_here; j++) {
      acc += weight[j] * v_at((c * CHUNK + j) * kv_stride + kvh * hd + d);
    }
    partial[dst + d] = acc;
  }
  if (lid == 0u) {
    partial[dst + hd] = m;
    partial[dst + hd + 1u] = sum;
  }
}

@compute @workgroup_size(CHUNK)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let h = wid.x;
  let hd = p.head_dim;
  let stride = hd + 2u;
  let base = h * p.n_chunks * stride;
  var m = NEG_BIG;
  for (var c = 0u; c < p.n_chunks; c++) {
    m = max(m, partial[base + c * stride + hd]);
  }
  var den = 0.0;
  for (var c = 0u; c < p.n_chunks; c++) {
    den += exp(partial[base + c * stride + hd] - m) * partial[base + c * stride + hd + 1u];
  }
  for (var d = lid; d < hd; d += CHUNK) {
    var num = 0.0;
    for (var c = 0u; c < p.n_chunks; c++) {
      num += exp(partial[base + c * stride + hd] - m) * partial[base + c * stride + d];
    }
    out[p.out_offset + h * hd + d] = num / den;
  }
}
