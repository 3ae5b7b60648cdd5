// Workgroup sum for 64-thread workgroups: a shared-memory tree (works on every adapter).
// Call from uniform control flow; every thread gets the total.

var<workgroup> reduce_scratch: array<f32, 64>;

fn workgroup_sum(v: f32, lid: u32) -> f32 {
  reduce_scratch[lid] = v;
  workgroupBarrier();
  for (var stride = 32u; stride > 0u; stride /= 2u) {
    if (lid < stride) {
      reduce_scratch[lid] += reduce_scratch[lid + stride];
    }
    workgroupBarrier();
  }
  let total = reduce_scratch[0];
  workgroupBarrier();
  return total;
}
