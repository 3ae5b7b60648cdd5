// IEEE half (f16) and bfloat16 conversions. Node 20 has no Float16Array, so these work on the
// raw 16-bit patterns. f32→f16 rounds to nearest even, as ggml's GGML_FP32_TO_FP16 does on
// CPUs with F16C.

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** f16 bit pattern → number (exact). */
export function f16ToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24; // subnormal (or zero)
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** A table of all 65,536 f16 values, for hot dequantisation loops. */
export const F16_TABLE: Float32Array = (() => {
  const t = new Float32Array(65536);
  for (let i = 0; i < 65536; i++) t[i] = f16ToF32(i);
  return t;
})();

/** number → f16 bit pattern, rounding to nearest even; overflow gives ±Inf, NaN stays NaN. */
export function f32ToF16(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // Inf / NaN
  const e = exp - 127 + 15; // re-biased exponent
  if (e >= 0x1f) return sign | 0x7c00; // overflow → Inf
  if (e <= 0) {
    // subnormal half (or zero): shift the implicit 1 in and round to nearest even
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    const rest = mant & ((1 << shift) - 1);
    let h = mant >>> shift;
    if (rest > half || (rest === half && (h & 1))) h++;
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++; // may carry into the exponent: correct
  return sign | h;
}

/** bf16 bit pattern → number (exact). */
export function bf16ToF32(b: number): number {
  u32[0] = (b & 0xffff) << 16;
  return f32[0]!;
}

/** number → bf16 bit pattern, rounding to nearest even (NaN stays quiet NaN), as ggml does. */
export function f32ToBf16(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  if ((x & 0x7fffffff) > 0x7f800000) return ((x >>> 16) | 64) & 0xffff;
  return ((x + (0x7fff + ((x >>> 16) & 1))) >>> 16) & 0xffff;
}
