// The Gated DeltaNet operations of the CPU reference (Qwen3.5's linear attention), as
// llama.cpp's ggml_ssm_conv, ggml_l2_norm and gated delta net compute them:
//
//   causal conv   out[t][c] = Σ_k in[t + k][c] · w[c][k] over the K − 1 carried rows + this batch
//   delta rule    per v head, state S [d_k × d_v]:  S ← exp(g_t)·S;  δ = β_t·(v_t − Sᵀk_t);
//                 S ← S + k_t ⊗ δ;  o_t = Sᵀq_t / √d_k
//
// The recurrence runs token by token (`deltaRuleRecurrent`, decode) or in chunks of CHUNK
// tokens (`deltaRuleChunked`, prefill): within a chunk the WY form turns the sequential
// updates into small triangular solves and matrix products, and the state is touched once per
// chunk instead of once per token. Both give the same result up to f32 rounding.
//
// State layout (as ggml's): per v head a d_v × d_k block, s[j·d_k + i] = S[i][j] (key index i
// fastest), so Sᵀk and Sᵀq are contiguous dot products.

const f32 = Math.fround;

/** Tokens per chunk of the chunked form (llama.cpp's chunk size for scalar gates). */
export const CHUNK = 64;

/** Shapes of one DeltaNet block's recurrence. */
export interface DeltaShape {
  /** q/k heads */
  nK: number;
  /** v heads (v head h uses q/k head h mod nK) */
  nV: number;
  /** head size d_k = d_v */
  d: number;
}

/**
 * Causal depthwise conv over `n` rows of `channels` (x: [n × channels]) with the carried
 * `state` [(K − 1) × channels] before them; writes out: [n × channels] and moves the last
 * K − 1 input rows into `state`. w: [channels × K] (ssm_conv1d, tap index fastest).
 */
export function causalConv(out: Float32Array, x: Float32Array, state: Float32Array, w: Float32Array, n: number, channels: number, kernel: number): void {
  const carried = kernel - 1;
  const row = (t: number, c: number): number => (t < carried ? state[t * channels + c]! : x[(t - carried) * channels + c]!);
  for (let t = 0; t < n; t++) {
    for (let c = 0; c < channels; c++) {
      let sum = 0;
      for (let k = 0; k < kernel; k++) sum = f32(sum + f32(row(t + k, c) * w[c * kernel + k]!));
      out[t * channels + c] = sum;
    }
  }
  // the new carried rows: the last K − 1 of [state | x]
  const next = new Float32Array(carried * channels);
  for (let t = 0; t < carried; t++) for (let c = 0; c < channels; c++) next[t * channels + c] = row(n + t, c);
  state.set(next);
}

/** x ← x / max(‖x‖, eps) over each of nRows rows of `width` values at stride `stride` (ggml_l2_norm). */
export function l2NormRows(x: Float32Array, offset: number, nRows: number, width: number, stride: number, eps: number): void {
  for (let r = 0; r < nRows; r++) {
    const o = offset + r * stride;
    let ss = 0;
    for (let i = 0; i < width; i++) ss += f32(x[o + i]! * x[o + i]!);
    const scale = f32(1 / Math.max(f32(Math.sqrt(ss)), eps));
    for (let i = 0; i < width; i++) x[o + i] = f32(x[o + i]! * scale);
  }
}

/** Per-token inputs of the recurrence, already split into heads. */
export interface DeltaInputs {
  /** [n × nK × d] queries, L2-normalised */
  q: Float32Array;
  /** [n × nK × d] keys, L2-normalised */
  k: Float32Array;
  /** [n × nV × d] values */
  v: Float32Array;
  /** [n × nV] log-decay g = softplus(α + dt_bias) · ssm_a (< 0) */
  g: Float32Array;
  /** [n × nV] write strength β = sigmoid(…) */
  beta: Float32Array;
}

/** Token-by-token delta rule over n tokens; state [nV × d × d] updated in place; out [n × nV × d]. */
export function deltaRuleRecurrent(out: Float32Array, inp: DeltaInputs, state: Float32Array, n: number, shape: DeltaShape): void {
  const { nK, nV, d } = shape;
  const scale = f32(1 / Math.sqrt(d));
  const delta = new Float32Array(d);
  for (let h = 0; h < nV; h++) {
    const s = state.subarray(h * d * d, (h + 1) * d * d);
    const hk = h % nK;
    for (let t = 0; t < n; t++) {
      const qo = (t * nK + hk) * d;
      const ko = qo;
      const vo = (t * nV + h) * d;
      const decay = f32(Math.exp(inp.g[t * nV + h]!));
      const beta = inp.beta[t * nV + h]!;
      for (let i = 0; i < d * d; i++) s[i] = f32(s[i]! * decay);
      for (let j = 0; j < d; j++) {
        let sk = 0;
        for (let i = 0; i < d; i++) sk = f32(sk + f32(s[j * d + i]! * inp.k[ko + i]!));
        delta[j] = f32(f32(inp.v[vo + j]! - sk) * beta);
      }
      for (let j = 0; j < d; j++) {
        const dj = delta[j]!;
        for (let i = 0; i < d; i++) s[j * d + i] = f32(s[j * d + i]! + f32(inp.k[ko + i]! * dj));
      }
      for (let j = 0; j < d; j++) {
        let sq = 0;
        for (let i = 0; i < d; i++) sq = f32(sq + f32(s[j * d + i]! * inp.q[qo + i]!));
        out[(t * nV + h) * d + j] = f32(sq * scale);
      }
    }
  }
}

