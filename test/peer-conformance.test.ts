// One conformance suite, run against both implementations of a native peer: the TypeScript
// node (`gguf-mesh node --backend cpu`) and the PyTorch peer (`--backend torch`, peers/torch/,
// written from docs/protocol.md). Each serves stories260K alone; the test speaks raw frames to
// its /v1/frames WebSocket and binary HTTP paths — malformed frames and fragments, unknown
// sessions, refused steps, a whole session — and expects the answers docs/protocol.md gives
// ("Strict decoding", "Fragments", "A stage"; the API's SessionOpen tokens/logprobs, wide Token frames
// and Rewind's sampler/logprobs/tokens/from; Verify frames — the greedy token after each
// position, llama.cpp's, and rejected drafts dropped by the next — and one-way steps, answered
// Status {returned}), identical for both. A tampered shard is refused
// by both with TENSOR_HASH_MISMATCH naming the tensor, after one re-fetch.
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildManifest, manifestJson } from '../src/gguf/manifest.ts';
import { readHeader } from '../src/gguf/parse.ts';
import { DType, encodeFrame, FrameFlag, FrameType, makeFrame } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { fragment } from '../src/protocol/fragment.ts';
import { decodeFrame } from '../src/protocol/frame.ts';
import { decodeI32, decodeJson, decodeSampled, hiddenFrame, payloadBody, jsonFrame, repairFrame, sampledFrame, tokensFrame } from '../src/protocol/payload.ts';
import { newSessionId } from '../src/protocol/session.ts';
import { greedyGenerate, loadModel } from './support/llama.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from './support/mesh.ts';
import { stories260K, STORIES_PROMPT_TOKENS } from './support/models.ts';

const IMPLEMENTATIONS = ['cpu', 'torch'] as const;
type Impl = (typeof IMPLEMENTATIONS)[number];

let model: string;
let work: string;
/** llama.cpp's greedy tokens after the prompt (positions 5 to 10): what Verify frames answer */
let greedy: number[];

beforeAll(async () => {
  model = await stories260K();
  work = mkdtempSync(join(tmpdir(), 'gguf-mesh-conformance-'));
  const llama = await loadModel(model);
  greedy = await greedyGenerate(llama, STORIES_PROMPT_TOKENS, 6);
  await llama.dispose();
});

afterAll(async () => {
  await killAll();
  rmSync(work, { recursive: true, force: true });
});

/** One request/reply WebSocket to a node's /v1/frames: send a message, get the next binary message. */
class RawSocket {
  private replies: Uint8Array[] = [];
  private waiting: Array<(m: Uint8Array) => void> = [];
  private constructor(readonly ws: WebSocket) {
    ws.on('message', (data: Buffer) => {
      const m = new Uint8Array(data);
      const w = this.waiting.shift();
      if (w) w(m);
      else this.replies.push(m);
    });
  }

  static open(url: string, secret: string): Promise<RawSocket> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { headers: { authorization: `Bearer ${secret}` } });
      ws.once('open', () => resolve(new RawSocket(ws)));
      ws.once('error', reject);
    });
  }

  /** Sends each message in turn and returns the one reply the last one causes. */
  send(...messages: Uint8Array[]): Promise<Frame> {
    for (const m of messages) this.ws.send(m);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no reply within 20 s')), 20_000);
      const take = (m: Uint8Array): void => {
        clearTimeout(timer);
        resolve(decodeFrame(m));
      };
      const queued = this.replies.shift();
      if (queued) take(queued);
      else this.waiting.push(take);
    });
  }
}

/** What a reply says, without what may differ between implementations (messages, the backend name, timings). */
function summary(f: Frame): unknown {
  if (f.type === FrameType.Error) {
    const e = decodeJson<{ code: string; stage?: number; details?: Record<string, unknown> }>(f.payload);
    return { error: e.code, ...(e.stage !== undefined ? { stage: e.stage } : {}), ...(e.details ? { details: e.details } : {}), seq: f.seq, reply: (f.flags & FrameFlag.Reply) !== 0 };
  }
  if (f.type === FrameType.Status) {
    const { backend, timing, ...rest } = decodeJson<Record<string, unknown>>(f.payload);
    return { status: rest, ...(backend !== undefined ? { backend: typeof backend } : {}), ...(timing ? { timing: Object.keys(timing as object).sort() } : {}), seq: f.seq };
  }
  if (f.type === FrameType.Token && f.flags & FrameFlag.Verify) return { verified: [...decodeI32(payloadBody(f))], position: f.position, seq: f.seq };
  if (f.type === FrameType.Token) {
    // log-probabilities to 2 decimals: the two implementations' logits differ in their last bits
    const { token, logprob } = decodeSampled(f);
    const round = (x: number) => Math.round(x * 100) / 100;
    const lp = logprob ? { width: f.width, logprob: round(logprob.logprob), top: logprob.top.map((t) => [t.token, round(t.logprob)]) } : {};
    return { token, ...lp, position: f.position, seq: f.seq };
  }
  return { type: FrameType[f.type], seq: f.seq };
}

