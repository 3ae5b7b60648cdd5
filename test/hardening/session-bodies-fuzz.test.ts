// The JSON bodies a stage reads from frames — SessionOpen, Rewind, Resend (session repair) and
// a session Status query — fuzzed from their schemas (protocol/session.ts SESSION_BODIES): every
// field mistyped, missing and extra, sent as real frames to a real stage (the CPU engine on
// stories260K, one stage holding every layer). Each bad body is a BAD_REQUEST naming the field;
// nothing else escapes, the session it aimed at is untouched, and the stage still generates.
import * as v from 'valibot';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../../src/backends/cpu/backend.ts';
import { MeshError } from '../../src/errors.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import type { TensorSource } from '../../src/gguf/types.ts';
import { StageService } from '../../src/peer/stage-service.ts';
import { DType, FrameType, makeFrame } from '../../src/protocol/frame.ts';
import type { Frame } from '../../src/protocol/frame.ts';
import { decodeI32, decodeJson, jsonFrame, tokensFrame } from '../../src/protocol/payload.ts';
import { SESSION_BODIES } from '../../src/protocol/session.ts';
import { stories260K } from '../support/models.ts';
import { STORIES_PROMPT_TOKENS } from '../support/models.ts';
import { GARBAGE, variantsOf } from './fuzz-values.ts';

const SID = 'ab'.repeat(16);
const OTHER = 'cd'.repeat(16);
const at = (sessionId: string) => ({ routeId: 1, sessionId });
let source: TensorSource;
let stage: StageService;

beforeAll(async () => {
  source = await openTensorSource(await stories260K());
  const backend = new CpuBackend();
  await backend.load(source, { start: 0, end: 5 });
  stage = new StageService({ backend, stage: 0, shard: { start: 0, end: 5 }, nLayer: 5, downstream: null });
});
afterAll(async () => {
  await stage.releaseAll();
  await source.close();
});

/** The frame a body of `kind` travels in. */
function frameOf(kind: keyof typeof SESSION_BODIES, body: unknown): Frame {
  const text = JSON.stringify(body);
  const payload = new TextEncoder().encode(text === undefined ? 'null' : text);
  const type = { 'session open': FrameType.SessionOpen, rewind: FrameType.Rewind, resend: FrameType.Resend, 'status query': FrameType.Status }[kind];
  return makeFrame({ type, ...at(kind === 'session open' ? OTHER : SID), position: kind === 'rewind' ? 3 : 0, dtype: DType.Json, payload });
}

const VALID: Record<keyof typeof SESSION_BODIES, Record<string, unknown>> = {
  'session open': { contextLength: 64, sampler: { temperature: 0.5, topK: 4, topP: 0.9, seed: 7 }, hiddenDtype: 'f32', promptLength: 5, draws: 0 },
  rewind: { draws: 0 },
  resend: { end: 5, maxTokens: 1 },
  'status query': { sentHashes: [0, 5], receivedHashes: [0, 5] },
};

describe('session frame bodies', () => {
  it('every mistyped, missing or extra field is BAD_REQUEST naming it; the stage still generates', async () => {
    await stage.handle(jsonFrame(FrameType.SessionOpen, at(SID), { contextLength: 64 }));
    await stage.handle(tokensFrame(FrameType.Prefill, at(SID), 0, STORIES_PROMPT_TOKENS));
    let refused = 0;
    for (const [kind, schema] of Object.entries(SESSION_BODIES) as Array<[keyof typeof SESSION_BODIES, (typeof SESSION_BODIES)[keyof typeof SESSION_BODIES]]>) {
      const variants = [...variantsOf(schema, VALID[kind]), ...GARBAGE.map((g) => ({ label: `garbage ${JSON.stringify(g)}`, message: g, field: null, valid: !Array.isArray(g) && v.safeParse(schema, g).success }))];
      for (const variant of variants) {
        if (variant.valid) continue; // valid ones would change the session (a rewind): their parse is covered by the schema
        let err: unknown = null;
        try {
          await stage.handle(frameOf(kind, variant.message));
        } catch (e) {
          err = e;
        }
        // the body is parsed before anything acts on it: a resend on this last stage would be refused for having no next stage only after
        expect(err, `${kind}: ${variant.label}`).toBeInstanceOf(MeshError);
        expect((err as MeshError).code, `${kind}: ${variant.label}: ${(err as Error).message}`).toBe('BAD_REQUEST');
        if (variant.field) expect((err as MeshError).details?.field, `${kind}: ${variant.label}`).toContain(variant.field);
        refused++;
      }
    }
    expect(refused).toBeGreaterThan(80);
    // the session is where it was, and goes on as before
    const status = decodeJson<{ position: number }>((await stage.handle(jsonFrame(FrameType.Status, at(SID), {}))).payload);
    expect(status.position).toBe(STORIES_PROMPT_TOKENS.length);
    const next = await stage.handle(tokensFrame(FrameType.Decode, at(SID), STORIES_PROMPT_TOKENS.length, [STORIES_PROMPT_TOKENS[1]!]));
    expect(next.type).toBe(FrameType.Token);
    expect(decodeI32(next.payload)[0]).toBeLessThan(512);
    expect(stage.openSessions).toBe(1);
  });
});
