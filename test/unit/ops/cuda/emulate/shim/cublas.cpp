// emulate/shim/cublas.cpp — the cuBLAS calls of cublas_v2.h and the cuBLASLt calls of
// cublasLt.h on the CPU (see there for the arithmetic and what is checked). Column-major
// throughout, as cuBLAS.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "emu.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

cublasStatus_t not_device(const char* call, const char* what) {
  std::fprintf(stderr,
               "cuda emulation: %s: %s is not (all) device memory: a GPU would fault here\n",
               call, what);
  return CUBLAS_STATUS_EXECUTION_FAILED;
}

std::size_t type_size(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

// Bytes a column-major rows x cols matrix with leading dimension ld spans.
std::size_t extent(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::size_t elem) {
  if (rows <= 0 || cols <= 0) return 0;
  return std::size_t((cols - 1) * ld + rows) * elem;
}

// fp32 rounded to TF32 (10 explicit mantissa bits), round to nearest even; inf/NaN kept.
float to_tf32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;
  u += 0xfffu + ((u >> 13) & 1u);
  u &= 0xffffe000u;
  std::memcpy(&f, &u, 4);
  return f;
}

float to_bf16(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

// Element (r, c) of a column-major matrix of `type`, as the compute type sees it.
float load(const void* p, cudaDataType type, std::int64_t r, std::int64_t c, std::int64_t ld,
           cublasComputeType_t compute) {
  const std::int64_t i = c * ld + r;
  if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  const float f = static_cast<const float*>(p)[i];
  if (compute == CUBLAS_COMPUTE_32F_FAST_TF32) return to_tf32(f);
  if (compute == CUBLAS_COMPUTE_32F_FAST_16BF) return to_bf16(f);
  return f;
}

// C[r, col] of an fp32 or bf16 matrix (ctype), read and written as float (bf16: rounded to
// nearest even on the store).
float load_c(const void* c, cudaDataType ctype, std::int64_t i) {
  if (ctype == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(c)[i]);
  return static_cast<const float*>(c)[i];
}
void store_c(void* c, cudaDataType ctype, std::int64_t i, float v) {
  if (ctype == CUDA_R_16BF)
    static_cast<__nv_bfloat16*>(c)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(c)[i] = v;
}

// One product C = alpha op(A) op(B) + beta C (arguments already checked); C fp32 or bf16.
void gemm_one(bool ta, bool tb, int m, int n, int k, float alpha, const void* a,
              cudaDataType atype, int lda, const void* b, cudaDataType btype, int ldb,
              float beta, void* c, cudaDataType ctype, int ldc, cublasComputeType_t compute) {
  std::vector<double> arow(static_cast<std::size_t>(k));
  for (int i = 0; i < m; i++) {
    for (int l = 0; l < k; l++) arow[l] = ta ? load(a, atype, l, i, lda, compute) : load(a, atype, i, l, lda, compute);
    for (int j = 0; j < n; j++) {
      double acc = 0.0;
      for (int l = 0; l < k; l++)
        acc += arow[l] * double(tb ? load(b, btype, j, l, ldb, compute) : load(b, btype, l, j, ldb, compute));
      const std::int64_t at = std::int64_t(j) * ldc + i;
      const float prod = alpha * float(acc);
      store_c(c, ctype, at, beta == 0.0f ? prod : prod + beta * load_c(c, ctype, at));
    }
  }
}

// cuBLAS's checks of a GEMM's shape and types.
cublasStatus_t check_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int k, cudaDataType atype, int lda, cudaDataType btype, int ldb,
                          cudaDataType ctype, int ldc, cublasComputeType_t compute) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return CUBLAS_STATUS_INVALID_VALUE;  // OP_C is OP_T for reals; trident never asks for it
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
  if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (atype != btype) return CUBLAS_STATUS_NOT_SUPPORTED;
  // bf16 C: bf16 A and B with fp32 compute only
  if (ctype != CUDA_R_32F && !(ctype == CUDA_R_16BF && atype == CUDA_R_16BF &&
                               compute == CUBLAS_COMPUTE_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      if (atype != CUDA_R_32F && atype != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
      break;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
      if (atype != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;  // fp32 in, fp32 out only
      break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// During a capture of the handle's stream: true (the call recorded by the caller) unless
// TRIDENT_EMU_CAPTURE_FAIL=cublas refuses it (the capture is invalidated).
bool capture_refused() {
  const char* v = std::getenv("TRIDENT_EMU_CAPTURE_FAIL");
  if (!(v && std::strcmp(v, "cublas") == 0)) return false;
  emu::refuse_in_capture("a cuBLAS call (TRIDENT_EMU_CAPTURE_FAIL=cublas)");
  return true;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  h->workspace = nullptr;  // as cuBLAS: a new stream resets the workspace to the default pool
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* w, std::size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && !emu::is_device(w, bytes)) return not_device("cublasSetWorkspace", "workspace");
  if (reinterpret_cast<std::uintptr_t>(w) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  h->workspace = w;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "cuBLAS error (emulated)";
  }
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* a, cudaDataType atype, int lda, long long stride_a,
    const void* b, cudaDataType btype, int ldb, long long stride_b, const void* beta, void* c,
    cudaDataType ctype, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo) {
  if (h && h->stream && emu::capturing(h->stream)) {  // alpha, beta as they are now
    if (capture_refused()) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    emu::record("cublasGemmStridedBatchedEx", [=] {
      return cublasGemmStridedBatchedEx(h, transa, transb, m, n, k, &al, a, atype, lda, stride_a,
                                        b, btype, ldb, stride_b, &be, c, ctype, ldc, stride_c,
                                        batch, compute, algo) == CUBLAS_STATUS_SUCCESS;
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  const cublasStatus_t s =
      check_gemm(h, transa, transb, m, n, k, atype, lda, btype, ldb, ctype, ldc, compute);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const std::size_t ea = type_size(atype), eb = type_size(btype), ec = type_size(ctype);
  for (int i = 0; i < batch; i++) {
    const char* ai = static_cast<const char*>(a) + std::int64_t(i) * stride_a * std::int64_t(ea);
    const char* bi = static_cast<const char*>(b) + std::int64_t(i) * stride_b * std::int64_t(eb);
    char* ci = static_cast<char*>(c) + std::int64_t(i) * stride_c * std::int64_t(ec);
    const bool reads = k > 0 && al != 0.0f;  // cuBLAS reads no A, B then
    if (reads && !emu::is_device(ai, extent(ta ? k : m, ta ? m : k, lda, ea))) return not_device("gemm", "A");
    if (reads && !emu::is_device(bi, extent(tb ? n : k, tb ? k : n, ldb, eb))) return not_device("gemm", "B");
    if (!emu::is_device(ci, extent(m, n, ldc, ec))) return not_device("gemm", "C");
    gemm_one(ta, tb, m, n, reads ? k : 0, al, ai, atype, lda, bi, btype, ldb, be, ci, ctype, ldc,
             compute);
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void* alpha, const void* a,
                            cudaDataType atype, int lda, const void* b, cudaDataType btype,
                            int ldb, const void* beta, void* c, cudaDataType ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(h, transa, transb, m, n, k, alpha, a, atype, lda, 0, b, btype,
                                    ldb, 0, beta, c, ctype, ldc, 0, 1, compute, algo);
}

cublasStatus_t cublasSgeam(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
                           int m, int n, const float* alpha, const float* a, int lda,
                           const float* beta, const float* b, int ldb, float* c, int ldc) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (h->stream && emu::capturing(h->stream)) {
    if (capture_refused()) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *alpha, be = *beta;
    emu::record("cublasSgeam", [=] {
      return cublasSgeam(h, transa, transb, m, n, &al, a, lda, &be, b, ldb, c, ldc) ==
             CUBLAS_STATUS_SUCCESS;
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  const int ar = ta ? n : m, br = tb ? n : m;
  if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  // In place only as cuBLAS allows it: C = A with op N and ldc = lda (likewise B).
  if ((c == a && (ta || lda != ldc)) || (c == b && (tb || ldb != ldc)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *alpha, be = *beta;
  if (al != 0.0f && !emu::is_device(a, extent(ar, ta ? m : n, lda, 4))) return not_device("cublasSgeam", "A");
  if (be != 0.0f && !emu::is_device(b, extent(br, tb ? m : n, ldb, 4))) return not_device("cublasSgeam", "B");
  if (!emu::is_device(c, extent(m, n, ldc, 4))) return not_device("cublasSgeam", "C");
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      float r = 0.0f;  // alpha == 0 reads no A, beta == 0 no B
      if (al != 0.0f) r = al * (ta ? a[std::int64_t(i) * lda + j] : a[std::int64_t(j) * lda + i]);
      if (be != 0.0f) r += be * (tb ? b[std::int64_t(i) * ldb + j] : b[std::int64_t(j) * ldb + i]);
      c[std::int64_t(j) * ldc + i] = r;
    }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemv(cublasHandle_t h, cublasOperation_t trans, int m, int n,
                           const float* alpha, const float* a, int lda, const float* x, int incx,
                           const float* beta, float* y, int incy) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (h->stream && emu::capturing(h->stream)) {
    if (capture_refused()) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *alpha, be = *beta;
    emu::record("cublasSgemv", [=] {
      return cublasSgemv(h, trans, m, n, &al, a, lda, x, incx, &be, y, incy) ==
             CUBLAS_STATUS_SUCCESS;
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || lda < (m > 1 ? m : 1) || incx == 0 || incy == 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (incx < 0 || incy < 0) return CUBLAS_STATUS_NOT_SUPPORTED;  // not emulated
  const bool t = trans == CUBLAS_OP_T;
  const int xl = t ? m : n, yl = t ? n : m;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *alpha, be = *beta;
  if (!emu::is_device(a, extent(m, n, lda, 4))) return not_device("cublasSgemv", "A");
  if (!emu::is_device(x, extent(1, xl, incx, 4))) return not_device("cublasSgemv", "x");
  if (!emu::is_device(y, extent(1, yl, incy, 4))) return not_device("cublasSgemv", "y");
  for (int i = 0; i < yl; i++) {
    double acc = 0.0;
    for (int l = 0; l < xl; l++)
      acc += double(t ? a[std::int64_t(i) * lda + l] : a[std::int64_t(l) * lda + i]) *
             double(x[std::int64_t(l) * incx]);
    float& out = y[std::int64_t(i) * incy];
    const float prod = al * float(acc);
    out = be == 0.0f ? prod : prod + be * out;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt ------------------------------------------------------------------------------

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  std::int32_t bias_type = -1;  // -1: D's type
  const void* aux = nullptr;    // the GELU epilogues' pre-GELU matrix
  std::int64_t aux_ld = 0;
  std::int32_t aux_type = -1;   // -1: D's type
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {
  std::uint64_t workspace = 0;
};

namespace {
template <class T>
cublasStatus_t get_attr(T& out, const void* buf, std::size_t size) {
  if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&out, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

// The bias alignment (bytes, up to a 16-byte vector load) an algorithm is chosen for: the
// heuristic reads it from the bias pointer's value, NULL meaning any (cublasLt.h,
// CUBLASLT_MATMUL_DESC_BIAS_POINTER); a run with a less aligned bias faults on a GPU.
std::uint64_t lt_bias_alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint64_t al = 16;
  while (a && al > 1 && a % al != 0) al /= 2;
  return al;
}

bool lt_gelu(const cublasLtMatmulDescOpaque_t* desc) {
  return desc->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

// GELU in its tanh form and its derivative (cublasLt.h's model), in double.
double lt_gelu_value(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double lt_gelu_grad(double x) {
  const double k = 0.7978845608028654, c = 0.044715, t = std::tanh(k * (x + c * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
}

// The problem the descriptors describe: m, n, k from D and op(A); INVALID_VALUE when the
// layouts disagree, NOT_SUPPORTED outside what cublasLt.h says is modelled.
cublasStatus_t lt_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                          cublasLtMatrixLayout_t d, int& m, int& n, int& k) {
  if (!desc || !a || !b || !d) return CUBLAS_STATUS_INVALID_VALUE;
  if (desc->compute != CUBLAS_COMPUTE_32F || desc->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->type != b->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d->type != CUDA_R_32F && !(d->type == CUDA_R_16BF && a->type == CUDA_R_16BF))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (c && (c->type != d->type || c->rows != d->rows || c->cols != d->cols || c->ld != d->ld))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = desc->ta == CUBLAS_OP_T, tb = desc->tb == CUBLAS_OP_T;
  m = int(d->rows), n = int(d->cols);
  k = int(ta ? a->rows : a->cols);
  if (int(ta ? a->cols : a->rows) != m || int(tb ? b->cols : b->rows) != k ||
      int(tb ? b->rows : b->cols) != n)
    return CUBLAS_STATUS_INVALID_VALUE;
  for (auto* l : {a, b, d})
    if (l->ld < std::int64_t(l->rows > 1 ? l->rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  // TRIDENT_EMU_LT_BIAS32=0: a cuBLASLt that takes a bias in D's type only (cublasLt.h's text)
  const char* b32 = std::getenv("TRIDENT_EMU_LT_BIAS32");  // read at each call (tests flip it)
  if (b32 && b32[0] == '0' && !b32[1] && d->type == CUDA_R_16BF && desc->bias_type >= 0 &&
      desc->bias_type != std::int32_t(d->type) &&
      (desc->epilogue == CUBLASLT_EPILOGUE_BIAS || desc->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (lt_gelu(desc)) {  // aux: ld >= D's rows and a multiple of 8, D's type
    if (desc->aux_ld < std::int64_t(d->rows) || desc->aux_ld % 8 != 0)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (desc->aux_type >= 0 && desc->aux_type != std::int32_t(d->type))
      return CUBLAS_STATUS_INVALID_VALUE;
    // TRIDENT_EMU_LT_BGRAD32=0: a cuBLASLt that takes the bias gradient in D's type only
    const char* v = std::getenv("TRIDENT_EMU_LT_BGRAD32");  // read at each call (tests flip it)
    const bool bgrad32 = !(v && v[0] == '0' && !v[1]);
    if (!bgrad32 && desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD && desc->bias_type >= 0 &&
        desc->bias_type != std::int32_t(d->type))
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

namespace {
std::uint64_t g_lt_bias16_matmuls = 0;  // emu::lt_bias16_matmuls
int g_lt_last_algo = 0;                 // emu::lt_last_algo
std::uint64_t g_lt_algo_matmuls[3] = {};

// The emulated algorithms (cublasLt.h): ids 11..13; algo.data holds [0] the id, [1] and [2]
// the bias and aux alignments chosen for (0: any), [3] tile, [4] stages, [5] split-K, [6]
// reduction | swizzling << 32, [7] custom | inner shape << 32 | cluster shape << 48.
constexpr int kLtFirstAlgo = 11, kLtAlgos = 3;
bool lt_algo_exists(int id) { return id >= kLtFirstAlgo && id < kLtFirstAlgo + kLtAlgos; }

// Whether `id` is listed in the environment variable `name` (comma-separated ids).
bool lt_listed(const char* name, int id) {
  const char* v = std::getenv(name);
  if (!v) return false;
  std::string s(v);
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t end = std::min(s.find(',', at), s.size());
    if (std::atoi(s.substr(at, end - at).c_str()) == id && end > at) return true;
    at = end + 1;
  }
  return false;
}
bool lt_algo_offered(int id) {
  return lt_algo_exists(id) && !lt_listed("TRIDENT_EMU_LT_INVALID_ALGO", id);
}

cublasLtMatmulAlgo_t lt_algo(int id) {
  cublasLtMatmulAlgo_t a{};
  a.data[0] = std::uint64_t(id);
  a.data[3] = std::uint64_t(100 + id);
  a.data[4] = std::uint64_t(200 + id);
  a.data[5] = 1;
  return a;
}

// The matrix types an algorithm was made for (the heuristic's problem, AlgoInit's arguments),
// kept in the upper half of word 0 beside its id (CONFIG_ID reads the lower four bytes).
std::uint64_t lt_types(int a, int b, int c, int d) {
  return (std::uint64_t(a & 0xff) << 32) | (std::uint64_t(b & 0xff) << 40) |
         (std::uint64_t(c & 0xff) << 48) | (std::uint64_t(d & 0xff) << 56);
}
std::uint64_t lt_types(cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d) {
  return lt_types(a->type, b->type, (c ? c : d)->type, d->type);
}

// NOT_SUPPORTED for an algorithm this "cuBLASLt" lacks, INVALID_VALUE for a configuration
// its id does not have (a mis-restored algorithm) or one made for other matrix types (cuBLASLt:
// "descriptors do not match algo").
cublasStatus_t lt_algo_valid(const cublasLtMatmulAlgo_t& a, std::uint64_t types) {
  const int id = int(a.data[0] & 0xffffffffu);
  if (!lt_algo_exists(id) || (a.data[0] & ~0xffffffffull) != types)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!lt_algo_offered(id)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const cublasLtMatmulAlgo_t want = lt_algo(id);
  for (int i : {3, 4, 5, 6, 7})
    if (a.data[i] != want.data[i]) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

std::uint64_t emu::lt_bias16_matmuls() { return g_lt_bias16_matmuls; }
int emu::lt_last_algo() { return g_lt_last_algo; }
std::uint64_t emu::lt_matmuls_with(int id) {
  return lt_algo_exists(id) ? g_lt_algo_matmuls[id - kLtFirstAlgo] : 0;
}

std::size_t cublasLtGetVersion() { return 1; }

cublasStatus_t cublasLtMatmulAlgoInit(cublasLtHandle_t h, cublasComputeType_t, cudaDataType_t,
                                      cudaDataType_t a_type, cudaDataType_t b_type,
                                      cudaDataType_t c_type, cudaDataType_t d_type, int algo_id,
                                      cublasLtMatmulAlgo_t* algo) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!algo || !lt_algo_exists(algo_id)) return CUBLAS_STATUS_INVALID_VALUE;
  *algo = cublasLtMatmulAlgo_t{};
  algo->data[0] = std::uint64_t(algo_id) | lt_types(a_type, b_type, c_type, d_type);
  algo->data[5] = 1;  // split-K's default; tile and stages "undefined" (0)
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// Where each config attribute lives in algo.data: word, shift, size in bytes.
struct LtConfigField {
  int word, shift;
  std::size_t size;
};
bool lt_config_field(cublasLtMatmulAlgoConfigAttributes_t attr, LtConfigField& f) {
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: f = {0, 0, 4}; return true;
    case CUBLASLT_ALGO_CONFIG_TILE_ID: f = {3, 0, 4}; return true;
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: f = {4, 0, 4}; return true;
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: f = {5, 0, 4}; return true;
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME: f = {6, 0, 4}; return true;
    case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING: f = {6, 32, 4}; return true;
    case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION: f = {7, 0, 4}; return true;
    case CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID: f = {7, 32, 2}; return true;
    case CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID: f = {7, 48, 2}; return true;
  }
  return false;
}
}  // namespace

cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void* buf, std::size_t size) {
  LtConfigField f{};
  if (!algo || !buf || !lt_config_field(attr, f) || size != f.size ||
      attr == CUBLASLT_ALGO_CONFIG_ID)
    return CUBLAS_STATUS_INVALID_VALUE;
  std::uint64_t v = 0;
  std::memcpy(&v, buf, size);  // little-endian x86-64
  const std::uint64_t mask = (size == 8 ? ~0ull : ((1ull << (8 * size)) - 1)) << f.shift;
  algo->data[f.word] = (algo->data[f.word] & ~mask) | ((v << f.shift) & mask);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void* buf, std::size_t size,
                                                    std::size_t* written) {
  LtConfigField f{};
  if (!algo || !lt_config_field(attr, f)) return CUBLAS_STATUS_INVALID_VALUE;
  if (size == 0) {
    if (!written) return CUBLAS_STATUS_INVALID_VALUE;
    *written = f.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf || size != f.size) return CUBLAS_STATUS_INVALID_VALUE;
  const std::uint64_t v = (algo->data[f.word] >> f.shift) & ((1ull << (8 * size)) - 1);
  std::memcpy(buf, &v, size);
  if (written) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescOpaque_t{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, std::size_t size) {
  if (!desc) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return get_attr(desc->ta, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return get_attr(desc->tb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return get_attr(desc->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return get_attr(desc->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return get_attr(desc->bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return get_attr(desc->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return get_attr(desc->aux_ld, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return get_attr(desc->aux_type, buf, size);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols,
                                          std::int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t size) {
  if (!pref) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::uint32_t a = 0;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return get_attr(pref->workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return get_attr(a, buf, size);  // recorded by cuBLASLt to pick kernels; nothing here
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!pref || requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
  int m, n, k;
  const cublasStatus_t s = lt_problem(desc, a, b, c, d, m, n, k);
  *returned = 0;
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  for (int id = kLtFirstAlgo; id < kLtFirstAlgo + kLtAlgos && *returned < requested; id++) {
    if (!lt_algo_offered(id)) continue;
    cublasLtMatmulHeuristicResult_t& r = results[*returned];
    r = cublasLtMatmulHeuristicResult_t{};
    r.algo = lt_algo(id);
    r.algo.data[0] |= lt_types(a, b, c, d);
    r.algo.data[1] = lt_bias_alignment(desc->bias);
    r.algo.data[2] = lt_bias_alignment(desc->aux);  // the same rule for aux
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    ++*returned;
  }
  return *returned ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!algo || !result) return CUBLAS_STATUS_INVALID_VALUE;
  int m, n, k;
  cublasStatus_t s = lt_problem(desc, a, b, c, d, m, n, k);
  if (s == CUBLAS_STATUS_SUCCESS) s = lt_algo_valid(*algo, lt_types(a, b, c, d));
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  result->workspaceSize = 0;  // result->algo is left alone, as cuBLASLt's
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.0f;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t adesc, const void* b,
                              cublasLtMatrixLayout_t bdesc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t cdesc, void* d,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream && emu::capturing(stream)) {  // the descriptors and scalars as they are now
    if (capture_refused()) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!desc || !adesc || !bdesc || !ddesc || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    cublasLtMatmulDescOpaque_t dc = *desc;
    cublasLtMatrixLayoutOpaque_t ac = *adesc, bc = *bdesc, ddc = *ddesc;
    const bool has_c = cdesc != nullptr, has_algo = algo != nullptr;
    cublasLtMatrixLayoutOpaque_t cc = has_c ? *cdesc : ddc;
    cublasLtMatmulAlgo_t alg = has_algo ? *algo : cublasLtMatmulAlgo_t{};
    emu::record("cublasLtMatmul", [=]() mutable {
      return cublasLtMatmul(h, &dc, &al, a, &ac, b, &bc, &be, c, has_c ? &cc : nullptr, d, &ddc,
                            has_algo ? &alg : nullptr, workspace, workspace_bytes, stream) ==
             CUBLAS_STATUS_SUCCESS;
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  int m, n, k;
  const cublasStatus_t s = lt_problem(desc, adesc, bdesc, cdesc, ddesc, m, n, k);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo) {
    const cublasStatus_t valid = lt_algo_valid(*algo, lt_types(adesc, bdesc, cdesc, ddesc));
    if (valid != CUBLAS_STATUS_SUCCESS) return valid;
  }
  if (workspace_bytes && !emu::is_device(workspace, workspace_bytes)) return not_device("cublasLtMatmul", "workspace");
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (be != 0.0f && !cdesc) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const bool ta = desc->ta == CUBLAS_OP_T, tb = desc->tb == CUBLAS_OP_T;
  const std::size_t e = type_size(adesc->type);
  const bool reads = k > 0 && al != 0.0f;
  if (reads && !emu::is_device(a, extent(adesc->rows, adesc->cols, adesc->ld, e))) return not_device("cublasLtMatmul", "A");
  if (reads && !emu::is_device(b, extent(bdesc->rows, bdesc->cols, bdesc->ld, e))) return not_device("cublasLtMatmul", "B");
  const std::size_t ed = type_size(ddesc->type);
  if (!emu::is_device(d, extent(m, n, ddesc->ld, ed))) return not_device("cublasLtMatmul", "D");
  if (be != 0.0f && !emu::is_device(c, extent(m, n, cdesc->ld, ed))) return not_device("cublasLtMatmul", "C");
  const bool gelu_fwd = desc->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu_bwd = desc->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  const bool bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS || gelu_fwd;  // added to D
  const bool vec = bias || gelu_bwd;  // the bias pointer is read or (bgrad) written
  if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && !vec) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (gelu_fwd && !desc->aux) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (gelu_bwd && !desc->aux) return CUBLAS_STATUS_INVALID_VALUE;
  if (vec && !desc->bias) return CUBLAS_STATUS_INVALID_VALUE;
  const cudaDataType bias_type =
      desc->bias_type < 0 ? ddesc->type : static_cast<cudaDataType>(desc->bias_type);
  if (vec && bias_type != CUDA_R_32F && bias_type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (vec && !emu::is_device(desc->bias, std::size_t(m) * type_size(bias_type)))
    return not_device("cublasLtMatmul", "bias");
  if (bias && bias_type == CUDA_R_16BF) ++g_lt_bias16_matmuls;
  if (vec && algo && lt_bias_alignment(desc->bias) < algo->data[1]) {
    std::fprintf(stderr, "cuda emulation: cublasLtMatmul: the bias is %llu-byte aligned, the "
                 "algorithm was chosen for %llu (the bias pointer at the heuristic): a GPU "
                 "would fault here\n", (unsigned long long)lt_bias_alignment(desc->bias),
                 (unsigned long long)algo->data[1]);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const cudaDataType aux_type = ddesc->type;  // lt_problem refused any other
  if (lt_gelu(desc)) {
    if (!emu::is_device(desc->aux, extent(m, n, desc->aux_ld, type_size(aux_type))))
      return not_device("cublasLtMatmul", "aux");
    if (algo && lt_bias_alignment(desc->aux) < algo->data[2]) {
      std::fprintf(stderr, "cuda emulation: cublasLtMatmul: aux is %llu-byte aligned, the "
                   "algorithm was chosen for %llu (the aux pointer at the heuristic): a GPU "
                   "would fault here\n", (unsigned long long)lt_bias_alignment(desc->aux),
                   (unsigned long long)algo->data[2]);
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  }
  const int id = algo ? int(algo->data[0] & 0xffffffffu) : kLtFirstAlgo;  // none given: the heuristic's first
  if (lt_listed("TRIDENT_EMU_LT_SLOW_ALGO", id))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  g_lt_last_algo = id;
  ++g_lt_algo_matmuls[id - kLtFirstAlgo];
  // In float (D = alpha AB + beta C, then the bias), rounded once when D is bf16; C may differ
  // from D (same layout).
  std::vector<float> out(std::size_t(m) * std::size_t(n));
  if (be != 0.0f)
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++)
        out[std::size_t(j) * m + i] = load_c(c, cdesc->type, std::int64_t(j) * cdesc->ld + i);
  gemm_one(ta, tb, m, n, reads ? k : 0, al, a, adesc->type, int(adesc->ld), b, bdesc->type,
           int(bdesc->ld), be, out.data(), CUDA_R_32F, m, CUBLAS_COMPUTE_32F);
  // DGELU_BGRAD reads aux before anything is written (aux may not alias D on a card either).
  std::vector<double> row_sum(gelu_bwd ? std::size_t(m) : 0, 0.0);
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      float v = out[std::size_t(j) * m + i] + (bias ? load_c(desc->bias, bias_type, i) : 0.0f);
      const std::int64_t at_aux = std::int64_t(j) * desc->aux_ld + i;
      if (gelu_fwd) {
        store_c(const_cast<void*>(desc->aux), aux_type, at_aux, v);
        v = float(lt_gelu_value(double(v)));
      } else if (gelu_bwd) {
        v = float(double(v) * lt_gelu_grad(double(load_c(desc->aux, aux_type, at_aux))));
        row_sum[std::size_t(i)] += double(v);
      }
      out[std::size_t(j) * m + i] = v;
    }
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++)
      store_c(d, ddesc->type, std::int64_t(j) * ddesc->ld + i, out[std::size_t(j) * m + i]);
  if (gelu_bwd)
    for (int i = 0; i < m; i++)
      store_c(const_cast<void*>(desc->bias), bias_type, i, float(row_sum[std::size_t(i)]));
  return CUBLAS_STATUS_SUCCESS;
}
