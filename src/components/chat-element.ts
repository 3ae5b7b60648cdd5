// <gguf-mesh-chat room="…">: a chat client of a room, usable on any page (the signaling server
// answers it with CORS). See docs/web-components.md for attributes, properties and events.

import { fetchRoom } from '../ui/room-api.ts';
import { MeshError } from '../errors.ts';
import { createChatView } from '../ui/chat-view.ts';
import type { ChatView } from '../ui/chat-view.ts';
import type { ChatMessage, SamplerChoice } from '../ui/chat-engine.ts';
import { emit, errorDetail, openRoom } from './shadow.ts';

const SAMPLER_ATTRS: Record<string, keyof SamplerChoice> = { temperature: 'temperature', 'top-k': 'topK', 'top-p': 'topP', seed: 'seed', 'max-tokens': 'maxTokens' };

export class GgufMeshChatElement extends HTMLElement {
  static observedAttributes = ['room', 'secret', 'system', ...Object.keys(SAMPLER_ATTRS)];
  private view: ChatView | null = null;
  private poll: ReturnType<typeof setTimeout> | null = null;
  private routeReady = false;

  /** true once the room's route is ready to generate */
  get ready(): boolean {
    return this.routeReady;
  }

  /** the conversation so far */
  get messages(): readonly ChatMessage[] {
    return this.view?.messages ?? [];
  }

  /** sampler settings in use (editable) */
  get sampler(): SamplerChoice | null {
    return this.view?.sampler ?? null;
  }

  /** sends a user message; resolves with the full reply */
  send(text: string): Promise<string> {
    if (!this.view) return Promise.reject(new MeshError('NO_ROOM', '<gguf-mesh-chat> is not connected to a room'));
    return this.view.send(text);
  }

  /** stops the reply that is streaming */
  stop(): void {
    this.view?.stop();
  }

  /** connectedCallback ran (attribute callbacks before it are the element's upgrade: connecting mounts once) */
  private connected = false;

  connectedCallback(): void {
    this.connected = true;
    this.mount();
  }

  disconnectedCallback(): void {
    this.connected = false;
    this.unmount();
  }

  attributeChangedCallback(name: string, old: string | null, value: string | null): void {
    if (old === value || !this.connected) return;
    const key = SAMPLER_ATTRS[name];
    if (key && this.view && value !== null && Number.isFinite(Number(value))) (this.view.sampler[key] as number) = Number(value);
    else if (name === 'room' || name === 'secret' || name === 'system') {
      this.unmount();
      this.mount();
    }
  }

  private mount(): void {
    const opened = openRoom(this);
    if (!opened) return;
    const { shadow, link } = opened;
    const sampler: Partial<SamplerChoice> = {};
    for (const [attr, key] of Object.entries(SAMPLER_ATTRS)) {
      const v = this.getAttribute(attr);
      if (v !== null && Number.isFinite(Number(v))) sampler[key] = Number(v);
    }
    const system = this.getAttribute('system');
    this.view = createChatView({
      link,
      sampler,
      ...(system ? { system } : {}),
      onToken: (text, id) => emit(this, 'token', { text, id }),
      onDone: (text, stats) => emit(this, 'done', { text, stats }),
      onError: (e) => emit(this, 'error', e),
    });
    shadow.replaceChildren(this.view.root);
    // `ready` when the route can generate; `progress` with the route's status until then
    const check = async (): Promise<void> => {
      try {
        const room = await fetchRoom(link);
        const status = room.route?.status ?? 'none';
        if (status === 'ready' && !this.routeReady) {
          this.routeReady = true;
          emit(this, 'ready', { roomId: room.id, routeId: room.route!.id, model: room.model.id });
        } else if (status !== 'ready') {
          this.routeReady = false;
          emit(this, 'progress', { phase: 'route', status, reason: room.route?.reason ?? null, peers: room.peers });
        }
      } catch (e) {
        emit(this, 'error', errorDetail(e));
      }
      if (this.view) this.poll = setTimeout(() => void check(), this.routeReady ? 5000 : 1000);
    };
    void check();
  }

  private unmount(): void {
    if (this.poll) clearTimeout(this.poll);
    this.poll = null;
    this.view?.stop();
    this.view = null;
    this.routeReady = false;
  }
}
