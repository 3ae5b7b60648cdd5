// Short-lived TURN credentials in the scheme coturn calls its REST API (`use-auth-secret` with
// `static-auth-secret`): the server and the TURN server share one secret; a peer's username is
// `<unix expiry>:<name>` and its password base64(HMAC-SHA1(secret, username)). The TURN server
// recomputes the password and refuses it after the expiry, so no static password reaches peers
// and a leaked credential stops working by itself.

import { createHmac } from 'node:crypto';
import type { IceServer } from '../src/protocol/control.ts';

export interface TurnCredential {
  username: string;
  credential: string;
}

/** A credential valid for `ttlS` seconds from `nowMs`, naming `name` (a peer id) in its username. */
export function mintTurnCredential(secret: string, name: string, ttlS: number, nowMs = Date.now()): TurnCredential {
  const username = `${Math.floor(nowMs / 1000) + ttlS}:${name.replace(/:/g, '_')}`;
  return { username, credential: createHmac('sha1', secret).update(username).digest('base64') };
}

/**
 * The ICE servers one peer is told: each TURN server without a credential gets a fresh minted
 * one; STUN servers and TURN servers with their own credential pass as they are.
 */
export function iceServersMinting(servers: readonly IceServer[], secret: string, ttlS: number): (peerId: string) => IceServer[] {
  return (peerId) => servers.map((s) => (/^turns?:/.test(s.urls) && s.username === undefined ? { ...s, ...mintTurnCredential(secret, peerId, ttlS) } : s));
}
