// ops/cuda/matmul.cpp — every matrix product of the CUDA backend through cuBLAS: gemm,
// linear forward/backward, and causal attention (strided-batched per-head products read in
// place from qkv, around the softmax kernels of softmax.cu).
// defines: CudaOps::gemm_rm, gemm_batched_rm, gemm, linear_forward, linear_backward,
//          attention_forward, attention_backward
//
// Row-major to cuBLAS: trident stores C[m,n] row-major with row stride ldc, which cuBLAS
// (column-major) reads as C^T[n,m] with leading dimension ldc; likewise A and B. So
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLAS is called with the operands
// swapped (B first), m and n swapped, and each operand's own transpose flag.
#include <cmath>

#include "check.hpp"
#include "cuda_ops.hpp"
#include "kernels.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {

cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Compute type of the fp32-input products (see cuda_ops.hpp, "Precision").
cublasComputeType_t fp32_input_compute(Precision p) {
  switch (p) {
    case Precision::fp32: return CUBLAS_COMPUTE_32F;
    case Precision::tf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case Precision::bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
  }
  return CUBLAS_COMPUTE_32F;
}

}  // namespace

void CudaOps::gemm_rm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                      int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // no product: C = beta C
    if (beta == 0.0f) {
      TRIDENT_CUDA_CHECK(cudaMemset2DAsync(c, std::size_t(ldc) * sizeof(float), 0,
                                           std::size_t(n) * sizeof(float), std::size_t(m), stream_));
    } else if (beta != 1.0f) {
      const float zero = 0.0f;  // in place: C = beta C + 0 C
      TRIDENT_CUBLAS_CHECK(cublasSgeam(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, &beta, c, ldc,
                                       &zero, c, ldc, c, ldc));
    }
    return;
  }
  if (precision_ == Precision::bf16) {
    // Packed bf16 copies of the stored operands: A is stored [m,k] (or [k,m] when
    // transposed), B [k,n] (or [n,k]); the copies' leading dimension is their column count.
    const std::int64_t ra = ta ? k : m, ca = ta ? m : k;
    const std::int64_t rb = tb ? n : k, cb = tb ? k : n;
    const std::size_t abytes = std::size_t(ra * ca) * 2, bbytes = std::size_t(rb * cb) * 2;
    DeviceArena& s = scratch(aligned_bytes(abytes) + aligned_bytes(bbytes));
    void* a16 = s.alloc(abytes);
    void* b16 = s.alloc(bbytes);
    launch_to_bf16(stream_, a16, a, ra, ca, lda);
    launch_to_bf16(stream_, b16, b, rb, cb, ldb);
    TRIDENT_CUBLAS_CHECK(cublasGemmEx(cublas_, op_of(tb), op_of(ta), n, m, k, &alpha, b16,
                                      CUDA_R_16BF, static_cast<int>(cb), a16, CUDA_R_16BF,
                                      static_cast<int>(ca), &beta, c, CUDA_R_32F, ldc,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  const cublasComputeType_t compute =
      precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  TRIDENT_CUBLAS_CHECK(cublasGemmEx(cublas_, op_of(tb), op_of(ta), n, m, k, &alpha, b, CUDA_R_32F,
                                    ldb, a, CUDA_R_32F, lda, &beta, c, CUDA_R_32F, ldc, compute,
                                    CUBLAS_GEMM_DEFAULT));
}

void CudaOps::gemm_batched_rm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                              int lda, std::int64_t sa, const float* b, int ldb, std::int64_t sb,
                              float beta, float* c, int ldc, std::int64_t sc, int batch) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return;
  TRIDENT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_, op_of(tb), op_of(ta), n, m, k, &alpha, b, CUDA_R_32F, ldb, sb, a, CUDA_R_32F, lda,
      sa, &beta, c, CUDA_R_32F, ldc, sc, batch, fp32_input_compute(precision_),
      CUBLAS_GEMM_DEFAULT));
}

void CudaOps::gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_rm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CudaOps::linear_forward(float* y, const float* x, const float* w, const float* b, int n,
                             int in, int out) {
  // y starts as the bias rows and the product is added (beta = 1), as the CPU backend.
  // (A cuBLASLt bias epilogue would save the pass over y: a later optimization.)
  if (b) launch_bias_rows(stream_, y, b, n, out);
  gemm_rm(false, false, n, out, in, 1.0f, x, in, w, out, b ? 1.0f : 0.0f, y, out);
}

