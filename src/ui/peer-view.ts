// "This device": the browser peer of this tab — its WebGPU adapter and memory budget, the layer
// range the route gave it, a progress bar for the slice download and GPU upload, what the shard
// cache held and its storage, and join/leave. Without WebGPU the tab stays a chat client and says
// why. A joined tab hands its layers over when the page is hidden or unloaded and joins again
// when shown (peer/suspension.ts), and says when a native node would serve this device better.

import { startBrowserPeer } from '../peer/browser-peer.ts';
import type { BrowserPeer, BrowserPeerState } from '../peer/browser-peer.ts';
import { guardSuspension } from '../peer/suspension.ts';
import type { SuspensionGuard } from '../peer/suspension.ts';
import { awakeText, budgetText, helpedText, nativeNodeAdvice, storageText } from './device-facts.ts';
import { field, h, replace } from './dom.ts';
import { formatBytes, parseBytes } from './format.ts';
import type { RoomLink } from './room-api.ts';

export interface PeerViewOptions {
  link: RoomLink;
  /** join as soon as the view opens (default true) */
  autoJoin?: boolean;
  name?: string;
  /** preset memory budget, e.g. "2GiB" (default: measured) */
  memory?: string;
  /** hand the layers over while the page is hidden, frozen or unloaded, and rejoin when shown (default true) */
  suspend?: boolean;
  onState?: (s: BrowserPeerState) => void;
  onError?: (e: { code: string; message: string }) => void;
  log?: (line: string) => void;
}

export interface PeerView {
  root: HTMLElement;
  readonly peer: BrowserPeer | null;
  join(): Promise<void>;
  leave(): Promise<void>;
  dispose(): Promise<void>;
}

const STATUS_TEXT: Record<string, string> = {
  joining: 'Joining the room…',
  idle: 'Joined — waiting for the route to give this device layers',
  loading: 'Loading its layers',
  ready: 'Serving its layers',
  failed: 'Failed to load',
  'client-only': 'Chat client only',
  reconnecting: 'Lost the server — rejoining',
  closed: 'Left the room',
};

