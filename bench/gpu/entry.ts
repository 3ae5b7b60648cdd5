// The entry the GPU machine runs (bench/gpu/pack.sh bundles it): `npm run bench -- webgpu`
// without tsx, so one bundled file and Node are all it needs there. Prints the bench's JSON
// and exits 1 when a checked goal is missed, as bench/main.ts does.
import type { Goal } from '../lib/goals.ts';
import { run } from '../webgpu.ts';

const result = (await run(process.argv.slice(2))) as { goals?: Goal[] };
console.log(JSON.stringify(result, null, 2));
const missed = (result.goals ?? []).filter((g) => !g.met && !g.skipped);
if (missed.length > 0) {
  console.error(`goals missed: ${missed.map((g) => `${g.figure} = ${g.value} (goal ${g.target})`).join('; ')}`);
  process.exitCode = 1;
}
