// ops/cpu/cpu_ops.hpp — the CPU backend of trident::ops::Ops (private to src/ops/cpu):
// OpenBLAS cblas_sgemm for every matrix product, OpenMP over rows for everything else.
// The member functions are defined by topic in matmul.cpp, attention.cpp (the T x T reference),
// flash_attention.cpp, decode.cpp, layernorm.cpp, rmsnorm.cpp, rope.cpp, pointwise.cpp,
// embedding.cpp and crossentropy.cpp; cpu_ops.cpp builds the object.
// defines: trident::ops::cpu::CpuOps, BlasThreads, exp_approx, team_range, parallel_slabs,
//          TRIDENT_SIMD_CLONES
//
// Threading: one pool, OpenMP's. Large products call OpenBLAS with its own threads
// switched off, from inside an OpenMP loop that splits the output into one slab per
// thread (gemm_split); attention runs one (batch, head) per iteration, each with
// single-threaded sgemm. So OpenBLAS's worker threads never spin on the cores while an
// OpenMP team does (two busy-waiting pools on 2 cores cost more than either saves).
#pragma once

// exp_approx's clamps are compares, and under GCC's default -ftrapping-math those are not
// turned into vector blends (no loop calling it would vectorize). These kernels never read
// the floating-point exception flags, so they are compiled without it. Every file of this
// backend includes this header first.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "trident/ops/ops.hpp"

namespace trident::ops::cpu {

// exp(x) for |x| <= ~80 as plain arithmetic that GCC vectorizes inside `omp simd` loops
// (glibc's expf is a call per element without -ffast-math). Cody-Waite range reduction
// x = n ln2 + r, a degree-7 polynomial for e^r (Cephes expf), and 2^n built in the
// exponent bits. Max relative error ~2e-7 (1-2 ulp). Inputs are clamped to [-80, 80],
// which keeps every result normal (no denormal slow paths): callers use it for softmax
// (x <= 0; e^-80 ~ 1.8e-35 is 0 next to the row's 1) and for GELU's sigmoid.
inline float exp_approx(float x) {
  x = x < -80.0f ? -80.0f : x;
  x = x > 80.0f ? 80.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x/ln2)
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// TRIDENT_SIMD_CLONES on a loop kernel: GCC compiles it three times (AVX-512, AVX2+FMA,
// baseline SSE2) and the loader picks the one the running CPU supports (an ifunc). The
// default build has no -march flag, and the exp-heavy loops (GELU, softmax, cross-entropy)
// run about 4x faster 16 lanes wide than 4. Results may differ in the last bit between
// machines (FMA contraction), never between runs on one machine.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(TRIDENT_NO_SIMD_CLONES)
#define TRIDENT_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TRIDENT_SIMD_CLONES
#endif

// [begin, end) of the part of [0, n) that thread `tid` of a team of `nt` owns (contiguous
// slabs, rounded to `align` elements so slabs start on cache lines / GEMM panels).
inline void team_range(std::int64_t n, int tid, int nt, std::int64_t align, std::int64_t& begin,
                       std::int64_t& end) {
  std::int64_t per = (n + nt - 1) / nt;
  per = (per + align - 1) / align * align;
  begin = per * tid < n ? per * tid : n;
  end = begin + per < n ? begin + per : n;
}

// f(begin, end) on one contiguous slab of [0, n) per thread of a team of nt (no parallel
// region at all when nt == 1).
template <typename F>
void parallel_slabs(int nt, std::int64_t n, std::int64_t align, F&& f) {
  if (nt <= 1) {
    if (n > 0) f(std::int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    std::int64_t lo, hi;
    team_range(n, omp_get_thread_num(), omp_get_num_threads(), align, lo, hi);
    if (hi > lo) f(lo, hi);
  }
}

// Scoped OpenBLAS thread count: BlasThreads one(1) for the lifetime of an OpenMP loop that
// calls sgemm per iteration; restores the previous count.
class BlasThreads {
 public:
  explicit BlasThreads(int n);
  ~BlasThreads();
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  int saved_;
};

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads);

