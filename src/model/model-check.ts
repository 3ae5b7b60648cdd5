// What llama.cpp checks when it builds a model from a GGUF, for the architectures we run: every
// tensor the config implies is there with the shape it implies, no tensor is left over, norms
// and biases are F32, and the hyper-parameters agree with each other. `serve` runs it before it
// opens a room, so a file that lies about itself is refused at start with the tensor named —
// never served as garbage, never a failure at the first join. The full tensor check covers the
// dense llama family (llama, qwen2, qwen3); the other architectures our engines run get the
// config's own checks, and one only a llama.cpp node serves whole gets the checks every
// architecture shares (a room opens for it; llama.cpp refuses what else is wrong at its load).

import { MeshError } from '../errors.ts';
import { GgmlType } from '../gguf/types.ts';
import type { GgufHeader, TensorInfo } from '../gguf/types.ts';
import { hyperParameters } from '../gguf/summary.ts';
import { configFromHeader, ROPE_FREQS_TENSOR, SUPPORTED_ARCHITECTURES } from './config.ts';
import { Tokenizer } from './tokenizer/tokenizer.ts';
import type { ModelConfig } from './config.ts';

/** A tensor the config implies: its name, shape (ggml order) and whether it must be F32. */
interface Expected {
  name: string;
  shape: number[];
  f32: boolean;
  optional?: boolean;
}

function expectedTensors(c: ModelConfig): Expected[] {
  const q = c.nHead * c.headDim;
  const kv = c.nHeadKv * c.headDim;
  const out: Expected[] = [
    { name: 'token_embd.weight', shape: [c.nEmbd, c.nVocab], f32: false },
    { name: 'output_norm.weight', shape: [c.nEmbd], f32: true },
    { name: 'output.weight', shape: [c.nEmbd, c.nVocab], f32: false, optional: true },
    { name: ROPE_FREQS_TENSOR, shape: [c.rope.nRot / 2], f32: true, optional: true },
  ];
  for (let i = 0; i < c.nLayer; i++) {
    const b = `blk.${i}.`;
    out.push(
      { name: `${b}attn_norm.weight`, shape: [c.nEmbd], f32: true },
      { name: `${b}attn_q.weight`, shape: [c.nEmbd, q], f32: false },
      { name: `${b}attn_k.weight`, shape: [c.nEmbd, kv], f32: false },
      { name: `${b}attn_v.weight`, shape: [c.nEmbd, kv], f32: false },
      { name: `${b}attn_output.weight`, shape: [q, c.nEmbd], f32: false },
      { name: `${b}ffn_norm.weight`, shape: [c.nEmbd], f32: true },
      { name: `${b}ffn_gate.weight`, shape: [c.nEmbd, c.nFf], f32: false },
      { name: `${b}ffn_up.weight`, shape: [c.nEmbd, c.nFf], f32: false },
      { name: `${b}ffn_down.weight`, shape: [c.nFf, c.nEmbd], f32: false },
    );
    if (c.qkvBias) out.push({ name: `${b}attn_q.bias`, shape: [q], f32: true }, { name: `${b}attn_k.bias`, shape: [kv], f32: true }, { name: `${b}attn_v.bias`, shape: [kv], f32: true });
    if (c.qkNorm) out.push({ name: `${b}attn_q_norm.weight`, shape: [c.headDim], f32: true }, { name: `${b}attn_k_norm.weight`, shape: [c.headDim], f32: true });
  }
  return out;
}

/** Trailing 1s are not part of a ggml shape ([64, 1] is [64]). */
function trimmed(shape: readonly number[]): number[] {
  const s = [...shape];
  while (s.length > 1 && s[s.length - 1] === 1) s.pop();
  return s;
}

/**
 * The config of a model this runtime can serve, after checking the header against it;
 * BAD_MODEL_METADATA, TENSOR_MISSING, BAD_TENSOR_SHAPE, UNEXPECTED_TENSOR or
 * UNSUPPORTED_TENSOR_TYPE naming what is wrong otherwise.
 */
