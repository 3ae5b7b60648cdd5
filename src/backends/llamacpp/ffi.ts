// A thin binding (koffi) to the llama.cpp C API in the libllama that node-llama-cpp ships, for
// what node-llama-cpp's own API does not expose: raw logits, embeddings and the per-layer
// outputs seen by the graph's eval callback. Struct layouts follow include/llama.h of the
// llama.cpp source node-llama-cpp@3.21.1 bundles (llama/gitRelease.bundle); change them
// together with that pin.
//
// Calls are synchronous: llama_decode blocks the JS thread (a node's stages run in a worker thread).

import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { isMainThread } from 'node:worker_threads';
import { MeshError } from '../../errors.ts';

type Koffi = typeof import('koffi');
type Fn = (...args: unknown[]) => unknown;
type TypeSpec = ReturnType<Koffi['struct']>;

/** ggml_type ids used for the KV cache */
export const KV_TYPES = { f32: 0, f16: 1, q8_0: 8, q4_0: 2 } as const;
export type KvType = keyof typeof KV_TYPES;

export interface Bindings {
  koffi: Koffi;
  binsDir: string;
  ContextParams: TypeSpec;
  ModelParams: TypeSpec;
  Batch: TypeSpec;
  TensorHead: TypeSpec;
  EvalCallback: TypeSpec;
  fn: Record<string, Fn>;
  /** the last error-level lines llama.cpp logged, for error messages */
  recentErrors: string[];
  /** while set, every line llama.cpp logs is appended here (see `loggedBuffers`) */
  logSink: string[] | null;
}

let bindings: Bindings | null = null;

/** Directory of the prebuilt llama.cpp libraries of @node-llama-cpp/linux-x64 (or another platform package). */
export function llamaBinsDir(): string {
  const require = createRequire(import.meta.url);
  // node-llama-cpp's entry file lies below <node_modules>/node-llama-cpp/
  let dir = dirname(require.resolve('node-llama-cpp'));
  while (basename(dirname(dir)) !== 'node_modules' && dirname(dir) !== dir) dir = dirname(dir);
  const scope = join(dirname(dir), '@node-llama-cpp');
  const candidates: string[] = [];
  // the plain CPU build for this platform (linux-x64), not the cuda/vulkan/other-arch ones
  const platformPkg = `${process.platform}-${process.arch}`;
  if (existsSync(scope)) {
    for (const pkg of readdirSync(scope).filter((p) => p === platformPkg)) {
      const bins = join(scope, pkg, 'bins');
      if (!existsSync(bins)) continue;
      for (const d of readdirSync(bins)) candidates.push(join(bins, d));
    }
  }
  const found = candidates.find((d) => existsSync(join(d, 'libggml-base.so')) && readdirSync(d).some((f) => /^libllama(\.v[\d.]+)?\.so$/.test(f)));
  if (!found) {
    throw new MeshError('LLAMACPP_UNAVAILABLE', `no prebuilt llama.cpp libraries found under ${scope} (is @node-llama-cpp/linux-x64 installed?)`);
  }
  return found;
}

/** The koffi binding to libllama/libggml (loaded once per process). */
export async function llamaBindings(): Promise<Bindings> {
  return bind();
}

