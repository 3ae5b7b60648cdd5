// `npm run bench -- probe [--root <checkout>] [--only a,b] [--model <gguf>]`: the attacks and
// careless uses of issue 16 ("hardening"), run from outside against real `serve` and `node`
// processes of a checkout (this one by default; give an older one to measure before a change),
// loopback only. Prints what each did: whether serve survived, statuses, times, RSS.

import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { keys, restart, symlinkSwap } from './probe/access.ts';
import { badModels, corpusAcceptance, crashMessages, jsonBodies } from './probe/crashes.ts';
import { contextLimits, disconnect, floods, overload, starvation } from './probe/load.ts';

const here = dirname(fileURLToPath(import.meta.url));

const PROBES: Record<string, (root: string, model: string) => Promise<unknown>> = {
  crashMessages,
  badModels,
  jsonBodies,
  contextLimits,
  starvation,
  disconnect,
  floods,
  overload,
  keys,
  symlinkSwap,
  restart,
  corpusAcceptance,
};

export async function run(args: string[]): Promise<unknown> {
  const opt = (name: string): string | undefined => {
    const i = args.indexOf(`--${name}`);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const root = resolve(opt('root') ?? join(here, '..'));
  const model = resolve(opt('model') ?? join(here, '..', '..', 'shared', 'models', 'stories260K.gguf'));
  if (!existsSync(model)) throw new Error(`no model at ${model} (pass --model)`);
  const only = opt('only')?.split(',');
  const out: Record<string, unknown> = { root, model };
  for (const [name, probe] of Object.entries(PROBES)) {
    if (only && !only.includes(name)) continue;
    const t0 = Date.now();
    try {
      out[name] = await probe(root, model);
    } catch (e) {
      out[name] = { probeFailed: (e as Error).message.slice(0, 300) };
    }
    console.error(`probe ${name}: ${Math.round((Date.now() - t0) / 1000)} s`);
  }
  return out;
}
