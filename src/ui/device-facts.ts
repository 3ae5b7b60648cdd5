// What the peer panel says about this device beyond its adapter: where its memory budget came
// from, its shard cache's storage, whether it keeps the screen awake or paused, and — when the
// browser is what limits it — that a native node on the same machine would offer more, with
// the command to start one.

import type { BrowserPeerState } from '../peer/browser-peer.ts';
import type { SuspensionState } from '../peer/suspension.ts';
import { formatBytes } from './format.ts';

export function budgetText(s: BrowserPeerState): string {
  const c = s.capabilities;
  if (c?.backend !== 'webgpu') return '–';
  const p = c.memoryProbe;
  const lowered = p && c.memoryBytes < p.offeredBytes ? ' — lowered after the GPU lost its memory' : '';
  if (c.memorySource === 'user') return `${formatBytes(c.memoryBytes)} (set by you)`;
  if (c.memorySource === 'estimate' || !p) return `${formatBytes(c.memoryBytes)} (estimated: the browser would not be probed)${lowered}`;
  const stop = p.limitedBy === 'cap' ? `the probe's ${formatBytes(p.capBytes)} cap` : p.limitedBy === 'out-of-memory' ? 'the GPU running out of memory' : p.limitedBy === 'device-lost' ? 'the GPU device being lost' : 'a refused buffer';
  return `${formatBytes(c.memoryBytes)} (measured: held ${formatBytes(p.measuredBytes)}, stopped by ${stop})${lowered}`;
}

/** The "thank you for helping" line: what this tab gave other peers (null before it gave anything). */
export function helpedText(s: BrowserPeerState): string | null {
  if (!s.served.servedBytes) return null;
  return `Thank you for helping: this tab sent ${formatBytes(s.served.servedBytes)} of the model (${s.served.servedTensors} tensors) to other peers, bytes the server did not have to send.`;
}

export function storageText(s: BrowserPeerState): string {
  const st = s.storage;
  if (!st) return '–';
  const kept = st.persisted === true ? 'persistent' : st.persisted === false ? 'not persistent: the browser may evict it' : 'persistence unknown';
  const used = st.quotaBytes !== null ? ` · ${formatBytes(st.usageBytes)} of ${formatBytes(st.quotaBytes)} used` : '';
  const evicted = st.evictedUnits.length ? ` · evicted and fetched again: ${st.evictedUnits.join(', ')}` : '';
  return `${kept}${used}${evicted}`;
}

export function awakeText(g: SuspensionState | null): string {
  if (!g) return '–';
  if (g.suspendedBy) return `paused (${g.suspendedBy === 'battery' ? 'on battery' : `page ${g.suspendedBy}`}): its layers were handed over; it joins again when back`;
  const lock = g.wakeLock === 'held' ? 'screen kept awake while serving' : g.wakeLock === 'unsupported' ? 'no Screen Wake Lock in this browser' : g.wakeLock === 'released' ? 'screen may sleep (not serving)' : `wake lock ${g.wakeLock}`;
  return `${lock}${g.charging === false ? ' · on battery' : g.charging ? ' · charging' : ''}`;
}

/** The advice to run a native node instead, when the browser is what keeps this device small (null: no advice). */
export function nativeNodeAdvice(s: BrowserPeerState, joinUrl: string): string | null {
  const c = s.capabilities;
  const command = `gguf-mesh node --join '${joinUrl}'`;
  if (c?.backend === 'none') return `This browser cannot serve layers. On this device a native node can: ${command}`;
  if (!c || c.memorySource === 'user' || s.modelBytes === null || c.memoryBytes >= s.modelBytes) return null;
  const p = c.memoryProbe;
  const browserLimited = c.adapter?.isFallbackAdapter || !p || p.limitedBy !== 'cap' || c.memoryBytes < p.offeredBytes;
  if (!browserLimited) return null;
  return `This tab can hold ${formatBytes(c.memoryBytes)} of this ${formatBytes(s.modelBytes)} model: the browser limits what one tab may keep. A native node on this device offers all of its memory: ${command}`;
}
