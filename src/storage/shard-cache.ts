// The shard cache: verified tensor bytes kept between visits, keyed by the artifact's sha256
// (so two models never mix) and by shard unit (`embed`, `layer.N`, `head`, `global`).
//
// Records (one KeyValueStore):
//   t/<artifact sha256>/<tensor name>  → Uint8Array, the tensor's bytes
//   u/<artifact sha256>/<unit name>    → UnitRecord: the unit's tensors with their sha256
//
// A unit's tensors and its UnitRecord are written in one atomic batch, so a unit record never
// names a tensor that is not fully stored. Reading a unit re-hashes every tensor against the
// manifest (bytes on disk can rot or be edited); a unit that fails is dropped, never used.

import { MeshError } from '../errors.ts';
import type { Manifest } from '../gguf/verify.ts';
import { sha256HexAsync } from '../gguf/verify.ts';
import { storageError } from './kv-store.ts';
import type { KeyValueStore } from './kv-store.ts';

export interface UnitRecord {
  unit: string;
  tensors: Array<{ name: string; sha256: string; bytes: number }>;
  storedAt: number;
}

export interface CacheReadResult {
  /** verified bytes by tensor name */
  tensors: Map<string, Uint8Array>;
  /** bytes served from the cache */
  bytes: number;
}

export type CacheEvent =
  | { kind: 'dropped'; artifact: string; unit: string; reason: string }
  | { kind: 'stored'; artifact: string; unit: string; bytes: number };

const tensorKey = (artifact: string, name: string): string => `t/${artifact}/${name}`;
const unitKey = (artifact: string, unit: string): string => `u/${artifact}/${unit}`;

/** Tensor names a unit needs: its own tensors plus those it uses (the tied embedding). */
export function unitTensorNames(manifest: Manifest, unit: string): string[] {
  const g = manifest.groups.find((x) => x.name === unit);
  if (!g) throw new MeshError('UNKNOWN_UNIT', `artifact ${manifest.artifact.sha256} has no shard unit '${unit}'`);
  return [...g.tensors, ...g.uses];
}

function asBytes(v: unknown): Uint8Array | null {
  if (v instanceof Uint8Array) return v;
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  return null;
}

export class ShardCache {
  constructor(
    readonly store: KeyValueStore,
    private readonly onEvent: (e: CacheEvent) => void = () => {},
  ) {}

  /** Units of `artifact` that have a complete record (not yet re-verified: see `readUnits`). */
  async heldUnits(artifact: string): Promise<string[]> {
    const prefix = `u/${artifact}/`;
    try {
      return (await this.store.keys()).filter((k) => k.startsWith(prefix)).map((k) => k.slice(prefix.length)).sort();
    } catch (e) {
      throw storageError(e, 'listing the shard cache');
    }
  }

  /**
   * Reads and re-verifies `units`. Returns the tensors of every unit that is held and
   * verifies; a unit whose record or bytes are missing or wrong is dropped (and reported).
   */
  async readUnits(manifest: Manifest, units: readonly string[]): Promise<{ result: CacheReadResult; hit: string[]; miss: string[] }> {
    const artifact = manifest.artifact.sha256;
    const tensors = new Map<string, Uint8Array>();
    const hit: string[] = [];
    const miss: string[] = [];
    let bytes = 0;
    for (const unit of units) {
      const got = await this.readUnit(manifest, unit);
      if (!got) {
        miss.push(unit);
        continue;
      }
      hit.push(unit);
      for (const [k, v] of got) {
        if (!tensors.has(k)) bytes += v.byteLength;
        tensors.set(k, v);
      }
    }
    return { result: { tensors, bytes }, hit, miss };
  }

  private async readUnit(manifest: Manifest, unit: string): Promise<Map<string, Uint8Array> | null> {
    const artifact = manifest.artifact.sha256;
    const wanted = unitTensorNames(manifest, unit);
    let values: unknown[];
    try {
      values = await this.store.getMany([unitKey(artifact, unit), ...wanted.map((n) => tensorKey(artifact, n))]);
    } catch (e) {
      throw storageError(e, `reading unit ${unit} from the shard cache`);
    }
    const record = values[0] as UnitRecord | undefined;
    if (!record) return null;
    const out = new Map<string, Uint8Array>();
    for (let i = 0; i < wanted.length; i++) {
      const name = wanted[i]!;
      const entry = manifest.tensors.find((t) => t.name === name)!;
      const bytes = asBytes(values[i + 1]);
      const listed = record.tensors.find((t) => t.name === name);
      let reason: string | null = null;
      if (!listed) reason = `record does not list ${name}`;
      else if (!bytes) reason = `bytes of ${name} are missing`;
      else if (bytes.byteLength !== entry.byte_length) reason = `${name} has ${bytes.byteLength} bytes, the manifest says ${entry.byte_length}`;
      else {
        const actual = await sha256HexAsync(bytes);
        if (actual !== entry.sha256) reason = `${name}: sha256 ${actual}, the manifest says ${entry.sha256}`;
      }
      if (reason) {
        await this.dropUnit(artifact, unit, reason);
        return null;
      }
      out.set(name, bytes!);
    }
    return out;
  }

  /**
   * Stores one unit's verified tensors in one atomic batch. Throws STORAGE_QUOTA when the
   * browser refuses for lack of space (nothing of the unit is then stored).
   */
  async storeUnit(manifest: Manifest, unit: string, tensors: ReadonlyMap<string, Uint8Array>): Promise<void> {
    const artifact = manifest.artifact.sha256;
    const names = unitTensorNames(manifest, unit);
    const record: UnitRecord = { unit, tensors: [], storedAt: Date.now() };
    const entries: Array<[string, unknown]> = [];
    let bytes = 0;
    for (const name of names) {
      const b = tensors.get(name);
      const entry = manifest.tensors.find((t) => t.name === name)!;
      if (!b) throw new MeshError('CACHE_INCOMPLETE', `storing unit ${unit}: tensor ${name} was not given`);
      // a copy that owns its buffer: views into a coalesced read would store the neighbours too
      entries.push([tensorKey(artifact, name), b.byteOffset === 0 && b.byteLength === b.buffer.byteLength ? b : b.slice()]);
      record.tensors.push({ name, sha256: entry.sha256, bytes: b.byteLength });
      bytes += b.byteLength;
    }
    entries.push([unitKey(artifact, unit), record]); // the commit record rides in the same batch
    try {
      await this.store.setMany(entries);
    } catch (e) {
      throw storageError(e, `storing unit ${unit} (${bytes} bytes) of artifact ${artifact.slice(0, 12)}`);
    }
    this.onEvent({ kind: 'stored', artifact, unit, bytes });
  }

  /** Forgets a unit (its record first, so a crash in between leaves no usable half). */
  async dropUnit(artifact: string, unit: string, reason: string): Promise<void> {
    this.onEvent({ kind: 'dropped', artifact, unit, reason });
    try {
      await this.store.delMany([unitKey(artifact, unit)]);
    } catch (e) {
      throw storageError(e, `dropping unit ${unit} from the shard cache`);
    }
    // tensor records shared with another held unit (the tied embedding) stay
  }

  /** Removes everything cached for `artifact` (or for every artifact). */
  async clear(artifact?: string): Promise<void> {
    try {
      const all = await this.store.keys();
      await this.store.delMany(all.filter((k) => !artifact || k.startsWith(`t/${artifact}/`) || k.startsWith(`u/${artifact}/`)));
    } catch (e) {
      throw storageError(e, 'clearing the shard cache');
    }
  }
}
