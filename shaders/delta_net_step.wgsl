// One token of a Gated DeltaNet layer in the chunked form of the delta rule (the CPU
// reference's src/backends/cpu/delta-chunk.ts, same symbols): causal conv over the last K
// inputs → SiLU → L2-norm of q and k → V'_t and o_t from the chunk start's state S₀ and the
// chunk's earlier rows. One workgroup per v head h (q/k head h mod n_k); invocation j owns
// column j of the head (d ≤ 256), invocation r < t the coefficients of row r.

struct Params {
  t: u32,        // row of this token in the chunk (tokens of the chunk before it)
  n_k: u32,      // q/k heads
  n_v: u32,      // v heads
  d: u32,        // head size
  kernel: u32,   // conv width K
  channels: u32, // conv channels: 2·n_k·d + n_v·d
  eps: f32,      // L2-norm floor
  tok: u32,      // token of the batch: its row of `inputs` and of `out`
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> inputs: array<f32>;           // per token [channels | n_v | n_v] q|k|v before the conv, g, β
@group(0) @binding(2) var<storage, read> taps: array<f32>;             // [channels × K] ssm_conv1d
@group(0) @binding(3) var<storage, read_write> conv: array<f32>;       // [(K − 1 + CHUNK) × channels] conv inputs
@group(0) @binding(4) var<storage, read> s0: array<f32>;               // [n_v × d × d] s[j·d + i] = S[i][j]
@group(0) @binding(5) var<storage, read_write> krows: array<f32>;      // [CHUNK × n_k × d] normed keys
@group(0) @binding(6) var<storage, read_write> vp: array<f32>;         // [CHUNK × n_v × d] V' rows
@group(0) @binding(7) var<storage, read_write> gc: array<f32>;         // [CHUNK × n_v] cumulative log-decay
@group(0) @binding(8) var<storage, read_write> out: array<f32>;        // per token [n_v × d] o_t

const WG: u32 = 256u;
const CHUNK: u32 = 32u;

var<workgroup> q: array<f32, 256>;
var<workgroup> k: array<f32, 256>;
var<workgroup> red: array<f32, 512>;
var<workgroup> coef_a: array<f32, 32>;
var<workgroup> coef_b: array<f32, 32>;

fn conv_silu(c: u32) -> f32 {
  var s = 0.0;
  for (var j = 0u; j < p.kernel; j++) {
    s += conv[(p.t + j) * p.channels + c] * taps[c * p.kernel + j];
  }
  return s / (1.0 + exp(-s));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) j: u32) {
  let h = wid.x;
  let hk = h % p.n_k;
  let d = p.d;
  let kd = p.n_k * d;
  let live = j < d;
  let at = p.tok * (p.channels + 2u * p.n_v); // this token's inputs
  // this token's conv inputs (rows of a shared q/k head are written alike by each of its v heads)
  let cq = hk * d + j;
  let ck = kd + hk * d + j;
  let cv = 2u * kd + h * d + j;
  if (live) {
    let row = (p.kernel - 1u + p.t) * p.channels;
    conv[row + cq] = inputs[at + cq];
    conv[row + ck] = inputs[at + ck];
    conv[row + cv] = inputs[at + cv];
  }
  storageBarrier();
  var qj = 0.0;
  var kj = 0.0;
  var vj = 0.0;
  if (live) {
    qj = conv_silu(cq);
    kj = conv_silu(ck);
    vj = conv_silu(cv);
  }
  // L2 norms of q and k over the head
  red[j] = qj * qj;
  red[WG + j] = kj * kj;
  workgroupBarrier();
  for (var w = WG / 2u; w > 0u; w = w / 2u) {
    if (j < w) {
      red[j] += red[j + w];
      red[WG + j] += red[WG + j + w];
    }
    workgroupBarrier();
  }
  qj = qj / max(sqrt(red[0]), p.eps);
  kj = kj / max(sqrt(red[WG]), p.eps);
  if (live) {
    q[j] = qj;
    k[j] = kj;
    krows[(p.t * p.n_k + hk) * d + j] = kj;
  }
  let g = inputs[at + p.channels + h];
  let beta = inputs[at + p.channels + p.n_v + h];
  let G = select(0.0, gc[(p.t - 1u) * p.n_v + h], p.t > 0u) + g;
  workgroupBarrier();
  // invocation r ≤ t: A_tr = β (k·k_r) e^{G − G_r} and (q·k_r) e^{G − G_r}, k_t = this token's key
  if (j <= p.t) {
    var kk = 0.0;
    var qk = 0.0;
    for (var i = 0u; i < d; i++) {
      let kr = select(krows[(j * p.n_k + hk) * d + i], k[i], j == p.t);
      kk += k[i] * kr;
      qk += q[i] * kr;
    }
    let decay = select(exp(G - gc[j * p.n_v + h]), 1.0, j == p.t);
    coef_a[j] = beta * kk * decay;
    coef_b[j] = qk * decay;
  }
  workgroupBarrier();
  if (!live) {
    return;
  }
  let eG = exp(G);
  var ks = 0.0;
  var qs = 0.0;
  let sb = h * d * d + j * d;
  for (var i = 0u; i < d; i++) {
    ks += k[i] * s0[sb + i];
    qs += q[i] * s0[sb + i];
  }
  // V'_t = β v − β e^G S₀ᵀk − Σ_{r<t} A_tr V'_r;  o_t = e^G S₀ᵀq + Σ_{r≤t} (q·k_r) e^{G − G_r} V'_r
  var v_new = beta * vj - beta * eG * ks;
  var o = eG * qs;
  for (var r = 0u; r < p.t; r++) {
    let vr = vp[(r * p.n_v + h) * d + j];
    v_new -= coef_a[r] * vr;
    o += coef_b[r] * vr;
  }
  o += coef_b[p.t] * v_new;
  vp[(p.t * p.n_v + h) * d + j] = v_new;
  if (j == 0u) {
    gc[p.t * p.n_v + h] = G;
  }
  out[(p.tok * p.n_v + h) * d + j] = o / sqrt(f32(d));
}
