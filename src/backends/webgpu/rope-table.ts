// The cos/sin table the rope kernel reads, built on the host with the CPU reference's own
// formula (ggml's f32 rounding of θ, then cos/sin in double precision). GPU sin/cos are only
// accurate near zero, and positions reach thousands of radians, so the host does the trig.

import { ropeCache } from '../cpu/ops.ts';
import type { RopeConfig } from '../../model/config.ts';

/** [nTokens × nRot/2] interleaved (cos θ, sin θ) for positions pos0 … pos0 + nTokens - 1 */
export function ropeTable(rope: RopeConfig, pos0: number, nTokens: number): Float32Array {
  const table = new Float32Array(nTokens * rope.nRot);
  for (let t = 0; t < nTokens; t++) ropeCache(table.subarray(t * rope.nRot, (t + 1) * rope.nRot), pos0 + t, rope);
  return table;
}
