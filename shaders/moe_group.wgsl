// Sorts a batch's (token, slot) pairs by expert, for the grouped expert matmul (mul_mat_id):
// slots lists every slot index t·k + j, expert by expert and in token order within one;
// offsets[e] .. offsets[e + 1] is expert e's range. One thread does it all (a batch has at
// most a few thousand slots), so there are no barriers.

struct Params {
  n_slots: u32,   // n_tokens × k
  n_expert: u32,  // at most MAX_EXPERTS
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;           // [n_slots] expert of each slot
@group(0) @binding(2) var<storage, read_write> offsets: array<u32>; // [n_expert + 1]
@group(0) @binding(3) var<storage, read_write> slots: array<u32>;   // [n_slots]

const MAX_EXPERTS: u32 = 512u;

var<workgroup> cursor: array<u32, MAX_EXPERTS>;

@compute @workgroup_size(1)
fn main() {
  for (var e = 0u; e <= p.n_expert; e++) {
    offsets[e] = 0u;
  }
  for (var s = 0u; s < p.n_slots; s++) {
    offsets[ids[s] + 1u] += 1u;
  }
  for (var e = 0u; e < p.n_expert; e++) {
    offsets[e + 1u] += offsets[e];
    cursor[e] = offsets[e];
  }
  for (var s = 0u; s < p.n_slots; s++) {
    let e = ids[s];
    slots[cursor[e]] = s;
    cursor[e] += 1u;
  }
}
