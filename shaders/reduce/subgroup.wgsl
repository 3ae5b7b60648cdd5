// Workgroup sum for 64-thread workgroups with the `subgroups` feature: each subgroup adds in
// registers, one elected lane per subgroup publishes its sum, and every thread adds those up
// (two barriers instead of seven). Call from uniform control flow; every thread gets the total.
enable subgroups;

var<workgroup> reduce_scratch: array<f32, 64>;

fn workgroup_sum(v: f32, lid: u32) -> f32 {
  let s = subgroupAdd(v);
  reduce_scratch[lid] = select(0.0, s, subgroupElect());
  workgroupBarrier();
  var total = 0.0;
  for (var i = 0u; i < 64u; i++) {
    total += reduce_scratch[i];
  }
  workgroupBarrier();
  return total;
}