/** The structs and callback types of include/llama.h and ggml.h that the calls pass. */
function declareTypes(koffi: Koffi) {
  // include/llama.h `struct llama_model_params`
  const ModelParams = koffi.struct('gm_llama_model_params', {
    devices: 'void *',
    tensor_buft_overrides: 'void *',
    n_gpu_layers: 'int32_t',
    split_mode: 'int32_t',
    load_mode: 'int32_t',
    lazy_mode: 'int32_t',
    main_gpu: 'int32_t',
    tensor_split: 'void *',
    progress_callback: 'void *',
    progress_callback_user_data: 'void *',
    kv_overrides: 'void *',
    vocab_only: 'bool',
    check_tensors: 'bool',
    use_extra_bufts: 'bool',
    no_host: 'bool',
    no_alloc: 'bool',
    load_mtp: 'bool',
  });
  // include/llama.h `struct llama_context_params`
  const ContextParams = koffi.struct('gm_llama_context_params', {
    n_ctx: 'uint32_t',
    n_batch: 'uint32_t',
    n_ubatch: 'uint32_t',
    n_seq_max: 'uint32_t',
    n_rs_seq: 'uint32_t',
    n_outputs_max: 'uint32_t',
    n_outputs_max_per_seq: 'uint32_t',
    n_threads: 'int32_t',
    n_threads_batch: 'int32_t',
    ctx_type: 'int32_t',
    rope_scaling_type: 'int32_t',
    pooling_type: 'int32_t',
    attention_type: 'int32_t',
    flash_attn_type: 'int32_t',
    rope_freq_base: 'float',
    rope_freq_scale: 'float',
    yarn_ext_factor: 'float',
    yarn_attn_factor: 'float',
    yarn_beta_fast: 'float',
    yarn_beta_slow: 'float',
    yarn_orig_ctx: 'uint32_t',
    defrag_thold: 'float',
    cb_eval: 'void *',
    cb_eval_user_data: 'void *',
    type_k: 'int32_t',
    type_v: 'int32_t',
    abort_callback: 'void *',
    abort_callback_data: 'void *',
    embeddings: 'bool',
    offload_kqv: 'bool',
    no_perf: 'bool',
    op_offload: 'bool',
    swa_full: 'bool',
    kv_unified: 'bool',
    samplers: 'void *',
    n_samplers: 'size_t',
    ctx_other: 'void *',
  });
  const Batch = koffi.struct('gm_llama_batch', {
    n_tokens: 'int32_t',
    token: 'void *',
    embd: 'void *',
    pos: 'void *',
    n_seq_id: 'void *',
    seq_id: 'void *',
    logits: 'void *',
  });
  // the leading fields of ggml.h `struct ggml_tensor`
  const TensorHead = koffi.struct('gm_ggml_tensor_head', {
    type: 'int32_t',
    buffer: 'void *',
    ne: koffi.array('int64_t', 4),
  });
  const EvalCallback = koffi.proto('bool gm_eval_cb(void *t, bool ask, void *user)');
  const LogCallback = koffi.proto('void gm_log_cb(int level, const char *text, void *user)');

  return { ModelParams, ContextParams, Batch, TensorHead, EvalCallback, LogCallback };
}

type Library = ReturnType<Koffi['load']>;

