// Where the shard cache keeps its records: IndexedDB through idb-keyval in browsers, a Map in
// tests and in Node. `setMany` is the unit of atomicity: the whole batch goes in one
// IndexedDB transaction, so a reader sees all of it or none of it (a tab closed mid-write, or a
// quota error at commit, leaves no partial batch behind). idb-keyval's own setMany lets the
// puts before a synchronously failing put commit, so ours aborts the transaction instead.

import { createStore, delMany, getMany, keys, promisifyRequest } from 'idb-keyval';
import { MeshError } from '../errors.ts';

export interface KeyValueStore {
  readonly kind: 'indexeddb' | 'opfs' | 'memory';
  getMany(keys: readonly string[]): Promise<unknown[]>;
  /** writes every entry, or none of them */
  setMany(entries: ReadonlyArray<readonly [string, unknown]>): Promise<void>;
  delMany(keys: readonly string[]): Promise<void>;
  keys(): Promise<string[]>;
}

/** True for the errors browsers raise when storage is full or the origin's quota is spent. */
export function isQuotaError(e: unknown): boolean {
  const name = (e as { name?: string } | null)?.name;
  return name === 'QuotaExceededError' || name === 'NS_ERROR_DOM_QUOTA_REACHED';
}

/** Turns a storage failure into a MeshError: STORAGE_QUOTA when the quota bit, else STORAGE_FAILED. */
export function storageError(e: unknown, what: string): MeshError {
  if (e instanceof MeshError) return e;
  const err = e as { name?: string; message?: string } | null;
  if (isQuotaError(e)) {
    return new MeshError('STORAGE_QUOTA', `${what}: browser storage quota exceeded (${err?.message ?? err?.name})`, { cause: err?.name });
  }
  return new MeshError('STORAGE_FAILED', `${what}: ${err?.name ?? 'Error'}: ${err?.message ?? String(e)}`, { cause: err?.name });
}

/** IndexedDB database `dbName`, object store `storeName` (idb-keyval). */
export function indexedDbStore(dbName = 'gguf-mesh', storeName = 'shard-cache'): KeyValueStore {
  if (typeof indexedDB === 'undefined') throw new MeshError('STORAGE_UNAVAILABLE', 'IndexedDB is not available here');
  const store = createStore(dbName, storeName);
  return {
    kind: 'indexeddb',
    getMany: (k) => getMany([...k], store),
    setMany: (entries) =>
      store('readwrite', (os) => {
        try {
          for (const [k, v] of entries) os.put(v, k);
        } catch (e) {
          os.transaction.abort(); // nothing of the batch may commit
          throw e;
        }
        return promisifyRequest(os.transaction);
      }),
    delMany: (k) => delMany([...k], store),
    keys: async () => (await keys(store)).map(String),
  };
}

/** A store in memory (Node peers, tests); `quotaBytes` makes writes past it fail like a full disk. */
export function memoryStore(quotaBytes = Infinity): KeyValueStore {
  const map = new Map<string, unknown>();
  const sizeOf = (v: unknown): number => (v instanceof Uint8Array ? v.byteLength : v instanceof ArrayBuffer ? v.byteLength : JSON.stringify(v ?? null).length);
  let used = 0;
  return {
    kind: 'memory',
    getMany: async (k) => k.map((key) => map.get(key)),
    setMany: async (entries) => {
      let delta = 0;
      for (const [k, v] of entries) delta += sizeOf(v) - (map.has(k) ? sizeOf(map.get(k)) : 0);
      if (used + delta > quotaBytes) throw new DOMException(`memory store holds at most ${quotaBytes} bytes`, 'QuotaExceededError');
      for (const [k, v] of entries) map.set(k, v);
      used += delta;
    },
    delMany: async (k) => {
      for (const key of k) {
        if (map.has(key)) used -= sizeOf(map.get(key));
        map.delete(key);
      }
    },
    keys: async () => [...map.keys()],
  };
}
