// The shape of a model as a layer-split runtime sees it, read from a GGUF header: how many
// main blocks (MTP blocks excluded), which tensors belong to which block, KV bytes per token
// and fixed per-session state per block, bytes per token crossing a stage boundary, and the
// boundary rules the audits found (docs/audits/). All byte counts assume an f16 cache and
// f16 activations unless a model keeps state in f32 (recurrent state), as llama.cpp does.

import { deltaLayerBytes } from '../backends/cpu/delta-chunk.ts';
import { gpuDeltaLayerBytes } from '../backends/webgpu/delta-net.ts';
import { MeshError } from '../errors.ts';
import { architectureOf, metadataNumber, requiredNumber } from '../gguf/metadata.ts';
import { isEmbeddingTensor, isExpertTensor, layerOfTensor } from '../gguf/summary.ts';
import type { GgufHeader, MetadataValue, TensorInfo } from '../gguf/types.ts';

const F16 = 2;
const F32 = 4;
const I32 = 4;

export interface BlockTensors {
  /** tensors of this block, file order */
  tensors: TensorInfo[];
  bytes: number;
}

export interface ModelGeometry {
  architecture: string;
  /** main blocks a stage range indexes: block_count minus MTP blocks */
  nLayer: number;
  /** MTP ("nextn") blocks after the main ones; they travel with the head */
  nLayerNextn: number;
  nEmbd: number;
  /** residual streams per token (hyper-connections); 1 for ordinary models */
  hcStreams: number;
  blocks: BlockTensors[];
  embed: BlockTensors;
  /** output norm, output projection and the hyper-connection head mixer */
  head: BlockTensors;
  /** MTP blocks: optional (llama.cpp skips them unless speculative decoding asks); they would join the last stage */
  mtp: BlockTensors;
  /** tensors every stage needs (e.g. rope_freqs) */
  global: BlockTensors;
  /** the head reads token_embd.weight (no output.weight): the last stage needs the embedding too */
  tiedHead: boolean;
  /** f16 KV bytes each block adds per token */
  kvBytesPerToken: number[];
  /** bytes each block keeps per session whatever its length (windows, recurrent state) */
  fixedStateBytes: number[];
  /** f16 bytes of the state after a block, per token */
  hopBytesPerToken: number;
  /** per block: bytes of its routed-expert tensors (0 for dense blocks) */
  expertBytes: number[];
  /** experts a token is routed to / experts per layer (expert_used_count / expert_count; 1 when dense) */
  expertFraction: number;
  /** blocks that read the input token ids (hash routing); a stage starting inside needs them */
  tokenIdBlocks: number[];
  /** block indices a stage may start at with no extra traffic; null = any */
  freeStarts: ReadonlySet<number> | null;
  /** extra bytes per token a stage starting at a block outside `freeStarts` must receive */
  startPenaltyBytesPerToken: number;
  /** what the penalty carries, for messages */
  startPenaltyWhat: string;
  /** short facts about boundaries and caches for this architecture */
  notes: string[];
}

type Md = Record<string, MetadataValue>;

/** A metadata number; booleans count too (1/0), as flags such as expert_weights_norm are. */
function num(v: MetadataValue | undefined): number | undefined {
  if (typeof v === 'boolean') return v ? 1 : 0;
  return metadataNumber(v);
}

function nums(v: MetadataValue | undefined): number[] | undefined {
  if (!Array.isArray(v)) return undefined;
  const out = v.map((x) => num(x));
  return out.every((x) => x !== undefined) ? (out as number[]) : undefined;
}

/** A per-layer value: an array entry, a scalar for every layer, or the fallback. */
function perLayer(v: MetadataValue | undefined, i: number, fallback: number): number {
  const arr = nums(v);
  if (arr) return arr[i] ?? fallback;
  return num(v) ?? fallback;
}

// the head also holds the hyper-connection collapse (output_hc_*), unlike summary's shard groups
const HEAD_RE = /^(output_norm|output|output_hc_[a-z]+)\./;

function group(): BlockTensors {
  return { tensors: [], bytes: 0 };
}

function add(g: BlockTensors, t: TensorInfo): void {
  g.tensors.push(t);
  g.bytes += t.byteLength;
}

