// Pipelined prefill over real processes (serve + three CPU nodes, stories260K): the session
// manager answers a prefill chunk nobody waits on at once and sends it on (route/prefill-pipeline.ts),
// so the client's chunks queue on stage 0 while the stages compute the ones before. A long
// prompt prefilled so gives llama.cpp's greedy tokens and the same tokens as the prompt sent
// stage by stage (every chunk's answer awaited from the last stage); a stage killed while
// chunks are in flight is repaired from a warm spare with the same tokens, and without a spare
// the session fails naming the stage. The nodes run with --test-slow-factor so a chunk takes
// a few milliseconds on every stage and chunks really are in flight together.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LlamaModel } from 'node-llama-cpp';
import { stories260K } from './support/models.ts';
import { getJson, killAll, spawnMesh, spawnServe } from './support/mesh.ts';
import type { MeshProcess, ServeInfo } from './support/mesh.ts';
import { greedyGenerate, loadModel, tokenize } from './support/llama.ts';
import { joinRoom } from '../src/route/remote.ts';
import type { JoinedRoom } from '../src/route/remote.ts';
import { RouteSessionClient } from '../src/route/client.ts';
import { FrameType } from '../src/protocol/frame.ts';
import { decodeJson, tokensFrame } from '../src/protocol/payload.ts';
import { isMeshError } from '../src/errors.ts';

const STAGES = ['0-2', '2-3', '3-5'];
const CHUNK = 16;
const N_DECODE = 24;
const TEXT =
  'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball under a tree. ' +
  'She ran to the ball and picked it up. Her friend Tom came and said, "Can I play with the ball too?" Lily said yes and they played together all day. ' +
  'When the sun went down, their mom called them home. Lily was happy and tired. She said thank you to Tom and went to bed. ' +
  'The next day, Lily and Tom went back to the park. They saw a small dog who was sad and alone. They gave the dog some water and a hug, and the dog wagged its tail. ';

let serve: ServeInfo;
let joined: JoinedRoom;
let llama: LlamaModel;
let prompt: number[];
let expected: number[];
const nodes = new Map<string, MeshProcess>();
let spawned = 0;

function spawnNode(layers: string): MeshProcess {
  const name = `p${spawned++}`;
  const proc = spawnMesh(['node', '--join', serve.joinUrl, '--backend', 'cpu', '--memory', '1GiB', '--layers', layers, '--name', name, '--test-slow-factor', '25']);
  nodes.set(name, proc);
  return proc;
}

async function route(): Promise<any> {
  const room = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}`, serve.secret)).body;
  return room.route ? (await getJson(`${serve.base}/v1/routes/${room.route.id}`, serve.secret)).body : null;
}

/** Polls until the route is ready and stage `stage` has `spares` ready spares. */
async function readyWith(stage: number, spares: number): Promise<any> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await route();
    if (r?.status === 'ready' && r.spares.filter((s: any) => s.stage === stage && s.status === 'ready').length >= spares) return r;
    if (Date.now() > deadline) throw new Error(`no ready route with ${spares} spares for stage ${stage}: ${JSON.stringify(r)}\n${serve.proc.output().slice(-3000)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

async function stageProcess(stage: number): Promise<MeshProcess> {
  const r = await route();
  return nodes.get(String(r.stages[stage].peerId).split('-')[0]!)!;
}

/**
 * The prompt sent chunk by chunk without waiting for any chunk to be computed (every answer but
 * the last is the session manager's `queued` until the fault), `fault` run after chunk `faultAfter`; then greedy decode.
 */
async function pipelined(faultAfter = -1, fault: () => Promise<void> = async () => undefined): Promise<{ tokens: number[]; client: RouteSessionClient }> {
  const client = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + N_DECODE + 8 });
  const at = { routeId: joined.routeId, sessionId: client.sessionId };
  const lastAt = Math.floor((prompt.length - 1) / CHUNK) * CHUNK;
  for (let i = 0; i < lastAt; i += CHUNK) {
    const reply = await joined.link.request(tokensFrame(FrameType.Prefill, at, i, prompt.slice(i, i + CHUNK)));
    // (once a stage is lost a chunk waits for the repair, like any step)
    if (faultAfter < 0 || i / CHUNK <= faultAfter) expect(decodeJson<{ queued?: boolean }>(reply.payload).queued).toBe(true);
    if (i / CHUNK === faultAfter) await fault();
  }
  client.position = lastAt;
  const tokens = [await client.prefill(prompt.slice(lastAt), CHUNK)];
  while (tokens.length < N_DECODE) tokens.push(await client.decode(tokens.at(-1)!));
  return { tokens, client };
}

beforeAll(async () => {
  const model = await stories260K();
  llama = await loadModel(model);
  prompt = tokenize(llama, TEXT);
  expected = await greedyGenerate(llama, prompt, N_DECODE);
  serve = await spawnServe(model, ['--min-peers', '3', '--heartbeat', '500', '--heartbeat-timeout', '2500', '--repair-timeout', '6000']);
  for (const layers of STAGES) await spawnNode(layers).waitFor(/joined room/);
  spawnNode(STAGES[1]!); // a warm spare for the middle stage
  await readyWith(1, 1);
  joined = await joinRoom(serve.joinUrl, serve.secret);
}, 120_000);

afterAll(async () => {
  await joined?.close();
  await llama?.dispose();
  await killAll();
});

describe('pipelined prefill on serve + three CPU nodes', () => {
  it(`a long prompt in ${CHUNK}-token chunks gives llama.cpp's tokens, and the same as stage by stage`, async () => {
    expect(prompt.length).toBeGreaterThan(150);
    const { tokens, client } = await pipelined();
    expect(tokens).toEqual(expected);
    await client.close();
    // stage by stage: every chunk's answer (its last row sampled) comes from the last stage before the next chunk goes
    const serial = await RouteSessionClient.open(joined.link, joined.routeId, { contextLength: prompt.length + N_DECODE + 8 });
    let tok = -1;
    for (let i = 0; i < prompt.length; i += CHUNK) tok = await serial.prefill(prompt.slice(i, i + CHUNK), CHUNK);
    const serialTokens = [tok];
    while (serialTokens.length < N_DECODE) serialTokens.push(await serial.decode(serialTokens.at(-1)!));
    expect(serialTokens).toEqual(expected);
    await serial.close();
  }, 60_000);

  it('kill -9 of the middle stage while chunks are in flight: repaired from the spare, the same tokens', async () => {
    await readyWith(1, 1);
    const victim = await stageProcess(1);
    const { tokens, client } = await pipelined(0, async () => void (await victim.kill('SIGKILL')));
    expect(tokens).toEqual(expected);
    const info = await client.info();
    expect(info.repairs).toBeGreaterThanOrEqual(1);
    expect(info.state).toBe('idle');
    await client.close();
  }, 60_000);

  it('the same loss with no spare left: the session fails naming the stage', async () => {
    const r = await route();
    expect(r.spares.filter((s: any) => s.stage === 1 && s.status === 'ready')).toEqual([]);
    const victim = await stageProcess(1);
    let caught: unknown = null;
    try {
      await pipelined(0, async () => void (await victim.kill('SIGKILL')));
    } catch (e) {
      caught = e;
    }
    expect(isMeshError(caught), String(caught)).toBe(true);
    expect((caught as { details?: { stage?: number } }).details?.stage).toBe(1);
  }, 60_000);
});
