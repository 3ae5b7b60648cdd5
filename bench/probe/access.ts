// Probes of keys, files and faults (issue 16): what one API key can do, a hosted model whose
// symlink is re-pointed, and nodes across a restart of `serve`.

import { copyFileSync, readFileSync, symlinkSync, unlinkSync } from 'node:fs';
import { get as httpGet } from 'node:http';
import { join } from 'node:path';
import { FrameType } from '../../src/protocol/frame.ts';
import { jsonFrame } from '../../src/protocol/payload.ts';
import { newSessionId } from '../../src/protocol/session.ts';
import { WsLink } from '../../src/transport/ws.ts';
import { freePort, getJson, node, proofFor, rawPeer, serve, sleep, waitReady, withTempDir } from './procs.ts';
import type { Served } from './procs.ts';

/**
 * What an API key opens. With separate credentials (flags the code may not have: then the
 * default, one secret for everything, is what is measured), `apiKey` is the API key.
 */
export async function keys(root: string, model: string): Promise<Record<string, unknown>> {
  const separate = ['--api-key', 'api-one', '--api-key', 'api-two', '--join-secret', 'join-secret', '--admin-secret', 'admin-secret'];
  let s: Served;
  let mode = 'separate credentials';
  let apiKey = 'api-one';
  let other = 'api-two';
  try {
    s = await serve(root, model, separate);
  } catch {
    mode = 'one secret (no separate credentials in this build)';
    s = await serve(root, model);
    apiKey = other = s.secret;
  }
  const n = await node(root, { ...s, joinUrl: mode.startsWith('one') ? s.joinUrl : s.joinUrl.replace(/#secret=.*/, '#secret=join-secret') });
  try {
    const routeId = await waitReady(mode.startsWith('one') ? s : { ...s, secret: 'admin-secret' });
    const link = await WsLink.connect(`${s.base.replace(/^http/, 'ws')}/v1/rooms/${s.roomId}/client`, { headers: { authorization: `Bearer ${other}` } });
    const sid = newSessionId();
    await link.request(jsonFrame(FrameType.SessionOpen, { routeId, sessionId: sid }, { contextLength: 64 }));
    const peer = await rawPeer(s);
    const ch = await peer.next();
    peer.send(JSON.stringify({ t: 'hello', proof: proofFor(apiKey, String(ch?.nonce)), backend: 'cpu', memoryBytes: 1 }));
    const joined = (await peer.next())?.t === 'welcome';
    peer.ws.terminate();
    const modelId = (await getJson(`${s.base}/v1/models`, apiKey)).body?.data?.[0]?.id;
    const dl = await fetch(`${s.base}/models/${modelId}.gguf`, { headers: { authorization: `Bearer ${apiKey}`, range: 'bytes=0-3' } });
    const read = await getJson(`${s.base}/v1/sessions/${sid}`, apiKey);
    const del = await fetch(`${s.base}/v1/sessions/${sid}`, { method: 'DELETE', headers: { authorization: `Bearer ${apiKey}` } });
    await link.close();
    return { mode, 'API key joins as a stage': joined, 'API key downloads the weights': dl.status, "API key reads another caller's session": read.status, "API key deletes another caller's session": del.status };
  } finally {
    await n.kill();
    await s.proc.kill();
  }
}

/** A hosted model served through a symlink that is re-pointed at /etc/hostname while serving. */
export async function symlinkSwap(root: string, model: string): Promise<Record<string, unknown>> {
  return withTempDir('probe-link-', async (dir) => {
    const real = join(dir, 'real.gguf');
    copyFileSync(model, real);
    const link = join(dir, 'm.gguf');
    symlinkSync(real, link);
    const s = await serve(root, link);
    try {
      unlinkSync(link);
      symlinkSync('/etc/hostname', link);
      // raw http: the reply may end short of its content-length, which fetch reports as an error
      const { status, body } = await new Promise<{ status: number; body: Buffer }>((resolve) => {
        const req = httpGet(`${s.base}/models/m.gguf`, { headers: { authorization: `Bearer ${s.secret}`, range: 'bytes=0-15' } }, (res) => {
          const parts: Buffer[] = [];
          res.on('data', (d: Buffer) => parts.push(d));
          const done = (): void => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(parts) });
          res.on('end', done);
          res.on('close', done);
          res.on('error', done);
        });
        req.on('error', () => resolve({ status: 0, body: Buffer.alloc(0) }));
      });
      const hostname = readFileSync('/etc/hostname');
      const leaked = body.length > 0 && body.equals(hostname.subarray(0, body.length));
      return { status, servedEtcHostname: leaked, first4: body.subarray(0, 4).toString('latin1') };
    } finally {
      await s.proc.kill();
    }
  });
}

/** serve restarted on the same port with the same model and secret: do nodes stay, does the room id and join link survive? */
export async function restart(root: string, model: string): Promise<Record<string, unknown>> {
  const port = await freePort();
  const args = ['--port', String(port), '--secret', 'restart-secret'];
  const first = await serve(root, model, args);
  const n = await node(root, first);
  await waitReady(first);
  await first.proc.kill();
  await sleep(500);
  const second = await serve(root, model, args);
  const t0 = Date.now();
  let ready = false;
  while (Date.now() - t0 < 20_000 && n.alive()) {
    const r = await getJson(`${second.base}/v1/rooms/${second.roomId}`, second.secret);
    if (r.body?.route?.status === 'ready') {
      ready = true;
      break;
    }
    await sleep(200);
  }
  const oldLink = await getJson(`${first.base}/v1/rooms/${first.roomId}`, first.secret);
  const out = {
    sameRoomId: first.roomId === second.roomId,
    nodeAlive: n.alive(),
    nodeSaid: n.output().trim().split('\n').slice(-1)[0]?.slice(0, 120),
    routeReadyAgainMs: ready ? Date.now() - t0 : null,
    oldJoinLink: `${oldLink.status} ${oldLink.body?.error?.code ?? oldLink.body?.route?.status ?? ''}`,
  };
  await n.kill();
  await second.proc.kill();
  return out;
}
