// Rebuilding one session on a repaired route, without recomputing the stages that survived.
//
// A session knows every frame it sent into stage 0 (its history) and how far the last stage
// confirmed it (`confirmed`: the position every stage holds, and the sampler draws made up to
// it). When a stage's peer changed, the session is opened on the new peer and rebuilt:
//
//   1. every surviving stage rewinds to the confirmed position (a step in flight when the loss
//      happened may have reached some of them; its frames still queued there are dropped) and
//      restarts its sampler after the confirmed draws — so the step can be sent again and
//      samples exactly what it would have; then the new peers open the session;
//   2. a new stage 0 replays the token history (the session has it); a new stage k > 0 gets the
//      hidden states stage k − 1 logged when it sent them (stage-service's Resend: they go peer
//      to peer, n_embd × 2 bytes per token, and only stage k computes);
//   3. where the stage after a new one survived, the hashes of the rows it received from the
//      lost peer are compared with the rows the new peer computed: the first position that
//      differs is reported (null: identical; a last stage is not checked).
//
// Backends whose results do not depend on how rows are batched (the CPU reference) replay in
// chunks of REPLAY_CHUNK tokens; the others replay frame by frame, as the positions were first
// computed, so the rebuilt KV cache is bit-identical either way.

import { MeshError } from '../errors.ts';
import { FrameFlag, FrameType, makeFrame } from '../protocol/frame.ts';
import type { Frame } from '../protocol/frame.ts';
import { decodeJson, jsonFrame, repairFrame, tokensFrame } from '../protocol/payload.ts';
import type { RewindBody, SessionOpenBody } from '../protocol/session.ts';
import type { FrameLink } from '../transport/link.ts';

/** Tokens per replay frame where the backend is batch-invariant. */
export const REPLAY_CHUNK = 256;

/** Backends whose output rows do not depend on how many rows a forward holds. */
const BATCH_INVARIANT = new Set(['cpu']);

/** One frame a session sent into stage 0. */
export interface HistoryEntry {
  type: FrameType.Prefill | FrameType.Decode;
  position: number;
  tokens: Int32Array;
  flags: number;
}

/** The token ids the history's frames fed from position `from` on, in order (the penalties' history). */
export function historyTokens(history: readonly HistoryEntry[], from: number): number[] {
  const out: number[] = [];
  for (const h of history) for (let i = 0; i < h.tokens.length; i++) if (h.position + i >= from) out.push(h.tokens[i]!);
  return out;
}

/** The history's frames before position p (a frame straddling p cut there). */
export function historyBefore(history: readonly HistoryEntry[], p: number): HistoryEntry[] {
  const out: HistoryEntry[] = [];
  for (const h of history) {
    if (h.position >= p) break;
    out.push(h.position + h.tokens.length <= p ? h : { ...h, tokens: h.tokens.slice(0, p - h.position) });
  }
  return out;
}

/** What a rebuild needs to know about the session. */
export interface RebuildTarget {
  sessionId: string;
  routeId: number;
  body: SessionOpenBody;
  history: readonly HistoryEntry[];
  /** history[0, confirmedEntries) reached the last stage */
  confirmedEntries: number;
  confirmedPosition: number;
  confirmedDraws: number;
  /** the peer of each stage when the session last had its KV there */
  peers: readonly string[];
}

export interface RebuildResult {
  /** stages opened and rebuilt on new peers */
  stages: number[];
  peers: string[];
  tokensReplayed: number;
  /** bytes of hidden states resent peer to peer, and of tokens replayed into stage 0 */
  bytesReplayed: number;
  /** first position whose hidden state from a new stage differs from the lost one's (null: none, or not checked) */
  firstDivergentPosition: number | null;
  divergenceChecked: boolean;
}

/** Stages whose peer is not the one the session last used. */
export function replacedStages(sessionPeers: readonly string[], routePeers: readonly string[]): number[] {
  return routePeers.flatMap((p, i) => (p !== sessionPeers[i] ? [i] : []));
}

/** The confirmed history as frames for a new stage 0: merged up to `maxTokens` where that does not change results. */
export function historyChunks(history: readonly HistoryEntry[], entries: number, maxTokens: number): Array<{ position: number; tokens: number[] }> {
  const out: Array<{ position: number; tokens: number[] }> = [];
  for (const h of history.slice(0, entries)) {
    const prev = out[out.length - 1];
    if (prev && maxTokens > 1 && prev.position + prev.tokens.length === h.position && prev.tokens.length + h.tokens.length <= maxTokens) prev.tokens.push(...h.tokens);
    else out.push({ position: h.position, tokens: [...h.tokens] });
  }
  return out;
}

function linkOf(links: ReadonlyArray<FrameLink | null>, stage: number): FrameLink {
  const l = links[stage];
  if (!l) throw new MeshError('STAGE_UNREACHABLE', `stage ${stage} has no peer`, { stage });
  return l;
}

