// Split GGUFs (`name-00001-of-00003.gguf` …, as llama.cpp's gguf-split writes them) are ONE
// artifact of several files. Each part is a GGUF with its own header: the first holds all the
// model's metadata, every part carries `split.no` (u16, 0-based), `split.count` (u16) and
// `split.tensors.count` (i32, tensors in all parts), and each tensor lives in exactly one part.
//
// The artifact's bytes are the parts concatenated in order (its sha256 is theirs), and the
// artifact header addresses tensors in that concatenation: a tensor at offset o of part k sits
// at `(size of parts 0…k-1) + o`. Manifests keep (file, offset within the file) instead.
//
// Browser-safe: only parse.ts (whose Node imports are dynamic, on the file path).

import { MeshError } from '../errors.ts';
import { readHeader } from './parse.ts';
import type { ReadHeaderOptions } from './parse.ts';
import type { GgufHeader } from './types.ts';

const SPLIT_RE = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/;

export const SPLIT_NO_KEY = 'split.no';
export const SPLIT_COUNT_KEY = 'split.count';
export const SPLIT_TENSORS_COUNT_KEY = 'split.tensors.count';

/** `prefix-00002-of-00003.gguf` → { prefix, index: 1, count: 3 }; null when not a split name. */
export function splitName(location: string): { prefix: string; index: number; count: number } | null {
  const m = SPLIT_RE.exec(location);
  if (!m) return null;
  return { prefix: m[1]!, index: Number(m[2]) - 1, count: Number(m[3]) };
}

/** The name of part `index` (0-based) of `count`, llama.cpp's `%s-%05d-of-%05d.gguf`. */
export function splitPartName(prefix: string, index: number, count: number): string {
  return `${prefix}-${String(index + 1).padStart(5, '0')}-of-${String(count).padStart(5, '0')}.gguf`;
}

/** The files of an artifact: the location itself, or every part of a split GGUF (any part names it). */
export function artifactFiles(location: string): string[] {
  const s = splitName(location);
  if (!s) return [location];
  if (s.count < 1 || s.index >= s.count) throw new MeshError('GGUF_BAD_SPLIT', `${location}: part ${s.index + 1} of a split of ${s.count} files`);
  return Array.from({ length: s.count }, (_, i) => splitPartName(s.prefix, i, s.count));
}

export interface ArtifactHeader {
  /** the artifact's header: first part's metadata, all tensors at offsets into the concatenated parts */
  header: GgufHeader;
  /** every file in part order with its own header (offsets within that file) */
  files: Array<{ location: string; header: GgufHeader }>;
  /** where each file starts in the artifact's bytes */
  fileBase: number[];
  /** file index of each tensor, by name */
  fileOf: Map<string, number>;
}

function metaInt(h: GgufHeader, key: string): number | undefined {
  const v = h.metadata[key];
  return v === undefined ? undefined : Number(v);
}

/**
 * Joins the headers of a split's parts into the artifact header, checking that they are one
 * split: part k says `split.no` = k and `split.count` = n, the first part's
 * `split.tensors.count` is the number of tensors in all parts, and no tensor appears twice.
 */
export function joinSplitHeaders(files: Array<{ location: string; header: GgufHeader }>): ArtifactHeader {
  const n = files.length;
  const bad = (msg: string): MeshError => new MeshError('GGUF_BAD_SPLIT', msg);
  if (n === 0) throw bad('a split of no files');
  if (n > 1) {
    const first = files[0]!;
    if (metaInt(first.header, SPLIT_COUNT_KEY) !== n) {
      throw bad(`${first.location}: ${SPLIT_COUNT_KEY} is ${String(first.header.metadata[SPLIT_COUNT_KEY])}, the file names say ${n} parts`);
    }
    files.forEach(({ location, header }, k) => {
      const no = metaInt(header, SPLIT_NO_KEY);
      const count = metaInt(header, SPLIT_COUNT_KEY);
      if (no !== undefined && no !== k) throw bad(`${location}: ${SPLIT_NO_KEY} is ${no}, expected ${k}`);
      if (count !== undefined && count !== n) throw bad(`${location}: ${SPLIT_COUNT_KEY} is ${count}, expected ${n}`);
    });
  }
  const fileBase: number[] = [];
  const fileOf = new Map<string, number>();
  const tensors: GgufHeader['tensors'] = [];
  let base = 0;
  files.forEach(({ location, header }, k) => {
    fileBase.push(base);
    for (const t of header.tensors) {
      if (fileOf.has(t.name)) throw bad(`tensor '${t.name}' appears in part ${fileOf.get(t.name)! + 1} and again in ${location}`);
      fileOf.set(t.name, k);
      tensors.push({ ...t, shape: [...t.shape], offset: base + t.offset });
    }
    base += header.fileBytes;
  });
  const declared = metaInt(files[0]!.header, SPLIT_TENSORS_COUNT_KEY);
  if (n > 1 && declared !== undefined && declared !== tensors.length) {
    throw bad(`${files[0]!.location}: ${SPLIT_TENSORS_COUNT_KEY} is ${declared}, the parts hold ${tensors.length} tensors`);
  }
  const first = files[0]!.header;
  return {
    header: n === 1 ? first : { ...first, tensors, fileBytes: base },
    files,
    fileBase,
    fileOf,
  };
}

/** Reads the header of every file of the artifact at `location` (a plain GGUF or any part of a split). */
export async function readArtifactHeader(location: string, opts: ReadHeaderOptions = {}): Promise<ArtifactHeader> {
  const files: Array<{ location: string; header: GgufHeader }> = [];
  for (const loc of artifactFiles(location)) files.push({ location: loc, header: await readHeader(loc, opts) });
  return joinSplitHeaders(files);
}
