// `npm run bench -- <name> [args…]`: runs bench/<name>.ts, which prints one JSON document
// (figures plus a ratio against a baseline measured in the same run) on stdout.
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

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
const result = await mod.run(rest);
console.log(JSON.stringify(result, null, 2));
