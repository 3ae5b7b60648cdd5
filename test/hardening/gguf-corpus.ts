// A corpus of corrupted copies of a real GGUF, made at test time from its bytes: truncations,
// flipped header bytes, lying counts, dims, types, offsets and string lengths, and semantic
// lies (hyper-parameters that disagree with the tensors). Every case is one field rewritten
// (gguf-layout.ts says where each lies), named so a failure says which. A few benign cases
// (a renamed model, a flipped weight byte) are there to prove acceptance is compared too.

import { mulberry32 } from '../support/prng.ts';
import { layoutOf } from './gguf-layout.ts';
import type { GgufLayout, KvLayout } from './gguf-layout.ts';

export interface CorruptCase {
  name: string;
  category: 'truncation' | 'flip' | 'count' | 'dims' | 'type' | 'offset' | 'string' | 'semantic' | 'benign';
  bytes: Uint8Array;
}

type Edit = (b: Uint8Array, v: DataView) => void;

function kv(l: GgufLayout, key: string): KvLayout {
  const k = l.kvs.find((x) => x.key === key);
  if (!k) throw new Error(`the model has no ${key}`);
  return k;
}

export function corruptCorpus(original: Uint8Array, flips = 120): CorruptCase[] {
  const l = layoutOf(original);
  const out: CorruptCase[] = [];
  const add = (category: CorruptCase['category'], name: string, edit: Edit | Uint8Array): void => {
    let bytes: Uint8Array;
    if (edit instanceof Uint8Array) bytes = edit;
    else {
      bytes = original.slice();
      edit(bytes, new DataView(bytes.buffer));
    }
    out.push({ name: `${category}: ${name}`, category, bytes });
  };
  const u32 = (at: number, x: number): Edit => (_b, v) => v.setUint32(at, x >>> 0, true);
  const u64 = (at: number, x: bigint): Edit => (_b, v) => v.setBigUint64(at, x, true);
  const f32 = (at: number, x: number): Edit => (_b, v) => v.setFloat32(at, x, true);

  // truncations: inside every part of the file
  const cuts = [0, 3, 4, 10, 23, 24, 40, l.kvs[3]!.valueAt, l.kvs[l.kvs.length - 1]!.valueAt, l.tensors[0]!.nameLenAt + 4, l.tensors[20]!.offsetAt, l.headerEnd - 1, l.headerEnd, l.dataStart + 100, l.fileBytes - 1];
  for (const n of cuts) add('truncation', `first ${n} bytes`, original.slice(0, n));

  // flipped bits anywhere in the header (seeded: the same cases every run)
  const rnd = mulberry32(0x5eed);
  for (let i = 0; i < flips; i++) {
    const at = Math.floor(rnd() * l.headerEnd);
    const bit = Math.floor(rnd() * 8);
    add('flip', `bit ${bit} of header byte ${at}`, (b) => void (b[at]! ^= 1 << bit));
  }

  // lying counts
  const realTensors = l.tensors.length;
  for (const n of [0n, 1n, BigInt(realTensors - 1), BigInt(realTensors + 1), 1n << 32n, 1n << 62n]) add('count', `tensor_count = ${n}`, u64(l.tensorCountAt, n));
  for (const n of [0n, BigInt(l.kvs.length - 1), BigInt(l.kvs.length + 1), 1n << 40n]) add('count', `kv_count = ${n}`, u64(l.kvCountAt, n));
  const tokens = kv(l, 'tokenizer.ggml.tokens');
  const scores = kv(l, 'tokenizer.ggml.scores');
  for (const n of [0n, BigInt(tokens.count! - 1), BigInt(tokens.count! + 1), 1n << 40n]) add('count', `tokens array count = ${n}`, u64(tokens.arrayCountAt!, n));
  add('count', 'scores array count = 2^50', u64(scores.arrayCountAt!, 1n << 50n));
  add('count', 'scores array element type = 99', u32(scores.arrayTypeAt!, 99));
  for (const n of [0, 5, 0x80000000]) add('count', `token_embd n_dims = ${n}`, u32(l.tensors[0]!.nDimsAt, n));

  // dims
  const embd = l.tensors[0]!;
  const q = l.tensors.find((t) => t.name === 'blk.0.attn_q.weight')!;
  const gate = l.tensors.find((t) => t.name === 'blk.2.ffn_gate.weight')!;
  const norm = l.tensors.find((t) => t.name === 'output_norm.weight')!;
  add('dims', 'token_embd ne0 doubled', u64(embd.dimsAt[0]!, BigInt(embd.dims[0]! * 2)));
  add('dims', 'token_embd ne1 halved', u64(embd.dimsAt[1]!, BigInt(embd.dims[1]! / 2)));
  add('dims', 'token_embd ne1 = 0', u64(embd.dimsAt[1]!, 0n));
  add('dims', 'token_embd ne1 = 2^40', u64(embd.dimsAt[1]!, 1n << 40n));
  add('dims', 'token_embd ne1 = 2^63', u64(embd.dimsAt[1]!, 1n << 63n));
  add('dims', 'attn_q ne1 halved', u64(q.dimsAt[1]!, BigInt(q.dims[1]! / 2)));
  add('dims', 'attn_q dims swapped with a same-size shape', (_b, v) => (v.setBigUint64(q.dimsAt[0]!, 32n, true), v.setBigUint64(q.dimsAt[1]!, 128n, true)));
  add('dims', 'ffn_gate ne1 - 1', u64(gate.dimsAt[1]!, BigInt(gate.dims[1]! - 1)));
  add('dims', 'output_norm ne0 = 32', u64(norm.dimsAt[0]!, 32n));

  // types
  for (const [t, n] of [[1, 'F16'], [8, 'Q8_0'], [2, 'Q4_0'], [14, 'Q6_K'], [99, 'unknown 99'], [0xffffffff, 'unknown 2^32-1'], [4, 'removed Q4_2']] as const) {
    add('type', `blk.0.attn_q type = ${n}`, u32(q.typeAt, t));
  }
  const last = [...l.tensors].sort((a, b) => b.offset - a.offset)[0]!;
  add('type', `last tensor (${last.name}) type = F16`, u32(last.typeAt, 1));
  add('type', 'output_norm type = F16', u32(norm.typeAt, 1));

  // offsets
  const second = l.tensors[1]!;
  add('offset', 'output_norm offset + 1 (unaligned)', u64(second.offsetAt, BigInt(second.offset + 1)));
  add('offset', 'output_norm offset + 32 (overlaps the next tensor)', u64(second.offsetAt, BigInt(second.offset + 32)));
  add('offset', 'output_norm offset = token_embd offset (overlap)', u64(second.offsetAt, BigInt(embd.offset)));
  add('offset', 'two tensors swap offsets', (_b, v) => (v.setBigUint64(q.offsetAt, BigInt(second.offset), true), v.setBigUint64(second.offsetAt, BigInt(q.offset), true)));
  add('offset', `last tensor offset past EOF`, u64(last.offsetAt, BigInt(l.fileBytes)));
  add('offset', 'token_embd offset = 2^60', u64(embd.offsetAt, 1n << 60n));
  add('offset', 'general.alignment-sized gap before token_embd', u64(embd.offsetAt, 32n));

  // string lengths
  const arch = kv(l, 'general.architecture');
  add('string', 'first key length = 0', u64(l.kvs[0]!.keyLenAt, 0n));
  add('string', 'first key length = 2^40', u64(l.kvs[0]!.keyLenAt, 1n << 40n));
  add('string', 'first key length + 1', u64(l.kvs[0]!.keyLenAt, BigInt('tokenizer.ggml.tokens'.length + 1)));
  add('string', 'architecture value length = 2^62', u64(arch.strLenAt!, 1n << 62n));
  add('string', 'architecture value length - 1 ("llam")', u64(arch.strLenAt!, 4n));
  add('string', 'token 5 string length = 2^40', (b, v) => {
    // the tokens array: u64 length + bytes each; find the sixth entry
    let at = tokens.arrayCountAt! + 8;
    for (let i = 0; i < 5; i++) at += 8 + Number(v.getBigUint64(at, true));
    v.setBigUint64(at, 1n << 40n, true);
    void b;
  });
  add('string', 'tensor name length = 2^40', u64(q.nameLenAt, 1n << 40n));
  add('string', 'tensor name length - 1', u64(q.nameLenAt, BigInt(q.name.length - 1)));
  add('string', 'value type of block_count = 8 (string)', u32(kv(l, 'llama.block_count').typeAt, 8));
  add('string', 'value type of a key = 13 (unknown)', u32(kv(l, 'llama.context_length').typeAt, 13));

  // semantic lies: hyper-parameters that disagree with the tensors
  const num = (key: string): number => kv(l, key).valueAt;
  for (const n of [0, 4, 6, 0x80000000, 0xffffffff]) add('semantic', `block_count = ${n}`, u32(num('llama.block_count'), n));
  for (const n of [0, 63, 128]) add('semantic', `embedding_length = ${n}`, u32(num('llama.embedding_length'), n));
  for (const n of [0, 7, 16]) add('semantic', `head_count = ${n}`, u32(num('llama.attention.head_count'), n));
  for (const n of [0, 3, 8]) add('semantic', `head_count_kv = ${n}`, u32(num('llama.attention.head_count_kv'), n));
  for (const n of [0, 171, 344]) add('semantic', `feed_forward_length = ${n}`, u32(num('llama.feed_forward_length'), n));
  add('semantic', 'context_length = 0', u32(num('llama.context_length'), 0));
  for (const n of [0, 7, 16]) add('semantic', `rope.dimension_count = ${n}`, u32(num('llama.rope.dimension_count'), n));
  add('semantic', 'rms epsilon = NaN', f32(num('llama.attention.layer_norm_rms_epsilon'), NaN));
  add('semantic', 'rms epsilon key renamed (missing)', (b) => void (b[kv(l, 'llama.attention.layer_norm_rms_epsilon').valueAt - 5] = 0x78));
  add('semantic', 'architecture = "gpt2-"', (b) => b.set(new TextEncoder().encode('gpt2-'), arch.valueAt + 8));
  add('semantic', 'architecture = "llamb"', (b) => b.set(new TextEncoder().encode('llamb'), arch.valueAt + 8));
  add('semantic', 'bos_token_id = 512 (outside the vocabulary)', u32(num('tokenizer.ggml.bos_token_id'), 512));
  add('semantic', 'tokenizer.ggml.model = "llamb"', (b) => b.set(new TextEncoder().encode('llamb'), kv(l, 'tokenizer.ggml.model').valueAt + 8));
  add('semantic', 'blk.4.* renamed blk.5.* (a missing layer)', (b) => {
    for (const t of l.tensors.filter((x) => x.name.startsWith('blk.4.'))) b[t.nameLenAt + 8 + 4] = 0x35;
  });
  add('semantic', 'two tensors with one name', (b) => b.set(new TextEncoder().encode('blk.0.attn_k'), l.tensors.find((t) => t.name === 'blk.0.attn_v.weight')!.nameLenAt + 8));
  add('semantic', 'output.weight renamed (tied head)', (b) => void (b[l.tensors.find((t) => t.name === 'output.weight')!.nameLenAt + 8] = 0x78));

  // benign: accepted by llama.cpp, and what we compute must be what it computes
  add('benign', 'general.name = "lllma"', (b) => b.set(new TextEncoder().encode('lllma'), kv(l, 'general.name').valueAt + 8));
  add('benign', 'an unknown key (a renamed general.name)', (b) => void (b[kv(l, 'general.name').keyLenAt + 8 + 8] = 0x4e));
  add('benign', 'a flipped bit in a layer weight', (b) => void (b[l.dataStart + q.offset + 1001]! ^= 0x08));
  add('benign', 'a flipped bit in the embedding', (b) => void (b[l.dataStart + embd.offset + 4 * (64 * 403 + 5) + 2]! ^= 0x10));
  return out;
}
