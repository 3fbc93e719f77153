// ops/cuda/matmul.cpp — every matrix product of the CUDA backend through cuBLAS: gemm,
// linear forward/backward, and causal attention (strided-batched per-head products read in
// place from qkv, around the softmax kernels of softmax.cu).
// defines: CudaOps::gemm_rm, gemm_batched_rm, gemm, linear_forward, linear_backward,
//          attention_forward, attention_backward (the kernels of flash_attention.cu or
//          flash_attention_tc.cu: tc_attention), attention_merge, attention_naive_forward,
//          attention_naive_backward, tc_attention
//
// Row-major to cuBLAS: see col_major in plans.hpp (C^T = op(B)^T op(A)^T), which also holds
// the order of attention's products; both run on the CPU in test/unit/ops/cuda/emulate.
#include <algorithm>
#include <cmath>
#include <vector>

#include "check.hpp"
#include "cuda_ops.hpp"
#include "kernels.hpp"
#include "lt_tune.hpp"
#include "plans.hpp"
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
    // An operand in the weights is read from the weight cache (leading dimension as stored).
    const void* a16 = cached_bf16(a, ra, ca, lda);
    const void* b16 = cached_bf16(b, rb, cb, ldb);
    const std::size_t abytes = a16 ? 0 : std::size_t(ra * ca) * 2;
    const std::size_t bbytes = b16 ? 0 : std::size_t(rb * cb) * 2;
    int lda16 = lda, ldb16 = ldb;
    if (abytes || bbytes) {
      BumpBlock& s = scratch(aligned_bytes(abytes) + aligned_bytes(bbytes));
      if (!a16) {
        void* packed = s.alloc(abytes);
        launch_to_bf16(stream_, packed, a, ra, ca, lda);
        a16 = packed;
        lda16 = static_cast<int>(ca);
      }
      if (!b16) {
        void* packed = s.alloc(bbytes);
        launch_to_bf16(stream_, packed, b, rb, cb, ldb);
        b16 = packed;
        ldb16 = static_cast<int>(cb);
      }
    }
    gemm_rm16(ta, tb, m, n, k, alpha, a16, lda16, b16, ldb16, beta, c, ldc);
    return;
  }
  const cublasComputeType_t compute =
      precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const ColMajor g = col_major(ta, tb, m, n, k, a, lda, 0, b, ldb, 0);
  TRIDENT_CUBLAS_CHECK(cublasGemmEx(cublas_, op_of(g.trans1), op_of(g.trans2), g.m, g.n, g.k,
                                    &alpha, g.p1, CUDA_R_32F, g.ld1, g.p2, CUDA_R_32F, g.ld2,
                                    &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
}

void CudaOps::gemm_rm16(bool ta, bool tb, int m, int n, int k, float alpha, const void* a16,
                        int lda, const void* b16, int ldb, float beta, float* c, int ldc) {
  // the mapping with the bf16 operands' leading dimensions (col_major only swaps them)
  const ColMajor g = col_major(ta, tb, m, n, k, nullptr, lda, 0, nullptr, ldb, 0);
  if (lt_tune_ && gemm_lt16(g, alpha, b16, a16, beta, c, false, ldc)) return;
  TRIDENT_CUBLAS_CHECK(cublasGemmEx(cublas_, op_of(g.trans1), op_of(g.trans2), g.m, g.n, g.k,
                                    &alpha, b16, CUDA_R_16BF, g.ld1, a16, CUDA_R_16BF, g.ld2,
                                    &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
}

void CudaOps::gemm_batched_rm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                              int lda, std::int64_t sa, const float* b, int ldb, std::int64_t sb,
                              float beta, float* c, int ldc, std::int64_t sc, int batch) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return;
  const ColMajor g = col_major(ta, tb, m, n, k, a, lda, sa, b, ldb, sb);
  TRIDENT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_, op_of(g.trans1), op_of(g.trans2), g.m, g.n, g.k, &alpha, g.p1, CUDA_R_32F, g.ld1,
      g.stride1, g.p2, CUDA_R_32F, g.ld2, g.stride2, &beta, c, CUDA_R_32F, ldc, sc, batch,
      fp32_input_compute(precision_), CUBLAS_GEMM_DEFAULT));
}

