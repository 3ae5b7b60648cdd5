// The feed-forward blocks of the CPU reference: a dense gated FFN (SwiGLU, or GeGLU for Gemma)
// and a mixture of experts as llama.cpp's build_moe_ffn computes it with softmax gating:
// router logits → softmax → top-k (descending) → optionally renormalised weights → each
// expert's gated FFN over the tokens routed to it → weighted sum in top-k order (plus
// qwen2moe's shared expert times its sigmoid gate). Only the routed experts' matrices are read.

import type { FfnActivation, MoeConfig } from '../../model/config.ts';
import { geglu } from './gelu.ts';
import { silu, softmax, swiglu } from './ops.ts';
import type { Matrix } from './matrix.ts';

const f32 = Math.fround;
/** llama.cpp clamps the sum of the top-k weights to the smallest normal f16 before dividing */
const MIN_WEIGHT_SUM = 6.103515625e-5;

export interface DenseFfn {
  kind: 'dense';
  wGate: Matrix; // [nFf × nEmbd]
  wUp: Matrix; // [nFf × nEmbd]
  wDown: Matrix; // [nEmbd × nFf]
}

export interface MoeFfn {
  kind: 'moe';
  router: Matrix; // [nExpert × nEmbd] (ffn_gate_inp)
  gate: Matrix[]; // per expert [nFfExp × nEmbd] (ffn_gate_exps)
  up: Matrix[]; // per expert [nFfExp × nEmbd]
  down: Matrix[]; // per expert [nEmbd × nFfExp]
  /** qwen2moe: the shared expert and its gate [1 × nEmbd] (ffn_gate_inp_shexp) */
  shared: { gateInp: Matrix; ffn: DenseFfn } | null;
}

/** y = down(act(gate(x)) ⊙ up(x)). x: [n × nEmbd]; y: [n × nEmbd] */
export function denseFfn(w: DenseFfn, act: FfnActivation, y: Float32Array, x: Float32Array, n: number): void {
  const gate = new Float32Array(n * w.wGate.rows); // [n × nFf]
  const up = new Float32Array(n * w.wUp.rows); // [n × nFf]
  w.wGate.matmul(gate, x, n);
  w.wUp.matmul(up, x, n);
  if (act === 'gelu') geglu(gate, gate, up);
  else swiglu(gate, gate, up);
  w.wDown.matmul(y, gate, n);
}

/** Routing of n tokens: for token t, slot j: the expert and its weight. ids, weights: [n × nUsed] */
export interface Routing {
  ids: Int32Array;
  weights: Float32Array;
}

/** softmax → top-k → (renormalise) over router logits [n × nExpert], as build_moe_ffn. */
export function route(logits: Float32Array, n: number, moe: MoeConfig): Routing {
  const { nExpert, nExpertUsed: k } = moe;
  const ids = new Int32Array(n * k);
  const weights = new Float32Array(n * k);
  const order = new Int32Array(nExpert);
  for (let t = 0; t < n; t++) {
    softmax(logits, t * nExpert, nExpert);
    const probs = logits.subarray(t * nExpert, (t + 1) * nExpert);
    for (let e = 0; e < nExpert; e++) order[e] = e;
    order.sort((a, b) => probs[b]! - probs[a]!);
    let sum = 0; // ggml_sum_rows adds in double
    for (let j = 0; j < k; j++) {
      ids[t * k + j] = order[j]!;
      weights[t * k + j] = probs[order[j]!]!;
      sum += weights[t * k + j]!;
    }
    if (moe.normWeights) {
      const s = Math.max(f32(sum), MIN_WEIGHT_SUM);
      for (let j = 0; j < k; j++) weights[t * k + j] = f32(weights[t * k + j]! / s);
    }
  }
  return { ids, weights };
}

/**
 * Mixture of experts over x: [n × nEmbd] → y: [n × nEmbd]. Tokens are grouped by expert so
 * each selected expert's matrices multiply all its tokens at once.
 */
export function moeFfn(w: MoeFfn, moe: MoeConfig, act: FfnActivation, y: Float32Array, x: Float32Array, n: number): void {
  const nEmbd = w.router.cols;
  const k = moe.nExpertUsed;
  const logits = new Float32Array(n * moe.nExpert); // [n × nExpert]
  w.router.matmul(logits, x, n);
  const { ids, weights } = route(logits, n, moe);

  // every (token, slot)'s expert output: [n × k × nEmbd]
  const experts = new Float32Array(n * k * nEmbd);
  for (let e = 0; e < moe.nExpert; e++) {
    const slots: number[] = []; // t·k + j of the tokens routed to e, in token order
    for (let s = 0; s < n * k; s++) if (ids[s] === e) slots.push(s);
    if (slots.length === 0) continue;
    const m = slots.length;
    const xe = new Float32Array(m * nEmbd); // [m × nEmbd] the routed tokens' rows
    slots.forEach((s, i) => xe.set(x.subarray(Math.floor(s / k) * nEmbd, (Math.floor(s / k) + 1) * nEmbd), i * nEmbd));
    const ye = new Float32Array(m * nEmbd); // [m × nEmbd]
    denseFfn({ kind: 'dense', wGate: w.gate[e]!, wUp: w.up[e]!, wDown: w.down[e]! }, act, ye, xe, m);
    slots.forEach((s, i) => experts.set(ye.subarray(i * nEmbd, (i + 1) * nEmbd), s * nEmbd));
  }

  // weighted sum in top-k order, each product rounded to f32 (ggml_mul, then ggml_add per slot)
  for (let t = 0; t < n; t++) {
    for (let d = 0; d < nEmbd; d++) {
      let acc = f32(experts[(t * k) * nEmbd + d]! * weights[t * k]!);
      for (let j = 1; j < k; j++) acc = f32(acc + f32(experts[(t * k + j) * nEmbd + d]! * weights[t * k + j]!));
      y[t * nEmbd + d] = acc;
    }
  }
  if (w.shared) addSharedExpert(w.shared, act, y, x, n, nEmbd, moe.sigmoidSharedGate === true);
}

/** y += ffn_shexp(x) · sigmoid(x · gate_inp_shexp): qwen2moe's graph takes sigmoid as silu(g) / g, qwen35moe's as ggml_sigmoid. */
function addSharedExpert(sh: NonNullable<MoeFfn['shared']>, act: FfnActivation, y: Float32Array, x: Float32Array, n: number, nEmbd: number, sigmoid: boolean): void {
  const g = new Float32Array(n); // [n × 1]
  sh.gateInp.matmul(g, x, n);
  const out = new Float32Array(n * nEmbd);
  denseFfn(sh.ffn, act, out, x, n);
  for (let t = 0; t < n; t++) {
    const gate = sigmoid ? f32(1 / f32(1 + f32(Math.exp(-g[t]!)))) : f32(silu(g[t]!) / g[t]!);
    for (let d = 0; d < nEmbd; d++) y[t * nEmbd + d] = f32(y[t * nEmbd + d]! + f32(out[t * nEmbd + d]! * gate));
  }
}
