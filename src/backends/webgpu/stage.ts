// The WebGPU stage engine: owns a GPUDevice, the shard's weights as uploaded GGUF blocks, a KV
// cache per session and the scratch buffers of the forward pass. It runs wherever a device
// exists — a Web Worker (workers/webgpu-stage.worker.ts), a page, or Node with Dawn — and
// speaks plain data (typed arrays, numbers), so it can sit behind comlink unchanged.
//
// One forward call = one command submission; only the stage's output is read back (hidden
// states [n × n_embd], or the last position's logits on the shard that holds the head).
// Formulas shared with the CPU reference (RoPE angles, ggml's activation rounding rule) are
// imported from it, so the two backends cannot drift apart.

import { BufferUsage } from './usage.ts';
import { MeshError } from '../../errors.ts';
import { dequantize } from '../../gguf/dequant.ts';
import type { GgmlType } from '../../gguf/types.ts';
import type { ModelConfig } from '../../model/config.ts';
import type { ForwardResult, SessionStats, ShardRange, StageInput, StageOutput } from '../types.ts';
import type { AdapterSummary } from './device.ts';
import { GpuMemory } from './gpu-memory.ts';
import { KernelLibrary, Recorder, SubmitResources } from './kernels.ts';
import { destroyMatrix, uploadMatrix } from './matrix.ts';
import type { GpuMatrix } from './matrix.ts';
import * as op from './ops.ts';
import type { MatMulKernel, MatVecKernel } from './ops.ts';
import { kvCapacity } from './kv-capacity.ts';
import { ropeTable } from './rope-table.ts';
import { activationFormatFor } from '../cpu/act-round.ts';
import type { KvType, QuantKind, ShaderSources } from './shader-library.ts';

/** One tensor of the shard as read from the artifact. */
export interface StageTensor {
  name: string;
  type: GgmlType;
  /** ggml order: shape[0] is the row length */
  shape: number[];
  bytes: Uint8Array;
}

export interface StageModel {
  config: ModelConfig;
  shard: ShardRange;
  /** where the shard came from, for error messages ("model.gguf") */
  artifact: string;
  tensors: StageTensor[];
}

export interface WebGpuStageOptions {
  /** split weight matrices into buffers of at most this many bytes (default: the device limit) */
  maxChunkBytes?: number;
  /** matrix × vector kernel for decode; 'auto' picks mul_mat on software adapters */
  matVec?: MatVecKernel | 'auto';
  /** matrix × matrix kernel for prefill; 'auto' picks mul_mat_tiled except on software adapters */
  matMul?: MatMulKernel | 'auto';
  /**
   * 'ggml' (default, like the CPU reference): round activations as llama.cpp's CPU backend does
   * before each quantised or f16 matmul, so greedy tokens match it; 'none': exact f32.
   */
  activationRounding?: 'ggml' | 'none';
  /** KV cache elements: 'f32' (default, like the CPU reference) or 'f16' (half the memory, like llama.cpp's default) */
  kvType?: KvType;
}

interface LayerGpu {
  attnNorm: GPUBuffer; // [nEmbd] f32
  wq: GpuMatrix; // [nHead·headDim rows × nEmbd]
  wk: GpuMatrix; // [nHeadKv·headDim rows × nEmbd]
  wv: GpuMatrix;
  wo: GpuMatrix; // [nEmbd rows × nHead·headDim]
  bq?: GPUBuffer; // [nHead·headDim] f32 (qwen2)
  bk?: GPUBuffer; // [nHeadKv·headDim]
  bv?: GPUBuffer;
  qNorm?: GPUBuffer; // [headDim] f32 (qwen3)
  kNorm?: GPUBuffer;
  ffnNorm: GPUBuffer; // [nEmbd] f32
  wGate: GpuMatrix; // [nFf rows × nEmbd]
  wUp: GpuMatrix;
  wDown: GpuMatrix; // [nEmbd rows × nFf]
}

interface Loaded {
  config: ModelConfig;
  shard: ShardRange;
  artifact: string;
  tokenEmbd?: GpuMatrix; // [nVocab rows × nEmbd]
  layers: LayerGpu[];
  outputNorm?: GPUBuffer; // [nEmbd] f32
  output?: GpuMatrix; // [nVocab rows × nEmbd]
}