void CudaOps::gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  OpScope timed(timer_.get(), [&] { return str("gemm ", trans_a ? "T" : "N", trans_b ? "T" : "N",
                                                 " m=", m, " n=", n, " k=", k); }, 0);
  gemm_rm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void CudaOps::linear_forward(float* y, const float* x, const float* w, const float* b, int n,
                             int in, int out) {
  OpScope timed(
      timer_.get(), [&] { return str("linear_forward n=", n, " in=", in, " out=", out); }, 0);
  if (precision_ == Precision::bf16 && b && !baseline_ && n > 0 && in > 0 && out > 0) {
    // bf16 copies of x and w (w from the weight cache when it is a weight), then the product
    // with the bias in cuBLASLt's epilogue
    const void* w16 = cached_bf16(w, in, out, out);
    const std::size_t xbytes = std::size_t(n) * in * 2, wbytes = w16 ? 0 : std::size_t(in) * out * 2;
    BumpBlock& s = scratch(aligned_bytes(xbytes) + aligned_bytes(wbytes));
    void* x16 = s.alloc(xbytes);
    launch_to_bf16(stream_, x16, x, n, in, in);
    if (!w16) {
      void* packed = s.alloc(wbytes);
      launch_to_bf16(stream_, packed, w, in, out, out);
      w16 = packed;
    }
    if (bias_lt(y, false, nullptr, x16, w16, false, b, n, in, out)) return;
    launch_bias_rows(stream_, y, b, n, out);
    gemm_rm16(false, false, n, out, in, 1.0f, x16, in, w16, out, 1.0f, y, out);
    return;
  }
  // y starts as the bias rows and the product is added (beta = 1), as the CPU backend.
  if (b) launch_bias_rows(stream_, y, b, n, out);
  gemm_rm(false, false, n, out, in, 1.0f, x, in, w, out, b ? 1.0f : 0.0f, y, out);
}

namespace {
// The largest power of two (at most 256) dividing the address: cuBLASLt's alignment hints.
std::int64_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::int64_t al = 256;
  while (al > 1 && a % std::uintptr_t(al) != 0) al /= 2;
  return al;
}

bool lt_declined(cublasStatus_t s) {
  return s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE ||
         s == CUBLAS_STATUS_ARCH_MISMATCH;
}
}  // namespace