/** The C functions called, by short name. */
function declareFunctions(libs: { llama: Library; ggml: Library; ggmlBase: Library }, t: ReturnType<typeof declareTypes>): Record<string, Fn> {
  const { llama, ggml, ggmlBase } = libs;
  const { ModelParams, ContextParams, Batch } = t;
  return {
    backend_init: llama.func('void llama_backend_init(void)') as Fn,
    load_all: ggml.func('void ggml_backend_load_all_from_path(const char *dir)') as Fn,
    dev_count: ggml.func('size_t ggml_backend_dev_count(void)') as Fn,
    log_set: llama.func('void llama_log_set(void *cb, void *user)') as Fn,
    model_default_params: llama.func('llama_model_default_params', ModelParams, []) as Fn,
    context_default_params: llama.func('llama_context_default_params', ContextParams, []) as Fn,
    model_load: llama.func('llama_model_load_from_file', 'void *', ['const char *', ModelParams]) as Fn,
    model_free: llama.func('void llama_model_free(void *model)') as Fn,
    init_from_model: llama.func('llama_init_from_model', 'void *', ['void *', ContextParams]) as Fn,
    free: llama.func('void llama_free(void *ctx)') as Fn,
    get_vocab: llama.func('void *llama_model_get_vocab(void *model)') as Fn,
    vocab_n_tokens: llama.func('int32_t llama_vocab_n_tokens(void *vocab)') as Fn,
    model_n_embd: llama.func('int32_t llama_model_n_embd(void *model)') as Fn,
    tokenize: llama.func('int32_t llama_tokenize(void *vocab, const char *text, int32_t len, _Out_ int32_t *tokens, int32_t max, bool add_special, bool parse_special)') as Fn,
    batch_get_one: llama.func('llama_batch_get_one', Batch, ['int32_t *', 'int32_t']) as Fn,
    decode: llama.func('llama_decode', 'int32_t', ['void *', Batch]) as Fn,
    get_logits_ith: llama.func('float *llama_get_logits_ith(void *ctx, int32_t i)') as Fn,
    get_embeddings_ith: llama.func('float *llama_get_embeddings_ith(void *ctx, int32_t i)') as Fn,
    get_memory: llama.func('void *llama_get_memory(void *ctx)') as Fn,
    memory_clear: llama.func('void llama_memory_clear(void *mem, bool data)') as Fn,
    set_n_threads: llama.func('void llama_set_n_threads(void *ctx, int32_t n, int32_t n_batch)') as Fn,
    tensor_name: ggmlBase.func('const char *ggml_get_name(void *t)') as Fn,
    tensor_nbytes: ggmlBase.func('size_t ggml_nbytes(void *t)') as Fn,
    tensor_get: ggmlBase.func('void ggml_backend_tensor_get(void *t, _Out_ void *data, size_t offset, size_t size)') as Fn,
    // for layer ranges (range-pool.ts): batches of embeddings, per-sequence KV removal and
    // copies, graph tensors' data read in place, ggml's own row conversions
    batch_init: llama.func('llama_batch_init', Batch, ['int32_t', 'int32_t', 'int32_t']) as Fn,
    batch_free: llama.func('llama_batch_free', 'void', [Batch]) as Fn,
    memory_seq_rm: llama.func('bool llama_memory_seq_rm(void *mem, int32_t seq_id, int32_t p0, int32_t p1)') as Fn,
    state_seq_get_size: llama.func('size_t llama_state_seq_get_size(void *ctx, int32_t seq_id)') as Fn,
    state_seq_get_data: llama.func('size_t llama_state_seq_get_data(void *ctx, _Out_ uint8_t *dst, size_t size, int32_t seq_id)') as Fn,
    state_seq_set_data: llama.func('size_t llama_state_seq_set_data(void *ctx, const uint8_t *src, size_t size, int32_t dest_seq_id)') as Fn,
    model_size: llama.func('uint64_t llama_model_size(void *model)') as Fn,
    tensor_data: ggmlBase.func('void *ggml_get_data(void *t)') as Fn,
    fp16_to_fp32_row: ggmlBase.func('void ggml_fp16_to_fp32_row(const void *x, void *y, int64_t n)') as Fn,
    fp32_to_fp16_row: ggmlBase.func('void ggml_fp32_to_fp16_row(const void *x, void *y, int64_t n)') as Fn,
    type_traits: ggmlBase.func('void *ggml_get_type_traits(int type)') as Fn,
  };
}

/** the calls during which llama.cpp logs (loads, contexts, decode errors, frees) */
const LOGGING_CALLS = ['backend_init', 'load_all', 'model_load', 'model_free', 'init_from_model', 'free', 'decode', 'state_seq_set_data'];

async function bind(): Promise<Bindings> {
  if (bindings) return bindings;
  const mod = (await import('koffi')) as unknown as Koffi & { default?: Koffi };
  const koffi = mod.default ?? mod;
  const binsDir = llamaBinsDir();
  const file = (re: RegExp): string => join(binsDir, readdirSync(binsDir).find((f) => re.test(f))!);
  const ggmlBase = koffi.load(join(binsDir, 'libggml-base.so'));
  const ggml = koffi.load(file(/^libggml(\.v[\d.]+)?\.so$/));
  const llama = koffi.load(file(/^libllama(\.v[\d.]+)?\.so$/));

  const types = declareTypes(koffi);
  const { ContextParams, ModelParams, Batch, TensorHead, EvalCallback, LogCallback } = types;
  const fn = declareFunctions({ llama, ggml, ggmlBase }, types);

  const recentErrors: string[] = [];
  // keep llama.cpp quiet (it logs every tensor at load); remember errors for our messages
  const GGML_LOG_LEVEL_ERROR = 4;
  const logCb = koffi.register((level: number, text: string) => {
    bindings?.logSink?.push(text);
    if (level === GGML_LOG_LEVEL_ERROR) {
      recentErrors.push(text.trim());
      if (recentErrors.length > 8) recentErrors.shift();
    }
    if (process.env.GGUF_MESH_LLAMA_LOG) process.stderr.write(text);
  }, koffi.pointer(LogCallback));

  // llama.cpp's logger is one per process, and stages may run in worker threads: each call that
  // logs points it at this thread's callback, and a worker thread resets it afterwards, so an
  // ended thread's callback is never called (koffi aborts). Concurrent such calls may swap lines.
  for (const name of LOGGING_CALLS) {
    const call = fn[name]!;
    fn[name] = (...args: unknown[]) => {
      fn.log_set!(logCb, null);
      try {
        return call(...args);
      } finally {
        if (!isMainThread) fn.log_set!(null, null);
      }
    };
  }
  fn.backend_init!();
  // node-llama-cpp may have loaded the backends into this process already
  if (Number(fn.dev_count!()) === 0) fn.load_all!(binsDir);

  bindings = { koffi, binsDir, ContextParams, ModelParams, Batch, TensorHead, EvalCallback, fn, recentErrors, logSink: null };
  return bindings;
}

