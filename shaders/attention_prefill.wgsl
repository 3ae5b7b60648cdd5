// Causal attention for a batch of query tokens (prefill) over the session's KV cache, which
// already holds the batch's own keys and values. One workgroup per (query token, head); it walks
// the keys in tiles of TILE positions with an online softmax (running max and exp-sum, the
// accumulator rescaled when the max grows), so scores never leave the workgroup.
// Query t sits at position pos0 + t and attends to positions [0, pos0 + t].
// `workgroup_max` / `workgroup_sum` come from shaders/reduce/shared.wgsl.

struct Params {
  n_head: u32,
  n_head_kv: u32,
  head_dim: u32,  // at most TILE * MAX_D_PER_THREAD
  n_tokens: u32,
  pos0: u32,      // position of query token 0
  scale: f32,     // 1 / sqrt(head_dim)
  window: u32,    // sliding window: query t attends to its last `window` positions only; 0 = all
  head0: u32,     // split cache: first query head of this dispatch (see attention_decode)
  kv_head0: u32,  // split cache: first KV head this cache part holds
  kv_heads: u32,  // split cache: KV heads this cache part holds (= n_head_kv unsplit)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;         // [n_tokens × n_head × head_dim]
// bindings 2 and 3: the KV cache and its k_at / v_at readers, from shaders/kv/ (f32 or packed f16)
@group(0) @binding(4) var<storage, read_write> out: array<f32>; // [n_tokens × n_head × head_dim]

const TILE: u32 = 64u; // = workgroup size (the width of workgroup_max/sum): one key position per thread
const MAX_D_PER_THREAD: u32 = 4u;
const NEG_BIG: f32 = -3.0e38;

var<workgroup> weight: array<f32, TILE>;

@compute @workgroup_size(TILE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x;
  let h = p.head0 + wid.y;
  let hd = p.head_dim;
  let kvh = h / (p.n_head / p.n_head_kv) - p.kv_head0;
  let kv_stride = p.kv_heads * hd;
  let qb = (t * p.n_head + h) * hd;
  let n_kv = p.pos0 + t + 1u;

  var m = NEG_BIG;  // running max
  var l = 0.0;      // running exp-sum
  var acc: array<f32, MAX_D_PER_THREAD>; // output dims lid, lid + TILE, ...

  let lo = select(0u, n_kv - min(p.window, n_kv), p.window > 0u);
  for (var tile0 = (lo / TILE) * TILE; tile0 < n_kv; tile0 += TILE) {
    let pos = tile0 + lid;
    let valid = pos < n_kv && pos >= lo;
    var s = NEG_BIG;
    if (valid) {
      let kb = pos * kv_stride + kvh * hd;
      var dot_qk = 0.0;
      for (var d = 0u; d < hd; d++) {
        dot_qk += q[qb + d] * k_at(kb + d);
      }
      s = dot_qk * p.scale;
    }
    let m_new = max(m, workgroup_max(s, lid));
    let e = select(0.0, exp(s - m_new), valid);
    weight[lid] = e;
    let tile_sum = workgroup_sum(e, lid); // its barriers also publish `weight`
    let alpha = exp(m - m_new);
    l = l * alpha + tile_sum;
    let n_here = min(TILE, n_kv - tile0);
    for (var i = 0u; i < MAX_D_PER_THREAD; i++) {
      let d = lid + i * TILE;
      if (d < hd) {
        var a = acc[i] * alpha;
        for (var j = 0u; j < n_here; j++) {
          a += weight[j] * v_at((tile0 + j) * kv_stride + kvh * hd + d);
        }
        acc[i] = a;
      }
    }
    m = m_new;
    workgroupBarrier(); // everyone is done with `weight` before the next tile overwrites it
  }
  for (var i = 0u; i < MAX_D_PER_THREAD; i++) {
    let d = lid + i * TILE;
    if (d < hd) {
      out[qb + d] = acc[i] / l;
    }
  }
}