bool CudaOps::bias_lt(void* d, bool d16, const float* residual, const void* x16, const void* w16,
                      bool w_t, const void* bias, int n, int in, int out, LtGelu gelu,
                      const void* aux, void* bias_grad, bool bias16) {
  // Column-major: D^T[out, N] = w^T[out, in] x^T[in, N] + bias[out] per column (+ C =
  // residual^T), i.e. A = w16 as stored (column-major [out, in] for row-major w[in, out]; under
  // w_t [in, out], transposed), B = x16 (in x N, ld in), C and D (out x N, ld out), the bias
  // over D's rows.
  // The GELU epilogues (cublasLt.h, cublasLtEpilogue_t and the EPILOGUE_AUX_* attributes):
  // GELU_AUX_BIAS writes GELU's input (after the bias) to aux and gelu of it to D; DGELU_BGRAD
  // reads aux, writes D = product * gelu'(aux) and the bias gradient (D's row sums, over N) to
  // the bias pointer, overwriting it. GELU is the tanh form (GPT-2's), as measured on a card
  // against 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). aux has D's shape and type (its
  // default, EPILOGUE_AUX_DATA_TYPE unset: bf16 here; another type is refused), leading
  // dimension EPILOGUE_AUX_LD >= rows and a multiple of 8 (else refused: the fallback); the
  // heuristic takes aux's alignment from the pointer's value, as the bias's, so the key holds
  // it. The bias gradient's type is BIAS_DATA_TYPE (fp32, as the forward's bias; unset, under
  // backward_bgrad16, its default: D's).
  const bool gelu_fwd = gelu == LtGelu::forward;
  const bool grad16 = gelu == LtGelu::backward_bgrad16;
  const bool gelu_bwd = gelu == LtGelu::backward || grad16;
  TRIDENT_CHECK(gelu == LtGelu::none || (d16 && !residual && aux && (gelu_fwd ? bias && !bias_grad
                                                                             : bias_grad && !bias)),
                "bias_lt: the GELU epilogues take bf16 D, no residual, aux, and a bias (forward) "
                "or a bias gradient (backward)");
  const void* vec = gelu_bwd ? static_cast<const void*>(bias_grad) : bias;  // BIAS_POINTER
  const int w_rows = w_t ? out : in, w_cols = w_t ? in : out;
  const std::int64_t al_cd = std::min(alignment_of(d), residual ? alignment_of(residual) : 256);
  const std::int64_t align = al_cd | (alignment_of(vec) << 16) | (alignment_of(x16) << 32) |
                             (alignment_of(w16) << 48) | (std::int64_t(d16) << 58) |
                             (std::int64_t(w_t) << 59) | (std::int64_t(!vec) << 60);
  const std::int64_t epi_key =
      std::int64_t(gelu) | (std::int64_t(bias16) << 7) | (aux ? alignment_of(aux) << 8 : 0);
  const std::array<std::int64_t, 5> key{n, in, out, align, epi_key};
  auto it = lt_plans_.find(key);
  if (it == lt_plans_.end()) {
    LtPlan plan;
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_n = CUBLAS_OP_N, op_a = w_t ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = gelu_fwd ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                        : gelu_bwd ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                        : bias     ? CUBLASLT_EPILOGUE_BIAS
                                                   : CUBLASLT_EPILOGUE_DEFAULT;
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &op_a, sizeof(op_a)));
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &op_n, sizeof(op_n)));
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    // The bias (or its gradient) is fp32 (the model's); cuBLASLt reads it as D's type unless told.
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (vec && d16 && !grad16 && !bias16) {
      const std::int32_t bias_type = CUDA_R_32F;
      st = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                          &bias_type, sizeof(bias_type));
    }
    // Before the heuristic, which takes the bias's (and aux's) alignment from the pointer's
    // value (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, _EPILOGUE_AUX_POINTER); the key
    // holds those alignments. A refused GELU attribute is a declined plan (the fallback).
    if (vec && st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
                                          sizeof(vec));
    if (aux && st == CUBLAS_STATUS_SUCCESS) {
      const std::int64_t aux_ld = out;
      st = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                          &aux, sizeof(aux));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                            &aux_ld, sizeof(aux_ld));
    }
    if (st != CUBLAS_STATUS_SUCCESS && !lt_declined(st)) TRIDENT_CUBLAS_CHECK(st);
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, std::uint64_t(w_cols),
                                                    std::uint64_t(w_rows), w_cols));
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, std::uint64_t(in),
                                                    std::uint64_t(n), in));
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, d16 ? CUDA_R_16BF : CUDA_R_32F,
                                                    std::uint64_t(out), std::uint64_t(n), out));
    // the heuristic's first, or (TRIDENT_CUDA_LT_TUNE) its candidates for lt_choose
    std::array<cublasLtMatmulHeuristicResult_t, LtTuner::kCandidates> results{};
    const int found = st == CUBLAS_STATUS_SUCCESS
                          ? lt_heuristic(plan, alignment_of(w16), alignment_of(x16), al_cd,
                                         results.data())
                          : 0;
    it = lt_plans_.emplace(key, plan).first;
    if (plan.ok && lt_tune_)
      lt_choose(key, it->second, d16, results.data(), found, x16, w16, 1.0f, residual ? 1.0f : 0.0f,
                residual ? static_cast<const void*>(residual) : d, d,
                std::size_t(n) * std::size_t(out) * (d16 ? 2 : 4));
  }
  LtPlan& plan = it->second;
  if (!plan.ok) return false;
  if (vec)
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
  if (aux)
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  const float one = 1.0f, beta = residual ? 1.0f : 0.0f;
  const void* c = residual ? static_cast<const void*>(residual) : d;
  const cublasStatus_t st =
      cublasLtMatmul(lt_, plan.desc, &one, w16, plan.a, x16, plan.b, &beta, c, plan.d, d, plan.d,
                     &plan.algo, cublas_workspace_, kCublasWorkspaceBytes, stream_);
  if (lt_declined(st)) {  // refused before running: the fallback for this shape from now on
    plan.ok = false;
    return false;
  }
  TRIDENT_CUBLAS_CHECK(st);
  return true;
}

