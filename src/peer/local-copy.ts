// llama.cpp reads local files only, so a llama.cpp node keeps a whole copy of the artifact:
// fetched once into the cache, named by its sha256, every file verified against the manifest
// as its bytes pass (a cached copy is re-verified; a mismatch is fetched once more, then refused).

import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, rename, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { MeshError } from '../errors.ts';
import { artifactFiles, splitPartName } from '../gguf/split.ts';
import type { Manifest } from '../gguf/verify.ts';

/** sha256 of a file, reporting the bytes hashed so far. */
async function fileSha256(path: string, onBytes: (n: number) => void = () => undefined): Promise<string> {
  const h = createHash('sha256');
  let n = 0;
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) {
    h.update(chunk as Buffer);
    onBytes((n += (chunk as Buffer).length));
  }
  return h.digest('hex');
}

/** Downloads `url` to `path`, hashing as the bytes pass; returns the sha256. */
async function download(url: string, headers: Record<string, string>, path: string, onBytes: (n: number) => void): Promise<string> {
  const res = await fetch(url, { headers });
  if (!res.ok || !res.body) {
    await res.body?.cancel();
    throw new MeshError('MODEL_FETCH_FAILED', `GET ${url}: HTTP ${res.status}`);
  }
  const h = createHash('sha256');
  let n = 0;
  await pipeline(
    Readable.fromWeb(res.body as never),
    async function* (chunks: AsyncIterable<Buffer>) {
      for await (const chunk of chunks) {
        h.update(chunk);
        onBytes((n += chunk.length));
        yield chunk;
      }
    },
    createWriteStream(path),
  );
  return h.digest('hex');
}

/**
 * llama.cpp reads local files only: fetch the whole artifact once into the cache, named by
 * its sha256 (a split GGUF's parts as `<sha256>-0000k-of-0000n.gguf`, which llama.cpp loads
 * from the first), and verify every file against the manifest (a cached copy is re-verified;
 * a mismatch is fetched once more, then refused). `onProgress` hears bytes verified so far of
 * the artifact's size.
 */
export async function localCopy(
  url: string,
  headers: Record<string, string>,
  cacheDir: string,
  manifest: Manifest,
  onProgress: (done: number, total: number) => void,
): Promise<{ path: string; bytesFetched: number }> {
  await mkdir(cacheDir, { recursive: true });
  const sha = manifest.artifact.sha256;
  const files = manifest.artifact.files;
  const urls = artifactFiles(url);
  if (urls.length !== files.length) {
    throw new MeshError('GGUF_BAD_SPLIT', `the manifest lists ${files.length} file(s) but ${url} names ${urls.length}`);
  }
  const names = files.length === 1 ? [`${sha}.gguf`] : files.map((_, k) => splitPartName(sha, k, files.length));
  const total = manifest.artifact.size;
  let before = 0; // bytes of the files already verified
  let bytesFetched = 0;
  onProgress(0, total);
  for (let k = 0; k < files.length; k++) {
    const want = files[k]!;
    const path = join(cacheDir, names[k]!);
    const have = await stat(path).catch(() => null);
    const cachedOk = have?.size === want.size && (await fileSha256(path, (n) => onProgress(before + n, total))) === want.sha256;
    if (!cachedOk) {
      for (let attempt = 0; ; attempt++) {
        const got = await download(urls[k]!, headers, `${path}.part`, (n) => onProgress(before + n, total));
        bytesFetched += (await stat(`${path}.part`)).size;
        if (got === want.sha256) break;
        await unlink(`${path}.part`).catch(() => undefined);
        if (attempt === 1) {
          throw new MeshError('ARTIFACT_HASH_MISMATCH', `file ${k + 1} of ${files.length} of artifact ${sha} from ${urls[k]}: expected sha256 ${want.sha256}, got ${got}`, { file: k, expected: want.sha256, actual: got });
        }
      }
      await rename(`${path}.part`, path);
    }
    before += want.size;
  }
  onProgress(total, total);
  return { path: join(cacheDir, names[0]!), bytesFetched };
}
