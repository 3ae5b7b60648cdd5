// The shape of one CLI command. Each command lives in its own file under ./commands/ and
// exports `command`; main.ts finds them by listing that folder, so adding a command touches
// no shared file.

import { MeshError } from '../errors.ts';
import { parseByteSize } from '../units.ts';

export interface OptionSpec {
  type: 'string' | 'boolean';
  short?: string;
  /** one line for --help */
  description: string;
  /** shown in --help; parsing leaves the value undefined when absent */
  default?: string | boolean;
  /** placeholder in --help, e.g. <file> */
  valueName?: string;
  multiple?: boolean;
}

export interface ParsedArgs {
  values: Record<string, string | boolean | string[] | boolean[] | undefined>;
  positionals: string[];
}

export interface Command {
  name: string;
  /** one line for the command list */
  summary: string;
  /** usage line after `gguf-mesh <name>`, e.g. `<path|url> [--json]` */
  usage: string;
  options: Record<string, OptionSpec>;
  /** positional arguments allowed: [min, max] */
  positionals?: [number, number];
  /** returns the process exit code */
  run(args: ParsedArgs): Promise<number>;
}

/** An error in how a command was called: printed as one line, exit code 2. */
/** A malformed option or argument: `main` prints it with the usage and exits with status 2. */
export class UsageError extends MeshError {
  constructor(message: string) {
    super('BAD_USAGE', message);
    this.name = 'UsageError';
  }
}

/** Reads a string option that must be a non-negative integer. */
export function intOption(args: ParsedArgs, name: string, fallback: number): number {
  const raw = args.values[name];
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (typeof raw !== 'string' || !/^-?\d+$/.test(raw) || !Number.isSafeInteger(n)) {
    throw new UsageError(`--${name} must be an integer, got '${String(raw)}'`);
  }
  return n;
}

/** Reads an optional integer option: undefined when absent. */
export function optionalIntOption(args: ParsedArgs, name: string): number | undefined {
  return args.values[name] === undefined ? undefined : intOption(args, name, 0);
}

/** Reads an optional string option that must be one of `allowed`: undefined when absent. */
export function choiceOption<T extends string>(args: ParsedArgs, name: string, allowed: readonly T[]): T | undefined {
  const v = stringOption(args, name);
  if (v === undefined) return undefined;
  if (!allowed.includes(v as T)) throw new UsageError(`--${name} must be one of ${allowed.join(', ')}, got '${v}'`);
  return v as T;
}

/** Reads a string option that must be a finite number. */
export function numberOption(args: ParsedArgs, name: string, fallback: number): number {
  const raw = args.values[name];
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (typeof raw !== 'string' || raw.trim() === '' || !Number.isFinite(n)) {
    throw new UsageError(`--${name} must be a number, got '${String(raw)}'`);
  }
  return n;
}

/** Reads a string option, throwing when it is required and missing. */
export function stringOption(args: ParsedArgs, name: string, required: true): string;
export function stringOption(args: ParsedArgs, name: string, required?: false): string | undefined;
export function stringOption(args: ParsedArgs, name: string, required = false): string | undefined {
  const raw = args.values[name];
  if (raw === undefined) {
    if (required) throw new UsageError(`--${name} is required`);
    return undefined;
  }
  if (typeof raw !== 'string') throw new UsageError(`--${name} takes a value`);
  return raw;
}

/** A size option (`1GiB`, `512MB`, bytes); 0 when absent. */
export function sizeOption(args: ParsedArgs, name: string): number {
  const text = stringOption(args, name);
  if (text === undefined) return 0;
  const n = parseByteSize(text);
  if (n === undefined) throw new UsageError(`--${name}: '${text}' is not a size (e.g. 1GiB = 2³⁰ bytes, 2GB = 2·10⁹)`);
  return n;
}
