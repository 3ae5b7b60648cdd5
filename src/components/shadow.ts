// Shared by both elements: a shadow root with the app's stylesheet, and typed event helpers.

import css from '../ui/styles.css?inline';
import { MeshError } from '../errors.ts';
import { roomLink } from '../ui/room-api.ts';
import type { RoomLink } from '../ui/room-api.ts';

let sheet: CSSStyleSheet | null = null;

/** Opens the element's shadow root with the stylesheet adopted (one parsed copy for all). */
export function styledShadow(host: HTMLElement): ShadowRoot {
  const root = host.shadowRoot ?? host.attachShadow({ mode: 'open' });
  if (!sheet) {
    sheet = new CSSStyleSheet();
    sheet.replaceSync(css);
  }
  root.adoptedStyleSheets = [sheet];
  return root;
}

/** The room of an element: its `room` attribute (a join link), the secret from `secret` or the link's fragment. */
export function roomOf(host: HTMLElement): RoomLink {
  const room = host.getAttribute('room');
  if (!room) throw new MeshError('NO_ROOM', `<${host.localName}> needs a room="http://host:port/room/<id>#secret=…" attribute`);
  return roomLink(new URL(room, location.href).toString(), host.getAttribute('secret'));
}

export function emit<T>(host: HTMLElement, type: string, detail: T): void {
  host.dispatchEvent(new CustomEvent<T>(type, { detail, bubbles: true, composed: true }));
}

export function errorDetail(e: unknown, stage: number | null = null): { code: string; message: string; stage: number | null } {
  return { code: (e as { code?: string }).code ?? 'INTERNAL', message: (e as Error).message ?? String(e), stage };
}

/**
 * The start of both elements' mount: the styled shadow root and the element's room. A missing or
 * bad room attribute clears the shadow root, emits `error` and gives null.
 */
export function openRoom(host: HTMLElement): { shadow: ShadowRoot; link: RoomLink } | null {
  const shadow = styledShadow(host);
  try {
    return { shadow, link: roomOf(host) };
  } catch (e) {
    shadow.replaceChildren();
    emit(host, 'error', errorDetail(e));
    return null;
  }
}
