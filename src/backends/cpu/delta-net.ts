// The Gated DeltaNet operations of the CPU reference (Qwen3.5's linear attention), as
// llama.cpp's ggml_l2_norm and gated delta net compute them:
//
//   delta rule    per v head, state S [d_k × d_v]:  S ← exp(g_t)·S;  δ = β_t·(v_t − Sᵀk_t);
//                 S ← S + k_t ⊗ δ;  o_t = Sᵀq_t / √d_k
//
// `deltaRuleRecurrent` is the plain token-by-token form (llama.cpp's fused op; kept as the
// check of the chunked form). The engine runs the chunked form (./delta-chunk.ts).
//
// State layout (as ggml's): per v head a d_v × d_k block, s[j·d_k + i] = S[i][j] (key index i
// fastest), so Sᵀk and Sᵀq are contiguous dot products.

const f32 = Math.fround;

/** Shapes of one DeltaNet block's recurrence. */
export interface DeltaShape {
  /** q/k heads */
  nK: number;
  /** v heads (v head h uses q/k head h mod nK) */
  nV: number;
  /** head size d_k = d_v */
  d: number;
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

