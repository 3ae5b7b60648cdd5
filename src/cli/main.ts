// `gguf-mesh` command-line entry: finds the commands in ./commands/, parses options strictly
// (unknown commands and options exit 2 with a one-line reason) and runs one.

import { existsSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import type { Command, OptionSpec } from './command.ts';
import { UsageError } from './command.ts';
import { isMeshError } from '../errors.ts';

const COMMANDS_DIR = join(dirname(fileURLToPath(import.meta.url)), 'commands');

/** The command files, each named by its command (`serve.ts` holds `serve`). */
function commandFiles(): string[] {
  // git keeps no empty folders: a clean clone before the first command has none
  if (!existsSync(COMMANDS_DIR)) return [];
  return readdirSync(COMMANDS_DIR).filter((f) => f.endsWith('.ts')).sort();
}

async function loadCommand(file: string): Promise<Command | undefined> {
  return ((await import(pathToFileURL(join(COMMANDS_DIR, file)).href)) as { command?: Command }).command;
}

async function loadCommands(): Promise<Map<string, Command>> {
  const commands = new Map<string, Command>();
  for (const file of commandFiles()) {
    const cmd = await loadCommand(file);
    if (cmd) commands.set(cmd.name, cmd);
  }
  return commands;
}

/** Only the named command's module: each command's imports (llama.cpp, WebRTC, the server) cost
 * a second or more of start-up, paid by every process a user or a test starts. */
async function findCommand(name: string): Promise<Command | undefined> {
  const file = commandFiles().find((f) => f === `${name}.ts`);
  const cmd = file ? await loadCommand(file) : undefined;
  return cmd?.name === name ? cmd : (await loadCommands()).get(name);
}

function optionLine(name: string, spec: OptionSpec): string {
  const flag = `--${name}${spec.type === 'string' ? ` ${spec.valueName ?? '<value>'}` : ''}`;
  const short = spec.short ? `-${spec.short}, ` : '    ';
  const dflt = spec.default !== undefined ? ` (default: ${String(spec.default)})` : '';
  return `  ${short}${flag.padEnd(28)} ${spec.description}${dflt}`;
}

export function commandHelp(cmd: Command): string {
  const lines = [`usage: gguf-mesh ${cmd.name} ${cmd.usage}`.trimEnd(), '', cmd.summary, '', 'options:'];
  for (const [name, spec] of Object.entries(cmd.options)) lines.push(optionLine(name, spec));
  lines.push(optionLine('help', { type: 'boolean', short: 'h', description: 'show this help' }));
  return lines.join('\n');
}

function mainHelp(commands: Map<string, Command>): string {
  const lines = [
    'gguf-mesh — serve one GGUF language model across many devices',
    '',
    'usage: gguf-mesh <command> [options]',
    '',
    'commands:',
  ];
  for (const cmd of commands.values()) lines.push(`  ${cmd.name.padEnd(14)} ${cmd.summary}`);
  lines.push('', 'Run `gguf-mesh <command> --help` for the options of one command.');
  for (const cmd of commands.values()) lines.push('', commandHelp(cmd));
  return lines.join('\n');
}

/**
 * `--opt -value` as `--opt=-value` where `--opt` takes a value and `-value` is none of this
 * command's options: generated secrets are base64url and may start with '-', which parseArgs
 * alone refuses as ambiguous (a TURN secret did, 1 run in 64). A missing value before a real
 * option (`--secret --port 1`) stays an error.
 */
function valuesWithDashes(args: string[], options: Record<string, { type: 'string' | 'boolean'; short?: string }>): string[] {
  const known = new Set(Object.entries(options).flatMap(([k, o]) => [`--${k}`, ...(o.short ? [`-${o.short}`] : [])]));
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (a === '--') return [...out, ...args.slice(i)]; // the end of options: the rest as they are
    const next = args[i + 1];
    const spec = a.startsWith('--') && !a.includes('=') ? options[a.slice(2)] : undefined;
    if (spec?.type === 'string' && next !== undefined && next.startsWith('-') && next !== '--' && !known.has(next.split('=')[0]!)) {
      out.push(`${a}=${next}`);
      i++;
    } else out.push(a);
  }
  return out;
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    console.log(mainHelp(await loadCommands()));
    return 0;
  }
  const cmd = await findCommand(name);
  if (!cmd) {
    console.error(`gguf-mesh: unknown command '${name}' (commands: ${[...(await loadCommands()).keys()].join(', ')})`);
    return 2;
  }
  try {
    const options: Record<string, { type: 'string' | 'boolean'; short?: string; multiple?: boolean }> = {
      help: { type: 'boolean', short: 'h' },
    };
    for (const [k, spec] of Object.entries(cmd.options)) {
      options[k] = { type: spec.type, ...(spec.short ? { short: spec.short } : {}), ...(spec.multiple ? { multiple: true } : {}) };
    }
    let parsed;
    try {
      parsed = parseArgs({ args: valuesWithDashes(rest, options), allowPositionals: true, options, strict: true });
    } catch (e) {
      throw new UsageError((e as Error).message.replace(/\s*\n\s*/g, ' ').trim());
    }
    if (parsed.values.help) {
      console.log(commandHelp(cmd));
      return 0;
    }
    const [min, max] = cmd.positionals ?? [0, 0];
    if (parsed.positionals.length < min || parsed.positionals.length > max) {
      throw new UsageError(
        max === 0
          ? `${cmd.name} takes no positional arguments, got '${parsed.positionals.join(' ')}'`
          : `${cmd.name} expects ${min === max ? min : `${min} to ${max}`} positional argument(s): ${cmd.usage}`,
      );
    }
    return await cmd.run({ values: parsed.values as Record<string, string | boolean | undefined>, positionals: parsed.positionals });
  } catch (e) {
    if (e instanceof UsageError) {
      console.error(`gguf-mesh ${cmd.name}: ${e.message}`);
      return 2;
    }
    if (isMeshError(e)) {
      console.error(`gguf-mesh ${cmd.name}: ${e.code}: ${e.message}`);
      return 1;
    }
    console.error(`gguf-mesh ${cmd.name}: ${(e as Error).stack ?? String(e)}`);
    return 1;
  }
}
