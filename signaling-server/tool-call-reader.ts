// Tool calls read from a reply while it is generated. Text outside calls comes out as content
// as soon as it cannot be the start of a call (only a possible opening tag, and whitespace
// before it, is held back); a call comes out as soon as its tool's name is known and its
// arguments begin, then its arguments piece by piece as they are written, as OpenAI streams
// them. A call found malformed before it came out stays text. One reader serves streamed and
// whole replies alike, so the pieces a stream sends make up the whole reply's arguments.

import { randomBytes } from 'node:crypto';
import { isJsonSpace, JsonObjectScanner } from './json-object-scanner.ts';

/** How a template's model writes a call (openai-tools.ts has the formats). */
export interface ToolCallSyntax {
  /** the tag before a call in free text, and the one after it; open null: only a reply that is a call's JSON object whole */
  open: string | null;
  close: string | null;
  /** the call object's member that holds the arguments ("arguments", "parameters") */
  argsKey: string;
}

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export type ToolEvent =
  | { kind: 'content'; text: string }
  | { kind: 'call'; index: number; id: string; name: string }
  | { kind: 'arguments'; index: number; text: string };

const callId = (): string => `call_${randomBytes(12).toString('hex')}`;

/** the reply's state: in text (calls may start), in a call's JSON, or in text where no call can start any more */
type State = 'text' | 'call' | 'plain';

interface Attempt {
  scanner: JsonObjectScanner;
  /** the raw text from the opening tag (or the object's {) on */
  raw: string;
  /** the call object's text from its { */
  json: string;
  name: string | null;
  args: { start: number; end: number } | null;
  /** the call as it went out, once it did */
  call: ToolCall | null;
  /** arguments characters of `json` already sent */
  sent: number;
}

export class ToolCallReader {
  readonly calls: ToolCall[] = [];
  /** why a call already sent broke off (text that is not JSON in its arguments) */
  broken: string | null = null;
  /** a call already sent was cut short by the end of the reply */
  cut = false;
  private state: State;
  /** text not yet sent: a possible opening tag, whitespace before it, whitespace at the end */
  private held = '';
  /** after a call: its closing tag is dropped */
  private closing = false;
  private attempt: Attempt | null = null;
  private content = '';
  /** what a broken or cut call leaves: its raw text and everything after, content of a whole reply */
  private tail = '';
  private out: ToolEvent[] = [];

  /** forced: the whole reply is one call's JSON object (tool_choice constrained it) */
  constructor(private readonly syntax: ToolCallSyntax, private readonly names: ReadonlySet<string>, private readonly forced: boolean) {
    this.state = forced ? 'call' : 'text';
    if (forced) this.attempt = this.newAttempt('');
  }

  /** Reads the next piece of the reply; returns what may go out now. */
  push(text: string): ToolEvent[] {
    if (this.broken) this.tail += text;
    else this.feed(text);
    return this.out.splice(0);
  }

  /** The reply has ended: what was held back goes out (a call left open is dropped). */
  end(): ToolEvent[] {
    const a = this.attempt;
    this.attempt = null;
    if (a?.call) {
      // cut short after it went out: the stream cannot take it back; a whole reply keeps it as text
      this.calls.pop();
      this.tail = a.raw + this.tail;
      this.cut = true;
    } else if (a) this.emit(a.raw);
    this.emit(this.calls.length > 0 || this.cut ? this.held.trimEnd() : this.held);
    this.held = '';
    return this.out.splice(0);
  }

  /** The whole reply's content and calls: a call that broke off or was cut stays text. */
  result(): { content: string | null; calls: ToolCall[] } {
    const content = this.content + this.tail;
    return { content: this.calls.length > 0 && !content ? null : content, calls: this.calls };
  }

  private feed(text: string): void {
    if (this.state === 'call') return this.feedCall(text);
    this.held += text;
    // leading whitespace of the reply (or after calls with nothing before them) is dropped
    if (this.content === '') this.held = this.held.trimStart();
    const { open, close } = this.syntax;
    if (this.closing && close) {
      const t = this.held.trimStart();
      if (t.startsWith(close)) {
        this.held = t.slice(close.length);
        if (this.content === '') this.held = this.held.trimStart();
      } else if (close.startsWith(t)) return; // still maybe the closing tag
      this.closing = false;
    }
    if (this.state === 'text' && open === null && this.held) {
      // a call is the reply's whole JSON object: it starts the reply, or there is none
      if (this.content !== '' || this.calls.length > 0 || this.held[0] !== '{') this.state = 'plain';
      else return this.startCall('', this.held);
    }
    if (this.state === 'text' && open !== null) {
      const i = this.held.indexOf(open);
      if (i >= 0) {
        this.emit(this.held.slice(0, i).trimEnd());
        return this.startCall(open, this.held.slice(i + open.length));
      }
    }
    const keep = holdFrom(this.held, this.state === 'text' ? open : null);
    this.emit(this.held.slice(0, keep));
    this.held = this.held.slice(keep);
  }

