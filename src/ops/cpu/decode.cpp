// ops/cpu/decode.cpp — attention of one new query row against a key-value cache (generation).
// defines: CpuOps::attention_decode
#include "cpu_ops.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/error.hpp"

namespace trident::ops::cpu {

// Generation with a key-value cache: one query row per sequence, every cached key. One
// (sequence, head) per iteration; scores in this call's scratch[B, NH, S].
void CpuOps::attention_decode(float* out, float* scratch, const float* q, const float* k,
                              const float* v, int b, int s, int nh, int nkv, int hs,
                              std::int64_t ld_q, std::int64_t ld_kv, std::int64_t kv_batch,
                              std::int64_t ld_o) {
  TRIDENT_CHECK(nkv >= 1 && nh % nkv == 0, "attention_decode: ", nh, " query heads over ", nkv,
                " kv heads");
  const int rep = nh / nkv;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int nt = team(std::int64_t(b) * nh * s * hs);
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
  for (int bb = 0; bb < b; bb++)
    for (int h = 0; h < nh; h++) {
      const float* qh = q + bb * ld_q + std::int64_t(h) * hs;
      const std::int64_t kv_col = std::int64_t(h / rep) * hs;
      float* p = scratch + (std::int64_t(bb) * nh + h) * s;
      float mx = -INFINITY;
      for (int j = 0; j < s; j++) {
        const float* kj = k + bb * kv_batch + j * ld_kv + kv_col;
        float dot = 0.0f;
        for (int d = 0; d < hs; d++) dot += qh[d] * kj[d];
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < s; j++) sum += (p[j] = std::exp(p[j] - mx));
      float* o = out + bb * ld_o + std::int64_t(h) * hs;
      for (int d = 0; d < hs; d++) o[d] = 0.0f;
      for (int j = 0; j < s; j++) {
        const float* vj = v + bb * kv_batch + j * ld_kv + kv_col;
        const float w = p[j] / sum;
        for (int d = 0; d < hs; d++) o[d] += w * vj[d];
      }
    }
}

}  // namespace trident::ops::cpu
