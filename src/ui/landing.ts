// The landing page: pick a model this server hosts (or paste a GGUF URL), start its room, and
// go to the room page, which shares the link. Rooms and their secrets are only listed to the
// machine running the server; other devices arrive with a link.

import { MeshError } from '../errors.ts';
import { field, h, replace } from './dom.ts';
import { formatBytes } from './format.ts';
import { jsonReply } from '../transport/server-json.ts';
import { createTrustCard } from './trust.ts';

/**
 * The admin secret `serve` puts in the page URL's fragment (#admin=…): kept for this tab and
 * taken out of the address bar, sent only to this origin's /app/rooms (join links, new rooms).
 */
function adminHeaders(): Record<string, string> {
  const fromLink = new URLSearchParams(location.hash.replace(/^#/, '')).get('admin');
  if (fromLink) {
    sessionStorage.setItem('gguf-mesh-admin', fromLink);
    history.replaceState(null, '', location.pathname + location.search);
  }
  const admin = sessionStorage.getItem('gguf-mesh-admin');
  return admin ? { authorization: `Bearer ${admin}` } : {};
}

/** ggml-org's copy of Karpathy's 260K-parameter TinyStories model (llama, 5 layers, MIT). */
export const SUGGESTED_MODEL_URL = 'https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf';

interface HostedRoom {
  roomId: string;
  model: { id: string; nLayer: number; fileBytes: number; remote: boolean; description: string | null };
  peers: number;
  route: { id: number; status: string } | null;
  joinUrl?: string;
}

/**
 * A notice that appears when this browser has no WebGPU: no navigator.gpu, or no adapter
 * (WebGPU disabled, blocklisted GPU). The tab still serves layers, on the (slower) CPU engine.
 */
export function webGpuNotice(): HTMLElement {
  const box = h('div', { class: 'notice-slot' });
  const show = (why: string): void =>
    replace(
      box,
      h(
        'p',
        { class: 'notice', role: 'note' },
        h('strong', {}, 'No WebGPU here: '),
        `${why}. This tab serves layers on the CPU engine instead (slower). For GPU speed use a current Chrome, Edge or Chromium (on Linux, enable WebGPU), or run a native peer: `,
        h('code', {}, 'gguf-mesh node --join <room link>'),
        '.',
      ),
    );
  const gpu = (navigator as Navigator & { gpu?: GPU }).gpu;
  if (!gpu) show('this browser has no navigator.gpu');
  else
    void gpu.requestAdapter().then(
      (a) => (a ? undefined : show('the browser offers no WebGPU adapter (disabled or no usable GPU)')),
      (e: Error) => show(`the adapter request failed (${e.message})`),
    );
  return box;
}

export function createLanding(go: (joinUrl: string) => void): HTMLElement {
  const list = h('div', { class: 'model-list', role: 'radiogroup', 'aria-labelledby': 'hosted-title' }, h('p', { class: 'muted' }, 'Loading the hosted models…'));
  const urlInput = h('input', { type: 'url', placeholder: 'https://…/model.gguf', autocomplete: 'off', spellcheck: 'false' });
  const start = h('button', { type: 'submit', class: 'primary' }, 'Start a room');
  // a real tiny model for machines that are online (the hosted default is random weights)
  const suggestion = h('button', { type: 'button', class: 'link' }, 'stories260K on Hugging Face');
  suggestion.addEventListener('click', () => {
    urlInput.value = SUGGESTED_MODEL_URL;
    urlInput.focus();
  });
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const joinInput = h('input', { type: 'url', placeholder: 'https://…/room/…#secret=…', autocomplete: 'off', spellcheck: 'false' });
  let rooms: HostedRoom[] = [];
  let local = false;

  const selected = (): HostedRoom | null => {
    const r = list.querySelector<HTMLInputElement>('input[name=model]:checked');
    return rooms.find((x) => x.roomId === r?.value) ?? null;
  };

  void fetch('/app/rooms', { headers: adminHeaders() })
    .then((r) => jsonReply<{ local: boolean; rooms: HostedRoom[] }>(r, '/app/rooms'))
    .then((body) => {
      rooms = body.rooms;
      local = body.local;
      if (rooms.length === 0) return replace(list, h('p', { class: 'muted' }, 'This server hosts no model.'));
      replace(
        list,
        ...rooms.map((r, i) => {
          const id = `model-${r.roomId}`;
          return h(
            'label',
            { class: 'model-option', for: id },
            h('input', { type: 'radio', name: 'model', id, value: r.roomId, checked: i === 0 }),
            h('span', { class: 'model-name' }, r.model.id),
            h('span', { class: 'model-facts' }, `${r.model.nLayer} layers · ${formatBytes(r.model.fileBytes)} · ${r.peers} peer${r.peers === 1 ? '' : 's'}${r.route ? ` · route ${r.route.status}` : ''}`),
            r.model.description ? h('span', { class: 'model-desc' }, r.model.description) : null,
          );
        }),
      );
      if (!local) list.append(h('p', { class: 'muted' }, 'Rooms open from the machine that runs the server; ask its owner for a room link.'));
    })
    .catch((e: Error) => replace(list, h('p', { class: 'error' }, `Cannot list the hosted models: ${e.message}`)));

  const showError = (e: unknown): void => {
    error.hidden = false;
    replace(error, h('strong', {}, (e as { code?: string }).code ?? 'INTERNAL'), ` ${(e as Error).message}`);
  };

  const form = h(
    'form',
    { class: 'card start', 'aria-labelledby': 'start-title' },
    h('h2', { id: 'start-title' }, 'Start a room'),
    h('h3', { id: 'hosted-title' }, 'A model this server hosts'),
    list,
    h('h3', {}, 'Or a GGUF file by URL'),
    field('GGUF URL', urlInput, 'Any URL with HTTP Range support and CORS, e.g. a model hub file. Peers fetch only their layers.'),
    h('p', { class: 'muted suggestion' }, 'Online? Try ', suggestion, ' — a 1 MB TinyStories model that writes real sentences.'),
    error,
    start,
  );
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    error.hidden = true;
    start.disabled = true;
    try {
      const url = urlInput.value.trim();
      if (url) {
        const body = await jsonReply<{ joinUrl: string }>(await fetch('/app/rooms', { method: 'POST', headers: { 'content-type': 'application/json', ...adminHeaders() }, body: JSON.stringify({ model: url }) }), 'POST /app/rooms');
        go(body.joinUrl);
        return;
      }
      const r = selected();
      if (!r) throw new MeshError('NO_MODEL', 'pick a hosted model or paste a GGUF URL');
      if (!r.joinUrl) throw new MeshError('FORBIDDEN', 'rooms open from the machine that runs the server; ask its owner for the room link');
      go(r.joinUrl);
    } catch (e) {
      showError(e);
    } finally {
      start.disabled = false;
    }
  });

  const joinForm = h('form', { class: 'card join', 'aria-labelledby': 'join-title' }, h('h2', { id: 'join-title' }, 'Join a room'), field('Room link', joinInput), h('button', { type: 'submit' }, 'Join'));
  joinForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const v = joinInput.value.trim();
    if (/\/room\/[^/#]+#.*secret=/.test(v)) go(v);
    else showError(new MeshError('BAD_JOIN_URL', 'a room link looks like http://host:port/room/<id>#secret=…'));
  });

  return h(
    'main',
    { class: 'landing', id: 'main' },
    h('header', { class: 'hero' }, h('h1', {}, 'gguf-mesh'), h('p', { class: 'lede' }, 'One GGUF model served across many devices: each browser tab runs a slice of the layers in WebGPU and passes activations to the next over WebRTC.')),
    webGpuNotice(),
    h('div', { class: 'columns' }, form, joinForm),
    createTrustCard(),
  );
}
