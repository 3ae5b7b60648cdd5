// Where each field of a GGUF header lies in the file: a small walker over a well-formed file
// (the real test model) that records the byte offset of every count, length, type and offset,
// so the corruption corpus can rewrite one field at a time. It trusts its input: it is only
// run on files known to be good.

export interface KvLayout {
  key: string;
  keyLenAt: number;
  /** the value's type id (u32) */
  typeAt: number;
  type: number;
  /** first byte of the value (for an array: its element type) */
  valueAt: number;
  valueEnd: number;
  /** arrays: element type and count fields */
  arrayTypeAt?: number;
  arrayCountAt?: number;
  count?: number;
  /** strings: the value's length field */
  strLenAt?: number;
}

export interface TensorLayout {
  name: string;
  nameLenAt: number;
  nDimsAt: number;
  dims: number[];
  dimsAt: number[];
  typeAt: number;
  type: number;
  offsetAt: number;
  /** relative to the data section */
  offset: number;
}

export interface GgufLayout {
  tensorCountAt: number;
  kvCountAt: number;
  kvs: KvLayout[];
  tensors: TensorLayout[];
  /** end of the tensor infos */
  headerEnd: number;
  /** start of the data section (aligned) */
  dataStart: number;
  fileBytes: number;
}

const SCALAR_BYTES: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
const STRING = 8;
const ARRAY = 9;

export function layoutOf(bytes: Uint8Array): GgufLayout {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let at = 24;
  const u32 = (): number => {
    const x = v.getUint32(at, true);
    at += 4;
    return x;
  };
  const u64 = (): number => {
    const x = Number(v.getBigUint64(at, true));
    at += 8;
    return x;
  };
  const str = (): string => {
    const n = u64();
    const s = new TextDecoder().decode(bytes.subarray(at, at + n));
    at += n;
    return s;
  };
  const skipValue = (type: number): void => {
    if (type === STRING) {
      const n = u64();
      at += n;
    } else at += SCALAR_BYTES[type]!;
  };
  const nTensors = Number(v.getBigUint64(8, true));
  const nKv = Number(v.getBigUint64(16, true));
  const kvs: KvLayout[] = [];
  for (let i = 0; i < nKv; i++) {
    const keyLenAt = at;
    const key = str();
    const typeAt = at;
    const type = u32();
    const valueAt = at;
    const kv: KvLayout = { key, keyLenAt, typeAt, type, valueAt, valueEnd: 0 };
    if (type === ARRAY) {
      kv.arrayTypeAt = at;
      const et = u32();
      kv.arrayCountAt = at;
      const n = u64();
      kv.count = n;
      for (let k = 0; k < n; k++) skipValue(et);
    } else {
      if (type === STRING) kv.strLenAt = at;
      skipValue(type);
    }
    kv.valueEnd = at;
    kvs.push(kv);
  }
  const tensors: TensorLayout[] = [];
  for (let i = 0; i < nTensors; i++) {
    const nameLenAt = at;
    const name = str();
    const nDimsAt = at;
    const nDims = u32();
    const dims: number[] = [];
    const dimsAt: number[] = [];
    for (let d = 0; d < nDims; d++) {
      dimsAt.push(at);
      dims.push(u64());
    }
    const typeAt = at;
    const type = u32();
    const offsetAt = at;
    const offset = u64();
    tensors.push({ name, nameLenAt, nDimsAt, dims, dimsAt, typeAt, type, offsetAt, offset });
  }
  const alignKv = kvs.find((k) => k.key === 'general.alignment');
  const alignment = alignKv ? v.getUint32(alignKv.valueAt, true) : 32;
  const dataStart = Math.ceil(at / alignment) * alignment;
  return { tensorCountAt: 8, kvCountAt: 16, kvs, tensors, headerEnd: at, dataStart, fileBytes: bytes.byteLength };
}