/** An encoded frame with bytes changed: [offset, value] pairs. */
function patched(f: Frame, ...changes: Array<[number, number]>): Uint8Array {
  const b = encodeFrame(f);
  for (const [o, v] of changes) b[o] = v;
  return b;
}

const TIMING_KEYS = ['bytesIn', 'bytesOut', 'computeMs', 'downstreamMs', 'overheadMs', 'stage', 'steps'];
const SID = 'c0ffee00' + '0'.repeat(23) + '1';
const SID2 = 'c0ffee00' + '0'.repeat(23) + '2';
const at = (seq: number, sessionId = SID) => ({ routeId: 1, sessionId, seq });

/** The probes, in order (a session is opened, stepped and closed along the way), each with its reply. */
async function frameProbes(sock: RawSocket, greedy: number[]): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  const probe = async (name: string, ...messages: Uint8Array[]): Promise<void> => {
    out[name] = summary(await sock.send(...messages));
  };
  const prefill = (seq: number, pos: number, tokens: number[], flags = 0) => tokensFrame(FrameType.Prefill, at(seq), pos, tokens, flags);
  // strict decoding, in the documented order
  await probe('garbage', new Uint8Array(80).fill(7));
  await probe('short header', encodeFrame(prefill(1, 0, [1])).subarray(0, 30));
  await probe('version 2', patched(prefill(1, 0, [1]), [4, 2]));
  await probe('reserved byte', patched(prefill(1, 0, [1]), [42, 1]));
  await probe('type 99', patched(prefill(1, 0, [1]), [5, 99]));
  await probe('flag bit 12', patched(prefill(1, 0, [1]), [7, 0x10]));
  await probe('prefill as f32', patched(prefill(1, 0, [1]), [40, DType.F32]));
  await probe('prefill of 0 tokens', patched(prefill(1, 0, [1]), [36, 0]));
  await probe('decode of width 2', patched(tokensFrame(FrameType.Decode, at(1), 0, [1]), [44, 2]));
  await probe('payload length off', patched(prefill(1, 0, [1, 2]), [48, 4]));
  await probe('payload cut short', encodeFrame(prefill(1, 0, [1, 2])).subarray(0, 56));
  await probe('bytes after the frame', new Uint8Array([...encodeFrame(prefill(1, 0, [1])), 0]));
  await probe('timings on a JSON frame', encodeFrame({ ...jsonFrame(FrameType.Status, at(1), {}), flags: 0 }).map((x, i) => (i === 6 ? FrameFlag.Timings : x)));
  // fragments
  // 52 + 80 bytes in 64-byte messages: three fragments of 44-byte slices
  const whole = encodeFrame(makeFrame({ type: FrameType.Status, ...at(11), dtype: DType.Json, payload: new TextEncoder().encode(JSON.stringify({ pad: 'x'.repeat(70) })) }));
  const [f0, f1, f2] = fragment(whole, 64, 7);
  await probe('fragment 1 first', f1!);
  await probe('fragment version 2', f0!.map((x, i) => (i === 4 ? 2 : x)));
  await probe('a frame in fragments', f0!, f1!, f2!);
  const short = fragment(whole, 64, 8);
  const lastCut = short[1]!.slice(0, 24).map((x, i) => (i === 5 ? 1 : x));
  await probe('last fragment leaves bytes missing', short[0]!, lastCut);
  // sessions
  await probe('prefill, no session', encodeFrame(prefill(21, 0, [1])));
  await probe('close, no session', encodeFrame(makeFrame({ type: FrameType.SessionClose, ...at(22) })));
  await probe('status, no session', encodeFrame(makeFrame({ type: FrameType.Status, ...at(23) })));
  await probe('open, contextLength 0', encodeFrame(jsonFrame(FrameType.SessionOpen, at(24), { contextLength: 0 })));
  await probe('open, not JSON', encodeFrame(makeFrame({ type: FrameType.SessionOpen, ...at(25), dtype: DType.Json, payload: new TextEncoder().encode('{nope') })));
  await probe('open', encodeFrame(jsonFrame(FrameType.SessionOpen, at(26), { contextLength: 8 })));
  await probe('open again', encodeFrame(jsonFrame(FrameType.SessionOpen, at(27), { contextLength: 8 })));
  await probe('stage status', encodeFrame(makeFrame({ type: FrameType.Status, ...at(40, '0'.repeat(32)) })));
  await probe('prefill at position 3', encodeFrame(prefill(28, 3, [1])));
  await probe('hidden into stage 0', encodeFrame(hiddenFrame(at(29), 0, new Float32Array(64), 1, DType.F16)));
  await probe('a token frame', encodeFrame(tokensFrame(FrameType.Token, at(30), 0, [1])));
  await probe('token outside the vocabulary', encodeFrame(prefill(31, 0, [99999])));
  await probe('prefill, pipelined', encodeFrame(prefill(32, 0, STORIES_PROMPT_TOKENS.slice(0, 2))));
  await probe('prefill, sampled', encodeFrame(prefill(33, 2, STORIES_PROMPT_TOKENS.slice(2), FrameFlag.Sample)));
  await probe('decode', encodeFrame(tokensFrame(FrameType.Decode, at(34), 5, [432])));
  await probe('status, open', encodeFrame(makeFrame({ type: FrameType.Status, ...at(35) })));
  await probe('prefill past the context', encodeFrame(prefill(36, 6, [1, 2, 3])));
  await probe('status after the refusals', encodeFrame(makeFrame({ type: FrameType.Status, ...at(37) })));
  // repair requests (docs/protocol.md: Rewind, Resend, the Replay flag, Status hash queries)
  const rewind = (seq: number, pos: number, body: unknown, sessionId = SID) => encodeFrame(repairFrame(FrameType.Rewind, at(seq, sessionId), pos, body));
  await probe('rewind, no session', rewind(50, 0, { draws: 0 }, 'f'.repeat(32)));
  await probe('rewind past the position', rewind(51, 9, { draws: 0 }));
  await probe('rewind, draws not a count', rewind(52, 2, { draws: -1 }));
  await probe('resend, end not a count', encodeFrame(repairFrame(FrameType.Resend, at(53), 0, { end: 'x', maxTokens: 1 })));
  await probe('resend on the last stage', encodeFrame(repairFrame(FrameType.Resend, at(54), 0, { end: 2, maxTokens: 1 })));
  await probe('rewind to 2', rewind(55, 2, { draws: 0 }));
  await probe('status after the rewind', encodeFrame(makeFrame({ type: FrameType.Status, ...at(56) })));
  await probe('decode at the old position', encodeFrame(tokensFrame(FrameType.Decode, at(57), 6, [1])));
  await probe('replayed prefill', encodeFrame(prefill(58, 2, STORIES_PROMPT_TOKENS.slice(2), FrameFlag.Replay | FrameFlag.Sample)));
  await probe('decode after the replay', encodeFrame(tokensFrame(FrameType.Decode, at(59), 5, [432])));
  await probe('status with hash queries', encodeFrame(jsonFrame(FrameType.Status, at(60), { sentHashes: [0, 6], receivedHashes: [0, 6] })));
  await probe('status, a bad hash query', encodeFrame(jsonFrame(FrameType.Status, at(61), { sentHashes: [0] })));
  await probe('close', encodeFrame(makeFrame({ type: FrameType.SessionClose, ...at(62) })));
  await probe('decode after close', encodeFrame(tokensFrame(FrameType.Decode, at(39), 6, [1])));
  // the API's session fields (docs/protocol.md: SessionOpen tokens/logprobs, the wide Token frame, Rewind's sampler/logprobs/tokens/from)
  const at2 = (seq: number) => at(seq, SID2);
  const wide = sampledFrame(at2(70), 0, 5, { token: 5, logprob: -1.5, top: [{ token: 5, logprob: -1.5 }] });
  await probe('a token frame with logprobs', encodeFrame(wide));
  await probe('a token frame of width 3', patched(wide, [44, 3]));
  // a negative presence penalty of -100 lifts every token of the history above the rest: the greedy pick shows which history the stage holds
  const penalties = { frequencyPenalty: 0.5, presencePenalty: -100 };
  await probe('open, a bad sampler', encodeFrame(jsonFrame(FrameType.SessionOpen, at2(71), { contextLength: 8, sampler: { topP: 0 } })));
  await probe('open, tokens not ids', encodeFrame(jsonFrame(FrameType.SessionOpen, at2(82), { contextLength: 8, tokens: [1, -2] })));
  await probe('open with tokens and logprobs', encodeFrame(jsonFrame(FrameType.SessionOpen, at2(72), { contextLength: 8, sampler: penalties, tokens: STORIES_PROMPT_TOKENS, logprobs: 2 })));
  await probe('prefill, sampled, penalised, logprobs', encodeFrame(tokensFrame(FrameType.Prefill, at2(73), 0, STORIES_PROMPT_TOKENS, FrameFlag.Sample)));
  await probe('decode, penalised, logprobs', encodeFrame(tokensFrame(FrameType.Decode, at2(74), 5, [432])));
  const rewind2 = (seq: number, pos: number, body: unknown) => encodeFrame(repairFrame(FrameType.Rewind, at2(seq), pos, body));
  await probe('rewind, a bad sampler', rewind2(75, 5, { draws: 0, sampler: { temperature: -1 } }));
  await probe('rewind, from not a count', rewind2(83, 5, { draws: 0, tokens: [1], from: 'x' }));
  await probe('status after the refused rewind', encodeFrame(makeFrame({ type: FrameType.Status, ...at2(76) })));
  await probe('rewind to a new turn: greedy, no logprobs', rewind2(77, 5, { draws: 0, sampler: { temperature: 0 }, logprobs: null }));
  await probe('decode in the new turn', encodeFrame(tokensFrame(FrameType.Decode, at2(78), 5, [432])));
  // the penalties' history: position 0 kept, the rest given again from 1 (as 432s): only tokens 1 and 432 are lifted now
  await probe('rewind with tokens from 1', rewind2(79, 5, { draws: 0, sampler: { presencePenalty: -100 }, logprobs: 0, tokens: [432, 432, 432, 432], from: 1 }));
  await probe('decode with the rewound history', encodeFrame(tokensFrame(FrameType.Decode, at2(80), 5, [432])));
  await probe('close the second session', encodeFrame(makeFrame({ type: FrameType.SessionClose, ...at2(81) })));
  await verifyProbes(sock, out, greedy);
  return out;
}

