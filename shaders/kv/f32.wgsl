// KV cache of f32 elements, for the attention kernels (bindings 2 and 3).

@group(0) @binding(2) var<storage, read> k_cache: array<f32>; // [ctx × n_head_kv × head_dim] f32, RoPE applied
@group(0) @binding(3) var<storage, read> v_cache: array<f32>; // [ctx × n_head_kv × head_dim] f32

fn k_at(i: u32) -> f32 {
  return k_cache[i];
}

fn v_at(i: u32) -> f32 {
  return v_cache[i];
}
