// Q4_1 and Q5_1 weights as ggml's CPU backend multiplies them: activations go to Q8_1 blocks,
// whose integers and scale are Q8_0's but which also carry s = f16(d · Σq), and each block's
// dot product is d_w·d_x·Σ(q_w·q_x) + m_w·s. That f16 rounding of s moves every output by
// ~1e-3 relative, so rounding x to Q8_0 and multiplying by the dequantised weights (d·q + m)
// does not match llama.cpp. Here the weights are split into their scaled part d·q (exact in
// f32) and their per-block mins m: y = x̃ · (d·q)ᵀ + s · mᵀ.

import { GgmlType } from '../../gguf/types.ts';
import { dequantize } from '../../gguf/dequant.ts';
import { F16_TABLE } from '../../gguf/fp16.ts';
import { q8_1Sums, roundActivations } from './act-round.ts';
import { matmulRows } from './ops.ts';
import type { WasmArena } from './wasm-matmul.ts';
import type { Matrix } from './matrix.ts';

/** bytes per block, and the byte offset of the f16 min in it */
const LAYOUT: Partial<Record<GgmlType, { bytes: number }>> = { [GgmlType.Q4_1]: { bytes: 20 }, [GgmlType.Q5_1]: { bytes: 24 } };

export function isQ8_1Type(type: GgmlType): boolean {
  return LAYOUT[type] !== undefined;
}

export class Q8_1Matrix implements Matrix {
  private readonly nb: number;

  constructor(
    readonly name: string,
    readonly rows: number,
    readonly cols: number,
    /** [rows × cols] f32: d·q, the weights without their block mins */
    private readonly scaled: Float32Array,
    /** [rows × cols/32] f32: each block's min m */
    private readonly mins: Float32Array,
    private readonly arena: WasmArena | null,
  ) {
    this.nb = cols / 32;
  }

  /** Splits Q4_1 / Q5_1 bytes ([rows × cols/32] blocks) into d·q and m; `scaled` may be an arena view. */
  static fromBlocks(name: string, type: GgmlType, raw: Uint8Array, rows: number, cols: number, scaled: Float32Array | null, arena: WasmArena | null): Q8_1Matrix {
    const { bytes } = LAYOUT[type]!;
    const nBlocks = (rows * cols) / 32;
    const mins = new Float32Array(nBlocks); // [rows × cols/32]
    const noMin = raw.slice();
    for (let b = 0; b < nBlocks; b++) {
      const o = b * bytes + 2; // f16 m follows f16 d
      mins[b] = F16_TABLE[noMin[o]! | (noMin[o + 1]! << 8)]!;
      noMin[o] = 0;
      noMin[o + 1] = 0;
    }
    // with m = +0, dequantisation gives d·q + 0 = d·q exactly
    const dq = dequantize(type, noMin, rows * cols);
    if (scaled) scaled.set(dq);
    return new Q8_1Matrix(name, rows, cols, scaled ?? dq, mins, arena);
  }

  get bytes(): number {
    return this.scaled.byteLength + this.mins.byteLength;
  }

  matmul(y: Float32Array, x: Float32Array, nTokens: number): void {
    const xr = roundActivations(x, nTokens, this.cols, 'q8_0'); // Q8_1's integers and scale are Q8_0's
    if (this.arena) this.arena.matmul(y, xr, this.scaled, nTokens, this.cols, this.rows);
    else matmulRows(y, xr, this.scaled, nTokens, this.cols, this.rows, 0, this.rows, 0);
    const s = q8_1Sums(x, nTokens, this.cols); // [nTokens × nb]
    const ym = new Float32Array(nTokens * this.rows);
    matmulRows(ym, s, this.mins, nTokens, this.nb, this.rows, 0, this.rows, 0);
    for (let i = 0; i < y.length; i++) y[i] = y[i]! + ym[i]!;
  }

  row(r: number, out: Float32Array, outOffset: number): void {
    for (let j = 0; j < this.cols; j++) out[outOffset + j] = this.scaled[r * this.cols + j]! + this.mins[r * this.nb + (j >> 5)]!;
  }
}
