// Mixture-of-experts routing, one thread per token (llama.cpp's build_moe_ffn with softmax
// gating): softmax over the router logits, the top k experts by probability (descending; on a
// tie the lower index first), their probabilities as weights — divided by their sum (clamped
// to the smallest normal f16) when `norm` is set (qwen3moe), as they are (qwen2moe).

struct Params {
  n_tokens: u32,
  n_expert: u32,  // at most MAX_EXPERTS
  k: u32,         // experts per token
  norm: u32,      // 1: renormalise the k weights
  wg_x: u32,      // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;        // [n_tokens × n_expert]
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;     // [n_tokens × k] chosen experts
@group(0) @binding(3) var<storage, read_write> weights: array<f32>; // [n_tokens × k] their weights

const WG: u32 = 64u;
const MAX_EXPERTS: u32 = 512u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (t >= p.n_tokens) {
    return;
  }
  let base = t * p.n_expert;
  var m = -3.0e38;
  for (var e = 0u; e < p.n_expert; e++) {
    m = max(m, logits[base + e]);
  }
  var sum = 0.0;
  for (var e = 0u; e < p.n_expert; e++) {
    sum += exp(logits[base + e] - m);
  }
  let inv = 1.0 / sum;
  var taken: array<u32, MAX_EXPERTS / 32u>;
  var wsum = 0.0;
  for (var j = 0u; j < p.k; j++) {
    var best = 0u;
    var best_p = -1.0;
    for (var e = 0u; e < p.n_expert; e++) {
      let pe = exp(logits[base + e] - m) * inv;
      if ((taken[e / 32u] & (1u << (e % 32u))) == 0u && pe > best_p) {
        best = e;
        best_p = pe;
      }
    }
    taken[best / 32u] |= 1u << (best % 32u);
    ids[t * p.k + j] = best;
    weights[t * p.k + j] = best_p;
    wsum += best_p;
  }
  if (p.norm != 0u) {
    let s = max(wsum, 6.103515625e-5);
    for (var j = 0u; j < p.k; j++) {
      weights[t * p.k + j] = weights[t * p.k + j] / s;
    }
  }
}