const SID3 = 'c0ffee00' + '0'.repeat(23) + '3';

/**
 * Speculative decoding (the Verify flag) and the one-way token path (ReturnDirect) on a lone
 * stage: `greedy` is llama.cpp's greedy continuation of the prompt, from position 5.
 */
async function verifyProbes(sock: RawSocket, out: Record<string, unknown>, greedy: number[]): Promise<void> {
  const at3 = (seq: number) => at(seq, SID3);
  const probe = async (name: string, ...messages: Uint8Array[]): Promise<void> => {
    out[name] = summary(await sock.send(...messages));
  };
  const verify = (seq: number, pos: number, tokens: number[], flags = 0) => encodeFrame(tokensFrame(FrameType.Prefill, at3(seq), pos, tokens, FrameFlag.Sample | FrameFlag.Verify | flags));
  const status = (seq: number) => encodeFrame(makeFrame({ type: FrameType.Status, ...at3(seq) }));
  const [g5, g6, g7, g8, g9, g10] = greedy as [number, number, number, number, number, number];
  await probe('verify, no session', encodeFrame(tokensFrame(FrameType.Prefill, at(90, 'e'.repeat(32)), 0, [1, 2], FrameFlag.Sample | FrameFlag.Verify)));
  await probe('a verify token frame of 0 tokens', patched(tokensFrame(FrameType.Token, at3(91), 0, [1], FrameFlag.Verify), [36, 0]));
  await probe('open a speculating session', encodeFrame(jsonFrame(FrameType.SessionOpen, at3(92), { contextLength: 16 })));
  await probe('prefill the prompt', encodeFrame(tokensFrame(FrameType.Prefill, at3(93), 0, STORIES_PROMPT_TOKENS, FrameFlag.Sample)));
  // the step's token, a right draft and a wrong one: the greedy token after each position
  await probe('verify: a right draft, a wrong one', verify(94, 5, [g5, g6, 7]));
  await probe('status after the verify', status(95));
  // the server kept one draft: the next Verify frame starts at the wrong draft's position, and drops it
  await probe('verify over the rejected draft', verify(96, 7, [g7, g8, g9]));
  await probe('status after the rollback', status(97));
  // positions a plain frame wrote are never dropped so
  await probe('verify where a plain frame wrote', verify(98, 3, [1, 2]));
  // one-way: the token goes to the server on the control socket; the stage answers that it did
  await probe('decode, one-way', encodeFrame(tokensFrame(FrameType.Decode, at3(99), 10, [g10], FrameFlag.ReturnDirect | FrameFlag.WantTimings)));
  await probe('verify, one-way', verify(100, 11, [1, 2], FrameFlag.ReturnDirect));
  await probe('status after the one-way steps', status(101));
  await probe('close the speculating session', encodeFrame(makeFrame({ type: FrameType.SessionClose, ...at3(102) })));
}

