// The route as a picture: client → stage 0 → … → last stage, each stage a box (device, layers,
// backend, status) with its load bar and per-stage timing bars, each hop an arrow labelled with
// its carrier and the bytes it carried; above it time to first token, tok/s and bytes per hop.
// It polls the room's route summary (stage telemetry included) once a second.

import { h, replace, svg } from './dom.ts';
import { formatBytes, formatMs, formatRate } from './format.ts';
import type { GenerationStats } from './chat-engine.ts';
import type { RoomLink, RouteSummary, StageSummary } from './room-api.ts';
import type { StepStageTiming } from '../route/telemetry.ts';
import { fetchRoom, fetchRoute } from './room-api.ts';

export interface RouteView {
  root: HTMLElement;
  /** the numbers the chat measured for its last reply */
  setClientStats(stats: GenerationStats | null): void;
  /** the latest step's per-stage breakdown (live while a reply streams) */
  setStepTimings(stages: readonly StepStageTiming[] | null): void;
  /** marks a stage as the one that failed (from a chat error) */
  setFailedStage(stage: number | null): void;
  refresh(): Promise<void>;
  readonly route: RouteSummary | null;
  dispose(): void;
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/** Per-step timing a stage reported, wherever the telemetry puts it (ms). */
export function stageTimings(t: Record<string, unknown> | undefined): { computeMs: number | null; transferMs: number | null; queueMs: number | null } {
  const step = (t?.step ?? t?.timing ?? t?.timings ?? t) as Record<string, unknown> | undefined;
  return { computeMs: num(step?.computeMs), transferMs: num(step?.transferMs), queueMs: num(step?.queueMs) };
}

/** Bytes a stage sent on to the next stage (data channel or relay). */
function hopBytes(s: StageSummary): { bytes: number | null; frames: number | null; kind: string } {
  const t = s.telemetry ?? {};
  const ch = t.downstreamChannel as { bytesSent?: number; framesSent?: number } | null | undefined;
  const relay = t.relayed as { bytes?: number; frames?: number } | undefined;
  const kind = typeof t.hop === 'string' ? t.hop : s.peer?.backend && s.peer.backend !== 'webgpu' ? 'websocket' : '';
  if (ch && num(ch.bytesSent) !== null) return { bytes: ch.bytesSent!, frames: num(ch.framesSent), kind: kind || 'webrtc' };
  if (relay && num(relay.bytes) !== null) return { bytes: relay.bytes!, frames: num(relay.frames), kind: kind || 'relay' };
  return { bytes: null, frames: null, kind };
}

const BOX_W = 168;
const BOX_H = 118;
const GAP = 76;
const CLIENT_W = 84;

type Timing = { computeMs: number | null; transferMs: number | null; queueMs: number | null };

function stageBox(s: StageSummary, x: number, y: number, failed: boolean, maxStepMs: number, t: Timing): SVGGElement {
  const status = failed ? 'failed' : s.status;
  const g = svg('g', { class: `stage stage-${status}`, transform: `translate(${x} ${y})`, 'data-stage': s.stage });
  const device = s.peer?.adapter?.description || s.peer?.adapter?.architecture || s.peer?.name || s.peer?.id || s.peerId;
  const backend = s.peer?.backend ?? '?';
  g.append(
    svg('title', {}, `stage ${s.stage}: layers [${s.shard.start}, ${s.shard.end}) on ${s.peerId} (${backend}), ${status}${s.error ? ` — ${s.error.code} ${s.error.message}` : ''}`),
    svg('rect', { class: 'box', width: BOX_W, height: BOX_H, rx: 12 }),
    svg('text', { x: 12, y: 22, class: 'stage-name' }, `stage ${s.stage}`),
    svg('text', { x: BOX_W - 12, y: 22, class: `badge badge-${status}`, 'text-anchor': 'end' }, status),
    svg('text', { x: 12, y: 42, class: 'stage-layers' }, `layers ${s.shard.start}–${s.shard.end - 1}`),
    svg('text', { x: 12, y: 60, class: 'stage-device' }, `${backend} · ${String(device).slice(0, 20)}`),
  );
  // load bar (bytes verified / total) until ready
  const load = s.telemetry?.load as { doneBytes?: number; totalBytes?: number } | undefined;
  const frac = s.status === 'ready' ? 1 : load && load.totalBytes ? (load.doneBytes ?? 0) / load.totalBytes : 0;
  g.append(svg('rect', { class: 'load-track', x: 12, y: 70, width: BOX_W - 24, height: 6, rx: 3 }), svg('rect', { class: 'load-fill', x: 12, y: 70, width: Math.max(0, (BOX_W - 24) * Math.min(1, frac)), height: 6, rx: 3 }));
  // per-step timing: compute / transfer / queue as a stacked bar scaled to the slowest stage
  const parts: Array<[string, number | null]> = [['compute', t.computeMs], ['transfer', t.transferMs], ['queue', t.queueMs]];
  let at = 12;
  const width = BOX_W - 24;
  const total = parts.reduce((a, [, v]) => a + (v ?? 0), 0);
  for (const [kind, v] of parts) {
    if (!v) continue;
    const w = (width * v) / Math.max(maxStepMs, total, 1e-9);
    g.append(svg('rect', { class: `time-${kind}`, x: at, y: 86, width: Math.max(1, w), height: 10, rx: 2 }));
    at += w;
  }
  g.append(svg('text', { x: 12, y: 110, class: 'stage-time' }, total > 0 ? `${formatMs(total)} / step` : s.loadMs ? `loaded in ${formatMs(s.loadMs)}` : status === 'loading' ? 'loading…' : ''));
  return g;
}

function arrow(x1: number, x2: number, y: number, label: string, sub: string, kind: string): SVGGElement {
  const g = svg('g', { class: `hop hop-${kind || 'unknown'}` });
  g.append(
    svg('line', { x1, y1: y, x2: x2 - 8, y2: y, class: 'hop-line' }),
    svg('path', { d: `M${x2 - 10},${y - 6} L${x2},${y} L${x2 - 10},${y + 6} Z`, class: 'hop-head' }),
    svg('text', { x: (x1 + x2) / 2, y: y - 8, 'text-anchor': 'middle', class: 'hop-label' }, label),
    svg('text', { x: (x1 + x2) / 2, y: y + 18, 'text-anchor': 'middle', class: 'hop-sub' }, sub),
  );
  return g;
}

export function createRouteView(link: RoomLink, pollMs = 1000): RouteView {
  let route: RouteSummary | null = null;
  let client: GenerationStats | null = null;
  let live: readonly StepStageTiming[] | null = null;
  /** a stage's step timing: the live step when one streams, else the last reply's means, else telemetry */
  const timingOf = (s: StageSummary): Timing => {
    const step = live?.find((x) => x.stage === s.stage) ?? client?.stages.find((x) => x.stage === s.stage);
    return step ? { computeMs: step.computeMs, transferMs: step.transferMs, queueMs: step.queueMs } : stageTimings(s.telemetry);
  };
  let failedStage: number | null = null;
  let timer: ReturnType<typeof setTimeout> | null = null;
  let disposed = false;
  const heading = h('p', { class: 'route-status', role: 'status', 'aria-live': 'polite' }, 'Waiting for the route…');
  const stats = h('dl', { class: 'stats' });
  const picture = h('div', { class: 'route-picture' });
  const legend = h(
    'p',
    { class: 'legend' },
    h('span', { class: 'swatch time-compute' }),
    ' compute ',
    h('span', { class: 'swatch time-transfer' }),
    ' transfer ',
    h('span', { class: 'swatch time-queue' }),
    ' queue — per decode step, as each stage reports it',
  );
  const spares = h('p', { class: 'route-spares' });
  const root = h('section', { class: 'card route-view', 'aria-labelledby': 'route-title' }, h('h2', { id: 'route-title' }, 'Route'), heading, stats, picture, spares, legend);

  /** Spares (peers holding a standby shard) and a repair under way, in words under the picture. */
  const renderSpares = (): void => {
    const lines: string[] = [];
    for (const l of route?.repair?.lost ?? []) {
      lines.push(`repairing stage ${l.stage}: ${l.lostPeer} ${l.cause}; ${l.replacement ? `${l.replacement} takes over (${l.warm ? 'warm spare' : 'loading now'})` : 'waiting for a peer to take over'}`);
    }
    const ready = route?.spares ?? [];
    lines.push(ready.length ? `spares: ${ready.map((s) => `${s.peerId} (layers ${s.shard.start}–${s.shard.end - 1}, ${s.status})`).join(' · ')}` : 'no spares: a lost stage waits for a new peer');
    replace(spares, ...lines.map((t) => h('span', { class: 'spare-line' }, t)));
  };

  const renderStats = (): void => {
    const hops = route?.stages.slice(0, -1).map(hopBytes) ?? [];
    const perHop = hops.filter((x) => x.bytes !== null);
    const perToken = client?.stages.slice(0, -1).map((x) => x.bytesOut) ?? [];
    const single = route && route.stages.length === 1;
    const items: Array<[string, string]> = [
      ['Time to first token', client ? formatMs(client.ttftMs) : '–'],
      ['Decode', client ? formatRate(client.tokPerS, 'tok/s') : '–'],
      ['Tokens', client ? `${client.promptTokens} prompt + ${client.generatedTokens} generated` : '–'],
      ['Bytes per token per hop', perToken.length ? perToken.map((b) => formatBytes(Math.round(b))).join(' · ') : single ? 'one stage: no hops' : '–'],
      // from the stages' periodic telemetry: a hop not reported since it carried anything shows as pending
      ['Carried per hop so far', perHop.length ? hops.map((x) => (x.bytes ? formatBytes(x.bytes) : '…')).join(' · ') : single ? 'one stage: no hops' : '–'],
    ];
    replace(stats, ...items.map(([k, v]) => h('div', { class: 'stat' }, h('dt', {}, k), h('dd', {}, v))));
  };

  const renderPicture = (): void => {
    if (!route || route.stages.length === 0) {
      replace(picture, h('p', { class: 'muted' }, route?.reason ?? 'No stages yet: the route forms when peers join.'));
      return;
    }
    const n = route.stages.length;
    const width = CLIENT_W + GAP + n * BOX_W + (n - 1) * GAP + 16;
    const height = BOX_H + 70;
    const y = 16;
    const mid = y + BOX_H / 2;
    const maxStep = Math.max(0, ...route.stages.map((s) => {
      const t = timingOf(s);
      return (t.computeMs ?? 0) + (t.transferMs ?? 0) + (t.queueMs ?? 0);
    }));
    const root = svg('svg', { viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-label': `route ${route.id}: ${route.stages.map((s) => {
        const t = timingOf(s);
        const step = (t.computeMs ?? 0) + (t.transferMs ?? 0) + (t.queueMs ?? 0);
        return `stage ${s.stage} layers ${s.shard.start}-${s.shard.end - 1} on ${s.peer?.backend ?? 'unknown backend'}, ${failedStage === s.stage ? 'failed' : s.status}${step > 0 ? `, ${formatMs(step)} per step` : ''}`;
      }).join('; ')}` });
    root.append(
      svg('rect', { class: 'client-box', x: 0, y: mid - 28, width: CLIENT_W, height: 56, rx: 28 }),
      svg('text', { x: CLIENT_W / 2, y: mid + 5, 'text-anchor': 'middle', class: 'client-label' }, 'client'),
    );
    root.append(arrow(CLIENT_W, CLIENT_W + GAP, mid, 'tokens', client ? `${client.promptTokens + client.generatedTokens} sent` : '', 'client'));
    route.stages.forEach((s, i) => {
      const x = CLIENT_W + GAP + i * (BOX_W + GAP);
      root.append(stageBox(s, x, y, failedStage === s.stage, maxStep, timingOf(s)));
      if (i < n - 1) {
        const hop = hopBytes(s);
        root.append(arrow(x + BOX_W, x + BOX_W + GAP, mid, hop.kind || 'hidden', hop.bytes ? formatBytes(hop.bytes) : '', hop.kind));
      }
    });
    // the sampled token travels back to the client
    const lastX = CLIENT_W + GAP + n * BOX_W + (n - 1) * GAP;
    root.append(svg('path', { d: `M${lastX - BOX_W / 2},${y + BOX_H} C${lastX - BOX_W / 2},${height - 6} ${CLIENT_W / 2},${height - 6} ${CLIENT_W / 2},${mid + 30}`, class: 'return-path' }));
    root.append(svg('text', { x: width / 2, y: height - 10, 'text-anchor': 'middle', class: 'hop-sub' }, 'sampled token back to the client'));
    replace(picture, root);
  };

  const refresh = async (): Promise<void> => {
    try {
      const room = await fetchRoom(link);
      route = room.route ? await fetchRoute(link, room.route.id) : null;
      heading.textContent = route ? `Route ${route.id}: ${route.status}${route.reason ? ` — ${route.reason}` : ''} · ${room.peers} peer${room.peers === 1 ? '' : 's'} in the room · model ${room.model.id} (${room.model.nLayer} layers)` : `No route yet · ${room.peers} peer${room.peers === 1 ? '' : 's'} in the room`;
      root.dataset.status = route?.status ?? 'none';
    } catch (e) {
      heading.textContent = `Route unavailable: ${(e as Error).message}`;
    }
    renderStats();
    renderPicture();
    renderSpares();
  };

  const loop = async (): Promise<void> => {
    if (disposed) return;
    await refresh();
    if (!disposed) timer = setTimeout(() => void loop(), pollMs);
  };
  void loop();

  return {
    root,
    get route() {
      return route;
    },
    setClientStats(s) {
      client = s;
      renderStats();
      renderPicture();
    },
    setStepTimings(stages) {
      live = stages;
      renderPicture();
    },
    setFailedStage(stage) {
      failedStage = stage;
      renderPicture();
    },
    refresh,
    dispose() {
      disposed = true;
      if (timer) clearTimeout(timer);
    },
  };
}