// TRIDENT_CUDA_LT_TUNE: gemm_rm16's product (column-major D = alpha op(P1) op(P2) + beta C, C = D,
// fp32) and, with d16, gemm_rm16_to16's (bf16 D, beta 0) through a cuBLASLt plan of lt_plans_
// with its algorithm tuned, as bias_lt's. The key: {m, n, k, ld1 | ld2 << 21 | ldc << 42, the
// three alignments (9 bits each) | trans1 << 27 | trans2 << 28 | d16 << 29 | 1 << 62} (bit 62:
// not a bias_lt key, whose last word is below 2^17; bit 29: an fp32-D plan never serves a bf16 D
// of the same shape, nor its file entry, whose algorithm is D's type's). False when cuBLASLt
// declines or a leading dimension is 2^21 or more (cublasGemmEx then, as without the knob).
bool CudaOps::gemm_lt16(const ColMajor& g, float alpha, const void* p1, const void* p2, float beta,
                        void* c, bool d16, int ldc) {
  constexpr int kLdLimit = 1 << 21;  // the key's 21 bits per leading dimension
  if (g.ld1 >= kLdLimit || g.ld2 >= kLdLimit || ldc >= kLdLimit) return false;
  const std::array<std::int64_t, 5> key{
      g.m, g.n, g.k, std::int64_t(g.ld1) | (std::int64_t(g.ld2) << 21) | (std::int64_t(ldc) << 42),
      alignment_of(p1) | (alignment_of(p2) << 9) | (alignment_of(c) << 18) |
          (std::int64_t(g.trans1) << 27) | (std::int64_t(g.trans2) << 28) |
          (std::int64_t(d16) << 29) | (std::int64_t(1) << 62)};
  auto it = lt_plans_.find(key);
  if (it == lt_plans_.end()) {
    LtPlan plan;
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op1 = op_of(g.trans1), op2 = op_of(g.trans2);
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &op1, sizeof(op1)));
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &op2, sizeof(op2)));
    // stored shapes: P1 is m x k (k x m when transposed), P2 k x n (n x k)
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
        &plan.a, CUDA_R_16BF, std::uint64_t(g.trans1 ? g.k : g.m),
        std::uint64_t(g.trans1 ? g.m : g.k), g.ld1));
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
        &plan.b, CUDA_R_16BF, std::uint64_t(g.trans2 ? g.n : g.k),
        std::uint64_t(g.trans2 ? g.k : g.n), g.ld2));
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, d16 ? CUDA_R_16BF : CUDA_R_32F,
                                                    std::uint64_t(g.m), std::uint64_t(g.n), ldc));
    std::array<cublasLtMatmulHeuristicResult_t, LtTuner::kCandidates> results{};
    const int found =
        lt_heuristic(plan, alignment_of(p1), alignment_of(p2), alignment_of(c), results.data());
    it = lt_plans_.emplace(key, plan).first;
    if (plan.ok)
      lt_choose(key, it->second, d16, results.data(), found, p2, p1, alpha, beta, c, c,
                std::size_t(ldc) * std::size_t(g.n) * (d16 ? 2 : sizeof(float)));
  }
  LtPlan& plan = it->second;
  if (!plan.ok) return false;
  const cublasStatus_t st =
      cublasLtMatmul(lt_, plan.desc, &alpha, p1, plan.a, p2, plan.b, &beta, c, plan.d, c, plan.d,
                     &plan.algo, cublas_workspace_, kCublasWorkspaceBytes, stream_);
  if (lt_declined(st)) {
    plan.ok = false;
    return false;
  }
  TRIDENT_CUBLAS_CHECK(st);
  return true;
}

// A new plan's algorithm: the heuristic asked with the workspace and the operands' alignments
// (C is D's), for its first or (TRIDENT_CUDA_LT_TUNE) up to LtTuner::kCandidates for lt_choose.
// plan.ok stays false where cuBLASLt declines; any other failure throws. Returns how many it found.
int CudaOps::lt_heuristic(LtPlan& plan, std::int64_t align_a, std::int64_t align_b,
                          std::int64_t align_cd, cublasLtMatmulHeuristicResult_t* results) {
  cublasLtMatmulPreference_t pref = nullptr;
  TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t workspace = kCublasWorkspaceBytes;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  const std::uint32_t al[4] = {std::uint32_t(align_a), std::uint32_t(align_b),
                               std::uint32_t(align_cd), std::uint32_t(align_cd)};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
    st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof(al[i]));
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, plan.a, plan.b, plan.d, plan.d, pref,
                                        lt_tune_ ? LtTuner::kCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS && !lt_declined(st)) TRIDENT_CUBLAS_CHECK(st);
  plan.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS;
  plan.algo = results[0].algo;
  return plan.ok ? found : 0;
}