/** The binary HTTP paths and the secret checks. */
async function httpProbes(httpUrl: string, wsUrl: string, secret: string): Promise<Record<string, unknown>> {
  const auth = { authorization: `Bearer ${secret}` };
  const sid = newSessionId();
  const out: Record<string, unknown> = {};
  const frameAnswer = async (res: Response) => ({ http: res.status, ...(summary(decodeFrame(new Uint8Array(await res.arrayBuffer()))) as object) });
  out['POST garbage'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}/prefill`, { method: 'POST', headers: auth, body: new Uint8Array(80).fill(7) }));
  out['POST another session'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}`, { method: 'POST', headers: auth, body: encodeFrame(jsonFrame(FrameType.SessionOpen, at(1, newSessionId()), { contextLength: 8 })) }));
  out['POST open at decode'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}/decode`, { method: 'POST', headers: auth, body: encodeFrame(jsonFrame(FrameType.SessionOpen, at(1, sid), { contextLength: 8 })) }));
  out['DELETE unknown'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}`, { method: 'DELETE', headers: auth }));
  const get = await fetch(`${httpUrl}/v1/sessions/${sid}`, { headers: auth });
  out['GET unknown'] = { http: get.status, body: await get.json() };
  const open = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}`, { method: 'POST', headers: auth, body: encodeFrame(jsonFrame(FrameType.SessionOpen, at(5, sid), { contextLength: 8 })) }));
  out['POST open'] = open;
  out['POST prefill'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}/prefill`, { method: 'POST', headers: auth, body: encodeFrame(tokensFrame(FrameType.Prefill, at(6, sid), 0, STORIES_PROMPT_TOKENS, FrameFlag.Sample)) }));
  out['POST decode at 9'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}/decode`, { method: 'POST', headers: auth, body: encodeFrame(tokensFrame(FrameType.Decode, at(7, sid), 9, [432])) }));
  out['DELETE'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}`, { method: 'DELETE', headers: auth }));
  // a peer naming itself (x-mesh-peer) that is not this stage's upstream (stage 0 has none): refused
  const stranger = { ...auth, 'x-mesh-peer': 'peer-x', 'content-type': 'application/octet-stream' };
  out['POST hidden from a peer not upstream'] = await frameAnswer(await fetch(`${httpUrl}/v1/sessions/${sid}/decode`, { method: 'POST', headers: stranger, body: encodeFrame(hiddenFrame(at(8, sid), 5, new Float32Array(8), 1, DType.F32)) }));
  const status = (await (await fetch(`${httpUrl}/v1/status`, { headers: auth })).json()) as Record<string, any>;
  const fence = status.fence;
  out['node status'] = { keys: Object.keys(status).sort(), backend: typeof status.backend, stage: status.stage, shard: status.shard, sessions: status.sessions };
  out['fence status'] = { upstream: fence?.upstream, rewired: fence?.rewired, refused: fence?.refused, from: fence?.lastRefused?.from, type: fence?.lastRefused?.type, position: fence?.lastRefused?.position };
  out['status, wrong secret'] = (await fetch(`${httpUrl}/v1/status`, { headers: { authorization: 'Bearer wrong' } })).status;
  out['unknown path'] = (await fetch(`${httpUrl}/v1/nothing`, { headers: auth })).status;
  out['upgrade, wrong secret'] = await new Promise((resolve) => {
    const ws = new WebSocket(wsUrl, { headers: { authorization: 'Bearer wrong' } });
    ws.once('unexpected-response', (_req, res) => resolve(res.statusCode));
    ws.once('open', () => resolve('open'));
    ws.once('error', () => undefined);
  });
  out['upgrade, a malformed peer id'] = await new Promise((resolve) => {
    const ws = new WebSocket(wsUrl, { headers: { ...auth, 'x-mesh-peer': 'p'.repeat(65) } });
    ws.once('unexpected-response', (_req, res) => resolve(res.statusCode));
    ws.once('open', () => resolve('open'));
    ws.once('error', () => undefined);
  });
  return out;
}

