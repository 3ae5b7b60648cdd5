// Picks the next token from a logits vector with llama.cpp's sampler chain, step for step and
// in f32 where llama.cpp works in f32: logit bias → penalties (repeat, frequency, presence over
// the last `repeatLastN` tokens) → greedy when temperature is 0, else top-k → top-p → min-p →
// temperature → a draw from std::mt19937 (mt19937.ts). Candidates keep llama.cpp's order (id
// order until a step sorts them), because the draw walks them in that order: the same seed
// and the same logits give the same tokens here as in llama.cpp (node-llama-cpp's chain).

import { MeshError } from '../errors.ts';
import { Mt19937 } from './mt19937.ts';

export interface SamplerOptions {
  /** 0 (default) = greedy */
  temperature?: number;
  /** keep the k most likely tokens; 0 (default) = off */
  topK?: number;
  /** keep the smallest set whose probability reaches p; 1 (default) = off */
  topP?: number;
  /** drop tokens less likely than minP × the most likely one; 0 (default) = off */
  minP?: number;
  /** divide positive (multiply non-positive) logits of recent tokens by this; 1 (default) = off */
  repeatPenalty?: number;
  /** subtract count × this from a recent token's logit (OpenAI frequency_penalty); 0 = off */
  frequencyPenalty?: number;
  /** subtract this from a recent token's logit once (OpenAI presence_penalty); 0 = off */
  presencePenalty?: number;
  /** how many recent tokens (prompt and generated) the penalties look at (default 64, llama.cpp's) */
  repeatLastN?: number;
  /** added to a token's logit before anything else (token id → bias; -Infinity bans it) */
  logitBias?: Record<string, number>;
  /** PRNG seed (default 0xC0FFEE) */
  seed?: number;
}

const DEFAULT_SEED = 0xc0ffee;
const f32 = Math.fround;

/** the candidate list as llama.cpp's llama_token_data_array: ids and logits, `size` live, sorted or in id order */
interface Candidates {
  ids: Int32Array;
  logits: Float32Array;
  /** probabilities where a step computed them (top-p), f32 */
  p: Float32Array;
  size: number;
  sorted: boolean;
}

export class Sampler {
  readonly options: Required<Omit<SamplerOptions, 'logitBias'>> & { logitBias: Array<[number, number]> };
  private readonly rng: Mt19937;
  private drawn = 0;

  constructor(options: SamplerOptions = {}) {
    this.options = {
      temperature: options.temperature ?? 0,
      topK: options.topK ?? 0,
      topP: options.topP ?? 1,
      minP: options.minP ?? 0,
      repeatPenalty: options.repeatPenalty ?? 1,
      frequencyPenalty: options.frequencyPenalty ?? 0,
      presencePenalty: options.presencePenalty ?? 0,
      repeatLastN: options.repeatLastN ?? 64,
      logitBias: Object.entries(options.logitBias ?? {}).map(([k, v]) => [Number(k), v]),
      seed: options.seed ?? DEFAULT_SEED,
    };
    const o = this.options;
    const bad = (what: string) => {
      throw new MeshError('BAD_SAMPLER_OPTION', what);
    };
    if (!(o.temperature >= 0)) bad(`temperature must be >= 0, got ${o.temperature}`);
    if (!Number.isInteger(o.topK) || o.topK < 0) bad(`topK must be a non-negative integer, got ${o.topK}`);
    if (!(o.topP > 0 && o.topP <= 1)) bad(`topP must be in (0, 1], got ${o.topP}`);
    if (!(o.minP >= 0 && o.minP <= 1)) bad(`minP must be in [0, 1], got ${o.minP}`);
    if (!(o.repeatPenalty > 0)) bad(`repeatPenalty must be > 0, got ${o.repeatPenalty}`);
    if (!Number.isFinite(o.frequencyPenalty)) bad(`frequencyPenalty must be a finite number, got ${o.frequencyPenalty}`);
    if (!Number.isFinite(o.presencePenalty)) bad(`presencePenalty must be a finite number, got ${o.presencePenalty}`);
    if (!Number.isInteger(o.repeatLastN) || o.repeatLastN < 0) bad(`repeatLastN must be a non-negative integer, got ${o.repeatLastN}`);
    for (const [id, b] of o.logitBias) if (!Number.isInteger(id) || id < 0 || Number.isNaN(b)) bad(`logitBias: token ${id} → ${b} is not a token id and a number`);
    if (!Number.isInteger(o.seed) || o.seed < 0 || o.seed > 0xffffffff) bad(`seed must be an integer in [0, 2^32), got ${o.seed}`);
    this.rng = new Mt19937(o.seed);
  }

