// `npm run bench -- dequant [elements]`: dequantisation throughput of src/gguf/dequant.ts per
// type, against ggml's own C dequantisation (libggml-base via koffi) measured in the same run.
// Data: random weights quantised by ggml, [1024 × 4096] by default.
import { dequantize, DEQUANT_TYPES } from '../src/gguf/dequant.ts';
import { typeName } from '../src/gguf/types.ts';
import { ggmlDequantize, ggmlQuantize } from '../test/support/ggml-ffi.ts';

function timeMs(fn: () => void, reps: number): number {
  fn(); // warm up
  const t0 = performance.now();
  for (let i = 0; i < reps; i++) fn();
  return (performance.now() - t0) / reps;
}

export async function run(args: string[]): Promise<unknown> {
  const nPerRow = 4096;
  const nRows = Math.max(1, Math.round(Number(args[0] ?? 4 * 1024 * 1024) / nPerRow));
  const n = nRows * nPerRow;
  let seed = 1;
  const x = new Float32Array(n).map(() => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32 - 0.5) * 0.1); // [nRows × nPerRow] f32
  const types: Record<string, { ours_melem_s: number; ggml_melem_s: number; ratio_vs_ggml: number }> = {};
  for (const type of DEQUANT_TYPES) {
    const q = ggmlQuantize(type, x, nRows, nPerRow);
    const ours = timeMs(() => dequantize(type, q, n), 5);
    const theirs = timeMs(() => ggmlDequantize(type, q, n), 5);
    types[typeName(type)] = {
      ours_melem_s: Math.round(n / ours / 1e3),
      ggml_melem_s: Math.round(n / theirs / 1e3),
      ratio_vs_ggml: Number((theirs / ours).toFixed(3)),
    };
  }
  return { bench: 'dequant', elements: n, types };
}
