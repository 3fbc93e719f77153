// ops/cuda/plans.hpp — the parts of the CUDA backend's matrix products that are plain
// arithmetic on shapes and pointers, kept free of CUDA so that they run, unchanged, on the CPU
// in test/unit/ops/cuda/emulate (with column-major OpenBLAS standing in for cuBLAS):
//   col_major         trident's row-major C = op(A) op(B) as cuBLAS's column-major call;
//   attention_*_steps the order of attention's strided-batched products and softmax passes.
// defines: ColMajor, col_major, attention_forward_steps, attention_backward_steps
#pragma once

#include <cmath>
#include <cstdint>

namespace trident::ops::cuda {

// A column-major product C' = op1(P1) op2(P2) (C' m x n, k inner), as cuBLAS takes it.
struct ColMajor {
  bool trans1, trans2;
  int m, n, k;
  const float* p1;
  int ld1;
  std::int64_t stride1;
  const float* p2;
  int ld2;
  std::int64_t stride2;
};

// Row-major C[m,n] = op(A) op(B) (leading dimensions = row strides) is, read column-major,
// C^T[n,m] = op(B)^T op(A)^T with the same leading dimensions: B first, m and n swapped,
// each operand keeping its own transpose flag. Strides are per batch entry (0: one product).
inline ColMajor col_major(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                          std::int64_t sa, const float* b, int ldb, std::int64_t sb) {
  return ColMajor{tb, ta, n, m, k, b, ldb, sb, a, lda, sa};
}

// GemmBatched: (ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch), a
// row-major strided-batched product. Per batch row bb, one product over the NH heads: head h
// of q, k, v is the [T,hs] block at column h*hs of qkv[bb] (row stride 3C), so consecutive
// heads are hs floats apart; head h of out[bb] likewise at column h*hs (row stride C);
// att[bb,h] is [T,T]. The full T x T scores are computed; the softmax writes the masked zeros.
template <typename GemmBatched, typename Softmax>
void attention_forward_steps(GemmBatched&& gemm, Softmax&& softmax, float* out, float* att,
                             const float* qkv, int b, int t, int c, int nh) {
  const int hs = c / nh, c3 = 3 * c;
  const std::int64_t tt = std::int64_t(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int bb = 0; bb < b; bb++) {
    const float* q = qkv + std::int64_t(bb) * t * c3;
    const float* k = q + c;
    float* a = att + std::int64_t(bb) * nh * tt;
    // scores[h] = scale * q[h] @ k[h]^T
    gemm(false, true, t, t, hs, scale, q, c3, hs, k, c3, hs, 0.0f, a, t, tt, nh);
  }
  softmax(att, std::int64_t(b) * nh * t, t);
  for (int bb = 0; bb < b; bb++) {
    const float* v = qkv + std::int64_t(bb) * t * c3 + 2 * c;
    const float* a = att + std::int64_t(bb) * nh * tt;
    float* o = out + std::int64_t(bb) * t * c;
    // out[h] = att[h] @ v[h]
    gemm(false, false, t, hs, t, 1.0f, a, t, tt, v, c3, hs, 0.0f, o, c, hs, nh);
  }
}

// SoftmaxBackward: (datt, att, rows, t, scale), in place on datt.
template <typename GemmBatched, typename SoftmaxBackward>
void attention_backward_steps(GemmBatched&& gemm, SoftmaxBackward&& softmax_backward,
                              float* dqkv, float* datt, const float* dout, const float* qkv,
                              const float* att, int b, int t, int c, int nh) {
  const int hs = c / nh, c3 = 3 * c;
  const std::int64_t tt = std::int64_t(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int bb = 0; bb < b; bb++) {
    const float* v = qkv + std::int64_t(bb) * t * c3 + 2 * c;
    float* dv = dqkv + std::int64_t(bb) * t * c3 + 2 * c;
    const float* a = att + std::int64_t(bb) * nh * tt;
    float* da = datt + std::int64_t(bb) * nh * tt;
    const float* dob = dout + std::int64_t(bb) * t * c;
    // datt[h] = dout[h] @ v[h]^T;  dv[h] = att[h]^T @ dout[h]
    gemm(false, true, t, t, hs, 1.0f, dob, c, hs, v, c3, hs, 0.0f, da, t, tt, nh);
    gemm(true, false, t, hs, t, 1.0f, a, t, tt, dob, c, hs, 0.0f, dv, c3, hs, nh);
  }
  // datt becomes ds = d scores (the forward's 1/sqrt(hs) folded in)
  softmax_backward(datt, att, std::int64_t(b) * nh * t, t, scale);
  for (int bb = 0; bb < b; bb++) {
    const float* q = qkv + std::int64_t(bb) * t * c3;
    const float* k = q + c;
    float* dq = dqkv + std::int64_t(bb) * t * c3;
    float* dk = dq + c;
    const float* ds = datt + std::int64_t(bb) * nh * tt;
    // dq[h] = ds[h] @ k[h];  dk[h] = ds[h]^T @ q[h]
    gemm(false, false, t, hs, t, 1.0f, ds, t, tt, k, c3, hs, 0.0f, dq, c3, hs, nh);
    gemm(true, false, t, hs, t, 1.0f, ds, t, tt, q, c3, hs, 0.0f, dk, c3, hs, nh);
  }
}

}  // namespace trident::ops::cuda