  /** whether sampling reads the token history (a penalty is on) */
  get usesHistory(): boolean {
    const o = this.options;
    return o.repeatLastN > 0 && (o.repeatPenalty !== 1 || o.frequencyPenalty !== 0 || o.presencePenalty !== 0);
  }

  /** random draws made so far: one per sampled token when temperature > 0, none when greedy */
  get draws(): number {
    return this.drawn;
  }

  /** Makes `n` draws without sampling: a sampler that replaces another continues its stream. */
  skip(n: number): this {
    for (let i = 0; i < n; i++) this.rng.nextDouble();
    this.drawn += n;
    return this;
  }

  /**
   * The next token. logits: [nVocab] (not modified); history: tokens so far (prompt and
   * generated), for the penalties.
   */
  sample(logits: Float32Array, history: readonly number[] = []): number {
    const o = this.options;
    // a plain loop and slice(): Int32Array.from with a callback took ~1 ms of a 32k vocabulary, a few % of a decode step
    const ids = new Int32Array(logits.length);
    for (let i = 0; i < ids.length; i++) ids[i] = i;
    const c: Candidates = { ids, logits: logits.slice(), p: new Float32Array(logits.length), size: logits.length, sorted: false };
    for (const [id, bias] of o.logitBias) if (id < c.size) c.logits[id] = f32(c.logits[id]! + bias);
    this.penalise(c, history);
    if (o.temperature <= 0) return greedy(c);
    if (o.topK > 0) topK(c, o.topK);
    if (o.topP < 1) topP(c, o.topP);
    if (o.minP > 0) minP(c, o.minP);
    for (let i = 0; i < c.size; i++) c.logits[i] = f32(c.logits[i]! / f32(o.temperature));
    return c.ids[this.dist(c)]!;
  }

  /** llama.cpp's penalties sampler: counts over the last repeatLastN tokens */
  private penalise(c: Candidates, history: readonly number[]): void {
    if (!this.usesHistory || history.length === 0) return;
    const o = this.options;
    const counts = new Map<number, number>();
    for (const id of history.slice(-o.repeatLastN)) counts.set(id, (counts.get(id) ?? 0) + 1);
    const rep = f32(o.repeatPenalty);
    for (let i = 0; i < c.size; i++) {
      const n = counts.get(c.ids[i]!);
      if (n === undefined) continue;
      const l = c.logits[i]!;
      const scaled = l <= 0 ? f32(l * rep) : f32(l / rep);
      c.logits[i] = f32(scaled - f32(f32(n * f32(o.frequencyPenalty)) + f32(o.presencePenalty)));
    }
    c.sorted = false;
  }

  /** llama.cpp's dist sampler: softmax in f32 terms summed in f64, one uniform double, the first candidate whose running sum reaches it */
  private dist(c: Candidates): number {
    const u = this.rng.nextDouble();
    this.drawn++;
    if (c.size === 1) return 0;
    const maxL = c.sorted ? c.logits[0]! : maxOf(c.logits, c.size);
    let sum = 0;
    for (let i = 0; i < c.size; i++) sum += (c.p[i] = f32(Math.exp(f32(c.logits[i]! - maxL))));
    const target = sum * u;
    let run = 0;
    for (let i = 0; i < c.size; i++) {
      run += c.p[i]!;
      if (run >= target) return i;
    }
    return c.size - 1;
  }
}

