// A room's id and secret that survive restarts of `serve`: the id is derived from the secret
// and the model (an HMAC, so it says nothing about either), and a random secret made for a
// model is kept under the cache dir (rooms.json, mode 0600), so a join link printed once keeps
// working after a restart with the same model — nodes and tabs rejoin the same room.

import { createHmac, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { meshCacheDir } from '../src/cache-dir.ts';
import { isUrl } from '../src/gguf/parse.ts';

export interface RoomIdentity {
  id: string;
  secret: string;
}

/** What names a model across restarts: its id on this server, where it lives and its size. */
export function modelKey(modelId: string, location: string, fileBytes: number): string {
  return `${modelId}|${isUrl(location) ? location : resolve(location)}|${fileBytes}`;
}

/** The room id for a model key under a secret: 12 hex digits of HMAC-SHA256(secret, key). */
export function roomIdFor(secret: string, key: string): string {
  return createHmac('sha256', secret).update(key).digest('hex').slice(0, 12);
}

function readStore(file: string): Record<string, string> {
  try {
    const j = JSON.parse(readFileSync(file, 'utf8')) as unknown;
    return typeof j === 'object' && j !== null && !Array.isArray(j) ? (j as Record<string, string>) : {};
  } catch {
    return {};
  }
}

/**
 * A fresh room or admin secret: 18 random bytes as base64url, drawn again when it would start
 * with '-', which command-line parsers (ours, argparse) read as a flag after `--secret`.
 */
export function newSecret(): string {
  for (;;) {
    const s = randomBytes(18).toString('base64url');
    if (!s.startsWith('-')) return s;
  }
}

/**
 * The room's identity: with `secret` given, the id derived from it; without, the secret kept for
 * this model under the cache dir (made and kept the first time), and the id derived from that.
 */
export function roomIdentity(key: string, secret: string | undefined, store = join(meshCacheDir(), 'rooms.json')): RoomIdentity {
  if (secret) return { id: roomIdFor(secret, key), secret };
  const kept = readStore(store);
  let s = kept[key];
  if (typeof s !== 'string' || s.length < 16) {
    s = newSecret();
    try {
      mkdirSync(dirname(store), { recursive: true });
      const tmp = `${store}.${process.pid}.tmp`;
      writeFileSync(tmp, JSON.stringify({ ...readStore(store), [key]: s }, null, 2), { mode: 0o600 });
      renameSync(tmp, store);
    } catch {
      // a read-only cache: the room still opens, its link just will not outlive this process
    }
  }
  return { id: roomIdFor(s, key), secret: s };
}