/** Reads the layer-split geometry of any architecture; names the missing key when it cannot. */
export function modelGeometry(header: GgufHeader, location = 'GGUF'): ModelGeometry {
  const md: Md = header.metadata;
  const arch = architectureOf(header, location);
  const k = (name: string) => `${arch}.${name}`;
  const required = (name: string): number => requiredNumber(header, k(name), location, num);
  const blockCount = required('block_count');
  const nEmbd = required('embedding_length');
  const nextn = Math.min(num(md[k('nextn_predict_layers')]) ?? 0, blockCount);
  const nLayer = blockCount - nextn;

  const blocks = Array.from({ length: nLayer }, group);
  const embed = group();
  const head = group();
  const mtp = group();
  const global = group();
  for (const t of [...header.tensors].sort((a, b) => a.offset - b.offset)) {
    const i = layerOfTensor(t.name);
    if (i !== undefined) add(i < nLayer ? blocks[i]! : mtp, t);
    else if (isEmbeddingTensor(t.name)) add(embed, t);
    else if (HEAD_RE.test(t.name)) add(head, t);
    else add(global, t);
  }
  const names = new Set(header.tensors.map((t) => t.name));
  const tiedHead = !names.has('output.weight') && names.has('token_embd.weight');

  const geometry: ModelGeometry = {
    architecture: arch,
    nLayer,
    nLayerNextn: nextn,
    nEmbd,
    hcStreams: 1,
    blocks,
    embed,
    head,
    mtp,
    global,
    tiedHead,
    kvBytesPerToken: [],
    fixedStateBytes: new Array<number>(nLayer).fill(0),
    hopBytesPerToken: nEmbd * F16,
    expertBytes: blocks.map((b) => b.tensors.filter((t) => isExpertTensor(t.name)).reduce((a, t) => a + t.byteLength, 0)),
    expertFraction: expertFraction(md, k),
    tokenIdBlocks: [],
    freeStarts: null,
    startPenaltyBytesPerToken: 0,
    startPenaltyWhat: '',
    notes: [],
  };
  const shape = ARCH_SHAPES[arch] ?? gqaShape;
  shape(geometry, md, k, location);
  geometry.hopBytesPerToken = nEmbd * geometry.hcStreams * F16;
  return geometry;
}

/** expert_used_count / expert_count (a per-layer array's largest use), or 1 for a dense model. */
function expertFraction(md: Md, k: (name: string) => string): number {
  const n = num(md[k('expert_count')]) ?? 0;
  const used = nums(md[k('expert_used_count')]) ?? [num(md[k('expert_used_count')]) ?? 0];
  return n > 0 ? Math.min(1, Math.max(...used) / n) : 1;
}

/**
 * Weight bytes a decoded token reads: every non-expert tensor of the blocks, the routed share of
 * the expert tensors, one embedding row and the head. This is what decode streams per token.
 */
export function activeWeightBytesPerToken(g: ModelGeometry, nVocab: number): number {
  const blocks = g.blocks.reduce((a, b, i) => a + (b.bytes - g.expertBytes[i]!) + g.expertBytes[i]! * g.expertFraction, 0);
  const embedRow = nVocab > 0 ? g.embed.bytes / nVocab : 0;
  return blocks + embedRow + (g.tiedHead ? g.embed.bytes : 0) + g.head.bytes;
}

type ShapeFn = (g: ModelGeometry, md: Md, k: (name: string) => string, location: string) => void;

/** Ordinary attention: K and V per kv head per token (sliding windows ignored). */
const gqaShape: ShapeFn = (g, md, k) => {
  for (let i = 0; i < g.nLayer; i++) {
    const nHead = perLayer(md[k('attention.head_count')], i, 0);
    const nHeadKv = perLayer(md[k('attention.head_count_kv')], i, nHead);
    const headDim = nHead > 0 ? g.nEmbd / nHead : 0;
    const kLen = num(md[k('attention.key_length')]) ?? headDim;
    const vLen = num(md[k('attention.value_length')]) ?? headDim;
    g.kvBytesPerToken.push(nHeadKv * (kLen + vLen) * F16);
  }
};

/** MLA caches one latent (kv_lora_rank) plus the rotary key per token, shared by all heads. */
function mlaLatentBytes(md: Md, k: (name: string) => string): number {
  const kvLora = num(md[k('attention.kv_lora_rank')]) ?? 512;
  const rope = num(md[k('rope.dimension_count')]) ?? 64;
  return (kvLora + rope) * F16;
}

const deepseek2Shape: ShapeFn = (g, md, k) => {
  const latent = mlaLatentBytes(md, k);
  g.kvBytesPerToken = new Array<number>(g.nLayer).fill(latent);
  g.notes.push(`MLA: ${latent} B/token/layer (latent + rotary key at f16)`);
};

const deepseek32Shape: ShapeFn = (g, md, k) => {
  const latent = mlaLatentBytes(md, k);
  const idx = (num(md[k('attention.indexer.key_length')]) ?? 128) * F16;
  g.kvBytesPerToken = new Array<number>(g.nLayer).fill(latent + idx);
  g.notes.push(`MLA ${latent} B + indexer key ${idx} B per token per layer`);
};

/** GLM-5.2's default schedule when a 1M-context file carries no indexer.types (llama.cpp glm-dsa.cpp). */
export function glm52DefaultFullLayer(i: number): boolean {
  return i < 2 || (i - 2) % 4 === 0;
}