/** Index of the largest value, the lowest index on ties: the greedy pick, as llama.cpp's greedy sampler makes it. */
export function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
}

function greedy(c: Candidates): number {
  let best = 0;
  for (let i = 1; i < c.size; i++) if (c.logits[i]! > c.logits[best]!) best = i;
  return c.ids[best]!;
}

function maxOf(x: Float32Array, n: number): number {
  let m = x[0]!;
  for (let i = 1; i < n; i++) if (x[i]! > m) m = x[i]!;
  return m;
}

/** sorts the live candidates by logit, descending (ties: lower id first), keeping the first k */
function sortDescending(c: Candidates, k: number): void {
  const order = Array.from({ length: c.size }, (_, i) => i).sort((a, b) => c.logits[b]! - c.logits[a]! || c.ids[a]! - c.ids[b]!);
  const ids = order.slice(0, k).map((i) => c.ids[i]!);
  const logits = order.slice(0, k).map((i) => c.logits[i]!);
  const p = order.slice(0, k).map((i) => c.p[i]!);
  c.ids.set(ids);
  c.logits.set(logits);
  c.p.set(p);
  c.size = k;
  c.sorted = true;
}

function topK(c: Candidates, k: number): void {
  k = Math.min(k, c.size);
  if (!c.sorted) sortDescending(c, k);
  c.size = k;
}

/** llama.cpp's top-p: softmax (f32) in the current order, then sorted, cut where the f32 running sum reaches p */
function topP(c: Candidates, p: number): void {
  const maxL = c.sorted ? c.logits[0]! : maxOf(c.logits, c.size);
  let sum = f32(0);
  for (let i = 0; i < c.size; i++) sum = f32(sum + (c.p[i] = f32(Math.exp(f32(c.logits[i]! - maxL)))));
  for (let i = 0; i < c.size; i++) c.p[i] = f32(c.p[i]! / sum);
  if (!c.sorted) sortDescending(c, c.size);
  let cum = f32(0);
  const target = f32(p);
  for (let i = 0; i < c.size; i++) {
    cum = f32(cum + c.p[i]!);
    if (cum >= target) {
      c.size = i + 1;
      return;
    }
  }
}

/** llama.cpp's min-p: keep logits ≥ max + ln(p) (order kept when unsorted) */
function minP(c: Candidates, p: number): void {
  const floor = f32((c.sorted ? c.logits[0]! : maxOf(c.logits, c.size)) + f32(Math.log(f32(p))));
  if (c.sorted) {
    let i = 1;
    while (i < c.size && c.logits[i]! >= floor) i++;
    c.size = i;
    return;
  }
  let n = 0;
  for (let i = 0; i < c.size; i++) {
    if (c.logits[i]! < floor) continue;
    c.ids[n] = c.ids[i]!;
    c.logits[n] = c.logits[i]!;
    c.p[n] = c.p[i]!;
    n++;
  }
  c.size = n;
}

/** One token's log-probability under the raw logits (log-softmax at temperature 1), and the `top` most likely tokens' */
export interface TokenLogprob {
  token: number;
  logprob: number;
  top: Array<{ token: number; logprob: number }>;
}

/** log-softmax of the raw logits: what OpenAI's logprobs report (before penalties, bias and truncation, as llama-server does by default) */
export function tokenLogprob(logits: Float32Array, token: number, top: number): TokenLogprob {
  const maxL = maxOf(logits, logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i]! - maxL);
  const logZ = maxL + Math.log(sum);
  const best: number[] = [];
  if (top > 0) {
    const order = Array.from({ length: logits.length }, (_, i) => i).sort((a, b) => logits[b]! - logits[a]! || a - b);
    best.push(...order.slice(0, top));
  }
  return { token, logprob: logits[token]! - logZ, top: best.map((id) => ({ token: id, logprob: logits[id]! - logZ })) };
}
