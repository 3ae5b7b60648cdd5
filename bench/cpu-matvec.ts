// `npm run bench -- cpu-matvec [--k 2048] [--rows 2048] [--reps 5] [--types q4_k,q5_k,…]`
// (also part of `npm run bench -- engine`): the CPU engine's matrix × vector per weight type,
// GB/s over the bytes each storage keeps in memory and over the file's bytes: 'auto' (int8 for
// Q8_0/Q4_0, Q4_1/Q5_1 split for Q8_1 activations, f32 otherwise, WebAssembly SIMD) and
// 'quantized' (the file's blocks, dequantised tile by tile in JS). The baseline, measured in
// the same run, is the f32 matrix in 'auto'.
import { DEQUANT_TYPES } from '../src/gguf/dequant.ts';
import { quantize } from '../src/gguf/quantize.ts';
import { GgmlType, TYPE_TRAITS, typeName } from '../src/gguf/types.ts';
import { tryWasmArena } from '../src/backends/cpu/wasm-matmul.ts';
import { keepsInt8, makeMatrix } from '../src/backends/cpu/weights.ts';
import type { WeightStorage } from '../src/backends/cpu/weights.ts';
import { lcgCentered } from '../test/support/prng.ts';

function option(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1]! : fallback;
}

export interface CpuMatvecFigure {
  type: string;
  storage: WeightStorage;
  ms: number;
  /** GB/s over the bytes the matrix occupies in memory */
  memory_gb_s: number;
  /** GB/s over the tensor's bytes in the file (what a quantised format saves) */
  file_gb_s: number;
}

/** Median-timed y = W·x for a [rows × k] matrix of each type, in both storages. */
export function cpuMatvecFigures(k: number, rows: number, reps: number, types: readonly GgmlType[] = DEQUANT_TYPES): CpuMatvecFigure[] {
  const next = lcgCentered(11);
  const values = Float32Array.from({ length: k * rows }, next);
  const x = Float32Array.from({ length: k }, next);
  const y = new Float32Array(rows);
  const out: CpuMatvecFigure[] = [];
  for (const type of types) {
    if (k % TYPE_TRAITS[type]!.blockSize !== 0) continue;
    const raw = quantize(type, values, k);
    for (const storage of ['auto', 'quantized'] as const) {
      if (storage === 'quantized' && type === GgmlType.F32) continue;
      const int8 = keepsInt8(type, k, rows, storage, 'ggml', true);
      const arena = storage === 'auto' ? tryWasmArena(k * rows * 4 + 4096) : null;
      const m = makeMatrix('w', type, raw, rows, k, { storage, rounding: 'ggml', arena, int8 });
      m.matmul(y, x, 1); // warm
      const times: number[] = [];
      for (let i = 0; i < reps; i++) {
        const t0 = performance.now();
        m.matmul(y, x, 1);
        times.push(performance.now() - t0);
      }
      times.sort((a, b) => a - b);
      const ms = times[Math.floor(times.length / 2)]!;
      out.push({ type: typeName(type), storage, ms: Math.round(ms * 1000) / 1000, memory_gb_s: Math.round((m.bytes / ms / 1e6) * 100) / 100, file_gb_s: Math.round((raw.byteLength / ms / 1e6) * 100) / 100 });
    }
  }
  return out;
}

export async function run(args: string[]): Promise<unknown> {
  const k = Number(option(args, 'k', '2048'));
  const rows = Number(option(args, 'rows', '2048'));
  const list = option(args, 'types', '');
  const types = list ? list.split(',').map((n) => GgmlType[n.trim().toUpperCase() as keyof typeof GgmlType]) : DEQUANT_TYPES;
  const figures = cpuMatvecFigures(k, rows, Number(option(args, 'reps', '5')), types);
  const base = figures.find((f) => f.type === 'F32' && f.storage === 'auto');
  return {
    shape: `[${rows}×${k}]·[${k}]`,
    note: 'median of reps; single thread; activations rounded as ggml does for each type',
    figures: figures.map((f) => ({ ...f, ratio_to_f32_auto: base ? Math.round((base.ms / f.ms) * 100) / 100 : null })),
  };
}