interface Session {
  contextLength: number;
  /** positions the cache buffers hold now (grown by doubling up to contextLength) */
  capacity: number;
  position: number;
  processedTokens: number[];
  keys: GPUBuffer[]; // per layer [capacity × nHeadKv·headDim] f32 or packed f16 (kvType), RoPE applied
  values: GPUBuffer[]; // per layer [capacity × nHeadKv·headDim] f32 or packed f16
  kvBytes: number;
}

/** Activation buffers for up to `tokens` tokens per forward call. */
interface Scratch {
  tokens: number;
  x: GPUBuffer; // [n × nEmbd] residual stream
  xb: GPUBuffer; // [n × nEmbd] normed block input
  q: GPUBuffer; // [n × nHead·headDim]
  att: GPUBuffer; // [n × nHead·headDim] attention output (and raw q when q is normed)
  kTmp?: GPUBuffer; // [n × nHeadKv·headDim] f32 k on its way to the cache (normed or f16 caches)
  kTmp2?: GPUBuffer; // [n × nHeadKv·headDim] f32 normed k for an f16 cache (qwen3)
  vTmp?: GPUBuffer; // [n × nHeadKv·headDim] f32 v for an f16 cache
  tmp: GPUBuffer; // [n × nEmbd] block output before the residual add
  gate: GPUBuffer; // [n × nFf]
  up: GPUBuffer; // [n × nFf]
  ids: GPUBuffer; // [n] u32 token ids
  rope: GPUBuffer; // [n × nRot/2] (cos, sin)
  logits?: GPUBuffer; // [nVocab]
  /** rounded copies of a matmul input, by format: [n × widest input row] (ggml rounding only) */
  rounded: Partial<Record<Exclude<op.ActivationFormat, 'f32'>, GPUBuffer>>;
}

const ACTIVATION = BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST;


export class WebGpuStage {
  private readonly memory: GpuMemory;
  private readonly kernels: KernelLibrary;
  private readonly resources: SubmitResources;
  private readonly matVec: MatVecKernel;
  private readonly matMul: MatMulKernel;
  private readonly kvType: KvType;
  /** bytes per KV cache element */
  private readonly kvElementBytes: number;
  private model: Loaded | null = null;
  private readonly sessions = new Map<string, Session>();
  private scratch: Scratch | null = null;
  private partial: GPUBuffer | null = null; // split-K attention partials, grown to the longest context
  private partialElements = 0;
  private lost: string | null = null;
  /** calls run one at a time: they share scratch buffers, the readback buffer and error scopes */
  private tail: Promise<unknown> = Promise.resolve();
  private disposed = false;

  constructor(
    readonly device: GPUDevice,
    readonly adapter: AdapterSummary,
    sources: ShaderSources,
    private readonly options: WebGpuStageOptions = {},
  ) {
    this.memory = new GpuMemory(device);
    this.kernels = new KernelLibrary(device, sources);
    this.resources = new SubmitResources(this.memory);
    const choice = options.matVec ?? 'auto';
    this.matVec = choice === 'auto' ? (adapter.isFallbackAdapter ? 'mul_mat' : 'mul_mat_vec') : choice;
    const batched = options.matMul ?? 'auto';
    this.matMul = batched === 'auto' ? (adapter.isFallbackAdapter ? 'mul_mat' : 'mul_mat_tiled') : batched;
    this.kvType = options.kvType ?? 'f32';
    this.kvElementBytes = this.kvType === 'f16' ? 2 : 4;
    void device.lost.then((info) => {
      if (!this.disposed) this.lost = `${info.reason}: ${info.message}`;
    });
  }

  /** live GPU buffers and their bytes (0 and 0 after dispose) */
  bufferStats(): { count: number; bytes: number } {
    return { count: this.memory.count, bytes: this.memory.bytes };
  }

  /** queue submissions and bytes read back since the stage was made */
  transferStats(): { submissions: number; readbackBytes: number } {
    return { submissions: this.resources.submissions, readbackBytes: this.resources.readbackBytes };
  }

