// The shard cache over the Origin Private File System, for slices too large for IndexedDB to
// hold comfortably (one file per record; a multi-GiB tensor is one file, not one IDB value).
// Each record is written with createWritable(), which goes to a swap file and replaces the
// record only on close(): a record is whole or absent. A batch is written in order and the
// shard cache puts its commit record (the unit) last, so a batch cut short leaves tensor files
// that no unit names — never used, and overwritten by the next store.

import { MeshError } from '../errors.ts';
import type { KeyValueStore } from './kv-store.ts';

/** File name of a key (keys hold '/', which OPFS names may not). */
const fileOf = (key: string): string => encodeURIComponent(key);
const keyOf = (file: string): string => decodeURIComponent(file);
const JSON_SUFFIX = '.json';

export async function opfsStore(dirName = 'gguf-mesh-shard-cache'): Promise<KeyValueStore & { kind: 'opfs' }> {
  const storage = (globalThis.navigator as Navigator | undefined)?.storage;
  if (!storage?.getDirectory) throw new MeshError('STORAGE_UNAVAILABLE', 'the Origin Private File System is not available here');
  const root = await storage.getDirectory();
  const dir = await root.getDirectoryHandle(dirName, { create: true });

  const read = async (key: string): Promise<unknown> => {
    for (const [name, json] of [[fileOf(key), false], [fileOf(key) + JSON_SUFFIX, true]] as const) {
      let handle: FileSystemFileHandle;
      try {
        handle = await dir.getFileHandle(name);
      } catch {
        continue; // NotFoundError: try the other form
      }
      const file = await handle.getFile();
      if (!json) return new Uint8Array(await file.arrayBuffer());
      try {
        return JSON.parse(await file.text());
      } catch {
        return undefined; // an empty or foreign file (a write that never completed): no record
      }
    }
    return undefined;
  };

  return {
    kind: 'opfs',
    getMany: (keys) => Promise.all(keys.map(read)),
    async setMany(entries) {
      for (const [key, value] of entries) {
        const binary = value instanceof Uint8Array;
        const body = binary ? (value as Uint8Array<ArrayBuffer>) : JSON.stringify(value); // throws before any file exists
        const name = binary ? fileOf(key) : fileOf(key) + JSON_SUFFIX;
        const other = binary ? fileOf(key) + JSON_SUFFIX : fileOf(key);
        await dir.removeEntry(other).catch(() => undefined);
        const existed = await dir.getFileHandle(name).then(() => true, () => false);
        const handle = await dir.getFileHandle(name, { create: true });
        const w = await handle.createWritable();
        try {
          await w.write(body);
          await w.close(); // the record's content appears here, whole
        } catch (e) {
          await w.abort().catch(() => undefined);
          if (!existed) await dir.removeEntry(name).catch(() => undefined);
          throw e;
        }
      }
    },
    async delMany(keys) {
      for (const k of keys) {
        await dir.removeEntry(fileOf(k)).catch(() => undefined);
        await dir.removeEntry(fileOf(k) + JSON_SUFFIX).catch(() => undefined);
      }
    },
    async keys() {
      const out: string[] = [];
      for await (const name of (dir as unknown as { keys(): AsyncIterable<string> }).keys()) {
        if (name.endsWith('.crswap')) continue; // Chromium's in-progress swap files
        out.push(keyOf(name.endsWith(JSON_SUFFIX) ? name.slice(0, -JSON_SUFFIX.length) : name));
      }
      return [...new Set(out)];
    },
  };
}
