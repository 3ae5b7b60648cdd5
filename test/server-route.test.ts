// A distributed reference route: `gguf-mesh serve` and three `gguf-mesh node --backend cpu`
// processes on loopback serve stories260K; greedy tokens must equal llama.cpp's, no stage may
// recompute, and closing, expiring or losing a stage must free the KV cache everywhere.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';
import { greedyGenerate, loadModel, tokenize } from './support/llama.ts';
import { closeRouteTest, getJson, joinReadyRoute, roomEventsUntilReady, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { joinRoom, RemoteChain } from '../src/route/remote.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { newSessionId } from '../src/protocol/session.ts';
import { generate } from '../src/route/generation.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { shardTensors } from '../src/backends/shard.ts';
import { encodeFrame, FrameType } from '../src/protocol/frame.ts';
import { decodeJson, tokensFrame } from '../src/protocol/payload.ts';
import { runCli } from './support/cli.ts';
import { HttpLink } from '../src/transport/http.ts';
import { isMeshError } from '../src/errors.ts';

const PROMPTS = ['Once upon a time', 'The little dog', 'Lily and Tom went to the park.'];
const N = 24;

let modelPath: string;
let serve: ServeInfo;
let nodes: MeshProcess[] = [];
let joined: JoinedRoom;
let llamaModel: LlamaModel;
let tokenizer: Tokenizer;

beforeAll(async () => {
  modelPath = await stories260K();
  // a short repair timeout: with no spare in this room a lost stage fails its sessions after it
  serve = await spawnServe(modelPath, ['--min-peers', '3', '--session-ttl', '2', '--repair-timeout', '1000']);
  // memory 1 : 2 : 1 → layers [0,1) [1,4) [4,5)
  // join one after another so the plan (join order) is predictable
  for (const [i, m] of ['1GiB', '2GiB', '1GiB'].entries()) {
    const n = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', m, '--name', `n${i}`, '--no-cache']);
    await n.waitFor(/joined room/);
    nodes.push(n);
  }
  joined = await joinReadyRoute(serve);
  llamaModel = await loadModel(modelPath);
  tokenizer = Tokenizer.fromMetadata((await readHeader(modelPath)).metadata);
});

afterAll(() => closeRouteTest(joined, llamaModel));

describe('serve + three cpu nodes on stories260K', () => {
  it('plans three stages in proportion to memory and reports them', async () => {
    const { body } = await getJson(`${serve.base}/v1/routes`, serve.secret);
    const route = body.routes.at(-1);
    expect(route.status).toBe('ready');
    expect(route.history).toEqual(['forming', 'loading', 'ready']);
    expect(route.stages.map((s: any) => [s.shard.start, s.shard.end])).toEqual([[0, 1], [1, 4], [4, 5]]);
    const peers = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers;
    expect(peers).toHaveLength(3);
    expect(peers.every((p: any) => p.backend === 'cpu' && p.stageStatus === 'ready')).toBe(true);
  });

  it('the room\'s event stream replays the route\'s planning, loading progress and readiness', async () => {
    const events = await roomEventsUntilReady(serve);
    const kinds = events.map((e) => e.type);
    expect(kinds[0]).toBe('route_planned');
    expect(kinds.filter((k) => k === 'stage_ready')).toHaveLength(3);
    const loading = events.filter((e) => e.type === 'stage_loading');
    expect(loading.length).toBeGreaterThanOrEqual(3);
    for (const e of loading.filter((x) => x.bytesDone === x.bytesTotal)) expect(e.bytesTotal).toBeGreaterThan(0);
    expect(new Set(loading.filter((x) => x.bytesDone === x.bytesTotal).map((x) => x.stage))).toEqual(new Set([0, 1, 2]));
    expect(kinds.indexOf('route_status')).toBeGreaterThan(0);
  });

  it('each node read only its shard\'s tensor bytes (the header comes as JSON from the server)', async () => {
    const header = await readHeader(modelPath);
    const { body: route } = await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret);
    const { body: fetches } = await getJson(`${serve.base}/v1/models/stories260K/fetches`, serve.secret);
    for (const st of route.stages) {
      const log = fetches.clients[st.peerId];
      expect(log, `no fetches by ${st.peerId}`).toBeDefined();
      const wanted = shardTensors(header, st.shard, 5);
      const lo = Math.min(...wanted.map((t) => t.offset));
      const hi = Math.max(...wanted.map((t) => t.offset + t.byteLength));
      // every range a node fetched lies inside its shard's tensor span
      const dataReads = log.ranges as Array<[number, number]>;
      expect(dataReads.length).toBeGreaterThan(0);
      for (const [a, b] of dataReads) {
        expect(a).toBeGreaterThanOrEqual(lo);
        expect(b + 1).toBeLessThanOrEqual(hi);
      }
    }
  });

  it('greedy tokens over the route equal llama.cpp\'s for several prompts', async () => {
    const chain = new RemoteChain(joined);
    for (const prompt of PROMPTS) {
      const promptTokens = tokenizer.encode(prompt);
      expect(promptTokens).toEqual(tokenize(llamaModel, prompt));
      const expected = await greedyGenerate(llamaModel, promptTokens, N);
      const result = await generate(chain, tokenizer, { promptTokens, maxTokens: N, prefillChunk: 3 });
      expect(result.tokens.slice(0, expected.length)).toEqual(expected.slice(0, result.tokens.length));
      expect(result.tokens.length).toBeGreaterThan(5);
    }
  });

  it('`generate --join` prints the same JSON tokens as llama.cpp\'s greedy continuation', async () => {
    const expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
    const r = await runCli(['generate', '--join', serve.joinUrl.replace(/#.*/, ''), '--secret', serve.secret, '--prompt', 'Once upon a time', '--n', String(N), '--json']);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { prompt_tokens: number[]; tokens: number[]; text: string };
    expect(out.prompt_tokens).toEqual(STORIES_PROMPT_TOKENS);
    expect(out.tokens).toEqual(expected);
    expect(out.text.startsWith(', there was a little girl named Lily.')).toBe(true);
  });

  it('stage sampling: the last stage samples, every stage processed prompt + fed tokens once, and close frees all KV', async () => {
    const expected = await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, N);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 2)];
    while (tokens.length < N) tokens.push(await c.decode(tokens.at(-1)!));
    expect(tokens).toEqual(expected);
    const fed = STORIES_PROMPT_TOKENS.length + N - 1; // the last sampled token is never fed
    const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    expect(info).toMatchObject({ state: 'idle', position: fed, promptTokens: STORIES_PROMPT_TOKENS.length, generatedTokens: N });
    expect(info.stages).toHaveLength(3);
    for (const st of info.stages) {
      expect(st.processedTokens).toEqual(new Array(st.shard.end - st.shard.start).fill(fed));
      expect(st.kvBytes).toBeGreaterThan(0);
    }
    await c.close();
    const after = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    expect(after.state).toBe('closed');
    for (const st of after.stages) expect(st.kvBytes).toBe(0);
  });

  it('the binary HTTP session endpoints of the server drive the same route', async () => {
    const link = new HttpLink(serve.base, { authorization: `Bearer ${serve.secret}` });
    const c = await RouteSessionClient.open(link, joined.routeId, { contextLength: 64 });
    const tokens = [await c.prefill(STORIES_PROMPT_TOKENS, 3)];
    while (tokens.length < 12) tokens.push(await c.decode(tokens.at(-1)!));
    expect(tokens).toEqual((await greedyGenerate(llamaModel, STORIES_PROMPT_TOKENS, 12)));
    await c.close();
    expect((await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body.state).toBe('closed');
  });

  it('an idle session expires after the TTL and every stage frees it', async () => {
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 32 });
    await c.prefill(STORIES_PROMPT_TOKENS);
    await new Promise((r) => setTimeout(r, 3500));
    const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    expect(info.state).toBe('expired');
    for (const st of info.stages) expect(st.kvBytes).toBe(0);
  });

  it('a client whose WebSocket drops has its sessions cancelled and every stage freed', async () => {
    const other = await joinRoom(serve.joinUrl, serve.secret);
    const c = await RouteSessionClient.open(other.link, other.routeId, { contextLength: 32 });
    await c.prefill(STORIES_PROMPT_TOKENS);
    await other.close();
    let info: any;
    for (let i = 0; i < 50; i++) {
      info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
      if (info.state === 'closed' && info.stages.every((st: any) => st.kvBytes === 0)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(info.state).toBe('closed');
    for (const st of info.stages) expect(st.kvBytes).toBe(0);
  });

  it('refuses a wrong secret everywhere: HTTP, client WebSocket, node join', async () => {
    expect((await getJson(`${serve.base}/v1/routes`, 'wrong')).status).toBe(401);
    expect((await fetch(`${serve.base}/models/stories260K.gguf`, { headers: { range: 'bytes=0-3' } })).status).toBe(401);
    await expect(joinRoom(serve.joinUrl, 'wrong', 1000)).rejects.toMatchObject({ code: 'AUTH_FAILED' });
    const r = await runCli(['node', '--join', serve.joinUrl.replace(/#.*/, ''), '--secret', 'wrong'], { timeoutMs: 30_000 });
    expect(r.code).not.toBe(0);
    expect(r.stderr + r.stdout).toContain('AUTH_FAILED');
  });

  it('answers malformed frames, unknown sessions and out-of-order positions with typed errors', async () => {
    const auth = { authorization: `Bearer ${serve.secret}` };
    const sid = newSessionId();
    const garbage = await fetch(`${serve.base}/v1/sessions/${sid}/prefill`, { method: 'POST', headers: auth, body: new Uint8Array(80).fill(7) });
    expect(garbage.status).toBe(400);
    expect(decodeJson<{ code: string }>(new Uint8Array(await garbage.arrayBuffer()).subarray(52)).code).toBe('FRAME_BAD_MAGIC');
    const unknown = await fetch(`${serve.base}/v1/sessions/${sid}/decode`, { method: 'POST', headers: auth, body: encodeFrame(tokensFrame(FrameType.Decode, { routeId: joined.routeId, sessionId: sid }, 0, [1])) });
    expect(unknown.status).toBe(404);
    expect((await getJson(`${serve.base}/v1/sessions/${sid}`, serve.secret)).status).toBe(404);
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 32 });
    await c.prefill([1, 403]);
    const ooo = await fetch(`${serve.base}/v1/sessions/${c.sessionId}/decode`, { method: 'POST', headers: auth, body: encodeFrame(tokensFrame(FrameType.Decode, { routeId: joined.routeId, sessionId: c.sessionId }, 5, [407])) });
    expect(ooo.status).toBe(409);
    expect(decodeJson<{ code: string }>(new Uint8Array(await ooo.arrayBuffer()).subarray(52)).code).toBe('POSITION_MISMATCH');
    await c.decode(407); // the refused frame changed nothing
    expect(c.position).toBe(3);
    await c.close();
  });

  it('a node killed mid-session fails the session naming its stage; the other stages are freed', async () => {
    const c = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: 64 });
    let t = await c.prefill(STORIES_PROMPT_TOKENS);
    t = await c.decode(t);
    const route0 = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    expect(route0.stages[1].peerId.startsWith('n1-')).toBe(true);
    await nodes[1]!.kill('SIGKILL'); // stage 1, layers [1,4)
    let err: unknown;
    try {
      await new Promise((r) => setTimeout(r, 300));
      await c.decode(t);
    } catch (e) {
      err = e;
    }
    expect(isMeshError(err)).toBe(true);
    expect((err as { details?: { stage?: number } }).details?.stage).toBe(1);
    const info = (await getJson(`${serve.base}/v1/sessions/${c.sessionId}`, serve.secret)).body;
    expect(info.state).toBe('failed');
    expect(info.failure.stage).toBe(1);
    expect(info.stages[1].reachable).toBe(false);
    expect(info.stages[0].kvBytes).toBe(0);
    expect(info.stages[2].kvBytes).toBe(0);
    let route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    for (let i = 0; i < 50 && route.status !== 'degraded'; i++) {
      await new Promise((r) => setTimeout(r, 100));
      route = (await getJson(`${serve.base}/v1/routes/${joined.routeId}`, serve.secret)).body;
    }
    expect(route.status).toBe('degraded');
    expect(route.reason).toContain('stage 1');
  });
});
