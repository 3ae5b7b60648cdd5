// Who may do what. Three credentials, each a Bearer token (peers prove theirs with an HMAC):
//
//   join secret   the room secret in the join link: peers join, read the model's bytes, manifest and header
//   API key       what OpenAI clients send: completions, its own sessions (open, step, read, close), the header
//   admin secret  rooms, peers, routes, fetch logs, every session, the join links on /app/rooms
//
// With no API key and no admin secret configured (the default), each room's one secret opens
// everything for its room, as before; the server still has an admin secret for /app/rooms (the
// --secret given, or a random one printed in the page URL). API keys may download the model
// only when the operator says so (--api-downloads).

import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { MeshError } from '../src/errors.ts';
import { bearerOf, secretMatches } from '../src/transport/frame-server.ts';
import type { Room } from './room.ts';
import { newSecret } from './room-identity.ts';

/** api: OpenAI API and own sessions · peer: joining and model bytes · admin: management · download: model bytes */
export type Role = 'api' | 'peer' | 'admin' | 'download';

export interface Grant {
  /** the rooms the token opens */
  rooms: Room[];
  roles: ReadonlySet<Role>;
  /** who owns the sessions it opens (an API key's id); null where sessions are not kept apart */
  principal: string | null;
}

export interface CredentialOptions {
  /** API keys (Bearer tokens of OpenAI clients); any turns separate credentials on */
  apiKeys?: string[];
  /** the admin secret; given, it turns separate credentials on */
  adminSecret?: string;
  /** API keys may download the model's bytes (default false) */
  apiDownloads?: boolean;
  /** the one secret of every room in the default mode, also its admin secret there */
  secret?: string;
}

const ALL: ReadonlySet<Role> = new Set(['api', 'peer', 'admin', 'download']);

export class Access {
  /** separate credentials (API keys or an admin secret configured) rather than one secret per room */
  readonly separate: boolean;
  readonly adminSecret: string;
  private readonly apiKeys: string[];
  private readonly apiRoles: ReadonlySet<Role>;

  constructor(
    opts: CredentialOptions,
    private readonly rooms: () => Room[],
  ) {
    this.apiKeys = (opts.apiKeys ?? []).filter((k) => k.length > 0);
    this.separate = this.apiKeys.length > 0 || !!opts.adminSecret;
    this.adminSecret = opts.adminSecret ?? opts.secret ?? newSecret();
    this.apiRoles = new Set<Role>(opts.apiDownloads ? ['api', 'download'] : ['api']);
  }

  /** What a Bearer token opens; AUTH_FAILED when it opens nothing. */
  grant(token: string | undefined): Grant {
    if (token !== undefined && secretMatches(token, this.adminSecret)) return { rooms: this.rooms(), roles: ALL, principal: null };
    const key = token === undefined ? undefined : this.apiKeys.find((k) => secretMatches(token, k));
    if (key !== undefined) return { rooms: this.rooms(), roles: this.apiRoles, principal: `key:${createHash('sha256').update(key).digest('hex').slice(0, 12)}` };
    const rooms = token === undefined ? [] : this.rooms().filter((r) => secretMatches(token, r.secret));
    if (rooms.length) return { rooms, roles: this.separate ? new Set<Role>(['peer', 'download']) : ALL, principal: null };
    throw new MeshError('AUTH_FAILED', 'missing or wrong credential (Authorization: Bearer <room secret, API key or admin secret>)');
  }

  /** The request's grant (its Bearer token). */
  grantOf(req: IncomingMessage): Grant {
    return this.grant(bearerOf(req));
  }

  /** True when the request presents the admin secret (or, in the default mode, a room secret that opens every room). */
  isAdmin(req: IncomingMessage): boolean {
    try {
      const g = this.grantOf(req);
      return g.roles.has('admin') && g.rooms.length === this.rooms().length;
    } catch {
      return false;
    }
  }
}

/** FORBIDDEN (403) unless the grant holds one of `roles`; `what` names the endpoint. */
export function need(grant: Grant, roles: readonly Role[], what: string): void {
  if (!roles.some((r) => grant.roles.has(r))) {
    throw new MeshError('FORBIDDEN', `${what} takes ${roles.map((r) => (r === 'peer' ? 'the join secret' : r === 'api' ? 'an API key' : r === 'admin' ? 'the admin secret' : 'a credential that may download the model')).join(' or ')}`);
  }
}
