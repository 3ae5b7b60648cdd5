// `serve --ice-server` (repeatable): the STUN/TURN servers browser peers need to meet across
// the internet travel to every peer in the welcome message; a bad value is a usage error.
// `serve --stun on` (the default beyond loopback): serve answers STUN Binding requests itself on
// UDP at its own address and port number, and names that first in welcome.
import { createSocket } from 'node:dgram';
import { createRequire } from 'node:module';
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

  it('the welcome carries every --ice-server in order; without the flag it carries none (on loopback serve answers no STUN itself)', async () => {
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

  it('--stun on: serve answers a Binding request with the address it came from, ignores other datagrams, and names itself first in welcome', async () => {
    const served = await spawnServe(await stories260K(), ['--stun', 'on', '--ice-server', 'stun:stun.example.org:3478']);
    const port = Number(new URL(served.base).port);
    expect(served.proc.output()).toContain(`stun:     udp 127.0.0.1:${port}`);
    expect((await welcomeOf(served)).iceServers).toEqual([{ urls: `stun:127.0.0.1:${port}` }, { urls: 'stun:stun.example.org:3478' }]);
    // garbage, and a datagram that looks like STUN but is not one: the server keeps answering
    const junk = createSocket('udp4');
    await new Promise<void>((r) => junk.send(Buffer.from('not stun at all'), port, '127.0.0.1', () => r()));
    await new Promise<void>((r) => junk.send(Buffer.concat([Buffer.from([0, 1, 0, 0x10, 0x21, 0x12, 0xa4, 0x42]), Buffer.alloc(12)]), port, '127.0.0.1', () => r()));
    junk.close();
    const socket = createSocket('udp4');
    await new Promise<void>((r) => socket.bind(0, '127.0.0.1', () => r()));
    try {
      const stun = createRequire(import.meta.url)('@msimerson/stun');
      const res = await stun.request(`127.0.0.1:${port}`, { socket, retries: 2, timeout: 300 });
      expect(res.getXorAddress()).toEqual({ address: '127.0.0.1', port: socket.address().port, family: 'IPv4' });
    } finally {
      socket.close();
    }
    expect(served.proc.child.exitCode).toBeNull();
  });

  it('--host 0.0.0.0: each peer is told the STUN server at the address its own connection reached, not the join link\'s', async () => {
    const served = await spawnServe(await stories260K(), ['--host', '0.0.0.0', '--insecure-http', '--stun', 'on']);
    const port = Number(new URL(served.base).port);
    for (const host of ['127.0.0.1', '127.0.0.2']) {
      expect((await welcomeOf({ ...served, base: `http://${host}:${port}` })).iceServers, host).toEqual([{ urls: `stun:${host}:${port}` }]);
    }
  });

  it('--stun on where its UDP port is taken: serve exits naming the port and how to go without', async () => {
    const holder = createSocket('udp4');
    await new Promise<void>((r) => holder.bind(0, '127.0.0.1', () => r()));
    try {
      const port = holder.address().port;
      const r = await runCli(['serve', '--port', String(port), '--ui', 'off', '--stun', 'on', '--model', await stories260K()]);
      expect(r.code).not.toBe(0);
      expect(r.stderr).toContain('STUN_BIND_FAILED');
      expect(r.stderr).toContain(`UDP 127.0.0.1:${port}`);
      expect(r.stderr).toContain('--stun off');
    } finally {
      holder.close();
    }
  });

  it('serve --help documents --ice-server; a malformed one exits 2 naming the flag', async () => {
    const help = await runCli(['serve', '--help']);
    expect(help.stdout + help.stderr).toMatch(/--ice-server <url>.*STUN\/TURN/s);
    const r = await runCli(['serve', '--port', '0', '--ui', 'off', '--ice-server', 'turn:nohost.example.org']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--ice-server');
    expect(r.stderr).toContain('user:password@');
    expect(help.stdout + help.stderr).toMatch(/--stun <on\|off>.*default: on beyond loopback/s);
    const bad = await runCli(['serve', '--port', '0', '--ui', 'off', '--stun', 'maybe']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--stun must be on or off, got 'maybe'");
  });
});
