// A browser peer's path from model URL to WebGPU: each stage loads only its shard's slice
// (coalesced Range requests, verified against the manifest, kept in IndexedDB), hands the
// bytes to its WebGPU worker, and the chain of stages equals the CPU reference. A second visit
// loads the same slices from the cache with no model bytes fetched.
import { afterAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../../src/backends/cpu/backend.ts';
import type { StageBackend } from '../../src/backends/types.ts';
import { WebGpuBackend } from '../../src/backends/webgpu/backend.ts';
import { webGpuBackendInWorker } from '../../workers/webgpu-stage.ts';
import { isMeshError } from '../../src/errors.ts';
import { readHeader } from '../../src/gguf/parse.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import type { GgufHeader } from '../../src/gguf/types.ts';
import { parseManifest } from '../../src/gguf/verify.ts';
import type { Manifest } from '../../src/gguf/verify.ts';
import { loadSlice, sliceSource } from '../../src/peer/slice-loader.ts';
import { indexedDbStore } from '../../src/storage/kv-store.ts';
import { ShardCache } from '../../src/storage/shard-cache.ts';

const MODEL_URL = `${location.origin}/.cache/test-models/stories260K.gguf`;
const MANIFEST_URL = `${location.origin}/.cache/test-models/stories260K.manifest.json`;
const PROMPT = Int32Array.from([1, 403, 407, 261, 378]);
const SHARDS = [
  { start: 0, end: 2 },
  { start: 2, end: 4 },
  { start: 4, end: 5 },
];

const backends: StageBackend[] = [];
afterAll(async () => {
  for (const b of backends) await b.dispose().catch(() => {});
});

async function manifestAndHeader(): Promise<{ manifest: Manifest; header: GgufHeader }> {
  const res = await fetch(MANIFEST_URL);
  if (!res.ok) throw new Error(`${MANIFEST_URL}: HTTP ${res.status} — the browser project's globalSetup (test/browser/webgpu-global-setup.ts) writes it`);
  return { manifest: parseManifest(await res.text()), header: await readHeader(MODEL_URL) };
}

/** Loads every shard's slice into its own WebGPU worker; returns the stages and fetch figures. */
async function peers(cache: ShardCache): Promise<{ stages: WebGpuBackend[]; fetched: number; total: number }> {
  const { manifest, header } = await manifestAndHeader();
  const stages: WebGpuBackend[] = [];
  let fetched = 0;
  let total = 0;
  for (const shard of SHARDS) {
    const slice = await loadSlice({ manifest, modelUrl: MODEL_URL, shard, cache });
    fetched += slice.fetchedBytes;
    total += slice.totalBytes;
    const gpu = await webGpuBackendInWorker();
    backends.push(gpu);
    await gpu.load(sliceSource(header, manifest, slice.tensors, MODEL_URL), shard);
    stages.push(gpu);
  }
  return { stages, fetched, total };
}

async function prefillLogits(stages: StageBackend[], session: string): Promise<Float32Array> {
  for (const s of stages) await s.openSession(session, { contextLength: 32 });
  let out = (await stages[0]!.forward(session, { kind: 'tokens', tokens: PROMPT }, 0)).output;
  for (const s of stages.slice(1)) {
    if (out.kind !== 'hidden') throw new Error('expected hidden states');
    out = (await s.forward(session, { kind: 'hidden', hidden: out.hidden, nTokens: out.nTokens }, 0)).output;
  }
  if (out.kind !== 'logits') throw new Error('expected logits');
  return out.logits;
}

function relErr(got: Float32Array, want: Float32Array): number {
  let d = 0;
  let m = 0;
  want.forEach((v, i) => {
    d = Math.max(d, Math.abs(got[i]! - v));
    m = Math.max(m, Math.abs(v));
  });
  return d / m;
}

describe('browser peers serving stories260K in three WebGPU stages', () => {
  it('fetch only their slices, then load them from IndexedDB on the next visit; logits equal the CPU reference', async () => {
    const source = await openTensorSource(MODEL_URL);
    const cpu = new CpuBackend();
    backends.push(cpu);
    await cpu.load(source, { start: 0, end: 5 });
    const want = await prefillLogits([cpu], 'ref');
    await source.close();

    const db = `webgpu-peer-${Math.random().toString(36).slice(2)}`;
    const first = await peers(new ShardCache(indexedDbStore(db)));
    expect(first.fetched).toBeGreaterThan(0);
    expect(first.fetched).toBeLessThanOrEqual(1.02 * first.total);
    expect(relErr(await prefillLogits(first.stages, 'a'), want)).toBeLessThan(1e-3);

    // the slice's bytes went to the workers (transferred): loading them again says so
    const { manifest, header } = await manifestAndHeader();
    const slice = await loadSlice({ manifest, modelUrl: MODEL_URL, shard: SHARDS[0]!, cache: null });
    const once = await webGpuBackendInWorker();
    backends.push(once);
    await once.load(sliceSource(header, manifest, slice.tensors, MODEL_URL), SHARDS[0]!);
    const twice = await webGpuBackendInWorker();
    backends.push(twice);
    const err = await twice.load(sliceSource(header, manifest, slice.tensors, MODEL_URL), SHARDS[0]!).catch((e) => e);
    expect(isMeshError(err, 'TENSOR_BYTES_DETACHED')).toBe(true);
    const copying = await webGpuBackendInWorker({}, { copyTensorBytes: true });
    backends.push(copying);
    const fresh = await loadSlice({ manifest, modelUrl: MODEL_URL, shard: SHARDS[0]!, cache: null });
    await copying.load(sliceSource(header, manifest, fresh.tensors, MODEL_URL), SHARDS[0]!);
    expect([...fresh.tensors.values()].every((b) => b.byteLength > 0)).toBe(true);

    const again = await peers(new ShardCache(indexedDbStore(db)));
    expect(again.fetched).toBe(0);
    expect(relErr(await prefillLogits(again.stages, 'b'), want)).toBeLessThan(1e-3);
  });
});