export function createPeerView(opts: PeerViewOptions): PeerView {
  let peer: BrowserPeer | null = null;
  let busy = false;
  const status = h('p', { class: 'peer-status', role: 'status', 'aria-live': 'polite' }, 'Not joined');
  const adapter = h('dd', {}, '–');
  const budget = h('dd', {}, '–');
  const layers = h('dd', {}, '–');
  const cache = h('dd', {}, '–');
  const hop = h('dd', {}, '–');
  const storage = h('dd', {}, '–');
  const awake = h('dd', {}, '–');
  const advice = h('p', { class: 'advice', hidden: true });
  const thanks = h('p', { class: 'thanks', hidden: true });
  const chargingOnly = h('input', { type: 'checkbox' });
  let guard: SuspensionGuard | null = null;
  const bar = h('div', { class: 'bar-fill' });
  const barLabel = h('span', { class: 'bar-label' }, 'idle');
  const progress = h('div', { class: 'bar', role: 'progressbar', 'aria-label': 'slice download and GPU upload', 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': 0 }, bar, barLabel);
  const memoryInput = h('input', { type: 'text', inputmode: 'text', placeholder: 'auto', autocomplete: 'off', spellcheck: 'false', size: 10 });
  const joinButton = h('button', { type: 'button', class: 'primary' }, 'Join as a peer');
  const error = h('p', { class: 'error', role: 'alert', hidden: true });

  const root = h(
    'section',
    { class: 'card peer-view', 'aria-labelledby': 'peer-title' },
    h('h2', { id: 'peer-title' }, 'This device'),
    status,
    h('dl', { class: 'facts' }, h('dt', {}, 'Adapter'), adapter, h('dt', {}, 'Memory budget'), budget, h('dt', {}, 'Layers'), layers, h('dt', {}, 'Shard cache'), cache, h('dt', {}, 'Storage'), storage, h('dt', {}, 'Next hop'), hop, h('dt', {}, 'Awake'), awake),
    progress,
    error,
    advice,
    thanks,
    h('div', { class: 'row' }, field('Budget to offer on joining', memoryInput, 'e.g. 2GiB; empty = measured'), h('label', {}, chargingOnly, ' serve only while charging'), joinButton),
  );

  const render = (s: BrowserPeerState | null): void => {
    if (!s) {
      status.textContent = 'Not joined';
      joinButton.textContent = 'Join as a peer';
      return;
    }
    status.textContent = s.status === 'client-only' ? `${STATUS_TEXT[s.status]}: ${s.reason ?? ''}` : (STATUS_TEXT[s.status] ?? s.status);
    status.dataset.status = s.status;
    root.dataset.status = s.status;
    const a = s.capabilities?.adapter;
    const c = s.capabilities;
    const threads = c?.cpuThreads ?? 1;
    adapter.textContent = a
      ? `${[a.vendor, a.architecture].filter(Boolean).join(' · ') || 'WebGPU'}${a.description ? ` — ${a.description}` : ''}${a.isFallbackAdapter ? ' (software fallback)' : ''}`
      : c?.backend === 'cpu'
        ? `CPU engine (WebAssembly SIMD, ${threads} thread${threads === 1 ? '' : 's'}) — no WebGPU`
        : (c?.reason ?? '–');
    budget.textContent = budgetText(s);
    storage.textContent = storageText(s);
    awake.textContent = awakeText(guard?.state ?? null);
    const tip = nativeNodeAdvice(s, opts.link.joinUrl);
    advice.hidden = tip === null;
    advice.textContent = tip ?? '';
    const helped = helpedText(s);
    thanks.hidden = helped === null;
    thanks.textContent = helped ?? '';
    layers.textContent = s.shard ? `[${s.shard.start}, ${s.shard.end}) — stage ${s.stage} of route ${s.routeId}` : 'none yet';
    const held = s.heldUnits.length;
    cache.textContent = s.load
      ? `${formatBytes(s.load.cachedBytes)} from cache, ${formatBytes(s.load.fetchedBytes)} fetched${s.load.cacheError ? ` — cache: ${s.load.cacheError}` : ''}`
      : `${held} shard unit${held === 1 ? '' : 's'} held`;
    hop.textContent = s.hop === 'webrtc' ? 'WebRTC data channel' : s.hop === 'relay' ? 'relayed through the server' : s.hop === 'none' ? 'last stage' : '–';
    // the bar: the slice download (verified bytes), then the GPU upload until ready
    let pct = 0;
    let label = 'idle';
    if (s.status === 'loading') {
      const p = s.progress;
      pct = p && p.totalBytes > 0 ? (90 * p.doneBytes) / p.totalBytes : 0;
      label = p && p.doneBytes >= p.totalBytes && p.totalBytes > 0 ? 'uploading to the GPU…' : p ? `downloading ${formatBytes(p.doneBytes)} of ${formatBytes(p.totalBytes)}` : 'starting…';
    } else if (s.status === 'ready') {
      pct = 100;
      label = 'ready';
    } else if (s.status === 'failed') label = 'failed';
    bar.style.width = `${pct.toFixed(1)}%`;
    barLabel.textContent = label;
    progress.setAttribute('aria-valuenow', String(Math.round(pct)));
    progress.setAttribute('aria-valuetext', label);
    progress.dataset.phase = s.status;
    if (s.error) {
      error.hidden = false;
      replace(error, h('strong', {}, s.error.code), ` ${s.error.message}`);
    } else error.hidden = true;
    const live = s.status !== 'closed' && s.status !== 'client-only';
    joinButton.textContent = s.status === 'client-only' ? 'Cannot serve layers' : live ? 'Leave' : 'Join as a peer';
    joinButton.disabled = s.status === 'client-only';
    joinButton.classList.toggle('primary', !live && s.status !== 'client-only');
  };

  const join = async (): Promise<void> => {
    if (peer || busy) return;
    busy = true;
    error.hidden = true;
    status.textContent = STATUS_TEXT.joining!;
    const memory = memoryInput.value.trim() ? parseBytes(memoryInput.value) : null;
    if (memoryInput.value.trim() && memory === null) {
      busy = false;
      error.hidden = false;
      replace(error, h('strong', {}, 'BAD_BUDGET'), ` '${memoryInput.value}' is not a size (try 2GiB or 512MiB)`);
      return;
    }
    try {
      peer = await startBrowserPeer({
        joinUrl: opts.link.joinUrl,
        ...(opts.name ? { name: opts.name } : {}),
        ...(memory ? { memoryBytes: memory } : {}),
        onState: (s) => {
          render(s);
          guard?.update();
          opts.onState?.(s);
        },
        ...(opts.log ? { log: opts.log } : {}),
      });
      render(peer.state);
      opts.onState?.(peer.state);
      if (peer.state.status === 'client-only') peer = null;
    } catch (e) {
      const err = { code: (e as { code?: string }).code ?? 'JOIN_FAILED', message: (e as Error).message };
      error.hidden = false;
      replace(error, h('strong', {}, err.code), ` ${err.message}`);
      status.textContent = 'Could not join';
      opts.onError?.(err);
    } finally {
      busy = false;
    }
  };

  /** Leave: the stage is handed to a replacement first (sessions go on there), then the tab closes. */
  const leave = async (): Promise<void> => {
    const p = peer;
    peer = null;
    if (!p) return render(null);
    status.textContent = 'Handing this tab\'s layers over…';
    joinButton.disabled = true;
    const moved = await p.leave().catch(() => false);
    joinButton.disabled = false;
    render({ ...p.state, status: 'closed' });
    status.textContent = `${STATUS_TEXT.closed} — ${moved ? 'its layers are served elsewhere' : 'no replacement took its layers'}`;
  };

  const dispose = async (): Promise<void> => {
    guard?.dispose();
    guard = null;
    const p = peer;
    peer = null;
    if (p) await p.close();
  };

  if (opts.memory) memoryInput.value = opts.memory;
  const makeGuard = (): void => {
    guard?.dispose();
    guard = opts.suspend === false ? null : guardSuspension({
      joined: () => peer !== null,
      serving: () => peer?.state.status === 'loading' || peer?.state.status === 'ready',
      leave: () => leave(),
      rejoin: () => join(),
      chargingOnly: chargingOnly.checked,
      onChange: () => peer && render(peer.state),
      ...(opts.log ? { log: opts.log } : {}),
    });
  };
  makeGuard();
  chargingOnly.addEventListener('change', makeGuard);
  joinButton.addEventListener('click', () => void (peer ? leave() : join()));
  if (opts.autoJoin !== false) void join();
  return {
    root,
    get peer() {
      return peer;
    },
    join,
    leave,
    dispose,
  };
}