  /** labels of the compiled pipelines */
  pipelineLabels(): string[] {
    return this.kernels.labels;
  }

  load(model: StageModel): Promise<void> {
    return this.exclusive(() => this.loadNow(model));
  }

  private async loadNow(model: StageModel): Promise<void> {
    this.check();
    if (this.model) throw new MeshError('ALREADY_LOADED', 'this stage already holds a shard; dispose it first');
    const { config, shard } = model;
    if (config.headDim > op.ATTENTION_MAX_HEAD_DIM) {
      throw new MeshError('UNSUPPORTED_MODEL', `head dimension ${config.headDim} exceeds the WebGPU attention kernel's ${op.ATTENTION_MAX_HEAD_DIM}`);
    }
    const byName = new Map(model.tensors.map((t) => [t.name, t]));
    const maxChunk = Math.min(this.options.maxChunkBytes ?? Infinity, this.adapter.maxStorageBufferBindingSize, this.adapter.maxBufferSize);
    const where = this.where(model);
    const before = this.memory.snapshot();
    await this.guard(where, 'uploading weights', async () => {
      const need = (name: string): StageTensor => {
        const t = byName.get(name);
        if (!t) throw new MeshError('TENSOR_MISSING', `${where} needs ${name}, which was not given`);
        return t;
      };
      const matrix = (name: string): GpuMatrix => {
        const t = need(name);
        return uploadMatrix(this.memory, name, t.type, t.shape, t.bytes, maxChunk);
      };
      const vector = (name: string): GPUBuffer => {
        const t = need(name);
        const n = t.shape.reduce((a, b) => a * b, 1);
        return this.memory.upload(name, dequantize(t.type, t.bytes, n));
      };
      const optionalVector = (name: string): GPUBuffer | undefined => (byName.has(name) ? vector(name) : undefined);
      const loaded: Loaded = { config, shard: { ...shard }, artifact: model.artifact, layers: [] };
      this.model = loaded;
      if (shard.start === 0) loaded.tokenEmbd = matrix('token_embd.weight');
      for (let l = shard.start; l < shard.end; l++) {
        const p = `blk.${l}.`;
        loaded.layers.push({
          attnNorm: vector(`${p}attn_norm.weight`),
          wq: matrix(`${p}attn_q.weight`),
          wk: matrix(`${p}attn_k.weight`),
          wv: matrix(`${p}attn_v.weight`),
          wo: matrix(`${p}attn_output.weight`),
          bq: optionalVector(`${p}attn_q.bias`),
          bk: optionalVector(`${p}attn_k.bias`),
          bv: optionalVector(`${p}attn_v.bias`),
          qNorm: optionalVector(`${p}attn_q_norm.weight`),
          kNorm: optionalVector(`${p}attn_k_norm.weight`),
          ffnNorm: vector(`${p}ffn_norm.weight`),
          wGate: matrix(`${p}ffn_gate.weight`),
          wUp: matrix(`${p}ffn_up.weight`),
          wDown: matrix(`${p}ffn_down.weight`),
        });
      }
      if (shard.end === config.nLayer) {
        loaded.outputNorm = vector('output_norm.weight');
        loaded.output = byName.has('output.weight') ? matrix('output.weight') : (loaded.tokenEmbd ?? matrix('token_embd.weight'));
      }
      await this.kernels.prepare(this.pipelinesFor(loaded));
    }).catch((e) => {
      // free everything uploaded so far, including a layer that was only half built
      this.model = null;
      this.memory.destroyAllExcept(before);
      throw e;
    });
  }

  openSession(sessionId: string, contextLength: number): Promise<void> {
    return this.exclusive(() => this.openSessionNow(sessionId, contextLength));
  }

