// Matrix × matrix for prefill on real GPUs: out[t, row] = dot(W[row, :], x[t, :]), computed in
// 64-row × 64-token tiles by 256 threads. Each step along k dequantises a 64 × 32 slice of the
// weights and loads a 64 × 32 slice of x into workgroup memory once, then every thread
// accumulates a 4-row × 4-token block from it, so each weight byte is read once per 64 tokens.
// Needs k to be a multiple of TK (32; true of every quantised row). On software adapters,
// where barriers are slow, mul_mat.wgsl is used instead.
// Params and bindings (p, weights, x, out): shaders/matmul/batched_io.wgsl.

const TM: u32 = 64u;  // weight rows per tile
const TN: u32 = 64u;  // tokens per tile
const TK: u32 = 32u;  // k per step
const WG: u32 = 256u; // threads: 16 × 16, each owning 4 rows × 4 tokens

var<workgroup> w_tile: array<f32, TM * TK>; // [row][k]
var<workgroup> x_tile: array<f32, TN * TK>; // [token][k]

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row0 = wid.x * TM;
  let tok0 = wid.y * TN;
  let tr = (lid % 16u) * 4u; // this thread's rows within the tile
  let tt = (lid / 16u) * 4u; // this thread's tokens within the tile
  var acc: array<vec4<f32>, 4>; // acc[j][i]: token tt + j, row tr + i

  for (var k0 = 0u; k0 < p.k; k0 += TK) {
    for (var g = lid; g < TM * TK / 4u; g += WG) {
      let r = g / (TK / 4u);
      let kk = (g % (TK / 4u)) * 4u;
      var v = vec4<f32>(0.0);
      if (row0 + r < p.rows) {
        v = dequant4((row0 + r) * p.row_bytes, k0 + kk);
      }
      let o = r * TK + kk;
      w_tile[o] = v.x;
      w_tile[o + 1u] = v.y;
      w_tile[o + 2u] = v.z;
      w_tile[o + 3u] = v.w;
    }
    for (var g = lid; g < TN * TK / 4u; g += WG) {
      let t = g / (TK / 4u);
      let kk = (g % (TK / 4u)) * 4u;
      var v = vec4<f32>(0.0);
      if (tok0 + t < p.n_tokens) {
        v = x[(p.x_offset + (tok0 + t) * p.x_stride + k0 + kk) / 4u];
      }
      let o = t * TK + kk;
      x_tile[o] = v.x;
      x_tile[o + 1u] = v.y;
      x_tile[o + 2u] = v.z;
      x_tile[o + 3u] = v.w;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < TK; kk++) {
      let w = vec4<f32>(w_tile[tr * TK + kk], w_tile[(tr + 1u) * TK + kk], w_tile[(tr + 2u) * TK + kk], w_tile[(tr + 3u) * TK + kk]);
      for (var j = 0u; j < 4u; j++) {
        acc[j] += x_tile[(tt + j) * TK + kk] * w;
      }
    }
    workgroupBarrier();
  }

  for (var j = 0u; j < 4u; j++) {
    let t = tok0 + tt + j;
    if (t >= p.n_tokens) {
      continue;
    }
    for (var i = 0u; i < 4u; i++) {
      let r = row0 + tr + i;
      if (r < p.rows) {
        out[p.out_offset + t * p.out_stride + r] = acc[j][i];
      }
    }
  }
}
