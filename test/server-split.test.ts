// Split GGUFs are one artifact: a synthetic model cut into three parts the way llama.cpp's
// gguf-split does is served as one room (`serve --model <first part>`), routed over two cpu
// nodes whose shards each straddle two parts, and a llama.cpp node copies and loads the split
// set. Tokens equal llama.cpp's on the unsplit model; the manifest's sha256 is that of the
// parts concatenated.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { LlamaModel } from 'node-llama-cpp';
import { greedyGenerate, loadModel, tokenize } from './support/llama.ts';
import { closeRouteTest, getJson, joinReadyRoute, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { splitSyntheticModel } from './support/split-model.ts';
import type { SplitModel } from './support/split-model.ts';
import { REPO_ROOT } from './support/cli.ts';
import { startRangeServer } from './support/range-server.ts';
import { runCli } from './support/cli.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { artifactFiles, readArtifactHeader } from '../src/gguf/split.ts';
import { buildManifest } from '../src/gguf/manifest.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { shardTensors } from '../src/gguf/verify.ts';
import { RemoteChain } from '../src/route/remote.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { generate } from '../src/route/generation.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { isMeshError } from '../src/errors.ts';

const OPTIONS = { arch: 'llama', type: 'f32', layers: 4, embd: 256, heads: 4, kvHeads: 2, ffn: 512 } as const;
const PROMPTS = ['Once upon a time', 'The little dog ran to the park'];
const N = 16;

let model: SplitModel;
let serve: ServeInfo;
let joined: JoinedRoom;
let whole: LlamaModel;
let tokenizer: Tokenizer;
const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

beforeAll(async () => {
  // 39 tensors, 13 per part: blk.1 straddles parts 1-2 and blk.2 parts 2-3
  model = await splitSyntheticModel(OPTIONS, join(REPO_ROOT, '.cache', 'split-test'), 'tiny', 13);
  whole = await loadModel(model.whole);
  tokenizer = Tokenizer.fromMetadata((await readHeader(model.parts[0]!)).metadata);
  serve = await spawnServe(model.parts[0]!, ['--min-peers', '2']);
  for (const name of ['s0', 's1']) {
    const n = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--name', name, '--no-cache']);
    await n.waitFor(/joined room/);
  }
  joined = await joinReadyRoute(serve);
});

afterAll(() => closeRouteTest(joined, whole));

describe('a split GGUF (three parts written like gguf-split)', () => {
  it('parts carry split.no / split.count / split.tensors.count; the joined header is the unsplit one re-addressed', async () => {
    expect(model.parts.map((p) => p.split('/').pop())).toEqual(['tiny-00001-of-00003.gguf', 'tiny-00002-of-00003.gguf', 'tiny-00003-of-00003.gguf']);
    expect(model.tensorsOf.map((t) => t.length)).toEqual([13, 13, 13]);
    expect(artifactFiles(model.parts[2]!)).toEqual(model.parts);
    for (const [k, p] of model.parts.entries()) {
      const h = await readHeader(p);
      expect([h.metadata['split.no'], h.metadata['split.count'], h.metadata['split.tensors.count']]).toEqual([k, 3, 39]);
      // only the first part holds the model's metadata, as gguf-split writes it
      expect(h.metadata['general.architecture']).toBe(k === 0 ? 'llama' : undefined);
    }
    const art = await readArtifactHeader(model.parts[1]!);
    const unsplit = await readHeader(model.whole);
    expect(art.header.tensors.map((t) => t.name)).toEqual(unsplit.tensors.map((t) => t.name));
    expect(art.header.fileBytes).toBe(model.parts.reduce((a, p) => a + statSync(p).size, 0));
    // a tensor's bytes read through the joined header equal the unsplit file's, for every tensor
    const [a, b] = [await openTensorSource(model.parts[0]!), await openTensorSource(model.whole)];
    try {
      const [fromSplit, fromWhole] = [await a.read(a.header.tensors), await b.read(b.header.tensors)];
      for (const t of unsplit.tensors) expect(Buffer.from(fromSplit.get(t.name)!).equals(Buffer.from(fromWhole.get(t.name)!)), t.name).toBe(true);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it('a part that says it belongs to another split is refused (GGUF_BAD_SPLIT)', async () => {
    const first = await readHeader(model.parts[0]!);
    const { joinSplitHeaders } = await import('../src/gguf/split.ts');
    const files = await Promise.all(model.parts.map(async (p) => ({ location: p, header: await readHeader(p) })));
    files[2] = { ...files[2]!, header: { ...files[2]!.header, metadata: { ...files[2]!.header.metadata, 'split.no': 1 } } };
    let err: unknown;
    try {
      joinSplitHeaders(files);
    } catch (e) {
      err = e;
    }
    expect(isMeshError(err, 'GGUF_BAD_SPLIT')).toBe(true);
    expect(first.metadata['split.count']).toBe(3);
  });

  it('the manifest: sha256 of the parts concatenated, tensors hashed like the unsplit model\'s', async () => {
    const m = (await getJson(`${serve.base}/v1/models/tiny/manifest`, serve.secret)).body;
    const concat = Buffer.concat(model.parts.map((p) => readFileSync(p)));
    expect(m.artifact.sha256).toBe(sha(concat));
    expect(m.artifact.size).toBe(concat.length);
    expect(m.artifact.files.map((f: any) => f.sha256)).toEqual(model.parts.map((p) => sha(readFileSync(p))));
    const ref = await buildManifest(model.whole);
    expect(m.tensors.map((t: any) => [t.name, t.sha256])).toEqual(ref.tensors.map((t) => [t.name, t.sha256]));
    expect(m.tensors.map((t: any) => t.file)).toEqual(model.tensorsOf.flatMap((names, k) => names.map(() => k)));
  });

  it('is one room, one model: the brief counts three files and the artifact\'s bytes', async () => {
    const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
    expect(room.model).toMatchObject({ id: 'tiny', files: 3, nLayer: 4, fileBytes: model.parts.reduce((a, p) => a + statSync(p).size, 0) });
    expect(room.model.url).toMatch(/\/models\/tiny-00001-of-00003\.gguf$/);
    const part3 = await fetch(`${serve.base}/models/tiny-00003-of-00003.gguf`, { headers: { authorization: `Bearer ${serve.secret}`, range: 'bytes=0-3' } });
    expect(part3.status).toBe(206);
    expect(Buffer.from(await part3.arrayBuffer()).toString()).toBe('GGUF');
  });

  it('each node read only its shard\'s tensors, from both parts its layers live in', async () => {
    const m = (await getJson(`${serve.base}/v1/models/tiny/manifest`, serve.secret)).body;
    const route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    expect(route.stages.map((s: any) => [s.shard.start, s.shard.end])).toEqual([[0, 2], [2, 4]]);
    const fetches = (await getJson(`${serve.base}/v1/models/tiny/fetches`, serve.secret)).body.clients;
    for (const st of route.stages) {
      const log = fetches[st.peerId];
      const wanted = shardTensors(m, st.shard.start, st.shard.end);
      expect(new Set(log.files)).toEqual(new Set(wanted.map((t: any) => t.file)));
      expect(new Set(log.files).size).toBe(2);
      // every byte fetched belongs to a wanted tensor of that file (coalescing spans no foreign tensor here)
      log.ranges.forEach(([a, b]: [number, number], i: number) => {
        const inFile = wanted.filter((t: any) => t.file === log.files[i]);
        expect(a).toBeGreaterThanOrEqual(Math.min(...inFile.map((t: any) => t.offset)));
        expect(b + 1).toBeLessThanOrEqual(Math.max(...inFile.map((t: any) => t.offset + t.byte_length)));
      });
      expect(log.bytes).toBe(wanted.reduce((s: number, t: any) => s + t.byte_length, 0));
    }
  });

  it('greedy tokens over the two-node route equal llama.cpp\'s on the unsplit model (and on the split set)', async () => {
    const split = await loadModel(model.parts[0]!); // llama.cpp loads a split from its first part
    try {
      const chain = new RemoteChain(joined);
      for (const prompt of PROMPTS) {
        const promptTokens = tokenizer.encode(prompt);
        expect(promptTokens).toEqual(tokenize(whole, prompt));
        const expected = await greedyGenerate(whole, promptTokens, N);
        expect(await greedyGenerate(split, promptTokens, N)).toEqual(expected);
        const result = await generate(chain, tokenizer, { promptTokens, maxTokens: N, ignoreEog: true });
        expect(result.tokens).toEqual(expected);
      }
    } finally {
      await split.dispose();
    }
  });

  it('local `generate --model <first part>` reads the split like the unsplit file', async () => {
    const run = async (m: string) => {
      const r = await runCli(['generate', '--model', m, '--prompt', PROMPTS[0]!, '--n', String(N), '--json']);
      expect(r.code, r.stderr).toBe(0);
      return (JSON.parse(r.stdout) as { tokens: number[] }).tokens;
    };
    expect(await run(model.parts[0]!)).toEqual(await run(model.whole));
  });

  it('a llama.cpp node copies the three parts (verified per file, progress reported) and serves the split', async () => {
    const other = await spawnServe(model.parts[0]!);
    const node = spawnMesh(['node', '--join', other.joinUrl, '--backend', 'llamacpp', '--name', 'l']);
    await node.waitFor(/joined room/);
    const route = await waitForRoute(other, 'ready');
    expect(route.stages).toHaveLength(1);
    const total = model.parts.reduce((a, p) => a + statSync(p).size, 0);
    expect(route.stages[0].loading).toEqual({ bytesDone: total, bytesTotal: total });
    expect(route.stages[0].bytesRead).toBe(total);
    const r = await runCli(['generate', '--join', other.joinUrl, '--prompt', PROMPTS[1]!, '--n', String(N), '--json']);
    expect(r.code, r.stderr).toBe(0);
    const tokens = (JSON.parse(r.stdout) as { tokens: number[] }).tokens;
    expect(tokens.length).toBeGreaterThan(0); // generation may stop early at an end-of-generation token
    expect(tokens).toEqual((await greedyGenerate(whole, PROMPTS[1]!, N)).slice(0, tokens.length));
  });

  it('a split on a third-party Range host (serve --model <url of the first part>) is one room whose node reads every part by URL', async () => {
    const hub = await startRangeServer();
    try {
      for (const p of model.parts) hub.set(`/hub/${p.split('/').pop()}`, readFileSync(p));
      const remote = await spawnServe(`${hub.url}/hub/tiny-00001-of-00003.gguf`);
      const room = (await getJson(`${remote.base}/v1/rooms/${remote.roomId}`, remote.secret)).body;
      expect(room.model).toMatchObject({ id: 'tiny', files: 3, url: `${hub.url}/hub/tiny-00001-of-00003.gguf` });
      const m = (await getJson(`${remote.base}/v1/models/tiny/manifest`, remote.secret)).body;
      expect(m.artifact.sha256).toBe(sha(Buffer.concat(model.parts.map((p) => readFileSync(p)))));
      const before = hub.requests.length;
      const node = spawnMesh(['node', '--join', remote.joinUrl, '--backend', 'cpu', '--no-cache']);
      await node.waitFor(/joined room/);
      await waitForRoute(remote, 'ready');
      const read = hub.requests.slice(before).filter((r) => r.range);
      expect(new Set(read.map((r) => r.path))).toEqual(new Set(model.parts.map((p) => `/hub/${p.split('/').pop()}`)));
      const r = await runCli(['generate', '--join', remote.joinUrl, '--prompt', PROMPTS[0]!, '--n', String(N), '--json']);
      expect(r.code, r.stderr).toBe(0);
      const tokens = (JSON.parse(r.stdout) as { tokens: number[] }).tokens;
      expect(tokens.length).toBeGreaterThan(0);
      expect(tokens).toEqual((await greedyGenerate(whole, PROMPTS[0]!, N)).slice(0, tokens.length));
    } finally {
      await hub.close();
    }
  });
});
