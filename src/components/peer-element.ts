// <gguf-mesh-peer room="…">: this tab joins a room as a browser peer (WebGPU in a worker) and
// shows its peer view. The bundle may come from the room server's origin: the worker then starts
// from a same-origin blob: URL (workers/webgpu-stage.ts). See docs/web-components.md.

import type { BrowserPeerState } from '../peer/browser-peer.ts';
import { createPeerView } from '../ui/peer-view.ts';
import type { PeerView } from '../ui/peer-view.ts';
import { emit, openRoom } from './shadow.ts';

export class GgufMeshPeerElement extends HTMLElement {
  static observedAttributes = ['room', 'secret', 'name', 'memory'];
  private view: PeerView | null = null;
  private last: BrowserPeerState | null = null;

  /** the peer's state (status, adapter, shard, progress, cache, hop), null before joining */
  get state(): BrowserPeerState | null {
    return this.view?.peer?.state ?? this.last;
  }

  /** joins the room (done on connect unless the `manual` attribute is set) */
  join(): Promise<void> {
    return this.view?.join() ?? Promise.resolve();
  }

  /** leaves the room gracefully: the stage and its sessions move to a replacement first */
  leave(): Promise<void> {
    return this.view?.leave() ?? Promise.resolve();
  }

  /** connectedCallback ran: before it, attribute callbacks are the element's upgrade (the script
   *  defining it ran after the markup was parsed), and must not join — connecting joins once */
  private connected = false;

  connectedCallback(): void {
    this.connected = true;
    this.mount();
  }

  disconnectedCallback(): void {
    this.connected = false;
    void this.view?.dispose();
    this.view = null;
  }

  attributeChangedCallback(_name: string, old: string | null, value: string | null): void {
    if (old === value || !this.connected) return;
    void this.view?.dispose();
    this.mount();
  }

  private mount(): void {
    const opened = openRoom(this);
    if (!opened) return;
    const { shadow, link } = opened;
    let readyFor: string | null = null;
    this.view = createPeerView({
      link,
      autoJoin: !this.hasAttribute('manual'),
      name: this.getAttribute('name') ?? 'tab',
      ...(this.getAttribute('memory') ? { memory: this.getAttribute('memory')! } : {}),
      onState: (s) => {
        this.last = s;
        if (s.status === 'loading' && s.progress) emit(this, 'progress', { phase: 'load', ...s.progress, stage: s.stage, shard: s.shard });
        const key = `${s.routeId}:${s.stage}`;
        if (s.status === 'ready' && readyFor !== key) {
          readyFor = key;
          emit(this, 'ready', { peerId: s.peerId, routeId: s.routeId, stage: s.stage, shard: s.shard, hop: s.hop });
        }
        if (s.status === 'failed' && s.error) emit(this, 'error', { ...s.error, stage: s.stage });
        if (s.status === 'client-only') emit(this, 'error', { code: 'NO_WEBGPU', message: s.reason ?? 'no WebGPU', stage: null });
        emit(this, 'state', s);
      },
      onError: (e) => emit(this, 'error', { ...e, stage: null }),
    });
    shadow.replaceChildren(this.view.root);
  }
}