/** Every stage forgets the session's positions from `position` on (a Rewind with `body`); STAGE_UNREACHABLE where a stage has no peer. */
export async function rewindEveryStage(links: ReadonlyArray<FrameLink | null>, at: { routeId: number; sessionId: string }, position: number, body: RewindBody): Promise<void> {
  await Promise.all(links.map(async (_, i) => linkOf(links, i).request(repairFrame(FrameType.Rewind, at, position, body))));
}

/** Asks `stage` for row hashes of what it sent or received over [0, end). */
async function hashes(link: FrameLink, t: RebuildTarget, which: 'sentHashes' | 'receivedHashes', end: number): Promise<number[]> {
  const r = await link.request(jsonFrame(FrameType.Status, { routeId: t.routeId, sessionId: t.sessionId }, { [which]: [0, end] }));
  return decodeJson<Record<string, number[] | undefined>>(r.payload)[which] ?? [];
}

/**
 * Opens the session on the stages whose peer changed, rewinds the others to the confirmed
 * position, and rebuilds each new stage's KV cache (see the top of this file).
 */
export async function rebuildSession(t: RebuildTarget, links: ReadonlyArray<FrameLink | null>, routePeers: readonly string[], backends: readonly string[]): Promise<RebuildResult> {
  const at = { routeId: t.routeId, sessionId: t.sessionId };
  const replaced = replacedStages(t.peers, routePeers);
  const end = t.confirmedPosition;
  const isNew = new Set(replaced);
  const last = routePeers.length - 1;
  // 1. rewind the survivors, first to last, then open on the new peers (sampler after the
  //    confirmed draws). The order matters: a survivor's rewind drops the session's frames still
  //    queued or computing there, so once it answers nothing stale leaves it for the stage after
  //    (a new peer opened before that could compute a pipelined chunk the replay sends again).
  for (const i of routePeers.keys()) {
    if (isNew.has(i)) continue;
    const tokens = t.body.tokens ? { tokens: historyTokens(t.history, end) } : {};
    await linkOf(links, i).request(repairFrame(FrameType.Rewind, at, end, { draws: t.confirmedDraws, ...tokens } satisfies RewindBody));
  }
  await Promise.all(
    replaced.map(async (i) => {
      const link = linkOf(links, i);
      await link.request(makeFrame({ type: FrameType.SessionClose, ...at })).catch(() => undefined); // left by an earlier attempt
      // a penalised session's new last stage learns every token fed so far
      const tokens = t.body.tokens ? { tokens: historyTokens(t.history, 0) } : {};
      await link.request(jsonFrame(FrameType.SessionOpen, at, { ...t.body, ...tokens, draws: t.confirmedDraws } satisfies SessionOpenBody));
    }),
  );
  // 2. rebuild the new stages, first to last (a new stage's log feeds the next new one)
  let bytesReplayed = 0;
  for (const r of replaced) {
    if (end === 0) break;
    const maxTokens = BATCH_INVARIANT.has(backends[r] ?? '') ? REPLAY_CHUNK : 1;
    if (r === 0) {
      for (const c of historyChunks(t.history, t.confirmedEntries, maxTokens)) {
        await linkOf(links, 0).request(tokensFrame(FrameType.Prefill, at, c.position, c.tokens, FrameFlag.Replay));
        bytesReplayed += c.tokens.length * 4;
      }
    } else {
      const reply = await linkOf(links, r - 1).request(repairFrame(FrameType.Resend, at, 0, { end, maxTokens }));
      bytesReplayed += Number(decodeJson<{ bytes?: number }>(reply.payload).bytes ?? 0);
    }
  }
  // 3. did a new stage compute what the lost one had sent?
  let firstDivergentPosition: number | null = null;
  let divergenceChecked = false;
  for (const r of replaced) {
    if (r === last || isNew.has(r + 1) || end === 0) continue;
    const [sent, received] = await Promise.all([hashes(linkOf(links, r), t, 'sentHashes', end), hashes(linkOf(links, r + 1), t, 'receivedHashes', end)]);
    divergenceChecked = true;
    const n = Math.min(sent.length, received.length);
    for (let i = 0; i < n; i++) {
      if (sent[i] !== received[i]) {
        firstDivergentPosition = Math.min(firstDivergentPosition ?? i, i);
        break;
      }
    }
  }
  return { stages: replaced, peers: replaced.map((i) => routePeers[i]!), tokensReplayed: replaced.length > 0 ? end : 0, bytesReplayed, firstDivergentPosition, divergenceChecked };
}

/** Whether a reply came from the last stage (the step reached every stage), not a pipelined stage-0 answer. */
export function reachedLastStage(reply: Frame): boolean {
  if (reply.type === FrameType.Token || reply.type === FrameType.Logits) return true;
  if (reply.type !== FrameType.Status) return false;
  try {
    return !decodeJson<{ pipelined?: boolean }>(reply.payload).pipelined;
  } catch {
    return false;
  }
}