// TRIDENT_CUDA_LT_TUNE: the plan's algorithm from the tuner's file, else the fastest candidate
// run on the call's operands (its bias, aux and bias-gradient pointers are the plan
// descriptor's, set above). Each candidate writes D (and aux or the bias gradient) whole, and
// the caller's matmul after this overwrites them all with the chosen algorithm's. With beta != 0
// D may be C (or the sum is the caller's to keep): the candidates write a scratch D instead, so
// no product is ever added twice; no room for it leaves the heuristic's first.
void CudaOps::lt_choose(const std::array<std::int64_t, 5>& key, LtPlan& plan, bool d16,
                        const cublasLtMatmulHeuristicResult_t* results, int found,
                        const void* x16, const void* w16, float alpha, float beta, const void* c,
                        void* d, std::size_t d_bytes) {
  const cudaDataType_t d_type = d16 ? CUDA_R_16BF : CUDA_R_32F;
  if (lt_tune_->stored(lt_, key, plan.desc, plan.a, plan.b, plan.d, CUDA_R_16BF, d_type,
                       kCublasWorkspaceBytes, plan.algo))
    return;
  std::vector<cublasLtMatmulAlgo_t> candidates;
  for (int i = 0; i < found; i++)
    if (results[i].state == CUBLAS_STATUS_SUCCESS &&
        results[i].workspaceSize <= kCublasWorkspaceBytes)
      candidates.push_back(results[i].algo);
  if (candidates.size() > 1) {
    void* target = d;
    if (beta != 0.0f) {
      try {
        target = memory_->allocate(d_bytes);
      } catch (const Error&) {
        lt_tune_->skipped();
        return;
      }
    }
    const int best = lt_tune_->fastest(stream_, int(candidates.size()), [&](int i) {
      return cublasLtMatmul(lt_, plan.desc, &alpha, w16, plan.a, x16, plan.b, &beta, c, plan.d,
                            target, plan.d, &candidates[std::size_t(i)], cublas_workspace_,
                            kCublasWorkspaceBytes, stream_);
    });
    if (target != d) memory_->release(target);  // fastest() synchronized the stream
    if (best >= 0) plan.algo = candidates[std::size_t(best)];
  }
  lt_tune_->record(key, plan.algo, int(candidates.size()));
}

void CudaOps::linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                              const float* w, int n, int in, int out) {
  OpScope timed(
      timer_.get(), [&] { return str("linear_backward n=", n, " in=", in, " out=", out); }, 0);
  if (precision_ == Precision::bf16 && !baseline_ && n > 0 && in > 0 && out > 0) {
    linear_backward_bf16(dx, dw, db, dy, x, w, n, in, out);
    return;
  }
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

// bf16 products with each operand converted once: dy (with db's column sums in the same
// read) for both products, then w for dx (unless the weight cache has it), then x for dw in
// w's place (the stream orders the dx product's reads of w16 before x16's writes), so the
// scratch is no larger than one product's two operands (model::predict_memory's count) plus
// the column partials.
void CudaOps::linear_backward_bf16(float* dx, float* dw, float* db, const float* dy,
                                   const float* x, const float* w, int n, int in, int out) {
  const void* w16 = dx ? cached_bf16(w, in, out, out) : nullptr;
  const std::size_t dy_bytes = std::size_t(n) * out * 2;
  const std::size_t other_bytes = std::max(dx && !w16 ? std::size_t(in) * out * 2 : 0,
                                           std::size_t(n) * in * 2);
  const std::size_t partial_floats = db ? std::size_t(colsum_partial_floats(n, out)) : 0;
  BumpBlock& s = scratch(aligned_bytes(dy_bytes) + aligned_bytes(other_bytes) +
                         aligned_bytes(std::max<std::size_t>(partial_floats, 1) * sizeof(float)));
  void* dy16 = s.alloc(dy_bytes);
  void* other16 = s.alloc(other_bytes);
  if (db) {
    float* partial = s.alloc_n<float>(partial_floats);
    launch_to_bf16_colsum(stream_, dy16, db, partial, dy, n, out);
  } else {
    launch_to_bf16(stream_, dy16, dy, n, out, out);
  }
  if (dx) {  // dx[N,in] = dy[N,out] @ w[in,out]^T
    if (!w16) {
      launch_to_bf16(stream_, other16, w, in, out, out);
      w16 = other16;
    }
    gemm_rm16(false, true, n, in, out, 1.0f, dy16, out, w16, out, 0.0f, dx, in);
  }
  // dw[in,out] += x[N,in]^T @ dy[N,out]
  launch_to_bf16(stream_, other16, x, n, in, in);
  gemm_rm16(true, false, in, out, n, 1.0f, other16, in, dy16, out, 1.0f, dw, out);
}

void CudaOps::attention_naive_forward(float* out, float* att, const float* qkv, int b, int t, int c,
                                int nh) {
  OpScope timed(timer_.get(), "attention_naive_forward");
  TRIDENT_CHECK(nh > 0 && c % nh == 0, "attention_forward: C = ", c,
                " is not a multiple of NH = ", nh);
  attention_forward_steps(
      [this](auto... args) { gemm_batched_rm(args...); },
      [this](float* a, std::int64_t rows, int tq) { launch_causal_softmax(stream_, a, rows, tq); },
      out, att, qkv, b, t, c, nh);
}

void CudaOps::attention_naive_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                 const float* att, int b, int t, int c, int nh) {
  OpScope timed(timer_.get(), "attention_naive_backward");
  TRIDENT_CHECK(nh > 0 && c % nh == 0, "attention_backward: C = ", c,
                " is not a multiple of NH = ", nh);
  attention_backward_steps(
      [this](auto... args) { gemm_batched_rm(args...); },
      [this](float* d, const float* a, std::int64_t rows, int tq, float scale) {
        launch_causal_softmax_backward(stream_, d, a, rows, tq, scale);
      },
      dqkv, datt, dout, qkv, att, b, t, c, nh);
}

