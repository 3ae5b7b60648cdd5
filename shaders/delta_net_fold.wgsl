// The end of a chunk of the chunked delta rule (src/backends/cpu/delta-chunk.ts `fold`):
// S₀ ← e^{G_L} S₀ + Σ_t e^{G_L − G_t} k_t ⊗ V'_t, one invocation per state element; the
// invocations past the state move the chunk's last K − 1 conv inputs to the front.

struct Params {
  rows: u32,     // L: tokens in the chunk
  n_k: u32,
  n_v: u32,
  d: u32,
  kernel: u32,
  channels: u32,
  wg_x: u32,     // workgroups along x
  _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> s0: array<f32>;   // [n_v × d × d]
@group(0) @binding(2) var<storage, read> krows: array<f32>;      // [CHUNK × n_k × d]
@group(0) @binding(3) var<storage, read> vp: array<f32>;         // [CHUNK × n_v × d]
@group(0) @binding(4) var<storage, read> gc: array<f32>;         // [CHUNK × n_v]
@group(0) @binding(5) var<storage, read_write> conv: array<f32>; // [(K − 1 + CHUNK) × channels]

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let e = (wid.y * p.wg_x + wid.x) * WG + lid;
  let d = p.d;
  let n_state = p.n_v * d * d;
  if (e < n_state) {
    let h = e / (d * d);
    let j = (e / d) % d;
    let i = e % d;
    let hk = h % p.n_k;
    let GL = gc[(p.rows - 1u) * p.n_v + h];
    var acc = exp(GL) * s0[e];
    for (var t = 0u; t < p.rows; t++) {
      acc += exp(GL - gc[t * p.n_v + h]) * krows[(t * p.n_k + hk) * d + i] * vp[(t * p.n_v + h) * d + j];
    }
    s0[e] = acc;
    return;
  }
  let c = e - n_state;
  let carried = (p.kernel - 1u) * p.channels;
  if (c < carried) {
    conv[c] = conv[p.rows * p.channels + c];
  }
}