/**
 * Runs `f` and returns, besides its result, the buffers llama.cpp allocated meanwhile as it
 * logs them ("CPU KV buffer size = 1.00 MiB", "AMX model buffer size = …"): bytes by kind
 * ('model', 'KV', 'compute', 'output') and by buffer ('AMX model', 'CPU_Mapped model', …).
 * llama.cpp has no API that reports a context's memory; its log lines are its own accounting.
 */
export function loggedBuffers<T>(b: Bindings, f: () => T): { result: T; buffers: Record<string, number> } {
  const sink: string[] = [];
  const outer = b.logSink;
  b.logSink = sink;
  let result: T;
  try {
    result = f();
  } finally {
    b.logSink = outer;
    outer?.push(...sink);
  }
  const buffers: Record<string, number> = {};
  for (const line of sink.join('').split('\n')) {
    const m = /\s(\S+)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB/.exec(line);
    if (!m) continue;
    const bytes = Math.round(Number(m[3]) * 1024 * 1024);
    buffers[m[2]!] = (buffers[m[2]!] ?? 0) + bytes;
    buffers[`${m[1]} ${m[2]}`] = (buffers[`${m[1]} ${m[2]}`] ?? 0) + bytes;
  }
  return { result, buffers };
}

/**
 * Threads for llama.cpp when none are asked for: all cores but one. ggml's workers spin while
 * they wait, so asking for every core of a busy machine makes each step wait on a descheduled
 * thread (measured: 50× slower on 2 loaded cores).
 */
export function defaultLlamaThreads(): number {
  return Math.max(1, availableParallelism() - 1);
}

export interface LlamaContextOptions {
  /** KV cache positions (default 2048) */
  contextLength?: number;
  /** tokens per llama_decode batch (default: contextLength) */
  batchSize?: number;
  /** CPU threads (default: defaultLlamaThreads()) */
  threads?: number;
  /** default false: exact attention, for agreement with f32 references */
  flashAttention?: boolean;
  /** KV cache element type (default 'f32') */
  kvType?: KvType;
  /** also compute embeddings (output_norm(h_last)), readable with `embeddings()` */
  embeddings?: boolean;
  /** graph tensor names to capture after each decode (e.g. 'l_out-3'; by the eval callback), read with `captured()` */
  capture?: string[];
}

/** llama_context_params for `sequences` (default 1) sequences of `contextLength` positions, each in cells of its own (kv_unified off) */
export function contextParams(b: Bindings, options: Omit<LlamaContextOptions, 'capture' | 'embeddings'> & { sequences?: number }): Record<string, unknown> {
  const p = b.fn.context_default_params!() as Record<string, unknown>;
  const contextLength = options.contextLength ?? 2048;
  const sequences = options.sequences ?? 1;
  p.n_ctx = contextLength * sequences;
  p.n_batch = options.batchSize ?? contextLength;
  p.n_ubatch = options.batchSize ?? contextLength;
  p.n_seq_max = sequences;
  p.kv_unified = false;
  const threads = options.threads ?? defaultLlamaThreads();
  p.n_threads = p.n_threads_batch = threads;
  p.flash_attn_type = options.flashAttention ? 1 : 0;
  const kv = KV_TYPES[options.kvType ?? 'f32'];
  p.type_k = p.type_v = kv;
  p.no_perf = true;
  return p;
}