  private async openSessionNow(sessionId: string, contextLength: number): Promise<void> {
    this.check();
    const m = this.loadedModel();
    if (this.sessions.has(sessionId)) throw new MeshError('SESSION_EXISTS', `session ${sessionId} is already open`);
    if (!Number.isSafeInteger(contextLength) || contextLength <= 0) {
      throw new MeshError('BAD_CONTEXT_LENGTH', `context length must be a positive integer, got ${contextLength}`);
    }
    const kvDim = m.config.nHeadKv * m.config.headDim;
    const eb = this.kvElementBytes;
    const layerBytes = contextLength * kvDim * eb;
    if (layerBytes > this.adapter.maxStorageBufferBindingSize) {
      throw new MeshError('CONTEXT_TOO_LARGE', `a ${contextLength}-position KV cache needs ${layerBytes} bytes per layer, over this device's ${this.adapter.maxStorageBufferBindingSize}-byte binding limit`);
    }
    const nLayers = m.layers.length;
    const capacity = kvCapacity(0, 1, contextLength);
    const session: Session = { contextLength, capacity, position: 0, processedTokens: new Array<number>(nLayers).fill(0), keys: [], values: [], kvBytes: 2 * nLayers * capacity * kvDim * eb };
    await this.guard(this.where(m), `allocating the KV cache of session ${sessionId}`, async () => {
      for (let l = 0; l < nLayers; l++) {
        session.keys.push(this.memory.create(`k[${l}] ${sessionId}`, capacity * kvDim * eb, ACTIVATION));
        session.values.push(this.memory.create(`v[${l}] ${sessionId}`, capacity * kvDim * eb, ACTIVATION));
      }
    }).catch((e) => {
      this.freeSession(session);
      throw e;
    });
    this.sessions.set(sessionId, session);
  }

  /** frees the session's KV cache once any call in flight has finished with it */
  releaseSession(sessionId: string): Promise<void> {
    return this.exclusive(async () => {
      const s = this.session(sessionId);
      this.freeSession(s);
      this.sessions.delete(sessionId);
    });
  }

  sessionStats(sessionId: string): SessionStats {
    const s = this.session(sessionId);
    return { position: s.position, kvBytes: s.kvBytes, processedTokens: [...s.processedTokens] };
  }

  forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    return this.exclusive(() => this.forwardNow(sessionId, input, position));
  }

  private async forwardNow(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    this.check();
    const m = this.loadedModel();
    const s = this.session(sessionId);
    const { config: c, shard } = m;
    if (position !== s.position) {
      throw new MeshError('POSITION_MISMATCH', `session ${sessionId} is at position ${s.position}, forward was asked for position ${position}`, {
        expected: s.position,
        got: position,
      });
    }
    const n = input.kind === 'tokens' ? input.tokens.length : input.nTokens;
    if (n === 0) throw new MeshError('BAD_STAGE_INPUT', 'forward needs at least one token');
    if (input.kind === 'tokens') {
      if (!m.tokenEmbd) throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) takes hidden states, not token ids`);
      for (const t of input.tokens) {
        if (!Number.isInteger(t) || t < 0 || t >= m.tokenEmbd.rows) {
          throw new MeshError('BAD_TOKEN', `token id ${t} is outside the vocabulary [0, ${m.tokenEmbd.rows})`);
        }
      }
    } else {
      if (m.tokenEmbd) throw new MeshError('BAD_STAGE_INPUT', `shard [${shard.start}, ${shard.end}) starts at layer 0 and takes token ids`);
      if (input.hidden.length !== n * c.nEmbd) {
        throw new MeshError('BAD_STAGE_INPUT', `hidden states hold ${input.hidden.length} floats, expected ${n} × ${c.nEmbd}`);
      }
    }
    if (position + n > s.contextLength) {
      throw new MeshError('CONTEXT_FULL', `session context is full: ${position} positions held + ${n} new > context length ${s.contextLength}`);
    }

    const started = performance.now();
    const where = this.where(m);
    const output = await this.guard(where, `forward of session ${sessionId}`, async (): Promise<StageOutput> => {
      const sc = this.scratchFor(n);
      const partial = this.partialFor(position + n);
      const queue = this.device.queue;
      if (input.kind === 'tokens') queue.writeBuffer(sc.ids, 0, new Uint32Array(input.tokens));
      else queue.writeBuffer(sc.x, 0, input.hidden as Float32Array<ArrayBuffer>);
      queue.writeBuffer(sc.rope, 0, ropeTable(c.rope, position, n) as Float32Array<ArrayBuffer>);

      const rec = new Recorder(this.kernels, this.resources);
      const retired = this.growCache(rec, s, c, position + n, sessionId);
      if (m.tokenEmbd) op.getRows(rec, m.tokenEmbd, sc.ids, sc.x, n);
      m.layers.forEach((layer, l) => this.recordLayer(rec, c, layer, s.keys[l]!, s.values[l]!, sc, partial, n, position));

      let bytes: ArrayBuffer | undefined;
      if (m.output && m.outputNorm) {
        // logits of the last position only: output norm, then the head
        op.rmsNorm(rec, sc.x, (n - 1) * c.nEmbd, c.nEmbd, m.outputNorm, sc.xb, 0, c.nEmbd, c.nEmbd, 1, c.rmsEps);
        op.matmul(rec, m.output, this.input(rec, sc, m.output, sc.xb, 1, new Map()), 0, sc.logits!, 0, m.output.rows, 1, this.matVec);
        bytes = await rec.submit({ buffer: sc.logits!, offset: 0, bytes: m.output.rows * 4 });
        for (const b of retired) this.memory.destroy(b);
        return { kind: 'logits', logits: new Float32Array(bytes!) };
      }
      bytes = await rec.submit({ buffer: sc.x, offset: 0, bytes: n * c.nEmbd * 4 });
      for (const b of retired) this.memory.destroy(b);
      return { kind: 'hidden', hidden: new Float32Array(bytes!), nTokens: n };
    });
    s.position += n;
    for (let l = 0; l < s.processedTokens.length; l++) s.processedTokens[l]! += n;
    return { output, computeMs: performance.now() - started };
  }

  /** One transformer block over n tokens at positions [pos, pos + n). */
  private recordLayer(
    rec: Recorder,
    c: ModelConfig,
    w: LayerGpu,
    kCache: GPUBuffer,
    vCache: GPUBuffer,
    sc: Scratch,
    partial: GPUBuffer,
    n: number,
    pos: number,
  ): void {
    const { nEmbd, nHead, nHeadKv, headDim, nFf, rmsEps } = c;
    const qDim = nHead * headDim;
    const kvDim = nHeadKv * headDim;
    const kvAt = pos * kvDim; // this batch's rows of the cache
    const mv = this.matVec;
    const neox = c.rope.mode === 'neox';
    const mm = (w: GpuMatrix, x: GPUBuffer, memo: Map<string, GPUBuffer>, out: GPUBuffer, outOffset: number, outStride: number) =>
      op.matmul(rec, w, this.input(rec, sc, w, x, n, memo), 0, out, outOffset, outStride, n, mv, this.matMul);

    // attention norm
    op.rmsNorm(rec, sc.x, 0, nEmbd, w.attnNorm, sc.xb, 0, nEmbd, nEmbd, n, rmsEps);
    // q, k, v projections (+ biases for qwen2, per-head norms for qwen3), RoPE; k and v are
    // computed in f32 and land straight in an f32 cache, or are packed into an f16 one
    const f16kv = this.kvType === 'f16';
    const normed = new Map<string, GPUBuffer>();
    const qRaw = w.qNorm ? sc.att : sc.q;
    mm(w.wq, sc.xb, normed, qRaw, 0, qDim);
    if (w.bq) op.add(rec, qRaw, 0, w.bq, n * qDim, qDim);
    if (w.qNorm) op.rmsNorm(rec, sc.att, 0, headDim, w.qNorm, sc.q, 0, headDim, headDim, n * nHead, rmsEps);
    op.rope(rec, sc.q, 0, sc.rope, n, nHead, headDim, c.rope.nRot, neox);

    const direct = !w.kNorm && !f16kv; // k computed in place in the cache
    let kBuf = direct ? kCache : sc.kTmp!;
    let kAt = direct ? kvAt : 0;
    mm(w.wk, sc.xb, normed, kBuf, kAt, kvDim);
    if (w.bk) op.add(rec, kBuf, kAt, w.bk, n * kvDim, kvDim);
    if (w.kNorm) {
      const dst = f16kv ? sc.kTmp2! : kCache;
      const dstAt = f16kv ? 0 : kvAt;
      op.rmsNorm(rec, kBuf, kAt, headDim, w.kNorm, dst, dstAt, headDim, headDim, n * nHeadKv, rmsEps);
      kBuf = dst;
      kAt = dstAt;
    }
    op.rope(rec, kBuf, kAt, sc.rope, n, nHeadKv, headDim, c.rope.nRot, neox);
    if (f16kv) op.packF16(rec, kBuf, kCache, n * kvDim, 0, kvAt);

    const vBuf = f16kv ? sc.vTmp! : vCache;
    const vAt = f16kv ? 0 : kvAt;
    mm(w.wv, sc.xb, normed, vBuf, vAt, kvDim);
    if (w.bv) op.add(rec, vBuf, vAt, w.bv, n * kvDim, kvDim);
    if (f16kv) op.packF16(rec, vBuf, vCache, n * kvDim, 0, kvAt);
    // attention over the cache: split-K for one token, tiled causal for a batch
    const shape = { nHead, nHeadKv, headDim };
    if (n === 1) op.attentionDecode(rec, shape, sc.q, 0, kCache, vCache, partial, sc.att, pos + 1, this.kvType);
    else op.attentionPrefill(rec, shape, sc.q, kCache, vCache, sc.att, n, pos, this.kvType);
    // output projection, residual
    mm(w.wo, sc.att, new Map(), sc.tmp, 0, nEmbd);
    op.add(rec, sc.x, 0, sc.tmp, n * nEmbd);

    // feed-forward norm
    op.rmsNorm(rec, sc.x, 0, nEmbd, w.ffnNorm, sc.xb, 0, nEmbd, nEmbd, n, rmsEps);
    // gate and up, SwiGLU, down, residual
    const ffnIn = new Map<string, GPUBuffer>();
    mm(w.wGate, sc.xb, ffnIn, sc.gate, 0, nFf);
    mm(w.wUp, sc.xb, ffnIn, sc.up, 0, nFf);
    op.swiglu(rec, sc.gate, sc.up, n * nFf);
    mm(w.wDown, sc.gate, new Map(), sc.tmp, 0, nEmbd);
    op.add(rec, sc.x, 0, sc.tmp, n * nEmbd);
  }

  /**
   * Makes the session's cache hold `needed` positions: bigger buffers, with the filled positions
   * copied over at the start of this forward's submission. Returns the old buffers, to free
   * once that submission is made.
   */
  private growCache(rec: Recorder, s: Session, c: ModelConfig, needed: number, sessionId: string): GPUBuffer[] {
    if (needed <= s.capacity) return [];
    const kvDim = c.nHeadKv * c.headDim;
    const capacity = kvCapacity(s.capacity, needed, s.contextLength);
    const eb = this.kvElementBytes;
    const filled = s.position * kvDim * eb;
    const grow = (old: GPUBuffer[], name: string) =>
      old.map((b, l) => {
        const bigger = this.memory.create(`${name}[${l}] ${sessionId}`, capacity * kvDim * eb, ACTIVATION);
        if (filled > 0) rec.copyBefore(b, bigger, filled);
        return bigger;
      });
    const retired = [...s.keys, ...s.values];
    s.keys = grow(s.keys, 'k');
    s.values = grow(s.values, 'v');
    s.capacity = capacity;
    s.kvBytes = 2 * s.keys.length * capacity * kvDim * eb;
    return retired;
  }

  /** Every pipeline a forward over this shard can use. */
  private pipelinesFor(m: Loaded): { kernel: string; quant?: QuantKind; entry?: string }[] {
    const out: { kernel: string; quant?: QuantKind; entry?: string }[] = [];
    const matrices = m.layers.flatMap((l) => [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown]);
    if (m.output) matrices.push(m.output);
    for (const q of new Set(matrices.map((w) => w.quant))) {
      const ofType = matrices.filter((w) => w.quant === q);
      const kernels = new Set<string>([this.matVec]);
      // batches: the tiled kernel where the rows fit its k-steps, mul_mat otherwise
      if (this.matMul === 'mul_mat_tiled') kernels.add('mul_mat_tiled');
      if (this.matMul === 'mul_mat' || ofType.some((w) => !op.tiledFits(w.k))) kernels.add('mul_mat');
      for (const kernel of kernels) out.push({ kernel, quant: q });
    }
    if (m.tokenEmbd) out.push({ kernel: 'get_rows', quant: m.tokenEmbd.quant });
    if (this.options.activationRounding !== 'none') {
      for (const f of new Set(matrices.map((w) => activationFormatFor(w.type)))) {
        if (f !== 'f32') out.push({ kernel: 'round_activations', entry: f === 'q8_K' ? 'q8_k' : f });
      }
    }
    out.push(
      { kernel: 'rms_norm' },
      { kernel: 'rope' },
      { kernel: 'add' },
      { kernel: 'swiglu' },
      { kernel: 'attention_decode', quant: this.kvType, entry: 'split' },
      { kernel: 'attention_decode', quant: this.kvType, entry: 'combine' },
      { kernel: 'attention_prefill', quant: this.kvType },
    );
    if (this.kvType === 'f16') out.push({ kernel: 'pack_f16' });
    return out;
  }

  /**
   * The buffer a matmul with `w` should read for input x ([n × w.k]): x itself, or a copy
   * rounded as ggml rounds activations for w's type — made once per format per input (memo).
   */
  private input(rec: Recorder, sc: Scratch, w: GpuMatrix, x: GPUBuffer, n: number, memo: Map<string, GPUBuffer>): GPUBuffer {
    if (this.options.activationRounding === 'none') return x;
    const format = activationFormatFor(w.type);
    if (format === 'f32' || !op.roundsRows(format, w.k)) return x;
    let out = memo.get(format);
    if (!out) {
      out = sc.rounded[format]!;
      op.roundActivations(rec, format, x, out, n * w.k);
      memo.set(format, out);
    }
    return out;
  }

  /** frees every buffer, after any call in flight has finished */
  dispose(): Promise<void> {
    return this.exclusive(() => this.disposeNow());
  }

  private async disposeNow(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    for (const s of this.sessions.values()) this.freeSession(s);
    this.sessions.clear();
    this.freeModel();
    this.freeScratch();
    this.memory.destroy(this.partial);
    this.partial = null;
    this.resources.dispose();
    this.memory.destroyAll();
  }

  // ── internals ──

  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.tail.then(fn, fn);
    this.tail = run.catch(() => undefined);
    return run;
  }

  private scratchFor(n: number): Scratch {
    if (this.scratch && this.scratch.tokens >= n) return this.scratch;
    this.freeScratch();
    const m = this.loadedModel();
    const c = m.config;
    const tokens = Math.max(n, this.scratch ? this.scratch.tokens * 2 : 1);
    const qDim = c.nHead * c.headDim;
    const kvDim = c.nHeadKv * c.headDim;
    const buf = (label: string, elements: number) => this.memory.create(label, elements * 4, ACTIVATION);
    this.scratch = {
      tokens,
      x: buf('x', tokens * c.nEmbd),
      xb: buf('xb', tokens * c.nEmbd),
      q: buf('q', tokens * qDim),
      att: buf('att', tokens * qDim),
      kTmp: m.layers.some((l) => l.kNorm) || this.kvType === 'f16' ? buf('kTmp', tokens * kvDim) : undefined,
      kTmp2: m.layers.some((l) => l.kNorm) && this.kvType === 'f16' ? buf('kTmp2', tokens * kvDim) : undefined,
      vTmp: this.kvType === 'f16' ? buf('vTmp', tokens * kvDim) : undefined,
      tmp: buf('tmp', tokens * c.nEmbd),
      gate: buf('gate', tokens * c.nFf),
      up: buf('up', tokens * c.nFf),
      ids: buf('ids', tokens),
      rope: buf('rope', tokens * c.rope.nRot),
      logits: m.output ? buf('logits', m.output.rows) : undefined,
      rounded: {},
    };
    if (this.options.activationRounding !== 'none') {
      const widest = tokens * Math.max(c.nEmbd, qDim, c.nFf);
      for (const f of ['f16', 'q8_0', 'q8_K'] as const) this.scratch.rounded[f] = buf(`x rounded ${f}`, widest);
    }
    return this.scratch;
  }

  private freeScratch(): void {
    const sc = this.scratch;
    if (!sc) return;
    for (const b of [sc.x, sc.xb, sc.q, sc.att, sc.kTmp, sc.kTmp2, sc.vTmp, sc.tmp, sc.gate, sc.up, sc.ids, sc.rope, sc.logits, ...Object.values(sc.rounded)]) this.memory.destroy(b);
    this.scratch = null;
  }

  private partialFor(nKv: number): GPUBuffer {
    const c = this.loadedModel().config;
    const need = op.attentionPartialElements({ nHead: c.nHead, nHeadKv: c.nHeadKv, headDim: c.headDim }, nKv);
    if (!this.partial || this.partialElements < need) {
      this.memory.destroy(this.partial);
      this.partialElements = Math.max(need, this.partialElements * 2);
      this.partial = this.memory.create('attention partials', this.partialElements * 4, ACTIVATION);
    }
    return this.partial;
  }

  private freeModel(): void {
    const m = this.model;
    if (!m) return;
    const mem = this.memory;
    if (m.output !== m.tokenEmbd) destroyMatrix(mem, m.output);
    destroyMatrix(mem, m.tokenEmbd);
    mem.destroy(m.outputNorm);
    for (const l of m.layers) {
      for (const mat of [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown]) destroyMatrix(mem, mat);
      for (const v of [l.attnNorm, l.ffnNorm, l.bq, l.bk, l.bv, l.qNorm, l.kNorm]) mem.destroy(v);
    }
    this.model = null;
  }

  private freeSession(s: Session): void {
    for (const b of [...s.keys, ...s.values]) this.memory.destroy(b);
    s.keys = [];
    s.values = [];
  }

  private loadedModel(): Loaded {
    if (!this.model) throw new MeshError('NOT_LOADED', 'no shard is loaded; call load() first');
    return this.model;
  }

  private session(sessionId: string): Session {
    const s = this.sessions.get(sessionId);
    if (!s) throw new MeshError('SESSION_UNKNOWN', `no session ${sessionId} on this stage`);
    return s;
  }

  private where(m: { shard: ShardRange; artifact: string }): string {
    return `shard [${m.shard.start}, ${m.shard.end}) of ${m.artifact}`;
  }

  private check(): void {
    if (this.disposed) throw new MeshError('DISPOSED', 'this WebGPU stage was disposed');
    if (this.lost) {
      const where = this.model ? this.where(this.model) : 'no shard loaded';
      throw new MeshError('WEBGPU_DEVICE_LOST', `the WebGPU device was lost (${this.lost}); ${where} must be loaded again`);
    }
  }

  /**
   * Runs `fn` inside out-of-memory and validation error scopes, so an allocation failure or a
   * kernel misuse becomes a MeshError naming the shard instead of a silent wrong answer.
   */
  private async guard<T>(where: string, doing: string, fn: () => Promise<T>): Promise<T> {
    const device = this.device;
    device.pushErrorScope('out-of-memory');
    device.pushErrorScope('validation');
    let result: T;
    let failure: unknown = null;
    try {
      result = await fn();
    } catch (e) {
      failure = e;
    }
    const validation = await device.popErrorScope();
    const oom = await device.popErrorScope();
    if (this.lost) throw new MeshError('WEBGPU_DEVICE_LOST', `the WebGPU device was lost (${this.lost}) while ${doing} on ${where}`);
    if (oom) throw new MeshError('WEBGPU_OUT_OF_MEMORY', `out of GPU memory while ${doing} on ${where}: ${oom.message}`);
    if (validation) throw new MeshError('WEBGPU_ERROR', `WebGPU rejected a command while ${doing} on ${where}: ${validation.message}`);
    if (failure) throw failure;
    return result!;
  }
}