void CudaOps::linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                              const float* w, int n, int in, int out) {
  // dx[N,in] = dy[N,out] @ w[in,out]^T
  if (dx) gemm_rm(false, true, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in);
  // dw[in,out] += x[N,in]^T @ dy[N,out]
  gemm_rm(true, false, in, out, n, 1.0f, x, in, dy, out, 1.0f, dw, out);
  if (db && n > 0 && out > 0) {
    // db[out] += dy^T @ ones[N]: a cuBLAS fp32 GEMV (deterministic, whatever the precision).
    // dy row-major [N,out] is column-major [out,N] with leading dimension out.
    float* ones = scratch(aligned_bytes(std::size_t(n) * sizeof(float))).alloc_n<float>(std::size_t(n));
    launch_fill(stream_, ones, 1.0f, n);
    const float one = 1.0f;
    TRIDENT_CUBLAS_CHECK(cublasSgemv(cublas_, CUBLAS_OP_N, out, n, &one, dy, out, ones, 1, &one,
                                     db, 1));
  }
}

// Per batch row bb, one strided-batched product over the NH heads: head h of q, k, v is the
// [T,hs] block at column h*hs of qkv[bb] (row stride 3C), so consecutive heads are hs floats
// apart; head h of out[bb] likewise at column h*hs (row stride C); att[bb,h] is [T,T].
// The full T x T scores are computed and the softmax writes the masked half's zeros.
void CudaOps::attention_forward(float* out, float* att, const float* qkv, int b, int t, int c,
                                int nh) {
  TRIDENT_CHECK(nh > 0 && c % nh == 0, "attention_forward: C = ", c,
                " is not a multiple of NH = ", nh);
  const int hs = c / nh, c3 = 3 * c;
  const std::int64_t tt = std::int64_t(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int bb = 0; bb < b; bb++) {
    const float* q = qkv + std::int64_t(bb) * t * c3;  // [T,hs] per head, row stride 3C
    const float* k = q + c;
    float* a = att + std::int64_t(bb) * nh * tt;        // [NH,T,T]
    // scores[h] = scale * q[h] @ k[h]^T
    gemm_batched_rm(false, true, t, t, hs, scale, q, c3, hs, k, c3, hs, 0.0f, a, t, tt, nh);
  }
  launch_causal_softmax(stream_, att, std::int64_t(b) * nh * t, t);
  for (int bb = 0; bb < b; bb++) {
    const float* v = qkv + std::int64_t(bb) * t * c3 + 2 * c;
    const float* a = att + std::int64_t(bb) * nh * tt;
    float* o = out + std::int64_t(bb) * t * c;  // [T,hs] per head, row stride C
    // out[h] = att[h] @ v[h]
    gemm_batched_rm(false, false, t, hs, t, 1.0f, a, t, tt, v, c3, hs, 0.0f, o, c, hs, nh);
  }
}

void CudaOps::attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                 const float* att, int b, int t, int c, int nh) {
  TRIDENT_CHECK(nh > 0 && c % nh == 0, "attention_backward: C = ", c,
                " is not a multiple of NH = ", nh);
  const int hs = c / nh, c3 = 3 * c;
  const std::int64_t tt = std::int64_t(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int bb = 0; bb < b; bb++) {
    const float* v = qkv + std::int64_t(bb) * t * c3 + 2 * c;
    float* dv = dqkv + std::int64_t(bb) * t * c3 + 2 * c;
    const float* a = att + std::int64_t(bb) * nh * tt;
    float* da = datt + std::int64_t(bb) * nh * tt;
    const float* dob = dout + std::int64_t(bb) * t * c;
    // datt[h] = dout[h] @ v[h]^T
    gemm_batched_rm(false, true, t, t, hs, 1.0f, dob, c, hs, v, c3, hs, 0.0f, da, t, tt, nh);
    // dv[h] = att[h]^T @ dout[h]
    gemm_batched_rm(true, false, t, hs, t, 1.0f, a, t, tt, dob, c, hs, 0.0f, dv, c3, hs, nh);
  }
  // datt becomes ds = d scores (the 1/sqrt(hs) of the forward folded in)
  launch_causal_softmax_backward(stream_, datt, att, std::int64_t(b) * nh * t, t, scale);
  for (int bb = 0; bb < b; bb++) {
    const float* q = qkv + std::int64_t(bb) * t * c3;
    const float* k = q + c;
    float* dq = dqkv + std::int64_t(bb) * t * c3;
    float* dk = dq + c;
    const float* ds = datt + std::int64_t(bb) * nh * tt;
    // dq[h] = ds[h] @ k[h];  dk[h] = ds[h]^T @ q[h]
    gemm_batched_rm(false, false, t, hs, t, 1.0f, ds, t, tt, k, c3, hs, 0.0f, dq, c3, hs, nh);
    gemm_batched_rm(true, false, t, hs, t, 1.0f, ds, t, tt, q, c3, hs, 0.0f, dk, c3, hs, nh);
  }
}

}  // namespace trident::ops::cuda
