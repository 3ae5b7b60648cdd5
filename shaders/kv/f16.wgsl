// KV cache of f16 elements packed two to a u32 (element 2i in the low half), for the attention
// kernels (bindings 2 and 3). Half the memory and bandwidth of f32; widened with unpack2x16float,
// so it needs no shader-f16.

@group(0) @binding(2) var<storage, read> k_cache: array<u32>; // [ctx × n_head_kv × head_dim / 2] 2 × f16
@group(0) @binding(3) var<storage, read> v_cache: array<u32>; // [ctx × n_head_kv × head_dim / 2] 2 × f16

fn k_at(i: u32) -> f32 {
  return unpack2x16float(k_cache[i >> 1u])[i & 1u];
}

fn v_at(i: u32) -> f32 {
  return unpack2x16float(v_cache[i >> 1u])[i & 1u];
}
