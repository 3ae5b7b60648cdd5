// A donor that lies: a real peer (PeerCore over a real control socket and frame server, the CPU
// engine on its assigned shard) whose hidden states are shifted after they are computed, while
// `lying()` says so. What a hostile visitor to a public room could do; the spot checks must
// catch it. A test double of the peer's *behaviour*, not of any part under test.
import WebSocket from 'ws';
import { CpuBackend } from '../../src/backends/cpu/backend.ts';
import type { StageBackend } from '../../src/backends/types.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import { backendCapability } from '../../src/backends/capabilities.ts';
import { PeerCore } from '../../src/peer/peer-core.ts';
import { parseJoinUrl, parseServerMessage } from '../../src/protocol/control.ts';
import { MeshError } from '../../src/errors.ts';
import { startFrameServer } from '../../src/transport/frame-server.ts';
import { serveFrames, WsLink } from '../../src/transport/ws.ts';

/** Delegates to the CPU engine; adds `shift` to every hidden value it returns while lying. */
class LyingBackend implements StageBackend {
  readonly kind = 'cpu' as const;
  private readonly inner = new CpuBackend();
  constructor(private readonly lying: () => boolean, private readonly shift = 1) {}
  load: StageBackend['load'] = (s, r) => this.inner.load(s, r);
  openSession: StageBackend['openSession'] = (id, o) => this.inner.openSession(id, o);
  releaseSession: StageBackend['releaseSession'] = (id) => this.inner.releaseSession(id);
  truncateSession: StageBackend['truncateSession'] = (id, p) => this.inner.truncateSession(id, p);
  sessionStats: StageBackend['sessionStats'] = (id) => this.inner.sessionStats(id);
  dispose: StageBackend['dispose'] = () => this.inner.dispose();
  async forward(...args: Parameters<StageBackend['forward']>): ReturnType<StageBackend['forward']> {
    const r = await this.inner.forward(...args);
    if (this.lying() && r.output.kind === 'hidden') for (let i = 0; i < r.output.hidden.length; i++) r.output.hidden[i]! += this.shift;
    return r;
  }
}

export interface LyingPeer {
  peerId: string | null;
  close(): Promise<void>;
}

export async function startLyingPeer(joinUrl: string, name: string, lying: () => boolean): Promise<LyingPeer> {
  const { base, roomId, secret } = parseJoinUrl(joinUrl);
  const auth = { authorization: `Bearer ${secret!}` };
  let core!: PeerCore;
  const server = await startFrameServer({ host: '127.0.0.1', port: 0, secret: secret!, handler: (f) => core.handle(f), status: () => ({}) });
  const ws = new WebSocket(`${base.replace(/^http/, 'ws')}/v1/rooms/${roomId}/peer`);
  core = new PeerCore({
    secret: secret!,
    send: (m) => ws.readyState === ws.OPEN && ws.send(JSON.stringify(m)),
    log: () => undefined,
    loadShard: async (ctx) => {
      const a = ctx.assignment;
      const source = ctx.keep(await openTensorSource(a.modelUrl, { headers: auth }), (s) => s.close());
      const backend = ctx.keep(new LyingBackend(lying), (b) => b.dispose());
      await backend.load(source, a.shard);
      return { backend, bytesRead: 0, detail: 'a donor' };
    },
    linkNext: async (next, ctx) => ({ link: next.downstream ? ctx.keep(await WsLink.connect(next.downstream, { headers: auth }), (l) => l.close()) : null, detail: 'ws' }),
  });
  serveFrames(ws, core.handle);
  ws.on('message', (d, bin) => !bin && core.onMessage(parseServerMessage(d.toString())));
  const gone = new Promise<Error>((r) => ws.on('close', () => r(new MeshError('JOIN_FAILED', 'closed'))));
  // joining before the socket opens: the server's challenge comes first thing
  await core.join({ backend: 'cpu', memoryBytes: 4 * 2 ** 30, serves: backendCapability('cpu'), listen: server.wsUrl, httpUrl: server.url, name }, gone);
  return {
    get peerId() {
      return core.peerId;
    },
    async close() {
      ws.close();
      await core.close();
      await server.close();
    },
  };
}
