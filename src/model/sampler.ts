// Picks the next token from a logits vector: repetition penalty → top-k → top-p → min-p →
// temperature → a draw from a seeded PRNG (the order llama.cpp's default chain uses).
// Temperature 0 is greedy: the highest logit after the penalty, the lowest id on ties.
// The same seed and the same logits give the same tokens on every machine.

import { MeshError } from '../errors.ts';
import { Prng } from './prng.ts';

export interface SamplerOptions {
  /** 0 (default) = greedy */
  temperature?: number;
  /** keep the k most likely tokens; 0 (default) = off */
  topK?: number;
  /** keep the smallest set whose probability reaches p; 1 (default) = off */
  topP?: number;
  /** drop tokens less likely than minP × the most likely one; 0 (default) = off */
  minP?: number;
  /** divide positive (multiply negative) logits of recent tokens by this; 1 (default) = off */
  repeatPenalty?: number;
  /** how many recent tokens the penalty looks at (default 64) */
  repeatLastN?: number;
  /** PRNG seed (default 0xC0FFEE) */
  seed?: number;
}

const DEFAULT_SEED = 0xc0ffee;

export class Sampler {
  readonly options: Required<SamplerOptions>;
  private readonly prng: Prng;
  private drawn = 0;

  constructor(options: SamplerOptions = {}) {
    this.options = {
      temperature: options.temperature ?? 0,
      topK: options.topK ?? 0,
      topP: options.topP ?? 1,
      minP: options.minP ?? 0,
      repeatPenalty: options.repeatPenalty ?? 1,
      repeatLastN: options.repeatLastN ?? 64,
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
    if (!Number.isInteger(o.repeatLastN) || o.repeatLastN < 0) bad(`repeatLastN must be a non-negative integer, got ${o.repeatLastN}`);
    this.prng = new Prng(o.seed);
  }

  /** random draws made so far: one per sampled token when temperature > 0, none when greedy */
  get draws(): number {
    return this.drawn;
  }

  /** Makes `n` draws without sampling: a sampler that replaces another continues its stream. */
  skip(n: number): this {
    for (let i = 0; i < n; i++) this.prng.next();
    this.drawn += n;
    return this;
  }

  /**
   * The next token. logits: [nVocab] (not modified); history: tokens so far (prompt and
   * generated), for the repetition penalty.
   */
  sample(logits: Float32Array, history: readonly number[] = []): number {
    const o = this.options;
    const penalised = this.penalise(logits, history);
    const l = penalised ?? logits;
    if (o.temperature === 0) return argmax(l);

    // candidates, most likely first
    let ids = topIds(l, o.topK > 0 ? Math.min(o.topK, l.length) : l.length);
    const maxLogit = l[ids[0]!]!;
    // probabilities at temperature 1 decide top-p and min-p, as in llama.cpp's chain
    let probs = softmaxOf(ids, l, maxLogit, 1);
    if (o.topP < 1) {
      let cum = 0;
      let keep = ids.length;
      for (let i = 0; i < ids.length; i++) {
        cum += probs[i]!;
        if (cum >= o.topP) {
          keep = i + 1;
          break;
        }
      }
      ids = ids.slice(0, keep);
      probs = probs.slice(0, keep);
    }
    if (o.minP > 0) {
      const floor = o.minP * probs[0]!;
      let keep = 1;
      while (keep < ids.length && probs[keep]! >= floor) keep++;
      ids = ids.slice(0, keep);
    }
    probs = softmaxOf(ids, l, maxLogit, o.temperature);
    const r = this.prng.next();
    this.drawn++;
    let cum = 0;
    for (let i = 0; i < ids.length; i++) {
      cum += probs[i]!;
      if (r < cum) return ids[i]!;
    }
    return ids[ids.length - 1]!;
  }

  /** a copy of logits with the repetition penalty applied, or null when it is off */
  private penalise(logits: Float32Array, history: readonly number[]): Float32Array | null {
    const { repeatPenalty, repeatLastN } = this.options;
    if (repeatPenalty === 1 || repeatLastN === 0 || history.length === 0) return null;
    const out = logits.slice();
    const seen = new Set(history.slice(-repeatLastN));
    for (const id of seen) {
      if (id < 0 || id >= out.length) continue;
      const v = out[id]!;
      out[id] = v > 0 ? v / repeatPenalty : v * repeatPenalty;
    }
    return out;
  }
}

/** Index of the largest value, the lowest index on ties: the greedy pick, as llama.cpp's greedy sampler makes it. */
export function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
}

/** the k ids with the largest logits, in descending order (ties: lower id first) */
function topIds(l: Float32Array, k: number): number[] {
  const ids = Array.from({ length: l.length }, (_, i) => i);
  const byLogit = (a: number, b: number) => l[b]! - l[a]! || a - b;
  if (k >= l.length) return ids.sort(byLogit);
  // a cheap preselection: keep values at or above the k-th largest, then sort those
  const sorted = Float32Array.from(l).sort();
  const threshold = sorted[l.length - k]!;
  return ids.filter((i) => l[i]! >= threshold).sort(byLogit).slice(0, k);
}

/** softmax of l[ids] / temperature (max subtracted first), in the order of ids */
function softmaxOf(ids: readonly number[], l: Float32Array, maxLogit: number, temperature: number): number[] {
  const p = ids.map((i) => Math.exp((l[i]! - maxLogit) / temperature));
  const sum = p.reduce((a, b) => a + b, 0);
  return p.map((x) => x / sum);
}