/** A GGUF loaded by llama.cpp; contexts made from it share its weights. */
export class LlamaModelFfi {
  private constructor(
    private readonly b: Bindings,
    private ptr: unknown,
    readonly path: string,
    readonly nVocab: number,
    readonly nEmbd: number,
  ) {}

  static async load(path: string): Promise<LlamaModelFfi> {
    const b = await bind();
    const params = b.fn.model_default_params!() as Record<string, unknown>;
    params.n_gpu_layers = 0;
    b.recentErrors.length = 0;
    const { result: ptr, buffers } = loggedBuffers(b, () => b.fn.model_load!(path, params));
    if (!ptr) {
      throw new MeshError('LLAMACPP_LOAD_FAILED', `llama.cpp could not load ${path}: ${b.recentErrors.join(' | ') || 'no reason given'}`);
    }
    const vocab = b.fn.get_vocab!(ptr);
    const model = new LlamaModelFfi(b, ptr, path, Number(b.fn.vocab_n_tokens!(vocab)), Number(b.fn.model_n_embd!(ptr)));
    model.bufferBytes = buffers.model ?? 0;
    model.buffers = Object.fromEntries(Object.entries(buffers).filter(([k]) => k.endsWith(' model')));
    return model;
  }

  /** bytes of the model's weight buffers, as llama.cpp logged them at load (mapped or copied) */
  bufferBytes = 0;
  /**
   * the same by buffer: 'CPU_Mapped model' is the file mapped in place, 'AMX model' /
   * 'CPU_REPACK model' copies of the matrices in the layout the CPU kernels want (their mapped
   * source pages were read once and are clean page cache afterwards)
   */
  buffers: Record<string, number> = {};

  /** bytes of every weight tensor llama.cpp holds (llama_model_size) */
  get tensorBytes(): number {
    return Number(this.b.fn.model_size!(this.live()));
  }

  /** llama.cpp's tokenisation, as for generation: BOS when the model asks, special tokens parsed. */
  tokenize(text: string, addSpecial = true, parseSpecial = true): number[] {
    const vocab = this.b.fn.get_vocab!(this.live());
    const bytes = Buffer.byteLength(text);
    let out = new Int32Array(bytes + 8);
    let n = Number(this.b.fn.tokenize!(vocab, text, bytes, out, out.length, addSpecial, parseSpecial));
    if (n < 0) {
      out = new Int32Array(-n);
      n = Number(this.b.fn.tokenize!(vocab, text, bytes, out, out.length, addSpecial, parseSpecial));
    }
    return [...out.subarray(0, n)];
  }

  createContext(options: LlamaContextOptions = {}): LlamaContextFfi {
    return new LlamaContextFfi(this.b, this, this.live(), options);
  }

  /** @internal */
  live(): unknown {
    if (!this.ptr) throw new MeshError('DISPOSED', 'llama.cpp model was disposed');
    return this.ptr;
  }

  dispose(): void {
    if (this.ptr) this.b.fn.model_free!(this.ptr);
    this.ptr = null;
  }
}

/** One llama.cpp context: a KV cache for one sequence, positions advancing with each decode. */
export class LlamaContextFfi {
  private ptr: unknown;
  /** next position (= tokens decoded since the last clear) */
  position = 0;
  readonly contextLength: number;
  private readonly capturedTensors = new Map<string, Float32Array>();
  private readonly callback: unknown;