  private startCall(tag: string, rest: string): void {
    this.held = '';
    this.state = 'call';
    this.attempt = this.newAttempt(tag);
    this.feedCall(rest);
  }

  /** where text goes after a call (or a failed one): more calls may follow a tag, not a bare object */
  private afterCall(): State {
    return this.forced || this.syntax.open === null ? 'plain' : 'text';
  }

  private newAttempt(raw: string): Attempt {
    const a: Attempt = {
      raw, json: '', name: null, args: null, call: null, sent: 0,
      scanner: new JsonObjectScanner((key, start, end) => {
        if (key === 'name') a.name = a.json[start] === '"' ? (JSON.parse(a.json.slice(start, end)) as string) : '';
        else if (key === this.syntax.argsKey) a.args = { start, end };
      }),
    };
    return a;
  }

  private feedCall(text: string): void {
    const a = this.attempt!;
    for (let k = 0; k < text.length; k++) {
      const c = text[k]!;
      a.raw += c;
      if (a.json === '' && isJsonSpace(c)) continue;
      a.json += c;
      const why = a.scanner.step(c) ? this.refusal(a) : a.scanner.error;
      if (why !== null) return this.failed(a, why, text.slice(k + 1));
      if (!a.call && a.name !== null && this.ready(a)) this.open(a);
      if (a.scanner.done) {
        this.sendArgs(a);
        this.attempt = null;
        this.state = this.afterCall();
        this.closing = true;
        return this.feed(text.slice(k + 1));
      }
    }
    this.sendArgs(a);
  }

  /** why this call cannot be one (its tool unknown, arguments that are not an object), or null */
  private refusal(a: Attempt): string | null {
    if (a.name !== null && !this.names.has(a.name)) return `no tool named ${JSON.stringify(a.name)}`;
    const s = a.scanner;
    const first = a.args ? a.json[a.args.start] : s.inMember && s.key === this.syntax.argsKey ? a.json[s.valueStart] : undefined;
    if (first !== undefined && first !== '{' && first !== '"') return `${this.syntax.argsKey} must be an object`;
    if (s.done && a.name === null) return 'a call names no tool';
    return null;
  }

  /** its arguments can start going out: an object begun, or a JSON-encoded string whole; none at all once the object closes */
  private ready(a: Attempt): boolean {
    const s = a.scanner;
    return a.args !== null || s.done || (s.inMember && s.key === this.syntax.argsKey && a.json[s.valueStart] === '{');
  }

  private open(a: Attempt): void {
    a.call = { id: callId(), type: 'function', function: { name: a.name!, arguments: '' } };
    this.calls.push(a.call);
    this.out.push({ kind: 'call', index: this.calls.length - 1, id: a.call.id, name: a.call.function.name });
  }

  /** the arguments written since the last piece went out */
  private sendArgs(a: Attempt): void {
    if (!a.call) return;
    const s = a.scanner;
    let piece = '';
    if (a.args && a.json[a.args.start] === '"') {
      if (a.sent === 0) piece = JSON.parse(a.json.slice(a.args.start, a.args.end)) as string;
    } else if (a.args || (s.inMember && s.key === this.syntax.argsKey)) {
      piece = a.json.slice((a.args?.start ?? s.valueStart) + a.sent, a.args?.end ?? a.json.length);
    } else if (s.done && a.sent === 0) piece = '{}';
    if (!piece) return;
    a.sent += piece.length;
    a.call.function.arguments += piece;
    this.out.push({ kind: 'arguments', index: this.calls.length - 1, text: piece });
  }

  private failed(a: Attempt, why: string, rest: string): void {
    this.attempt = null;
    if (a.call) {
      // it went out already: the stream ends in an error; a whole reply keeps it, and all after it, as text
      this.calls.pop();
      this.broken = `the call to ${a.call.function.name} broke off: ${why}`;
      this.tail = a.raw + rest;
      return;
    }
    // never sent: it was text all along
    this.state = this.afterCall();
    this.emit(a.raw);
    this.feed(rest);
  }

  private emit(text: string): void {
    if (!text) return;
    this.content += text;
    const last = this.out.at(-1);
    if (last?.kind === 'content') last.text += text;
    else this.out.push({ kind: 'content', text });
  }
}

/** where the held-back part of `text` starts: a suffix that may begin `tag`, and the whitespace before it */
function holdFrom(text: string, tag: string | null): number {
  let from = text.length;
  for (let n = Math.min((tag?.length ?? 1) - 1, text.length); n > 0; n--) {
    if (tag!.startsWith(text.slice(text.length - n))) {
      from = text.length - n;
      break;
    }
  }
  while (from > 0 && isJsonSpace(text[from - 1]!)) from--;
  return from;
}
