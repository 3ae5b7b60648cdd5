// A serving tab and the page lifecycle. Phones suspend background tabs within seconds, and a
// frozen tab answers no frame: so a tab hands its stage over (the graceful leave of
// BrowserPeer.leave: the server moves the sessions to a replacement) as soon as it is hidden,
// or frozen (an unloading page turns hidden first), and joins again when it is shown or resumed. While it serves it holds a
// Screen Wake Lock where the browser has one (the lock drops by itself when the page is hidden,
// so it is asked for again on the way back). "Serve only while charging" leaves when the
// Battery Status API says the device went on battery, and rejoins when it is plugged in.

export type WakeLockState = 'held' | 'released' | 'unsupported' | `refused: ${string}`;
export type SuspendedBy = 'hidden' | 'frozen' | 'battery' | null;

export interface SuspensionState {
  wakeLock: WakeLockState;
  /** why the tab left the room for now (it rejoins when that ends), or null */
  suspendedBy: SuspendedBy;
  /** from the Battery Status API, where there is one */
  charging: boolean | null;
}

export interface SuspensionOptions {
  /** whether the tab is in the room (a spare, loading or serving): it leaves when suspended */
  joined: () => boolean;
  /** whether it loads or serves a stage: it holds the wake lock */
  serving: () => boolean;
  /** hand the stage over and leave the room (a graceful leave) */
  leave: () => Promise<unknown>;
  /** join the room again */
  rejoin: () => Promise<unknown>;
  /** leave while the device runs on battery */
  chargingOnly?: boolean;
  onChange?: (s: SuspensionState) => void;
  log?: (line: string) => void;
}

interface BatteryManagerLike extends EventTarget {
  charging: boolean;
}

export interface SuspensionGuard {
  readonly state: SuspensionState;
  /** tell the guard the peer's status changed: takes or drops the wake lock */
  update(): void;
  dispose(): void;
}

export function guardSuspension(o: SuspensionOptions): SuspensionGuard {
  const nav = globalThis.navigator as Navigator & { wakeLock?: { request(type: 'screen'): Promise<WakeLockSentinel> }; getBattery?: () => Promise<BatteryManagerLike> };
  const state: SuspensionState = { wakeLock: nav.wakeLock ? 'released' : 'unsupported', suspendedBy: null, charging: null };
  const log = o.log ?? (() => undefined);
  const changed = (): void => o.onChange?.(state);
  let sentinel: WakeLockSentinel | null = null;
  let asking = false;
  let disposed = false;
  let moving: Promise<unknown> = Promise.resolve();

  const takeLock = async (): Promise<void> => {
    if (!nav.wakeLock || sentinel || asking || document.visibilityState !== 'visible') return;
    asking = true;
    try {
      const s = await nav.wakeLock.request('screen');
      if (disposed || !o.serving()) {
        void s.release();
        return;
      }
      sentinel = s;
      state.wakeLock = 'held';
      s.addEventListener('release', () => {
        if (sentinel === s) sentinel = null;
        state.wakeLock = 'released';
        changed();
      });
    } catch (e) {
      state.wakeLock = `refused: ${(e as Error).message}`;
    } finally {
      asking = false;
      changed();
    }
  };
  const dropLock = (): void => {
    const s = sentinel;
    sentinel = null;
    if (s) void s.release();
  };
  const update = (): void => {
    if (o.serving()) void takeLock();
    else dropLock();
  };

  // a rejoin waits for the hand-over before it
  const suspend = (why: Exclude<SuspendedBy, null>): void => {
    if (disposed || state.suspendedBy || !o.joined()) return;
    state.suspendedBy = why;
    changed();
    log(`page ${why}: handing this tab's stage over`);
    dropLock();
    // at once, not after a promise: a page being frozen may run no later task
    const left = o.leave();
    moving = Promise.all([moving, left]).catch((e: Error) => log(`hand-over failed: ${e.message}`));
  };
  const resume = (): void => {
    if (disposed || !state.suspendedBy) return;
    if (o.chargingOnly && state.charging === false) return;
    if (document.visibilityState !== 'visible') return;
    log(`page back (was ${state.suspendedBy}): joining again`);
    state.suspendedBy = null;
    changed();
    moving = moving.then(() => o.rejoin()).then(update).catch((e: Error) => log(`rejoin failed: ${e.message}`));
  };

  const onVisibility = (): void => (document.visibilityState === 'hidden' ? suspend('hidden') : (resume(), update()));
  const onFreeze = (): void => suspend('frozen');
  // an unloading page turns hidden first (visibilitychange), so it says leave before its socket
  // closes; the server then finishes the hand-over as a repair (route-repair.ts)
  const onPageShow = (e: PageTransitionEvent): void => void (e.persisted && resume());
  document.addEventListener('visibilitychange', onVisibility);
  document.addEventListener('freeze', onFreeze);
  document.addEventListener('resume', resume);
  window.addEventListener('pageshow', onPageShow);

  let battery: BatteryManagerLike | null = null;
  const onCharging = (): void => {
    state.charging = battery!.charging;
    changed();
    if (!o.chargingOnly) return;
    if (battery!.charging) resume();
    else suspend('battery');
  };
  void nav.getBattery?.().then(
    (b) => {
      if (disposed) return;
      battery = b;
      b.addEventListener('chargingchange', onCharging);
      onCharging();
    },
    () => undefined,
  );

  return {
    state,
    update,
    dispose() {
      disposed = true;
      dropLock();
      document.removeEventListener('visibilitychange', onVisibility);
      document.removeEventListener('freeze', onFreeze);
      document.removeEventListener('resume', resume);
      window.removeEventListener('pageshow', onPageShow);
      battery?.removeEventListener('chargingchange', onCharging);
    },
  };
}
