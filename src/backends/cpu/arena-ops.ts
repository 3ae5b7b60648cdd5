// Elementwise ops of the forward pass on the arena's threads: the WebAssembly kernel where both
// operands are views into the arena and SIMD is there, the reference op from ./ops.ts otherwise.

import { KERNEL_IDS, piecesFor, rowCalls } from './compute-pool.ts';
import { swiglu } from './ops.ts';
import type { WasmArena } from './wasm-arena.ts';

/** gate = silu(gate) ⊙ up. gate, up: same length */
export function swigluInArena(arena: WasmArena, gate: Float32Array, up: Float32Array): void {
  const g = arena.offsetOf(gate);
  const u = arena.offsetOf(up);
  const n = gate.length;
  const n4 = n - (n % 4);
  if (g < 0 || u < 0 || !arena.swigluKernel || n4 === 0) return swiglu(gate, gate, up);
  // an exp costs about as much as 16 multiply-adds
  arena.run(rowCalls(KERNEL_IDS.swiglu, n4, piecesFor(arena.threads, 16 * n), (a, b) => [g + a * 4, u + a * 4, b - a]));
  if (n4 < n) swiglu(gate.subarray(n4), gate.subarray(n4), up.subarray(n4));
}
