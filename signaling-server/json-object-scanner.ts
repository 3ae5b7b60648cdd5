// A JSON object read one character at a time, as a model writes it: checks the syntax as it
// goes and reports where each top-level member's value starts and ends, so that a tool call's
// arguments can be streamed while they are still being generated. Hand-written because the
// streaming JSON libraries hand back parsed values, not the source offsets the stream needs.

type Mode =
  | 'root' // before the opening {
  | 'key-or-close' // after { (an empty object may close)
  | 'key' // after , in an object
  | 'colon'
  | 'value'
  | 'value-or-close' // after [ (an empty array may close)
  | 'after-value' // a value done: , or the container's close
  | 'string'
  | 'scalar'
  | 'done';

const WS = new Set([' ', '\t', '\n', '\r']);
const SCALAR_CHAR = /[0-9a-zA-Z.+-]/;
const SCALAR = /^(?:-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)$/;
const ESCAPES = new Set(['"', '\\', '/', 'b', 'f', 'n', 'r', 't']);

export const isJsonSpace = (c: string): boolean => WS.has(c);

export class JsonObjectScanner {
  /** characters consumed */
  pos = 0;
  /** the top-level member being read: its key, and where its value started (-1: not started) */
  key: string | null = null;
  valueStart = -1;
  /** why the text is not JSON, once it is not */
  error: string | null = null;
  private mode: Mode = 'root';
  private readonly stack: ('{' | '[')[] = [];
  private stringIsKey = false;
  private keyRaw = '';
  private escaped = false;
  private hexLeft = 0;
  private scalar = '';

  constructor(private readonly onMember: (key: string, start: number, end: number) => void) {}

  get done(): boolean {
    return this.mode === 'done';
  }

  /** the value now being read is a top-level member's (its characters so far belong to it) */
  get inMember(): boolean {
    return this.valueStart >= 0;
  }

  /** Consumes one character; false (with `error` set) when it breaks the syntax or follows the object's end. */
  step(c: string): boolean {
    if (this.error) return false;
    const at = this.pos++;
    if (this.mode === 'string') return this.stringChar(c, at);
    if (this.mode === 'scalar') {
      if (SCALAR_CHAR.test(c)) {
        this.scalar += c;
        return true;
      }
      if (!SCALAR.test(this.scalar)) return this.fail(`'${this.scalar}' is not a JSON value`);
      this.valueDone(at);
    }
    if (WS.has(c)) return true;
    // an empty object or array may close at once; otherwise a key or a value follows
    if ((this.mode === 'key-or-close' && c === '}') || (this.mode === 'value-or-close' && c === ']')) return this.close(c, at);
    switch (this.mode) {
      case 'root':
        if (c !== '{') return this.fail(`a call starts with {, not '${c}'`);
        this.stack.push('{');
        this.mode = 'key-or-close';
        return true;
      case 'key-or-close':
      case 'key':
        if (c !== '"') return this.fail(`a key is a string, not '${c}'`);
        this.mode = 'string';
        this.stringIsKey = true;
        this.keyRaw = c;
        return true;
      case 'colon':
        if (c !== ':') return this.fail(`expected : after a key, got '${c}'`);
        this.mode = 'value';
        return true;
      case 'value-or-close':
      case 'value':
        return this.startValue(c, at);
      case 'after-value':
        if (c === ',') {
          this.mode = this.stack.at(-1) === '{' ? 'key' : 'value';
          return true;
        }
        if (c === '}' || c === ']') return this.close(c, at);
        return this.fail(`expected , or a close after a value, got '${c}'`);
      default:
        return this.fail(`'${c}' after the object's end`);
    }
  }

  private startValue(c: string, at: number): boolean {
    if (this.stack.length === 1) this.valueStart = at;
    if (c === '{' || c === '[') {
      this.stack.push(c);
      this.mode = c === '{' ? 'key-or-close' : 'value-or-close';
    } else if (c === '"') {
      this.mode = 'string';
      this.stringIsKey = false;
    } else if (SCALAR_CHAR.test(c)) {
      this.mode = 'scalar';
      this.scalar = c;
    } else return this.fail(`'${c}' does not start a JSON value`);
    return true;
  }

  private stringChar(c: string, at: number): boolean {
    if (this.stringIsKey) this.keyRaw += c;
    if (this.hexLeft > 0) {
      this.hexLeft--;
      return /[0-9a-fA-F]/.test(c) || this.fail(`'${c}' in a \\u escape`);
    }
    if (this.escaped) {
      this.escaped = false;
      if (c === 'u') this.hexLeft = 4;
      return c === 'u' || ESCAPES.has(c) || this.fail(`'\\${c}' is not a JSON escape`);
    }
    if (c === '\\') this.escaped = true;
    else if (c < ' ') return this.fail('a raw control character inside a string');
    else if (c === '"') {
      if (this.stringIsKey) {
        if (this.stack.length === 1) this.key = JSON.parse(this.keyRaw) as string;
        this.mode = 'colon';
      } else this.valueDone(at + 1);
    }
    return true;
  }

  private close(c: string, at: number): boolean {
    if (this.stack.pop() !== (c === '}' ? '{' : '[')) return this.fail(`'${c}' closes nothing open`);
    this.valueDone(at + 1);
    return true;
  }

  /** a value ended just before `end`: a member's, when it sits directly in the object */
  private valueDone(end: number): void {
    this.mode = this.stack.length === 0 ? 'done' : 'after-value';
    if (this.stack.length === 1 && this.valueStart >= 0) {
      const start = this.valueStart;
      this.valueStart = -1;
      this.onMember(this.key ?? '', start, end);
    }
  }

  private fail(why: string): false {
    this.error = why;
    return false;
  }
}