namespace {
FlashShape flash_shape(const Ops::AttentionShape& s, const char* op) {
  TRIDENT_CHECK(s.hs > 0 && s.nh > 0 && s.nkv > 0 && s.nh % s.nkv == 0, op, ": bad shape (nh ",
                s.nh, ", nkv ", s.nkv, ", hs ", s.hs, "): nh must be a multiple of nkv");
  TRIDENT_CHECK(s.hs <= kFlashMaxHeadSize, op, ": head size ", s.hs,
                " is above the CUDA kernel's limit of ", kFlashMaxHeadSize);
  return FlashShape{s.b,         s.t,         s.nh,        s.nkv,       s.hs,
                    s.ld_q,      s.ld_k,      s.ld_v,      s.ld_o,      s.batch_q(),
                    s.batch_k(), s.batch_v(), s.batch_o(), s.lse_row(), s.causal,
                    s.accumulate};
}
}  // namespace

// The tensor-core kernels under bf16 products, for the head sizes they take (multiples of 16
// up to 128); the scalar fp32 kernels otherwise, under TRIDENT_CUDA_BASELINE=1, and with
// TRIDENT_CUDA_ATTENTION=scalar. TRIDENT_CUDA_ATTENTION=tc asks for the tensor cores under
// fp32 and tf32 too (benchmarks, tests).
bool CudaOps::tc_attention(const FlashShape& s) const {
  if (baseline_ || attention_kernel_ == "scalar" || !flash_tc_supported(s)) return false;
  return attention_kernel_ == "tc" || precision_ == Precision::bf16;
}

void CudaOps::attention_forward(float* out, float* lse, const float* q, const float* k,
                                const float* v, const AttentionShape& s) {
  if (attention_cudnn_forward(out, lse, q, k, v, s)) return;  // cudnn_attention.cpp
  OpScope timed(timer_.get(), "attention_forward");
  const FlashShape fs = flash_shape(s, "attention_forward");
  if (tc_attention(fs))
    launch_flash_attention_tc_forward(stream_, out, lse, q, k, v, fs);
  else
    launch_flash_attention_forward(stream_, out, lse, q, k, v, fs);
}

void CudaOps::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                 const float* out, const float* lse, const float* q,
                                 const float* k, const float* v, const AttentionShape& s) {
  if (attention_cudnn_backward(dq, dk, dv, dout, out, lse, q, k, v, s)) return;
  OpScope timed(timer_.get(), "attention_backward");
  const FlashShape fs = flash_shape(s, "attention_backward");
  if (tc_attention(fs))
    launch_flash_attention_tc_backward(stream_, dq, dk, dv, dout, out, lse, q, k, v, fs);
  else
    launch_flash_attention_backward(stream_, dq, dk, dv, dout, out, lse, q, k, v, fs);
}

void CudaOps::attention_merge(float* out, float* lse, const float* out_part,
                              const float* lse_part, const AttentionShape& s) {
  OpScope timed(timer_.get(), "attention_merge");
  launch_attention_merge(stream_, out, lse, out_part, lse_part, flash_shape(s, "attention_merge"));
}

}  // namespace trident::ops::cuda
