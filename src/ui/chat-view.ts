// The chat: the conversation (rendered with the model's chat template when sent), tokens
// streaming into the assistant's message, a stop button, sampler settings, and errors that
// name the failing stage. Enter sends, Shift+Enter starts a new line, Escape stops.

import { MeshError } from '../errors.ts';
import { DEFAULT_SAMPLER, chatOverRoute, loadChatModel } from './chat-engine.ts';
import type { ChatMessage, ChatModel, GenerationStats, SamplerChoice } from './chat-engine.ts';
import { field, h, replace } from './dom.ts';
import { formatMs, formatRate } from './format.ts';
import type { RoomLink } from './room-api.ts';
import type { StepStageTiming } from '../route/telemetry.ts';

export interface ChatViewOptions {
  link: RoomLink;
  sampler?: Partial<SamplerChoice>;
  system?: string;
  onToken?: (delta: string, tokenId: number) => void;
  /** each step's per-stage timing breakdown */
  onStep?: (stages: StepStageTiming[]) => void;
  onDone?: (text: string, stats: GenerationStats) => void;
  onError?: (e: { code: string; message: string; stage: number | null }) => void;
  onBusy?: (busy: boolean) => void;
}

export interface ChatView {
  root: HTMLElement;
  /** sends `text` as the user's message; resolves with the reply */
  send(text: string): Promise<string>;
  stop(): void;
  readonly messages: readonly ChatMessage[];
  sampler: SamplerChoice;
}

/** The stage an error names ("stage 2 …"), when it names one. */
export function failingStage(e: unknown): number | null {
  const d = (e as { details?: { stage?: unknown } }).details;
  if (typeof d?.stage === 'number') return d.stage;
  const m = /\bstage (\d+)\b/i.exec((e as Error).message ?? '');
  return m ? Number(m[1]) : null;
}