const glmDsaShape: ShapeFn = (g, md, k) => {
  const latent = mlaLatentBytes(md, k);
  const idxBytes = (num(md[k('attention.indexer.key_length')]) ?? 128) * F16;
  const types = nums(md[k('attention.indexer.types')]);
  const ctx = num(md[k('context_length')]) ?? 0;
  const full: number[] = [];
  for (let i = 0; i < g.nLayer; i++) {
    // pre-5.2 files (context below 1M, no key) run the indexer on every layer
    const isFull = types ? types[i] !== 0 : ctx < 1_048_576 ? true : glm52DefaultFullLayer(i);
    if (isFull) full.push(i);
    g.kvBytesPerToken.push(latent + (isFull ? idxBytes : 0));
  }
  const topK = num(md[k('attention.indexer.top_k')]) ?? 2048;
  if (full.length < g.nLayer) {
    g.freeStarts = new Set(full);
    g.startPenaltyBytesPerToken = topK * I32;
    g.startPenaltyWhat = `the previous full layer's indexer top-k (${topK} × 4 B)`;
    g.notes.push(
      `${full.length} full-indexer layers, ${g.nLayer - full.length} shared; a stage starting on a shared layer needs ` +
        `the previous full layer's top-k: ${topK * I32} B/token`,
    );
  }
  g.notes.push(`MLA ${latent} B/token/layer + indexer key ${idxBytes} B/token on full layers`);
};

const deepseek4Shape: ShapeFn = (g, md, k, location) => {
  g.hcStreams = num(md[k('hyper_connection.count')]) ?? 4;
  const ratios = nums(md[k('attention.compress_ratios')]);
  if (!ratios) {
    throw new MeshError('GGUF_MISSING_METADATA', `${location}: no ${k('attention.compress_ratios')} in the metadata`);
  }
  const headDim = num(md[k('attention.key_length')]) ?? 512;
  const idxDim = num(md[k('attention.indexer.key_length')]) ?? 128;
  const window = num(md[k('attention.sliding_window')]) ?? 128;
  const hash = num(md[k('hash_layer_count')]) ?? 0;
  for (let i = 0; i < g.nLayer; i++) {
    const r = ratios[i] ?? 0;
    // one compressed key per r tokens; ratio-4 layers also keep the indexer's compressed key
    g.kvBytesPerToken.push(r === 0 ? 0 : (headDim * F16) / r + (r === 4 ? (idxDim * F16) / r : 0));
    g.fixedStateBytes[i] = window * headDim * F16; // the raw sliding-window ring
  }
  g.tokenIdBlocks = Array.from({ length: Math.min(hash, g.nLayer) }, (_, i) => i);
  g.notes.push(
    `hyper-connections: ${g.hcStreams} streams of ${g.nEmbd} cross every boundary`,
    `blocks 0-${hash - 1} route experts by token id: a stage starting at 1-${hash - 1} needs the token ids (4 B/token)`,
    `raw window of ${window} keys per layer: ${window * headDim * F16} B fixed per session per layer`,
  );
};

/** Qwen3.5: every `full_attention_interval`-th block attends; the rest are Gated DeltaNet. */
const qwen35Shape: ShapeFn = (g, md, k) => {
  gqaShape(g, md, k, '');
  const recurrent = nums(md[k('attention.recurrent_layers')]);
  const interval = num(md[k('full_attention_interval')]) ?? 4;
  const dConv = num(md[k('ssm.conv_kernel')]) ?? 4;
  const dState = num(md[k('ssm.state_size')]) ?? 128; // head dim of k and v
  const nKHeads = num(md[k('ssm.group_count')]) ?? 16;
  const nVHeads = num(md[k('ssm.time_step_rank')]) ?? 32;
  const convDim = 2 * dState * nKHeads + dState * nVHeads;
  const stateBytes = ((dConv - 1) * convDim + dState * dState * nVHeads) * F32;
  let nRecurrent = 0;
  for (let i = 0; i < g.nLayer; i++) {
    const isRecurrent = recurrent ? recurrent[i] !== 0 : (i + 1) % interval !== 0;
    if (!isRecurrent) continue;
    nRecurrent++;
    g.kvBytesPerToken[i] = 0;
    g.fixedStateBytes[i] = stateBytes;
  }
  g.notes.push(`${nRecurrent} Gated DeltaNet blocks keep ${stateBytes} B of f32 state per session each; the rest attend`);
  // the CPU reference and the WebGPU stage also keep the current chunk's rows (rewinds within it, batch-invariant replays)
  const la = { convKernel: dConv, headDim: dState, nKHeads, nVHeads, convChannels: convDim };
  g.notes.push(`the CPU reference holds ${deltaLayerBytes(la)} B per DeltaNet block per session (the state plus its current chunk's rows; WebGPU ${gpuDeltaLayerBytes(la)} B, its decays in f32), up to twice that with a rewind checkpoint`);
};

const ARCH_SHAPES: Readonly<Record<string, ShapeFn>> = {
  deepseek2: deepseek2Shape,
  deepseek32: deepseek32Shape,
  'glm-dsa': glmDsaShape,
  deepseek4: deepseek4Shape,
  qwen35: qwen35Shape,
  qwen35moe: qwen35Shape,
};
