// A Gated DeltaNet layer's per-token gates, in place on its step inputs (rows of
// [channels | n_v | n_v]: the q|k|v mix, then α, then the β logit), as the CPU reference's
// hybrid-layer.ts computes them: g = softplus(α + dt_bias) · ssm_a (the log-decay) and
// β = sigmoid(β).

struct Params {
  n: u32,        // tokens × n_v
  n_v: u32,      // v heads
  channels: u32, // conv channels (the row's q|k|v part)
  wg_x: u32,     // workgroups along x
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> rows: array<f32>; // [tokens × (channels + 2·n_v)]
@group(0) @binding(2) var<storage, read> dt_bias: array<f32>;    // [n_v] ssm_dt.bias
@group(0) @binding(3) var<storage, read> a: array<f32>;          // [n_v] ssm_a = −exp(A_log)

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * p.wg_x + wid.x) * WG + lid;
  if (i >= p.n) {
    return;
  }
  let t = i / p.n_v;
  let h = i % p.n_v;
  let at = t * (p.channels + 2u * p.n_v) + p.channels;
  let x = rows[at + h] + dt_bias[h];
  let sp = select(log(1.0 + exp(x)), x, x > 20.0);
  rows[at + h] = sp * a[h];
  rows[at + p.n_v + h] = 1.0 / (1.0 + exp(-rows[at + p.n_v + h]));
}
