// Whether the browser may evict the shard cache, and how full the origin's storage is. A peer
// asks for persistent storage (navigator.storage.persist) when it starts caching: without it
// the browser may clear the cache under storage pressure, silently. Eviction is then found the
// only way a page can find it — units the tab advertised as held are missing when it loads
// them — and handled by fetching them again (every cached byte is re-hashed on read anyway, so
// a missing or damaged unit is never served).

export interface StorageStatus {
  /** the origin's storage is persistent (null: the browser has no StorageManager) */
  persisted: boolean | null;
  quotaBytes: number | null;
  usageBytes: number | null;
  /** units this tab advertised as held that were gone when it loaded them (evicted), re-fetched */
  evictedUnits: string[];
}

type Storage = Pick<StorageManager, 'persist' | 'persisted' | 'estimate'>;

const storageManager = (): Partial<Storage> | undefined => (globalThis.navigator as Navigator | undefined)?.storage;

/** Asks for persistent storage once (browsers grant it by engagement, installation or permission) and reads the estimate. */
export async function requestPersistence(): Promise<StorageStatus> {
  const sm = storageManager();
  let persisted: boolean | null = null;
  try {
    persisted = sm?.persisted ? await sm.persisted() : null;
    if (persisted === false && sm?.persist) persisted = await sm.persist();
  } catch {
    persisted = null;
  }
  return { persisted, ...(await storageEstimate()), evictedUnits: [] };
}

/** The origin's quota and usage, where the browser says. */
export async function storageEstimate(): Promise<{ quotaBytes: number | null; usageBytes: number | null }> {
  try {
    const e = await storageManager()?.estimate?.();
    return { quotaBytes: e?.quota ?? null, usageBytes: e?.usage ?? null };
  } catch {
    return { quotaBytes: null, usageBytes: null };
  }
}

/** Units advertised as held that a load had to fetch: the browser evicted them meanwhile. */
export function evictedUnits(advertised: readonly string[], fetched: readonly string[]): string[] {
  const held = new Set(advertised);
  return fetched.filter((u) => held.has(u));
}
