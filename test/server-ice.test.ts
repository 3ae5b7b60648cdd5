// `serve --ice-server` (repeatable): the STUN/TURN servers browser peers need to meet across
// the internet travel to every peer in the welcome message; a bad value is a usage error.
import { afterAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { stories260K } from './support/models.ts';
import { killAll, spawnServe } from './support/mesh.ts';
import type { ServeInfo } from './support/mesh.ts';
import { runCli } from './support/cli.ts';
import { helloProof, parseIceServer } from '../src/protocol/control.ts';

afterAll(async () => {
  await killAll();
});

/** Joins the room as a bare peer (the control protocol by hand) and returns the welcome. */
async function welcomeOf(serve: ServeInfo): Promise<Record<string, any>> {
  const ws = new WebSocket(`${serve.base.replace(/^http/, 'ws')}/v1/rooms/${serve.roomId}/peer`);
  try {
    return await new Promise((resolve, reject) => {
      ws.on('error', reject);
      ws.on('message', (data) => {
        const m = JSON.parse(data.toString());
        if (m.t === 'challenge') void helloProof(serve.secret, m.nonce).then((proof) => ws.send(JSON.stringify({ t: 'hello', proof, backend: 'none', memoryBytes: 0 })));
        else if (m.t === 'welcome') resolve(m);
        else if (m.t === 'error') reject(new Error(`${m.code}: ${m.message}`));
      });
    });
  } finally {
    ws.close();
  }
}

describe('ICE servers for browser peers', () => {
  it('parses stun: and turn:user:pass@ forms (credentials %-decoded) and refuses the rest', () => {
    expect(parseIceServer('stun:stun.example.org:3478')).toEqual({ urls: 'stun:stun.example.org:3478' });
    expect(parseIceServer('stun:[2001:db8::1]')).toEqual({ urls: 'stun:[2001:db8::1]' });
    expect(parseIceServer('turn:alice:s%40cret@turn.example.org:3478?transport=tcp')).toEqual({ urls: 'turn:turn.example.org:3478?transport=tcp', username: 'alice', credential: 's@cret' });
    expect(parseIceServer('turns:bob:pw@10.0.0.2:5349')).toEqual({ urls: 'turns:10.0.0.2:5349', username: 'bob', credential: 'pw' });
    for (const bad of ['http://stun.example.org', 'turn:turn.example.org:3478', 'stun:u:p@host', 'stun:host:99999', 'stun:', 'turn:a:b@host/path']) {
      expect(() => parseIceServer(bad), bad).toThrow();
    }
  });

  it('the welcome carries every --ice-server in order; without the flag it carries none', async () => {
    const model = await stories260K();
    const withIce = await spawnServe(model, ['--ice-server', 'stun:stun.example.org:3478', '--ice-server', 'turn:alice:s%40cret@turn.example.org:3478?transport=udp']);
    const plain = await spawnServe(model);
    const [a, b] = await Promise.all([welcomeOf(withIce), welcomeOf(plain)]);
    expect(a.iceServers).toEqual([
      { urls: 'stun:stun.example.org:3478' },
      { urls: 'turn:turn.example.org:3478?transport=udp', username: 'alice', credential: 's@cret' },
    ]);
    expect(a.peerId).toEqual(expect.any(String));
    expect(b).not.toHaveProperty('iceServers');
  });

  it('serve --help documents --ice-server; a malformed one exits 2 naming the flag', async () => {
    const help = await runCli(['serve', '--help']);
    expect(help.stdout + help.stderr).toMatch(/--ice-server <url>.*STUN\/TURN/s);
    const r = await runCli(['serve', '--port', '0', '--ui', 'off', '--ice-server', 'turn:nohost.example.org']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--ice-server');
    expect(r.stderr).toContain('user:password@');
  });
});