  Device device() const override { return Device::cpu; }
  std::string name() const override;
  int threads() const { return threads_; }

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override;
  void linear_forward(float* y, const float* x, const float* w, const float* b, int n, int in,
                      int out) override;
  void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                       const float* w, int n, int in, int out) override;

  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int n, int c) override;
  void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const float* mean, const float* rstd, int n,
                          int c) override;

  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int n, int c,
                       float eps) override;
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int n, int c) override;
  void rope_forward(float* x, int b, int t, int ld, int heads, int hs, int pos0,
                    float theta) override;
  void rope_backward(float* dx, int b, int t, int ld, int heads, int hs, int pos0,
                     float theta) override;
  void swiglu_forward(float* y, const float* gu, int n, int f) override;
  void swiglu_backward(float* dgu, const float* gu, const float* dy, int n, int f) override;

  void gelu_forward(float* y, const float* x, std::int64_t n) override;
  void gelu_backward(float* dx, const float* x, const float* dy, std::int64_t n) override;
  void add(float* y, const float* a, const float* b, std::int64_t n) override;
  void scale(float* x, float alpha, std::int64_t n) override;
  double sum_squares(const float* x, std::int64_t n) override;
  void fill(float* x, float value, std::int64_t n) override;
  void copy(float* dst, const float* src, std::int64_t n) override;
  void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                 std::int64_t rows, std::int64_t width) override;
  void to_bf16(std::uint16_t* dst, const float* src, std::int64_t n) override;
  void from_bf16(float* dst, const std::uint16_t* src, std::int64_t n) override;

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionShape& s) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const AttentionShape& s) override;
  void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                       const AttentionShape& s) override;
  void attention_naive_forward(float* out, float* att, const float* qkv, int b, int t, int c,
                         int nh) override;
  void attention_naive_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int b, int t, int c, int nh) override;

  void attention_decode(float* out, float* scratch, const float* q, const float* k,
                        const float* v, int b, int s, int nh, int nkv, int hs, std::int64_t ld_q,
                        std::int64_t ld_kv, std::int64_t kv_batch, std::int64_t ld_o) override;

  void embedding_forward(float* x, const std::int32_t* tokens, const float* wte, int n, int c,
                         int vocab_start, int v) override;
  void embedding_backward(float* dwte, const float* dx, const std::int32_t* tokens, int n,
                          int c, int vocab_start, int v) override;
  void position_forward(float* x, const float* wpe, int b, int t, int c) override;
  void position_backward(float* dwpe, const float* dx, int b, int t, int c) override;

  void xent_row_max(float* row_max, const float* logits, int n, int ld, int v_valid) override;
  void xent_sumexp(float* sumexp, float* target_logit, const float* logits,
                   const float* row_max, const std::int32_t* targets, int n, int ld, int v_valid,
                   int vocab_start) override;
  void xent_rescale_sumexp(float* sumexp, const float* shard_max, const float* row_max,
                           int n) override;
  void xent_loss(float* loss, const float* row_max, const float* sumexp,
                 const float* target_logit, int n) override;
  void xent_backward(float* logits, const float* row_max, const float* sumexp,
                     const std::int32_t* targets, int n, int ld, int v_valid, int vocab_start,
                     float scale) override;

  void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float bc1, float bc2) override;

 private:
  // C = alpha op(A) op(B) + beta C with the rows (or columns) of C split over the OpenMP
  // team, single-threaded sgemm per slab; small products run on the calling thread.
  void gemm_split(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                  int lda, const float* b, int ldb, float beta, float* c, int ldc);
  // Team size for a loop of `work` elementwise operations (1 below ~32k: a parallel
  // region costs a few microseconds).
  int team(std::int64_t work) const;

  int threads_;
};

}  // namespace trident::ops::cpu