export function checkedModelConfig(header: GgufHeader, location = 'the model'): ModelConfig {
  const c = configFromHeader(header);
  const where = `${location}:`;
  // llama.cpp requires it (our config falls back to 2,048 for synthetic and test headers)
  if (header.metadata[`${c.architecture}.context_length`] === undefined) throw new MeshError('BAD_MODEL_METADATA', `${where} ${c.architecture}.context_length is missing`);
  // every layer has tensors: a block count beyond the tensor count is a lie (and would size arrays)
  if (c.nLayer > header.tensors.length) throw new MeshError('BAD_MODEL_METADATA', `${where} block_count ${c.nLayer} but the file holds only ${header.tensors.length} tensors`);
  if (!c.nEmbd || c.headDim < 1) throw new MeshError('BAD_MODEL_METADATA', `${where} head dimension ${c.headDim} (embedding_length ${c.nEmbd} / head_count ${c.nHead}) is not a positive integer`);
  if (c.architecture === 'llama' && c.rope.nRot !== c.headDim) {
    throw new MeshError('BAD_MODEL_METADATA', `${where} rope.dimension_count ${c.rope.nRot} must equal the head dimension ${c.headDim} for llama (llama.cpp: invalid n_rot)`);
  }
  const tokens = header.metadata['tokenizer.ggml.tokens'];
  if (Array.isArray(tokens) && tokens.length !== c.nVocab) {
    throw new MeshError('BAD_MODEL_METADATA', `${where} the vocabulary has ${tokens.length} tokens but the model ${c.nVocab} (vocab_size or token_embd.weight)`);
  }
  const byName = new Map<string, TensorInfo>(header.tensors.map((t) => [t.name, t]));
  const used = new Set<string>();
  for (const e of expectedTensors(c)) {
    const t = byName.get(e.name);
    if (!t) {
      if (e.optional) continue;
      throw new MeshError('TENSOR_MISSING', `${where} the ${c.architecture} config needs tensor '${e.name}' (shape [${e.shape.join(', ')}]), which the file lacks`, { tensor: e.name });
    }
    used.add(e.name);
    const got = trimmed(t.shape);
    if (got.length !== e.shape.length || got.some((d, i) => d !== e.shape[i])) {
      throw new MeshError('BAD_TENSOR_SHAPE', `${where} tensor '${e.name}' has shape [${t.shape.join(', ')}], the config implies [${e.shape.join(', ')}]`, { tensor: e.name });
    }
    if (e.f32 && t.type !== GgmlType.F32) throw new MeshError('UNSUPPORTED_TENSOR_TYPE', `${where} tensor '${e.name}' is a norm or bias stored as type ${t.type}; it must be F32`, { tensor: e.name });
  }
  // llama.cpp refuses a file with tensors its architecture does not create
  const extra = header.tensors.find((t) => !used.has(t.name));
  if (extra) throw new MeshError('UNEXPECTED_TENSOR', `${where} tensor '${extra.name}' is not one a ${c.architecture} model with ${c.nLayer} blocks uses`, { tensor: extra.name });
  return c;
}

/** The architectures whose every tensor checkedModelConfig knows. */
const TENSOR_CHECKED = new Set(['llama', 'qwen2', 'qwen3']);

/** Refusals that say our engines lack a feature, not that the file lies: a whole-model llama.cpp node may still serve it. */
const ENGINE_LIMITS = new Set(['UNSUPPORTED_ARCHITECTURE', 'UNSUPPORTED_ROPE_SCALING']);

/**
 * What `serve` checks before it opens a room (and `audit` reports as serve's verdict): the
 * hyper-parameters read (block_count against the blk.N tensors), the context length is there,
 * the tokenizer reads, and — where our engines run the model — its config, with every tensor
 * for the llama family. A model our engines lack a feature for is still served (a llama.cpp
 * node may take it whole): its config is null then. Returns n_layer and the training context.
 */
export function checkedServableModel(header: GgufHeader, location = 'the model'): { nLayer: number; nCtx: number; config: ModelConfig | null } {
  const hp = hyperParameters(header, location);
  if (header.tensors.length === 0) throw new MeshError('BAD_MODEL_METADATA', `${location}: the file holds no tensors`);
  if (hp.n_layer < 1) throw new MeshError('BAD_MODEL_METADATA', `${location}: block_count ${hp.n_layer}: a model needs at least one block`);
  if (header.metadata[`${hp.architecture}.context_length`] === undefined) throw new MeshError('BAD_MODEL_METADATA', `${location}: ${hp.architecture}.context_length is missing`);
  Tokenizer.fromMetadata(header.metadata);
  const whole = { nLayer: hp.n_layer, nCtx: hp.n_ctx_train, config: null };
  if (!(SUPPORTED_ARCHITECTURES as readonly string[]).includes(hp.architecture)) return whole;
  let config: ModelConfig;
  try {
    config = TENSOR_CHECKED.has(hp.architecture) ? checkedModelConfig(header, location) : configFromHeader(header);
  } catch (e) {
    if (e instanceof MeshError && ENGINE_LIMITS.has(e.code)) return whole;
    throw e;
  }
  return { nLayer: config.nLayer, nCtx: config.nCtxTrain, config };
}