const answers: Partial<Record<Impl, { frames: Record<string, unknown>; http: Record<string, unknown> }>> = {};

describe.each(IMPLEMENTATIONS)('a %s peer serving stories260K alone', (impl) => {
  it('answers every probe as docs/protocol.md says', async () => {
    const serve = await spawnServe(model);
    const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', impl, '--no-cache', '--name', impl]);
    await node.waitFor(/joined room/, 120_000);
    await waitForRoute(serve, 'ready', 120_000);
    const peer = (await getJson(`${serve.base}/v1/rooms/${serve.roomId}/peers`, serve.secret)).body.peers[0];
    const sock = await RawSocket.open(peer.listen, serve.secret);
    const frames = await frameProbes(sock, greedy);
    sock.ws.close();
    const http = await httpProbes(peer.listen.replace(/^ws/, 'http').replace(/\/v1\/frames$/, ''), peer.listen, serve.secret);
    answers[impl] = { frames, http };
    await node.kill();
    await serve.proc.kill();

    const bad = (code: string, field: string) => ({ error: code, details: { field }, seq: 0, reply: true });
    const stageErr = (seq: number, code: string, details?: Record<string, unknown>) => ({ error: code, stage: 0, ...(details ? { details } : {}), seq, reply: true });
    const shard = { start: 0, end: 5 };
    const kv = 2 * 5 * 8 * 4 * 8 * 4; // K and V, 5 layers, 8 positions, 4 KV heads × 8 dims, f32
    const kv16 = 2 * kv; // a context of 16
    // [1, 403, 407, 261, 378] is the prompt; logprobs are of the raw logits, whatever the penalties picked
    const apiAnswers = {
      'a token frame with logprobs': stageErr(70, 'FRAME_BAD_TYPE', { field: 'type' }),
      'a token frame of width 3': bad('FRAME_BAD_DIMENSION', 'width'),
      'open, a bad sampler': stageErr(71, 'BAD_SAMPLER_OPTION'),
      'open, tokens not ids': stageErr(82, 'BAD_REQUEST', { field: 'tokens.1' }),
      // the refused opens left nothing behind: the same session id opens
      'open with tokens and logprobs': { status: { stage: 0, state: 'open', position: 0 }, seq: 72 },
      // llama.cpp's greedy 432 is the top alternative; the lifted history picks the prompt's 378
      'prefill, sampled, penalised, logprobs': { token: 378, width: 6, logprob: -9.59, top: [[432, -0.03], [383, -3.55]], position: 5, seq: 73 },
      // 378 is in the history twice now (the prompt's and the one sampled at 5): the frequency penalty takes 261
      'decode, penalised, logprobs': { token: 261, width: 6, logprob: -4.53, top: [[383, -0.07], [322, -2.98]], position: 6, seq: 74 },
      'rewind, a bad sampler': stageErr(75, 'BAD_SAMPLER_OPTION'),
      'rewind, from not a count': stageErr(83, 'BAD_REQUEST', { field: 'from' }),
      'status after the refused rewind': { status: { stage: 0, shard, open: true, position: 6, kvBytes: kv, processedTokens: [6, 6, 6, 6, 6], replayLogBytes: 0 }, backend: 'string', timing: TIMING_KEYS, seq: 76 },
      'rewind to a new turn: greedy, no logprobs': { status: { stage: 0, position: 5 }, seq: 77 },
      'decode in the new turn': { token: 383, position: 6, seq: 78 },
      'rewind with tokens from 1': { status: { stage: 0, position: 5 }, seq: 79 },
      'decode with the rewound history': { token: 432, width: 2, logprob: -8.88, top: [], position: 6, seq: 80 },
      'close the second session': { status: { stage: 0, state: 'closed' }, seq: 81 },
    };
    const [, g6, g7, g8, g9, g10] = greedy;
    const verifyAnswers = {
      'verify, no session': stageErr(90, 'SESSION_UNKNOWN', { field: 'session id' }),
      'a verify token frame of 0 tokens': bad('FRAME_BAD_DIMENSION', 'token count'),
      'open a speculating session': { status: { stage: 0, state: 'open', position: 0 }, seq: 92 },
      'prefill the prompt': { token: greedy[0], position: 5, seq: 93 },
      // after the wrong draft: whatever follows it (the same on both, compared below)
      'verify: a right draft, a wrong one': { verified: [g6, g7, expect.any(Number)], position: 8, seq: 94 },
      'status after the verify': { status: { stage: 0, shard, open: true, position: 8, kvBytes: kv16, processedTokens: new Array(5).fill(8), replayLogBytes: 0 }, backend: 'string', timing: TIMING_KEYS, seq: 95 },
      'verify over the rejected draft': { verified: [g8, g9, g10], position: 10, seq: 96 },
      // position 7 computed twice: the rejected draft's work counts, its KV does not
      'status after the rollback': { status: { stage: 0, shard, open: true, position: 10, kvBytes: kv16, processedTokens: new Array(5).fill(11), replayLogBytes: 0 }, backend: 'string', timing: TIMING_KEYS, seq: 97 },
      'verify where a plain frame wrote': stageErr(98, 'POSITION_MISMATCH', { expected: 10, got: 3 }),
      'decode, one-way': { status: { stage: 0, position: 11, returned: true }, seq: 99 },
      'verify, one-way': { status: { stage: 0, position: 13, returned: true }, seq: 100 },
      'status after the one-way steps': { status: { stage: 0, shard, open: true, position: 13, kvBytes: kv16, processedTokens: new Array(5).fill(14), replayLogBytes: 0 }, backend: 'string', timing: TIMING_KEYS, seq: 101 },
      'close the speculating session': { status: { stage: 0, state: 'closed' }, seq: 102 },
    };
    expect(frames).toEqual({
      garbage: bad('FRAME_BAD_MAGIC', 'magic'),
      'short header': bad('FRAME_TRUNCATED', 'header'),
      'version 2': bad('FRAME_BAD_VERSION', 'version'),
      'reserved byte': bad('FRAME_BAD_RESERVED', 'reserved'),
      'type 99': bad('FRAME_BAD_TYPE', 'type'),
      'flag bit 12': bad('FRAME_BAD_FLAGS', 'flags'),
      'prefill as f32': bad('FRAME_BAD_DTYPE', 'dtype'),
      'prefill of 0 tokens': bad('FRAME_BAD_DIMENSION', 'token count'),
      'decode of width 2': bad('FRAME_BAD_DIMENSION', 'width'),
      'payload length off': bad('FRAME_BAD_LENGTH', 'payload length'),
      'payload cut short': bad('FRAME_TRUNCATED', 'payload'),
      'bytes after the frame': bad('FRAME_BAD_LENGTH', 'payload length'),
      'timings on a JSON frame': bad('FRAME_BAD_FLAGS', 'flags'),
      'fragment 1 first': bad('FRAGMENT_OUT_OF_ORDER', 'index'),
      'fragment version 2': bad('FRAGMENT_BAD_VERSION', 'version'),
      'a frame in fragments': { status: { stage: 0, shard, open: false, position: 0, kvBytes: 0, processedTokens: [] }, seq: 11 },
      'last fragment leaves bytes missing': bad('FRAGMENT_TRUNCATED', 'total'),
      'prefill, no session': stageErr(21, 'SESSION_UNKNOWN', { field: 'session id' }),
      'close, no session': stageErr(22, 'SESSION_UNKNOWN', { field: 'session id' }),
      'status, no session': { status: { stage: 0, shard, open: false, position: 0, kvBytes: 0, processedTokens: [] }, seq: 23 },
      'open, contextLength 0': stageErr(24, 'BAD_REQUEST', { field: 'contextLength' }),
      'open, not JSON': stageErr(25, 'FRAME_BAD_PAYLOAD', { field: 'payload' }),
      open: { status: { stage: 0, state: 'open', position: 0 }, seq: 26 },
      'open again': stageErr(27, 'SESSION_EXISTS'),
      'stage status': { status: { stage: 0, shard, sessions: [{ sessionId: SID, position: 0, kvBytes: kv, processedTokens: [0, 0, 0, 0, 0] }], batching: { batches: 0, steps: 0, largest: 0, fallbacks: 0, batchMs: 0, alone: 0, aloneMs: 0 } }, backend: 'string', seq: 40 },
      'prefill at position 3': stageErr(28, 'POSITION_MISMATCH', { expected: 0, got: 3 }),
      'hidden into stage 0': stageErr(29, 'STAGE_INPUT_KIND'),
      'a token frame': stageErr(30, 'FRAME_BAD_TYPE', { field: 'type' }),
      'token outside the vocabulary': stageErr(31, 'BAD_TOKEN'),
      'prefill, pipelined': { status: { stage: 0, position: 2 }, seq: 32 },
      'prefill, sampled': { token: 432, position: 5, seq: 33 },
      decode: { token: 383, position: 6, seq: 34 },
      'status, open': { status: { stage: 0, shard, open: true, position: 6, kvBytes: kv, processedTokens: [6, 6, 6, 6, 6], replayLogBytes: 0 }, backend: 'string', timing: TIMING_KEYS, seq: 35 },
      'prefill past the context': stageErr(36, 'CONTEXT_FULL'),
      'status after the refusals': { status: { stage: 0, shard, open: true, position: 6, kvBytes: kv, processedTokens: [6, 6, 6, 6, 6], replayLogBytes: 0 }, backend: 'string', timing: TIMING_KEYS, seq: 37 },
      'rewind, no session': { ...stageErr(50, 'SESSION_UNKNOWN', { field: 'session id' }) },
      'rewind past the position': stageErr(51, 'POSITION_MISMATCH', { expected: 6, got: 9 }),
      'rewind, draws not a count': stageErr(52, 'BAD_REQUEST', { field: 'draws' }),
      'resend, end not a count': stageErr(53, 'BAD_REQUEST', { field: 'end' }),
      // a stage that is the last has no next stage: the hop to stage 1 is what fails
      'resend on the last stage': { error: 'STAGE_UNREACHABLE', stage: 1, seq: 54, reply: true },
      'rewind to 2': { status: { stage: 0, position: 2 }, seq: 55 },
      // processedTokens counts what each layer computed: a rewind forgets positions, not work
      'status after the rewind': { status: { stage: 0, shard, open: true, position: 2, kvBytes: kv, processedTokens: [6, 6, 6, 6, 6], replayLogBytes: 0 }, backend: 'string', timing: TIMING_KEYS, seq: 56 },
      'decode at the old position': stageErr(57, 'POSITION_MISMATCH', { expected: 2, got: 6 }),
      // a replay computes and keeps, and samples nothing (the Sample flag notwithstanding)
      'replayed prefill': { status: { stage: 0, position: 5, replayed: true }, seq: 58 },
      // the rebuilt KV cache gives the token the first run gave at this position
      'decode after the replay': { token: 383, position: 6, seq: 59 },
      'status with hash queries': { status: { stage: 0, shard, open: true, position: 6, kvBytes: kv, processedTokens: [10, 10, 10, 10, 10], replayLogBytes: 0, sentHashes: [], receivedHashes: [] }, backend: 'string', timing: TIMING_KEYS, seq: 60 },
      'status, a bad hash query': stageErr(61, 'BAD_REQUEST', { field: 'sentHashes.1' }),
      close: { status: { stage: 0, state: 'closed' }, seq: 62 },
      'decode after close': stageErr(39, 'SESSION_UNKNOWN', { field: 'session id' }),
      ...apiAnswers,
      ...verifyAnswers,
    });
    expect(http).toEqual({
      'POST garbage': { http: 400, ...bad('FRAME_BAD_MAGIC', 'magic') },
      'POST another session': { http: 400, ...bad('FRAME_SESSION_MISMATCH', 'session id') },
      'POST open at decode': { http: 400, ...bad('FRAME_BAD_TYPE', 'type') },
      'DELETE unknown': { http: 404, ...stageErr(0, 'SESSION_UNKNOWN', { field: 'session id' }) },
      'GET unknown': { http: 200, body: { stage: 0, shard, open: false, position: 0, kvBytes: 0, processedTokens: [] } },
      'POST open': { http: 200, status: { stage: 0, state: 'open', position: 0 }, seq: 5 },
      'POST prefill': { http: 200, token: 432, position: 5, seq: 6 },
      'POST decode at 9': { http: 409, ...stageErr(7, 'POSITION_MISMATCH', { expected: 5, got: 9 }) },
      DELETE: { http: 200, status: { stage: 0, state: 'closed' }, seq: 0 },
      'POST hidden from a peer not upstream': { http: 409, error: 'NOT_UPSTREAM', details: { from: 'peer-x', expected: null }, seq: 8, reply: true },
      'node status': { keys: ['backend', 'batching', 'fence', 'memoryBytes', 'peerId', 'routeId', 'sessions', 'shard', 'stage'], backend: 'string', stage: 0, shard, sessions: [] },
      'fence status': { upstream: null, rewired: false, refused: 1, from: 'peer-x', type: 'Hidden', position: 5 },
      'status, wrong secret': 401,
      'unknown path': 404,
      'upgrade, wrong secret': 401,
      'upgrade, a malformed peer id': 400,
    });
  });
});

