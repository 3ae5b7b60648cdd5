// A deterministic stand-in for a model: the "stub route" that proves prefill chunks, decode
// steps, KV bookkeeping and the wire end to end without weights. Each layer mixes the row
// with a running sum of every row it has seen in the session (its "KV cache"), so a stage
// that skipped or recomputed positions produces different numbers than one that did not.
// A chain of stubs over [0,a), [a,b), [b,n) computes exactly what one stub over [0,n) does.

import { MeshError } from '../../src/errors.ts';
import type { TensorSource } from '../../src/gguf/types.ts';
import type { ForwardResult, SessionOptions, SessionStats, ShardRange, StageBackend, StageInput } from '../../src/backends/types.ts';

export interface StubModel {
  nLayer: number;
  nEmbd: number;
  nVocab: number;
}

interface StubSession {
  contextLength: number;
  position: number;
  /** per layer: running sum of the rows the layer has seen, [n_embd] f32 */
  sums: Float32Array[];
  processed: number[];
}

export class StubBackend implements StageBackend {
  readonly kind = 'stub' as const;
  private shard: ShardRange | null = null;
  private sessions = new Map<string, StubSession>();

  constructor(readonly model: StubModel) {}

  async load(_source: TensorSource | null, shard: ShardRange): Promise<void> {
    if (shard.start < 0 || shard.end > this.model.nLayer || shard.start >= shard.end) {
      throw new MeshError('BAD_SHARD', `shard [${shard.start}, ${shard.end}) is not inside [0, ${this.model.nLayer})`);
    }
    this.shard = { ...shard };
  }

  async openSession(sessionId: string, options: SessionOptions): Promise<void> {
    const shard = this.requireShard();
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open on this stage`);
    const n = shard.end - shard.start;
    this.sessions.set(sessionId, {
      contextLength: options.contextLength,
      position: 0,
      sums: Array.from({ length: n }, () => new Float32Array(this.model.nEmbd)),
      processed: new Array<number>(n).fill(0),
    });
  }

  async releaseSession(sessionId: string): Promise<void> {
    if (!this.sessions.delete(sessionId)) throw new MeshError('SESSION_UNKNOWN', `session ${sessionId} is not open on this stage`);
  }

  async truncateSession(sessionId: string, position: number): Promise<void> {
    const s = this.session(sessionId);
    if (position !== s.position) throw new MeshError('POSITION_MISMATCH', `the stub keeps running sums: it can rewind only to where it is (${s.position}), not ${position}`);
  }

  async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const t0 = performance.now();
    const shard = this.requireShard();
    const s = this.session(sessionId);
    const { nEmbd, nVocab, nLayer } = this.model;
    if (position !== s.position) throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${s.position}, got a frame for position ${position}`);
    let rows: Float32Array; // [nTokens × n_embd] f32
    let nTokens: number;
    if (input.kind === 'tokens') {
      if (shard.start !== 0) throw new MeshError('STAGE_INPUT_KIND', `stage [${shard.start}, ${shard.end}) takes hidden states, got token ids`);
      nTokens = input.tokens.length;
      rows = new Float32Array(nTokens * nEmbd);
      for (let t = 0; t < nTokens; t++) {
        const tok = input.tokens[t]!;
        if (tok < 0 || tok >= nVocab) throw new MeshError('TOKEN_OUT_OF_RANGE', `token ${tok} is outside the vocabulary [0, ${nVocab})`);
        for (let j = 0; j < nEmbd; j++) rows[t * nEmbd + j] = Math.sin(tok * 0.37 + j * 0.11) * 0.5;
      }
    } else {
      if (shard.start === 0) throw new MeshError('STAGE_INPUT_KIND', 'the first stage takes token ids, got hidden states');
      nTokens = input.nTokens;
      if (input.hidden.length !== nTokens * nEmbd) {
        throw new MeshError('BAD_STAGE_INPUT', `hidden states hold ${input.hidden.length} values, expected ${nTokens} × ${nEmbd}`);
      }
      rows = input.hidden.slice();
    }
    if (position + nTokens > s.contextLength) {
      throw new MeshError('CONTEXT_FULL', `positions up to ${position + nTokens} exceed the session's context of ${s.contextLength}`);
    }
    for (let l = 0; l < shard.end - shard.start; l++) {
      const sum = s.sums[l]!;
      for (let t = 0; t < nTokens; t++) {
        const row = rows.subarray(t * nEmbd, (t + 1) * nEmbd);
        for (let j = 0; j < nEmbd; j++) sum[j] += row[j]!;
        const seen = position + t + 1;
        for (let j = 0; j < nEmbd; j++) row[j] = Math.tanh(row[j]! * 0.9 + (sum[j]! / seen) * 0.3 + (shard.start + l + 1) * 0.01);
      }
      s.processed[l]! += nTokens;
    }
    s.position += nTokens;
    const computeMs = performance.now() - t0;
    if (shard.end < nLayer) return { output: { kind: 'hidden', hidden: rows, nTokens }, computeMs };
    // head: logits of the last row against a fixed pseudo-embedding table
    const last = rows.subarray((nTokens - 1) * nEmbd);
    const logits = new Float32Array(nVocab); // [n_vocab]
    for (let v = 0; v < nVocab; v++) {
      let acc = 0;
      for (let j = 0; j < nEmbd; j++) acc += last[j]! * Math.cos(v * 0.71 + j * 0.13);
      logits[v] = acc;
    }
    return { output: { kind: 'logits', logits }, computeMs };
  }

  sessionStats(sessionId: string): SessionStats {
    const s = this.session(sessionId);
    // what a real f32 K+V cache of these layers would hold
    const kvBytes = s.position * this.model.nEmbd * 4 * 2 * s.sums.length;
    return { position: s.position, kvBytes, processedTokens: [...s.processed] };
  }

  /** Sessions open on this stage (for leak checks). */
  get openSessions(): number {
    return this.sessions.size;
  }

  async dispose(): Promise<void> {
    this.sessions.clear();
    this.shard = null;
  }

  private requireShard(): ShardRange {
    if (!this.shard) throw new MeshError('STAGE_NOT_LOADED', 'the stub stage has no shard loaded');
    return this.shard;
  }

  private session(id: string): StubSession {
    const s = this.sessions.get(id);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `session ${id} is not open on this stage`);
    return s;
  }
}
