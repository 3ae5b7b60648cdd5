// Byte access into GGUF tensor data uploaded as-is. `weights` is declared by the kernel that
// includes this snippet: array<u32> over the raw block bytes (little-endian). Every field the
// even-offset loaders read (f16 scales, quant bytes) starts at an even byte offset: block sizes
// of those types are even and each row starts at an even offset. MXFP4's 17-byte blocks are
// read with load_u32_any.

// 4 bytes starting at an even byte offset `off`.
fn load_u32_even(off: u32) -> u32 {
  let w = off >> 2u;
  if ((off & 3u) == 0u) {
    return weights[w];
  }
  return (weights[w] >> 16u) | (weights[w + 1u] << 16u);
}

// 4 bytes starting at any byte offset (bytes past the word holding `off` come from the next).
fn load_u32_any(off: u32) -> u32 {
  let w = off >> 2u;
  let sh = (off & 3u) * 8u;
  if (sh == 0u) {
    return weights[w];
  }
  return (weights[w] >> sh) | (weights[w + 1u] << (32u - sh));
}

// 2 bytes at an even byte offset, zero-extended.
fn load_u16(off: u32) -> u32 {
  return (weights[off >> 2u] >> ((off & 2u) * 8u)) & 0xffffu;
}

// 1 byte at any offset, zero-extended.
fn load_u8(off: u32) -> u32 {
  return (weights[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

// IEEE half at an even byte offset, widened to f32 (no shader-f16 needed).
fn load_f16(off: u32) -> f32 {
  return unpack2x16float(load_u16(off)).x;
}

// The 4 bytes of `w` as signed 8-bit integers, widened to f32.
fn i8x4(w: u32) -> vec4<f32> {
  return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w)) >> vec4<u32>(24u));
}

// The 4 bytes of `w` as unsigned values, widened to f32.
fn u8x4(w: u32) -> vec4<f32> {
  return vec4<f32>(f32(w & 0xffu), f32((w >> 8u) & 0xffu), f32((w >> 16u) & 0xffu), f32(w >> 24u));
}

// Bits j..j+3 of `bits`, each moved to bit 4 of its own byte (the fifth bits of Q5_0 / Q5_1).
fn high_bits4(bits: u32, j: u32) -> u32 {
  let b = bits >> j;
  return ((b & 1u) | ((b & 2u) << 7u) | ((b & 4u) << 14u) | ((b & 8u) << 21u)) << 4u;
}

// The 6-bit scale (x) and min (y) of sub-block `s` (0..7) from the 12 bytes at `sc` that Q4_K
// and Q5_K pack them in (ggml's get_scale_min_k4).
fn scale_min_k4(sc: u32, s: u32) -> vec2<f32> {
  if (s < 4u) {
    return vec2<f32>(f32(load_u8(sc + s) & 63u), f32(load_u8(sc + s + 4u) & 63u));
  }
  let hi = load_u8(sc + s + 4u);
  let scale = (hi & 0x0fu) | ((load_u8(sc + s - 4u) >> 6u) << 4u);
  let min = (hi >> 4u) | ((load_u8(sc + s) >> 6u) << 4u);
  return vec2<f32>(f32(scale), f32(min));
}
