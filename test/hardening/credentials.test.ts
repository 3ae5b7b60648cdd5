// Separate keys for separate powers, on a real serve with --api-key ×2, --join-secret and
// --admin-secret and a node that joined with the join secret: an API key runs completions and
// sees and cancels only its own sessions, cannot join as a stage, download the weights or read
// the room's peers; the join secret cannot use the API; the admin secret manages everything.
// With --api-downloads an API key may read the model. The default (one secret) is unchanged
// and covered by every other test.
import { createHmac } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { FrameType } from '../../src/protocol/frame.ts';
import { jsonFrame } from '../../src/protocol/payload.ts';
import { newSessionId } from '../../src/protocol/session.ts';
import { WsLink } from '../../src/transport/ws.ts';
import { getJson, killAll, spawnMesh, spawnServe, waitForRoute } from '../support/mesh.ts';
import type { ServeInfo } from '../support/mesh.ts';
import { stories260K } from '../support/models.ts';
import { runCli } from '../support/cli.ts';

const KEYS = { api1: 'api-key-one-0123456789', api2: 'api-key-two-0123456789', join: 'join-secret-0123456789', admin: 'admin-secret-0123456789' };
let s: ServeInfo;
let routeId: number;

beforeAll(async () => {
  s = await spawnServe(await stories260K(), ['--api-key', KEYS.api1, '--api-key', KEYS.api2, '--join-secret', KEYS.join, '--admin-secret', KEYS.admin]);
  expect(s.secret).toBe(KEYS.join);
  spawnMesh(['node', '--join', s.joinUrl]);
  routeId = (await waitForRoute({ ...s, secret: KEYS.admin }, 'ready')).id;
}, 90_000);

afterAll(() => killAll());

const status = async (path: string, key: string, init: RequestInit = {}): Promise<number> => (await fetch(`${s.base}${path}`, { ...init, headers: { authorization: `Bearer ${key}`, ...(init.headers ?? {}) } })).status;
const complete = (key: string): Promise<number> => status('/v1/completions', key, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 3 }) });
const client = (key: string): Promise<WsLink> => WsLink.connect(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/client`, { headers: { authorization: `Bearer ${key}` } });

/** Whether a peer proving `secret` is welcomed into the room. */
async function joinsAsPeer(secret: string): Promise<boolean> {
  const ws = new WebSocket(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/peer`);
  const msgs: Array<Record<string, string>> = [];
  ws.on('message', (d) => msgs.push(JSON.parse(d.toString())));
  await new Promise((r) => ws.once('open', r));
  while (!msgs.length) await new Promise((r) => setTimeout(r, 10));
  ws.send(JSON.stringify({ t: 'hello', proof: createHmac('sha256', secret).update(msgs[0]!.nonce!).digest('hex'), backend: 'cpu', memoryBytes: 1 }));
  while (msgs.length < 2 && ws.readyState === ws.OPEN) await new Promise((r) => setTimeout(r, 10));
  ws.terminate();
  return msgs[1]?.t === 'welcome';
}

describe('separate credentials', () => {
  it('each endpoint takes its credential', async () => {
    expect(await complete(KEYS.api1)).toBe(200);
    expect(await complete(KEYS.admin)).toBe(200);
    expect(await complete(KEYS.join)).toBe(403);
    expect(await complete('nobody')).toBe(401);
    const model = `/models/stories260K.gguf`;
    expect(await status(model, KEYS.join, { headers: { range: 'bytes=0-3' } })).toBe(206);
    expect(await status(model, KEYS.api1, { headers: { range: 'bytes=0-3' } })).toBe(403);
    for (const path of ['/v1/rooms', `/v1/rooms/${s.roomId}/peers`, '/v1/routes', `/v1/routes/${routeId}`, `/v1/rooms/${s.roomId}/events`, '/v1/models/stories260K/fetches']) {
      expect(await status(path, KEYS.api1), path).toBe(403);
      expect(await status(path, KEYS.join), path).toBe(403);
    }
    expect(await status('/v1/rooms', KEYS.admin)).toBe(200);
    expect(await status(`/v1/rooms/${s.roomId}`, KEYS.api1)).toBe(200);
    expect(await status('/v1/models/stories260K/header', KEYS.api1)).toBe(200);
    expect(await status('/v1/models/stories260K/manifest', KEYS.api1)).toBe(403);
    expect(await joinsAsPeer(KEYS.api1)).toBe(false);
    expect(await joinsAsPeer(KEYS.admin)).toBe(false);
    expect(await joinsAsPeer(KEYS.join)).toBe(true);
  });

  it("an API key sees and cancels only its own sessions; the admin sees everyone's", async () => {
    const mine = await client(KEYS.api2);
    const sid = newSessionId();
    await mine.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId: sid }, { contextLength: 64 }));
    expect(await status(`/v1/sessions/${sid}`, KEYS.api2)).toBe(200);
    expect(await status(`/v1/sessions/${sid}`, KEYS.api1)).toBe(404);
    expect(await status(`/v1/sessions/${sid}/events`, KEYS.api1)).toBe(404);
    expect(await status(`/v1/sessions/${sid}`, KEYS.api1, { method: 'DELETE' })).toBe(404);
    // on a client socket too
    const other = await client(KEYS.api1);
    const err = await other.request(jsonFrame(FrameType.Status, { routeId, sessionId: sid }, null)).then(() => null, (e: { code: string }) => e.code);
    expect(err).toBe('SESSION_UNKNOWN');
    expect((await getJson(`${s.base}/v1/sessions/${sid}`, KEYS.admin)).body.state).toBe('idle');
    expect(await status(`/v1/sessions/${sid}`, KEYS.admin, { method: 'DELETE' })).toBe(200);
    await other.close();
    await mine.close();
    // the join secret cannot open a client socket
    await expect(client(KEYS.join)).rejects.toMatchObject({ code: 'LINK_FAILED' });
  });

  it('generate --join runs over the room with an API key (the header comes as JSON, no model bytes)', async () => {
    const r = await runCli(['generate', '--join', s.joinUrl, '--secret', KEYS.api1, '--prompt', 'Once upon a time', '--n', '6']);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.length).toBeGreaterThan(0);
  });

  it('--api-downloads lets API keys read the model; peers always may', async () => {
    const t = await spawnServe(await stories260K(), ['--api-key', KEYS.api1, '--admin-secret', KEYS.admin, '--api-downloads']);
    const res = await fetch(`${t.base}/models/stories260K.gguf`, { headers: { authorization: `Bearer ${KEYS.api1}`, range: 'bytes=0-3' } });
    expect(res.status).toBe(206);
    expect(Buffer.from(await res.arrayBuffer()).toString('latin1')).toBe('GGUF');
    await t.proc.kill();
  });
});