describe('both implementations', () => {
  it('gave the same answers to every probe', () => {
    expect(answers.cpu, 'the cpu peer ran').toBeDefined();
    expect(answers.torch).toEqual(answers.cpu);
  });

  it.each(IMPLEMENTATIONS)('%s: a flipped byte in blk.2 is refused with TENSOR_HASH_MISMATCH naming the tensor, after one re-fetch', async (impl) => {
    const copy = join(work, `tampered-${impl}.gguf`);
    copyFileSync(model, copy);
    const header = await readHeader(copy);
    const victim = header.tensors.find((t) => t.name.startsWith('blk.2.'))!;
    const bytes = readFileSync(copy);
    bytes[victim.offset + 17]! ^= 0x40;
    writeFileSync(copy, bytes);
    writeFileSync(`${copy}.manifest.json`, manifestJson(await buildManifest(model)));
    const serve = await spawnServe(copy);
    const node = spawnMesh(['node', '--join', serve.joinUrl, '--backend', impl, '--no-cache', '--name', impl]);
    await node.waitFor(/joined room/, 120_000);
    const route = await waitForRoute(serve, 'degraded', 120_000);
    expect(route.stages[0].status).toBe('failed');
    expect(route.stages[0].error.code).toBe('TENSOR_HASH_MISMATCH');
    expect(route.stages[0].error.message).toContain(victim.name);
    const fetches = (await getJson(`${serve.base}/v1/models/tampered-${impl}/fetches`, serve.secret)).body.clients[route.stages[0].peerId];
    const hits = (fetches.ranges as Array<[number, number]>).filter(([a, b]) => a <= victim.offset + 17 && b >= victim.offset + 17);
    expect(hits.length).toBe(2);
    await node.kill();
    await serve.proc.kill();
  });
});
