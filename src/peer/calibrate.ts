// A peer's own speed, measured once it joins: one layer of the room's model loaded on its own
// backend (only that layer's bytes are read, verified like any shard), a few decode steps and
// one prefill chunk through it, then released. The planner (route/speed-planner.ts) reads the
// result from the hello; the server refreshes the decode figure from the stage timings of live
// steps (signaling-server/live-speed.ts).

import { MeshError } from '../errors.ts';
import type { PeerSpeed } from '../protocol/control.ts';
import type { LoadContext, ShardLoad, Standby } from './peer-core.ts';

/** Decode steps timed (after untimed warm-ups: the first passes allocate and compile) and the prefill chunk's length. */
const WARM_STEPS = 3;
const DECODE_STEPS = 8;
const PREFILL_TOKENS = 16;
/** Forward passes one calibration runs (two prefill chunks, then the decode steps): `node --test-slow-after` counts them. */
export const CALIBRATION_PASSES = 2 + WARM_STEPS + DECODE_STEPS;

export interface CalibrationTarget {
  /** where the room's model is read */
  modelUrl: string;
  nLayer: number;
  nEmbd: number;
}

/** Loads one middle layer (no embedding, no head), times it, frees it. */
export async function calibrate(load: (ctx: LoadContext) => Promise<ShardLoad>, t: CalibrationTarget): Promise<PeerSpeed> {
  const layer = t.nLayer >= 3 ? 1 : 0;
  const standby: Standby = { t: 'standby', routeId: 0, stage: layer === 0 ? 0 : 1, shard: { start: layer, end: layer + 1 }, nLayer: t.nLayer, modelUrl: t.modelUrl };
  const undo: Array<() => Promise<unknown>> = [];
  const ctx: LoadContext = { assignment: standby, current: true, keep: (thing, u) => (undo.push(() => u(thing)), thing) };
  try {
    const { backend } = await load(ctx);
    const id = '0'.repeat(31) + 'c';
    await backend.openSession(id, { contextLength: 2 * PREFILL_TOKENS + WARM_STEPS + DECODE_STEPS + 2 });
    const input = (n: number): Parameters<typeof backend.forward>[1] => (layer === 0 ? { kind: 'tokens', tokens: new Int32Array(n).fill(1) } : { kind: 'hidden', hidden: new Float32Array(n * t.nEmbd).fill(0.01), nTokens: n });
    // the least of each: a shared machine only ever adds time
    let prefillMs = Infinity;
    for (let i = 0; i < 2; i++) prefillMs = Math.min(prefillMs, (await backend.forward(id, input(PREFILL_TOKENS), i * PREFILL_TOKENS)).computeMs);
    let decodeMs = Infinity;
    for (let i = 0; i < WARM_STEPS + DECODE_STEPS; i++) {
      const r = await backend.forward(id, input(1), 2 * PREFILL_TOKENS + i);
      if (i >= WARM_STEPS) decodeMs = Math.min(decodeMs, r.computeMs);
    }
    await backend.releaseSession(id);
    return { decodeMsPerLayer: decodeMs, prefillMsPerTokenLayer: prefillMs / PREFILL_TOKENS, source: 'calibration' };
  } catch (e) {
    throw new MeshError('CALIBRATION_FAILED', `calibrating this peer's speed on layer ${layer} failed: ${(e as Error).message}`);
  } finally {
    for (const u of undo.reverse()) await u().catch(() => undefined);
  }
}
