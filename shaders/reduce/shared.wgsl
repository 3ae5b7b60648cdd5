// Workgroup max and sum for 64-thread workgroups: a shared-memory tree (works on every adapter).
// Call from uniform control flow; every thread gets the result. Its first barrier also publishes
// any workgroup memory the caller wrote just before (attention relies on that for its weights).
// Softmax and the attention kernels always take this snippet, so their sums add up in one fixed
// order on every adapter; mul_mat_vec and rms_norm take reduce/subgroup.wgsl where it exists.

var<workgroup> reduce_scratch: array<f32, 64>;

const REDUCE_SUM: u32 = 0u;
const REDUCE_MAX: u32 = 1u;

fn reduce_pair(a: f32, b: f32, op: u32) -> f32 {
  if (op == REDUCE_MAX) {
    return max(a, b);
  }
  return a + b;
}

fn workgroup_reduce(v: f32, lid: u32, op: u32) -> f32 {
  reduce_scratch[lid] = v;
  workgroupBarrier();
  for (var stride = 32u; stride > 0u; stride /= 2u) {
    if (lid < stride) {
      reduce_scratch[lid] = reduce_pair(reduce_scratch[lid], reduce_scratch[lid + stride], op);
    }
    workgroupBarrier();
  }
  let total = reduce_scratch[0];
  workgroupBarrier();
  return total;
}

fn workgroup_sum(v: f32, lid: u32) -> f32 {
  return workgroup_reduce(v, lid, REDUCE_SUM);
}

fn workgroup_max(v: f32, lid: u32) -> f32 {
  return workgroup_reduce(v, lid, REDUCE_MAX);
}
