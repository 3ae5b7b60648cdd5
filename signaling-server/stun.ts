// serve's own STUN responder (RFC 5389 Binding): a browser tab asks it, over UDP on the server's
// address, which address and port its packets arrive from, and offers the answer to the other
// end of a data channel as a server-reflexive candidate. Chromium hides a tab's addresses behind
// mDNS names (<uuid>.local) that resolve only on the tab's own link, so without this two tabs on
// different networks (two subnets, or behind two NATs) never form a data channel and their hop
// falls back to relaying every frame through the server. The protocol is @msimerson/stun's.
import { createSocket } from 'node:dgram';
import { createRequire } from 'node:module';
import { MeshError } from '../src/errors.ts';
import type { IceServer } from '../src/protocol/control.ts';

interface StunMessage {
  type: number;
  transactionId: Buffer;
}
interface StunLib {
  createServer(o: { type: 'udp4' | 'udp6'; socket: unknown }): {
    on(event: string, cb: (...a: any[]) => void): void;
    send(message: unknown, port: number, address: string): void;
    close(): void;
  };
  createMessage(type: number, transactionId: Buffer): { addXorAddress(address: string, port: number): void };
  constants: Record<string, any>;
}
// a CommonJS package with no types of its own
const stun = createRequire(import.meta.url)('@msimerson/stun') as StunLib;

export interface StunResponder {
  /** what peers are told in welcome: stun:<address>:<port> */
  iceServer: IceServer;
  /** the same server named by `host`: on a wildcard bind, the address a peer's connection reached (the one it can send UDP to) */
  iceServerAt(host: string): IceServer;
  /** Binding requests answered so far */
  answered(): number;
  close(): Promise<void>;
}

/**
 * Answers STUN Binding requests on UDP `bindHost`:`port` (the HTTP server's own address and port
 * number; UDP and TCP ports are separate). `shownHost` is the address peers are told (the one in
 * the join link, when bound to every interface). Anything that is not a Binding request is ignored.
 */
export async function startStunResponder(bindHost: string, port: number, shownHost: string, log: (line: string) => void): Promise<StunResponder> {
  const socket = createSocket({ type: bindHost.includes(':') ? 'udp6' : 'udp4' });
  await new Promise<void>((resolve, reject) => {
    socket.once('error', (e) => reject(new MeshError('STUN_BIND_FAILED', `cannot answer STUN on UDP ${bindHost}:${port} (${e.message}); serve --stun off goes without (tabs on other networks then relay through the server)`)));
    socket.bind(port, bindHost, () => resolve());
  });
  const server = stun.createServer({ type: bindHost.includes(':') ? 'udp6' : 'udp4', socket });
  let answered = 0;
  server.on(stun.constants.STUN_EVENT_BINDING_REQUEST, (request: StunMessage, rinfo: { address: string; port: number }) => {
    if (request.type !== stun.constants.STUN_BINDING_REQUEST) return; // a TURN request: serve is no relay
    const reply = stun.createMessage(stun.constants.STUN_BINDING_RESPONSE, request.transactionId);
    reply.addXorAddress(rinfo.address, rinfo.port);
    server.send(reply, rinfo.port, rinfo.address);
    answered++;
  });
  // a datagram that is no STUN message (or a socket error after the bind) must not end the server
  let noted = false;
  server.on('error', (e: Error) => {
    if (noted || e.name === 'StunMessageError' || e.name === 'StunResponseError') return;
    noted = true;
    log(`stun: ${e.message}`);
  });
  const at = (host: string): IceServer => ({ urls: `stun:${host.includes(':') ? `[${host}]` : host}:${port}` });
  return {
    iceServer: at(shownHost),
    iceServerAt: at,
    answered: () => answered,
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}