/**
 * The same recurrence in chunks of CHUNK tokens (the chunked / WY form). Within a chunk of L
 * tokens with cumulative log-decay G_t and state S₀ at its start:
 *   A[t][u] = β_t (k_t·k_u) e^{G_t − G_u} (u < t);  T = (I + A)⁻¹ (forward substitution)
 *   U = T·(β ⊙ V),  W = T·(β e^{G} ⊙ K);  V' = U − W·S₀
 *   o_t = e^{G_t} q_t·S₀ + Σ_{u ≤ t} (q_t·k_u) e^{G_t − G_u} V'_u
 *   S ← e^{G_L} S₀ + Σ_t e^{G_L − G_t} k_t ⊗ V'_t
 */
export function deltaRuleChunked(out: Float32Array, inp: DeltaInputs, state: Float32Array, n: number, shape: DeltaShape): void {
  const { nK, nV, d } = shape;
  const scale = f32(1 / Math.sqrt(d));
  const w = new Float32Array(CHUNK * d); // [L × d_k] W rows
  const u = new Float32Array(CHUNK * d); // [L × d_v] U, then V'
  const a = new Float32Array(CHUNK * CHUNK); // [L × L] A (strictly lower), then q·k decay (lower)
  const gc = new Float64Array(CHUNK); // cumulative log-decay
  const tail = new Float64Array(CHUNK); // e^{G_L − G_t}
  for (let h = 0; h < nV; h++) {
    const s = state.subarray(h * d * d, (h + 1) * d * d);
    const hk = h % nK;
    const qAt = (t: number) => (t * nK + hk) * d;
    const vAt = (t: number) => (t * nV + h) * d;
    for (let c0 = 0; c0 < n; c0 += CHUNK) {
      const L = Math.min(CHUNK, n - c0);
      let acc = 0;
      for (let t = 0; t < L; t++) gc[t] = acc += inp.g[(c0 + t) * nV + h]!;
      // A and the right-hand sides, then forward substitution row by row (T applied implicitly)
      for (let t = 0; t < L; t++) {
        const beta = inp.beta[(c0 + t) * nV + h]!;
        const kt = qAt(c0 + t);
        const eg = Math.exp(gc[t]!);
        for (let i = 0; i < d; i++) w[t * d + i] = beta * eg * inp.k[kt + i]!;
        for (let j = 0; j < d; j++) u[t * d + j] = beta * inp.v[vAt(c0 + t) + j]!;
        for (let r = 0; r < t; r++) {
          let kk = 0;
          const kr = qAt(c0 + r);
          for (let i = 0; i < d; i++) kk += inp.k[kt + i]! * inp.k[kr + i]!;
          const art = beta * kk * Math.exp(gc[t]! - gc[r]!);
          for (let i = 0; i < d; i++) w[t * d + i] = w[t * d + i]! - art * w[r * d + i]!;
          for (let j = 0; j < d; j++) u[t * d + j] = u[t * d + j]! - art * u[r * d + j]!;
        }
      }
      // V' = U − W·S₀  (S₀[i][j] = s[j·d + i])
      for (let t = 0; t < L; t++) {
        for (let j = 0; j < d; j++) {
          let ws = 0;
          for (let i = 0; i < d; i++) ws += w[t * d + i]! * s[j * d + i]!;
          u[t * d + j] = u[t * d + j]! - ws;
        }
      }
      // outputs: the state's part plus the causal part within the chunk
      for (let t = 0; t < L; t++) {
        const qt = qAt(c0 + t);
        for (let r = 0; r <= t; r++) {
          let qk = 0;
          const kr = qAt(c0 + r);
          for (let i = 0; i < d; i++) qk += inp.q[qt + i]! * inp.k[kr + i]!;
          a[t * CHUNK + r] = qk * Math.exp(gc[t]! - gc[r]!);
        }
        const eg = Math.exp(gc[t]!);
        for (let j = 0; j < d; j++) {
          let o = 0;
          for (let i = 0; i < d; i++) o += inp.q[qt + i]! * s[j * d + i]!;
          o *= eg;
          for (let r = 0; r <= t; r++) o += a[t * CHUNK + r]! * u[r * d + j]!;
          out[(c0 + t) * nV * d + h * d + j] = f32(o * scale);
        }
      }
      // the state at the chunk's end
      const gl = gc[L - 1]!;
      const egl = Math.exp(gl);
      for (let t = 0; t < L; t++) tail[t] = Math.exp(gl - gc[t]!);
      for (let j = 0; j < d; j++) {
        for (let i = 0; i < d; i++) {
          let v = s[j * d + i]! * egl;
          for (let t = 0; t < L; t++) v += tail[t]! * inp.k[qAt(c0 + t) + i]! * u[t * d + j]!;
          s[j * d + i] = v;
        }
      }
    }
  }
}
