// A Rewind is a fence on a stage (peer/stage-service.ts): the session's frames still queued
// there when it comes are dropped (SESSION_REWOUND), the one computing neither logs nor goes
// downstream, and a late failure of a chunk passed on before it is not the session's. A repair
// rewinds the survivors first to last before opening new peers (route/repair.ts), so once a
// survivor's rewind answers nothing stale reaches the stage after it. Without the fence a
// pipelined chunk in flight when a stage was lost reached its replacement ahead of the replay:
// "stage 1: session … is at position 16, forward was asked for position 0" (CI, kill -9 of a
// middle stage during a pipelined prefill). Real stages: the CPU engine on stories260K, split
// in two, stage 0's next stage an ordered link that records what arrives.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { isMeshError, MeshError } from '../src/errors.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import { StageService } from '../src/peer/stage-service.ts';
import { FrameType, makeFrame } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { decodeJson, jsonFrame, repairFrame, tokensFrame } from '../src/protocol/payload.ts';
import type { FrameLink } from '../src/transport/link.ts';
import { stories260K } from './support/models.ts';

const SID = 'ef'.repeat(16);
const at = { routeId: 1, sessionId: SID };
const CHUNK = 16;
const CHUNKS = 6;
const TOKENS = Array.from({ length: CHUNK * CHUNKS }, (_, i) => 1 + ((i * 37) % 500));

let source: TensorSource;
let first: StageService;
let second: StageService;
/** frames stage 0 passed on, in arrival order */
const arrived: Frame[] = [];
/** while set, stage 1 fails every frame (a peer that broke) */
let broken: MeshError | null = null;

/** Stage 0's next stage: ordered (so prefill chunks are pipelined), recording, and breakable. */
const downstream: FrameLink = {
  remote: 'stage-1',
  ordered: true,
  async request(f: Frame): Promise<Frame> {
    arrived.push(f);
    if (broken) throw broken;
    return second.handle(f);
  },
  async close(): Promise<void> {},
};

beforeAll(async () => {
  source = await openTensorSource(await stories260K());
  const a = new CpuBackend();
  await a.load(source, { start: 0, end: 2 });
  const b = new CpuBackend();
  await b.load(source, { start: 2, end: 5 });
  first = new StageService({ backend: a, stage: 0, shard: { start: 0, end: 2 }, nLayer: 5, downstream });
  second = new StageService({ backend: b, stage: 1, shard: { start: 2, end: 5 }, nLayer: 5, downstream: null });
});
afterAll(async () => {
  await first.releaseAll();
  await second.releaseAll();
  await source.close();
});

const chunk = (j: number): Frame => tokensFrame(FrameType.Prefill, at, j * CHUNK, TOKENS.slice(j * CHUNK, (j + 1) * CHUNK));
const position = (s: StageService): number => s.sessionStatus(SID).position as number;

describe('a Rewind fences the stage', () => {
  it('drops the queued chunks, keeps the computing one from going on, and the replay then runs cleanly', async () => {
    for (const s of [first, second]) await s.handle(jsonFrame(FrameType.SessionOpen, at, { contextLength: 256 }));
    // every chunk is sent at once (as the session manager pipelines a prompt), the rewind right behind them
    const answers = Array.from({ length: CHUNKS }, (_, j) => first.handle(chunk(j)).then(() => 'ok', (e: unknown) => e));
    await new Promise((r) => setImmediate(r)); // the first chunk is computing
    const rewound = await first.handle(repairFrame(FrameType.Rewind, at, 0, { draws: 0 }));
    expect(decodeJson<{ position: number }>(rewound.payload).position).toBe(0);
    const passedOnBefore = arrived.length;
    const outcomes = await Promise.all(answers);
    const dropped = outcomes.filter((o) => isMeshError(o) && o.code === 'SESSION_REWOUND');
    expect(dropped.length, JSON.stringify(outcomes.map((o) => (isMeshError(o) ? o.code : o)))).toBeGreaterThanOrEqual(CHUNKS - 1);
    expect(outcomes.filter((o) => o !== 'ok' && !(isMeshError(o) && o.code === 'SESSION_REWOUND'))).toEqual([]);
    await new Promise((r) => setTimeout(r, 50));
    expect(arrived.length, 'nothing left stage 0 after its rewind answered').toBe(passedOnBefore);
    expect(position(first)).toBe(0);

    // what did reach stage 1 is forgotten there too; the replay of the whole prompt then holds every position
    await second.handle(repairFrame(FrameType.Rewind, at, 0, { draws: 0 }));
    for (let j = 0; j < CHUNKS; j++) await first.handle(chunk(j));
    await new Promise((r) => setTimeout(r, 50));
    await second.handle(jsonFrame(FrameType.Status, at, {})); // stage 1's lane is past the chunks
    expect(position(first)).toBe(CHUNK * CHUNKS);
    expect(position(second)).toBe(CHUNK * CHUNKS);
    for (const s of [first, second]) await s.handle(makeFrame({ type: FrameType.SessionClose, ...at }));
  }, 60_000);

  it("a pipelined chunk's failure that comes back after the rewind is not the session's", async () => {
    arrived.length = 0;
    for (const s of [first, second]) await s.handle(jsonFrame(FrameType.SessionOpen, at, { contextLength: 256 }));
    broken = new MeshError('LINK_CLOSED', 'the old stage 1 is gone');
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const slow: FrameLink = { ...downstream, request: async (f) => (await held, downstream.request(f)) };
    first.setDownstream(slow);
    await first.handle(chunk(0)); // passed on; its failure comes back later
    await first.handle(repairFrame(FrameType.Rewind, at, 0, { draws: 0 }));
    release();
    await new Promise((r) => setTimeout(r, 20));
    broken = null;
    first.setDownstream(downstream);
    // the replay's chunk is not refused with the old link's failure
    const reply = await first.handle(chunk(0));
    expect(reply.type).toBe(FrameType.Status);
    expect(position(first)).toBe(CHUNK);
    for (const s of [first, second]) await s.handle(makeFrame({ type: FrameType.SessionClose, ...at }));
  }, 60_000);
});
