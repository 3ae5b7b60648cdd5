// The mixture-of-experts output: out[t, d] = Σ_j weights[t, j] · y[t·k + j, d], each product
// rounded and added in top-k order as ggml's mul and adds do. `with_shared` also adds qwen2moe's
// shared expert times its gate, sigmoid taken as silu(g) / g like llama.cpp; `with_sigmoid_shared`
// takes it as a plain sigmoid, as qwen35moe's graph does (ggml_sigmoid).

struct Params {
  n_tokens: u32,
  n_embd: u32,
  k: u32,
  wg_x: u32,      // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;             // [n_tokens × k × n_embd] expert outputs
@group(0) @binding(2) var<storage, read> weights: array<f32>;       // [n_tokens × k]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;     // [n_tokens × n_embd]
@group(0) @binding(4) var<storage, read> sh: array<f32>;            // [n_tokens × n_embd] shared expert
@group(0) @binding(5) var<storage, read> sh_gate: array<f32>;       // [n_tokens] its gate logit

const WG: u32 = 64u;

fn routed(t: u32, d: u32) -> f32 {
  var acc = y[(t * p.k) * p.n_embd + d] * weights[t * p.k];
  for (var j = 1u; j < p.k; j++) {
    acc += y[(t * p.k + j) * p.n_embd + d] * weights[t * p.k + j];
  }
  return acc;
}

fn index(wid: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * p.wg_x + wid.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = index(wid, lid);
  if (i < p.n_tokens * p.n_embd) {
    out[i] = routed(i / p.n_embd, i % p.n_embd);
  }
}

@compute @workgroup_size(WG)
fn with_shared(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = index(wid, lid);
  if (i < p.n_tokens * p.n_embd) {
    let t = i / p.n_embd;
    let g = sh_gate[t];
    let gate = (g / (1.0 + exp(-g))) / g;
    out[i] = routed(t, i % p.n_embd) + sh[i] * gate;
  }
}

@compute @workgroup_size(WG)
fn with_sigmoid_shared(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = index(wid, lid);
  if (i < p.n_tokens * p.n_embd) {
    let t = i / p.n_embd;
    let gate = 1.0 / (1.0 + exp(-sh_gate[t]));
    out[i] = routed(t, i % p.n_embd) + sh[i] * gate;
  }
}
