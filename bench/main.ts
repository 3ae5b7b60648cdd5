// `npm run bench -- <name> [args…]`: runs bench/<name>.ts, which prints one JSON document
// (figures plus a ratio against a baseline measured in the same run) on stdout. A result's
// `goals` (bench/lib/goals.ts) set the exit code: 1 when any is missed.
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Goal } from './lib/goals.ts';

const here = dirname(fileURLToPath(import.meta.url));
const available = readdirSync(here)
  .filter((f) => f.endsWith('.ts') && f !== 'main.ts')
  .map((f) => f.slice(0, -3));
const [name, ...rest] = process.argv.slice(2);
if (!name || !available.includes(name)) {
  console.error(`usage: npm run bench -- <${available.join('|')}> [args…]`);
  process.exit(2);
}
const mod = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as { run(args: string[]): Promise<unknown> };
const result = (await mod.run(rest)) as { goals?: Goal[] };
console.log(JSON.stringify(result, null, 2));
const missed = (result.goals ?? []).filter((g) => !g.met && !g.skipped);
const skipped = (result.goals ?? []).filter((g) => g.skipped);
if (skipped.length > 0) console.error(`goals not checked here: ${skipped.map((g) => `${g.figure} (${g.skipped})`).join('; ')}`);
if (missed.length > 0) {
  console.error(`goals missed: ${missed.map((g) => `${g.figure} = ${g.value} (goal ${g.kind === 'min' ? '≥' : '≤'} ${g.target})`).join('; ')}`);
  process.exitCode = 1;
}
