// A native peer inside the test process whose stage is the CPU reference (CpuBackend) over a
// local copy of the model, recording every input it is given: the hidden states another
// implementation's stage sent it, exactly as they arrived. Joins the room over the real
// control socket and frame server (peer/peer-core.ts), like `gguf-mesh node --backend cpu`.
import WebSocket from 'ws';
import { CpuBackend } from '../../src/backends/cpu/backend.ts';
import type { ForwardResult, StageInput } from '../../src/backends/types.ts';
import { openTensorSource } from '../../src/gguf/source.ts';
import { parseJoinUrl } from '../../src/protocol/control.ts';
import type { PeerToServer } from '../../src/protocol/control.ts';
import { backendCapability } from '../../src/backends/capabilities.ts';
import { PeerCore } from '../../src/peer/peer-core.ts';
import { startFrameServer } from '../../src/transport/frame-server.ts';
import type { FrameServer } from '../../src/transport/frame-server.ts';
import { serveFrames, WsLink } from '../../src/transport/ws.ts';
import type { FrameLink } from '../../src/transport/link.ts';

export interface RecordedInput {
  sessionId: string;
  position: number;
  /** token ids (stage 0) or hidden rows [nTokens × n_embd] as received */
  input: StageInput;
}

/** The CPU reference, recording what each forward was given. */
export class RecordingCpuBackend extends CpuBackend {
  readonly inputs: RecordedInput[] = [];

  override async forward(sessionId: string, input: StageInput, position: number): Promise<ForwardResult> {
    const copy: StageInput = input.kind === 'tokens' ? { kind: 'tokens', tokens: input.tokens.slice() } : { kind: 'hidden', hidden: input.hidden.slice(), nTokens: input.nTokens };
    this.inputs.push({ sessionId, position, input: copy });
    return super.forward(sessionId, input, position);
  }
}

export interface RecordingPeer {
  /** the backend of the stage it serves now (null before the first load) */
  backend(): RecordingCpuBackend | null;
  close(): Promise<void>;
}

/** Joins `joinUrl` as a peer serving whatever it is assigned from the local file `modelPath`. */
export async function startRecordingPeer(joinUrl: string, secret: string, modelPath: string, hello: { name: string; memoryBytes: number; layers?: { start: number; end: number } }): Promise<RecordingPeer> {
  const { base, roomId } = parseJoinUrl(joinUrl);
  let current: RecordingCpuBackend | null = null;
  let control: WebSocket | null = null;
  const send = (m: PeerToServer): void => void (control?.readyState === WebSocket.OPEN && control.send(JSON.stringify(m)));
  const core = new PeerCore({
    secret,
    send,
    log: () => undefined,
    loadShard: async (ctx) => {
      const a = ctx.assignment;
      const source = ctx.keep(await openTensorSource(modelPath), (s) => s.close());
      const backend = ctx.keep(new RecordingCpuBackend(), (b) => b.dispose());
      await backend.load(source, a.shard);
      current = backend;
      return { backend, bytesRead: 0, detail: 'local file' };
    },
    linkNext: async (next, ctx) => {
      const link: FrameLink | null = next.downstream ? ctx.keep(await WsLink.connect(next.downstream, { headers: { authorization: `Bearer ${secret}` } }), (l) => l.close()) : null;
      return { link, detail: link ? 'ws' : 'last stage' };
    },
  });
  const server: FrameServer = await startFrameServer({ host: '127.0.0.1', port: 0, secret, handler: core.handle, status: () => ({}) });
  const ws = (control = new WebSocket(`${base.replace(/^http/, 'ws')}/v1/rooms/${roomId}/peer`));
  serveFrames(ws, core.handle);
  ws.on('message', (data, isBinary) => void (!isBinary && core.onMessage(JSON.parse(data.toString()))));
  const gone = new Promise<Error>((resolve) => ws.once('close', () => resolve(new Error('control socket closed'))));
  await core.join({ backend: 'cpu', memoryBytes: hello.memoryBytes, serves: backendCapability('cpu'), listen: server.wsUrl, httpUrl: server.url, name: hello.name, ...(hello.layers ? { layers: hello.layers } : {}) }, gone);
  return {
    backend: () => current,
    async close() {
      ws.close();
      await core.close();
      await server.close();
    },
  };
}