  constructor(
    private readonly b: Bindings,
    readonly model: LlamaModelFfi,
    modelPtr: unknown,
    options: LlamaContextOptions,
  ) {
    const p = contextParams(b, options);
    this.contextLength = p.n_ctx as number;
    p.embeddings = options.embeddings ?? false;
    const wanted = new Set(options.capture ?? []);
    if (wanted.size > 0) {
      const { koffi } = b;
      this.callback = koffi.register((t: unknown, ask: boolean) => {
        const name = b.fn.tensor_name!(t) as string;
        if (!wanted.has(name)) return false;
        if (ask) return true;
        const head = koffi.decode(t, b.TensorHead) as { type: number; ne: (number | bigint)[] };
        if (head.type !== 0) return true; // only f32 tensors are captured
        const nbytes = Number(b.fn.tensor_nbytes!(t));
        const data = new Float32Array(nbytes / 4);
        b.fn.tensor_get!(t, data, 0, nbytes);
        this.capturedTensors.set(name, data);
        return true;
      }, koffi.pointer(b.EvalCallback));
      p.cb_eval = this.callback;
    }
    b.recentErrors.length = 0;
    this.ptr = b.fn.init_from_model!(modelPtr, p);
    if (!this.ptr) {
      throw new MeshError('LLAMACPP_CONTEXT_FAILED', `llama.cpp could not create a context: ${b.recentErrors.join(' | ') || 'no reason given'}`);
    }
  }

  /**
   * Runs `tokens` at positions [position, position + n) and returns the logits of the last
   * one ([nVocab], a copy).
   */
  decode(tokens: readonly number[] | Int32Array): Float32Array {
    const ctx = this.live();
    if (tokens.length === 0) throw new MeshError('BAD_STAGE_INPUT', 'decode needs at least one token');
    if (this.position + tokens.length > this.contextLength) {
      throw new MeshError('CONTEXT_FULL', `llama.cpp context is full: ${this.position} + ${tokens.length} > ${this.contextLength}`);
    }
    // a stage's tokens come as an Int32Array already: passed as they are, not copied
    const ids = tokens instanceof Int32Array ? tokens : Int32Array.from(tokens);
    this.capturedTensors.clear();
    const batch = this.b.fn.batch_get_one!(ids, ids.length);
    const rc = Number(this.b.fn.decode!(ctx, batch));
    if (rc !== 0) {
      throw new MeshError('LLAMACPP_DECODE_FAILED', `llama_decode returned ${rc}: ${this.b.recentErrors.join(' | ')}`);
    }
    this.position += ids.length;
    return this.readFloats(this.b.fn.get_logits_ith!(ctx, -1), this.model.nVocab);
  }

  /** embeddings (output-normed hidden state) of the last decoded token, [nEmbd] */
  embeddings(): Float32Array {
    return this.readFloats(this.b.fn.get_embeddings_ith!(this.live(), -1), this.model.nEmbd);
  }

  /** the tensor named in `capture`, as computed by the last decode (row-major, all rows) */
  captured(name: string): Float32Array | undefined {
    return this.capturedTensors.get(name);
  }

  /** forgets positions [position, current) of the one sequence (its KV cells are freed) */
  truncate(position: number): void {
    const ok = this.b.fn.memory_seq_rm!(this.b.fn.get_memory!(this.live()), 0, position, -1);
    if (!ok) throw new MeshError('LLAMACPP_DECODE_FAILED', `llama.cpp could not drop positions ${position}.. of its sequence`);
    this.position = position;
  }

  /** forgets every position (the KV cache is emptied) */
  clear(): void {
    this.b.fn.memory_clear!(this.b.fn.get_memory!(this.live()), true);
    this.position = 0;
  }

  setThreads(threads: number): void {
    this.b.fn.set_n_threads!(this.live(), threads, threads);
  }

  dispose(): void {
    if (this.ptr) this.b.fn.free!(this.ptr);
    this.ptr = null;
    if (this.callback) this.b.koffi.unregister(this.callback as never);
  }

  private live(): unknown {
    if (!this.ptr) throw new MeshError('DISPOSED', 'llama.cpp context was disposed');
    return this.ptr;
  }

  private readFloats(ptr: unknown, n: number): Float32Array {
    if (!ptr) throw new MeshError('LLAMACPP_NO_OUTPUT', `llama.cpp returned no output: ${this.b.recentErrors.join(' | ')}`);
    // a copy: the buffer behind ptr is reused by the next decode
    return new Float32Array(this.b.koffi.view(ptr, n * 4).slice(0));
  }
}