export function createChatView(opts: ChatViewOptions): ChatView {
  const messages: ChatMessage[] = opts.system ? [{ role: 'system', content: opts.system }] : [];
  const sampler: SamplerChoice = { ...DEFAULT_SAMPLER, ...opts.sampler };
  let model: Promise<ChatModel> | null = null;
  let abort: AbortController | null = null;

  const log = h('ol', { class: 'messages', role: 'log', 'aria-live': 'polite', 'aria-label': 'conversation' });
  const input = h('textarea', { rows: 2, placeholder: 'Write a message — Enter sends, Shift+Enter for a new line', autocomplete: 'off' });
  const sendButton = h('button', { type: 'submit', class: 'primary' }, 'Send');
  const stopButton = h('button', { type: 'button', disabled: true }, 'Stop');
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const meta = h('p', { class: 'chat-meta muted', 'aria-live': 'polite' });
  const promptView = h('pre', { class: 'prompt-text' });

  const numberInput = (value: number, attrs: Record<string, string | number>, apply: (v: number) => void): HTMLInputElement => {
    const el = h('input', { type: 'number', value, ...attrs });
    el.addEventListener('change', () => {
      const v = Number(el.value);
      if (Number.isFinite(v)) apply(v);
      else el.value = String(value);
    });
    return el;
  };
  const settings = h(
    'details',
    { class: 'sampler' },
    h('summary', {}, 'Sampler settings'),
    h(
      'div',
      { class: 'grid' },
      field('Temperature', numberInput(sampler.temperature, { min: 0, max: 2, step: 0.05 }, (v) => (sampler.temperature = v)), '0 = greedy'),
      field('Top-k', numberInput(sampler.topK, { min: 0, max: 1000, step: 1 }, (v) => (sampler.topK = Math.round(v)))),
      field('Top-p', numberInput(sampler.topP, { min: 0, max: 1, step: 0.01 }, (v) => (sampler.topP = v))),
      field('Seed', numberInput(sampler.seed, { min: 0, step: 1 }, (v) => (sampler.seed = Math.round(v)))),
      field('Max tokens', numberInput(sampler.maxTokens, { min: 1, max: 4096, step: 1 }, (v) => (sampler.maxTokens = Math.max(1, Math.round(v))))),
    ),
  );
  const form = h('form', { class: 'composer' }, field('Message', input), h('div', { class: 'buttons' }, sendButton, stopButton));
  const root = h(
    'section',
    { class: 'card chat-view', 'aria-labelledby': 'chat-title' },
    h('h2', { id: 'chat-title' }, 'Chat'),
    log,
    error,
    form,
    meta,
    settings,
    h('details', { class: 'prompt' }, h('summary', {}, 'Prompt as the model sees it (chat template applied)'), promptView),
  );

  const bubble = (role: string, text: string): HTMLElement => {
    const body = h('div', { class: 'text' }, text);
    const li = h('li', { class: `msg msg-${role}` }, h('span', { class: 'role' }, role === 'user' ? 'You' : role === 'assistant' ? 'Model' : role), body);
    log.append(li);
    li.scrollIntoView?.({ block: 'end' });
    return body;
  };

  const setBusy = (busy: boolean): void => {
    sendButton.disabled = busy;
    stopButton.disabled = !busy;
    root.dataset.busy = String(busy);
    opts.onBusy?.(busy);
  };

  const send = async (text: string): Promise<string> => {
    if (abort) throw new MeshError('CHAT_BUSY', 'a reply is still streaming');
    const content = text.trim();
    if (!content) return '';
    error.hidden = true;
    messages.push({ role: 'user', content });
    bubble('user', content);
    const out = bubble('assistant', '');
    out.parentElement!.dataset.streaming = 'true';
    out.parentElement!.setAttribute('aria-busy', 'true'); // screen readers read the reply once, when it is complete
    abort = new AbortController();
    setBusy(true);
    meta.textContent = 'Reading the model’s tokenizer and chat template…';
    let reply = '';
    try {
      const m = await (model ??= loadChatModel(opts.link).catch((e) => ((model = null), Promise.reject(e))));
      meta.textContent = 'Prefilling…';
      const { text: full, stats } = await chatOverRoute(
        opts.link,
        m,
        messages,
        sampler,
        {
          onPrefill: (done, total) => (meta.textContent = `Prefill ${done} / ${total} tokens…`),
          onStep: (stages) => opts.onStep?.(stages),
          onToken: (delta, id) => {
            reply += delta;
            out.textContent = reply;
            meta.textContent = 'Generating…';
            opts.onToken?.(delta, id);
          },
        },
        abort.signal,
      );
      reply = full;
      out.textContent = full;
      messages.push({ role: 'assistant', content: full });
      promptView.textContent = stats.promptText;
      meta.textContent = `${stats.generatedTokens} tokens · first token ${formatMs(stats.ttftMs)} · ${formatRate(stats.tokPerS, 'tok/s')} · stopped: ${stats.stopReason.replace('_', ' ')}`;
      opts.onDone?.(full, stats);
      return full;
    } catch (e) {
      messages.pop();
      const code = (e as { code?: string }).code ?? 'CHAT_FAILED';
      const stage = failingStage(e);
      error.hidden = false;
      replace(error, h('strong', {}, code), stage !== null ? ` at stage ${stage}: ` : ': ', (e as Error).message);
      out.parentElement!.classList.add('msg-failed');
      meta.textContent = '';
      opts.onError?.({ code, message: (e as Error).message, stage });
      throw e;
    } finally {
      delete out.parentElement!.dataset.streaming;
      out.parentElement!.removeAttribute('aria-busy');
      abort = null;
      setBusy(false);
    }
  };

  const stop = (): void => abort?.abort();
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = input.value;
    input.value = '';
    void send(text).catch(() => undefined);
  });
  input.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      form.requestSubmit();
    } else if (ev.key === 'Escape') stop();
  });
  stopButton.addEventListener('click', stop);
  return { root, send, stop, messages, sampler };
}
