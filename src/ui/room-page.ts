// The room page (the join link opens it): the route picture across the top, the chat, and this
// device's peer view beside the share box. The secret is read from the URL fragment only.

import { h, replace } from './dom.ts';
import { createChatView } from './chat-view.ts';
import { webGpuNotice } from './landing.ts';
import { createPeerView } from './peer-view.ts';
import { createRouteView } from './route-view.ts';
import { fetchRoom, roomLink } from './room-api.ts';
import type { RoomLink } from './room-api.ts';
import { createShareBox } from './share.ts';
import { createTrustCard } from './trust.ts';

export function createRoomPage(href: string): HTMLElement {
  let link: RoomLink;
  try {
    link = roomLink(href);
  } catch {
    return secretForm(href);
  }
  const modelLine = h('p', { class: 'lede' }, 'Room ', h('code', {}, link.roomId));
  const route = createRouteView(link);
  const chat = createChatView({
    link,
    onStep: (stages) => route.setStepTimings(stages),
    onDone: (_text, stats) => {
      route.setStepTimings(null);
      route.setFailedStage(null);
      route.setClientStats(stats);
      void route.refresh();
    },
    onError: (e) => {
      route.setStepTimings(null);
      route.setFailedStage(e.stage);
    },
  });
  const peer = createPeerView({ link, name: 'tab', onState: () => void route.refresh() });
  // which model runs (the server describes its default synthetic model: random weights, gibberish text)
  const described = fetch('/app/rooms')
    .then((r) => (r.ok ? (r.json() as Promise<{ rooms: Array<{ roomId: string; model: { description: string | null } }> }>) : { rooms: [] }))
    .then((b) => b.rooms.find((r) => r.roomId === link.roomId)?.model.description ?? null)
    .catch(() => null);
  void Promise.all([fetchRoom(link), described])
    .then(([room, description]) =>
      replace(modelLine, 'Room ', h('code', {}, link.roomId), ' · model ', h('strong', {}, room.model.id), ` · ${room.model.nLayer} layers`, description ? h('span', { class: 'model-desc' }, ` — ${description}`) : null),
    )
    .catch((e: Error) => replace(modelLine, h('span', { class: 'error' }, `Cannot open room ${link.roomId}: ${e.message}`)));
  addEventListener('pagehide', () => void peer.dispose());
  return h(
    'main',
    { class: 'room', id: 'main' },
    h('header', { class: 'hero compact' }, h('h1', {}, h('a', { href: '/' }, 'gguf-mesh')), modelLine),
    webGpuNotice(),
    route.root,
    h('div', { class: 'columns' }, chat.root, h('div', { class: 'side' }, peer.root, createShareBox(link.joinUrl), createTrustCard())),
  );
}

/** A room link without its secret: ask for it, keep it in the fragment. */
function secretForm(href: string): HTMLElement {
  const input = h('input', { type: 'password', id: 'secret', autocomplete: 'off' });
  const form = h('form', { class: 'card' }, h('h2', {}, 'This room needs its secret'), h('p', { class: 'muted' }, 'The link you opened has no #secret=… part. Paste the secret the server printed.'), h('label', { for: 'secret' }, 'Room secret'), input, h('button', { type: 'submit', class: 'primary' }, 'Open the room'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const u = new URL(href);
    u.hash = `secret=${encodeURIComponent(input.value.trim())}`;
    location.replace(u.toString());
    location.reload();
  });
  return h('main', { class: 'room', id: 'main' }, h('header', { class: 'hero compact' }, h('h1', {}, h('a', { href: '/' }, 'gguf-mesh'))), form);
}
