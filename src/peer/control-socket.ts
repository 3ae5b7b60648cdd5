// A browser peer's control connection to the signaling server: one WebSocket carrying JSON
// control messages (text) and frames from the server to this peer's stage (binary). The room
// secret never crosses the wire: the peer answers the server's nonce with an HMAC (protocol/control.ts).

import { MeshError } from '../errors.ts';
import { parseServerMessage } from '../protocol/control.ts';
import type { ServerMessage } from '../protocol/control.ts';
import type { MessagePipe } from '../transport/webrtc-link.ts';

export interface ControlSocket {
  /** frames from the server (the server's requests to this stage) */
  readonly frames: MessagePipe;
  sendJson(m: unknown): void;
  /** valid control messages only: one that does not match its schema goes to `onInvalid` */
  onJson(cb: (m: ServerMessage) => void): void;
  close(): void;
  readonly closed: Promise<MeshError>;
}

/** Largest frame message to the server (its WebSocket accepts 64 MiB). */
const SERVER_MESSAGE_LIMIT = 32 * 1024 * 1024;

export function openControlSocket(base: string, roomId: string, onInvalid: (e: MeshError) => void = () => undefined): Promise<ControlSocket> {
  const url = `${base.replace(/^http/, 'ws')}/v1/rooms/${encodeURIComponent(roomId)}/peer`;
  const ws = new WebSocket(url);
  ws.binaryType = 'arraybuffer';
  const jsonCbs: Array<(m: ServerMessage) => void> = [];
  const frameCbs: Array<(m: Uint8Array) => void> = [];
  const closeCbs: Array<(r: MeshError) => void> = [];
  let resolveClosed!: (e: MeshError) => void;
  const closed = new Promise<MeshError>((r) => (resolveClosed = r));
  ws.addEventListener('message', (ev) => {
    if (typeof ev.data === 'string') {
      let m: ServerMessage;
      try {
        m = parseServerMessage(ev.data);
      } catch (e) {
        return onInvalid(e as MeshError);
      }
      for (const cb of jsonCbs) cb(m);
    } else {
      const bytes = new Uint8Array(ev.data as ArrayBuffer);
      for (const cb of frameCbs) cb(bytes);
    }
  });
  ws.addEventListener('close', (ev) => {
    const err = new MeshError('LINK_CLOSED', `control connection to ${base} closed (${ev.code}${ev.reason ? ` ${ev.reason}` : ''})`);
    for (const cb of closeCbs) cb(err);
    resolveClosed(err);
  });
  const frames: MessagePipe = {
    label: 'signaling server',
    maxMessageSize: SERVER_MESSAGE_LIMIT,
    async send(m) {
      if (ws.readyState !== WebSocket.OPEN) throw new MeshError('LINK_CLOSED', 'control connection is closed');
      ws.send(m);
    },
    onMessage: (cb) => void frameCbs.push(cb),
    onClose: (cb) => void closeCbs.push(cb),
    close: () => ws.close(),
  };
  return new Promise((resolve, reject) => {
    ws.addEventListener('error', () => reject(new MeshError('JOIN_FAILED', `cannot open ${url}`)), { once: true });
    ws.addEventListener(
      'open',
      () =>
        resolve({
          frames,
          sendJson: (m) => {
            if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m));
          },
          onJson: (cb) => void jsonCbs.push(cb),
          close: () => ws.close(1000),
          closed,
        }),
      { once: true },
    );
  });
}
