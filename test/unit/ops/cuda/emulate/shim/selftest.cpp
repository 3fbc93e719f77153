// emulate/shim/selftest.cpp — the shim checked against itself before train.sh trusts it:
// cuBLAS's column-major GEMM (every transpose pair, padded leading dimensions, strided
// batches, bf16 inputs, the TF32/bf16 rounding of the fast compute types) against a plain
// double loop, cuBLAS's argument checks, and that the checks of device pointers, poisoned
// fresh memory and launch limits fire; cuBLASLt's bias epilogue against the GEMM plus the bias,
// its layout checks and its device-pointer check of the bias; the GELU epilogues (GELU_AUX_BIAS,
// DGELU_BGRAD: tanh GELU, aux written and read, the bias gradient overwritten) and their refusals; WMMA (mma.h): D = A B + C with
// A row-major, B column-major, C read column-major and D stored row-major from padded tiles,
// against a double loop on the bf16-rounded values, __all_sync, and the alignment check of
// 16-byte accesses (__ldca, __stwb: cuda_runtime.h); stream capture and graph launches
// (replay equals eager, a synchronization inside a capture is refused). Built with
// TRIDENT_EMU_DEVICE_POINTERS.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_runtime.h"
#include "mma.h"

namespace {
int bad = 0;
void check(bool ok, const char* what) {
  std::printf("%s  %s\n", ok ? "ok  " : "BAD ", what);
  bad += !ok;
}
float* dev(std::size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) std::abort();
  return static_cast<float*>(p);
}
__global__ void add_one_kernel(float* x, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += 1.0f;
}
__global__ void block_sum_kernel(float* out, const float* x) {
  __shared__ float part[32];
  float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; w++) s += part[w];
    out[blockIdx.x] = s;
  }
}
}  // namespace

int main() {
  cublasHandle_t h;
  cublasCreate(&h);
  const int m = 5, n = 4, k = 7, pad = 3, batch = 2;
  for (int tc = 0; tc < 4; tc++) {
    const bool ta = tc & 1, tb = tc & 2;
    const int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
    const long long sa = lda * (ta ? m : k), sb = ldb * (tb ? k : n), sc = ldc * n;
    std::vector<float> a(sa * batch), b(sb * batch), c(sc * batch);
    for (std::size_t i = 0; i < a.size(); i++) a[i] = std::sin(float(i));
    for (std::size_t i = 0; i < b.size(); i++) b[i] = std::cos(float(i));
    for (std::size_t i = 0; i < c.size(); i++) c[i] = float(i % 5);
    float *da = dev(a.size()), *db = dev(b.size()), *dc = dev(c.size());
    cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c.data(), c.size() * 4, cudaMemcpyHostToDevice);
    const float alpha = 0.5f, beta = 2.0f;
    const cublasStatus_t s = cublasGemmStridedBatchedEx(
        h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, da,
        CUDA_R_32F, lda, sa, db, CUDA_R_32F, ldb, sb, &beta, dc, CUDA_R_32F, ldc, sc, batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    std::vector<float> got(c.size());
    cudaMemcpy(got.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost);
    double err = 0;
    for (int q = 0; q < batch; q++)
      for (int i = 0; i < ldc; i++)
        for (int j = 0; j < n; j++) {
          double want = c[q * sc + j * ldc + i];
          if (i < m) {
            double acc = 0;
            for (int l = 0; l < k; l++)
              acc += double(ta ? a[q * sa + i * lda + l] : a[q * sa + l * lda + i]) *
                     double(tb ? b[q * sb + l * ldb + j] : b[q * sb + j * ldb + l]);
            want = alpha * acc + beta * want;
          }
          err = std::fmax(err, std::fabs(got[q * sc + j * ldc + i] - want));
        }
    char what[96];
    std::snprintf(what, sizeof what, "strided batched gemm ta%d tb%d: err %.1e", int(ta), int(tb), err);
    check(s == CUBLAS_STATUS_SUCCESS && err < 1e-5, what);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
  }
  // bf16 inputs, TF32 and bf16 rounding of fp32 inputs: 1 x (1 + 2^-12) is 1 + 2^-12 in fp32.
  float *x = dev(4), *y = dev(4), *z = dev(4);
  const float one = 1.0f, zero = 0.0f, v = 1.0f + std::ldexp(1.0f, -12), w = 1.0f + std::ldexp(1.0f, -9);
  cudaMemcpy(x, &one, 4, cudaMemcpyHostToDevice);
  cudaMemcpy(y, &v, 4, cudaMemcpyHostToDevice);
  float r = 0;
  auto gemm1 = [&](const void* p, const void* q, cudaDataType t, cublasComputeType_t ct) {
    const cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, p, t, 1, q,
                                          t, 1, &zero, z, CUDA_R_32F, 1, ct, CUBLAS_GEMM_DEFAULT);
    cudaMemcpy(&r, z, 4, cudaMemcpyDeviceToHost);
    return s;
  };
  check(gemm1(x, y, CUDA_R_32F, CUBLAS_COMPUTE_32F) == 0 && r == v, "32F keeps 1 + 2^-12");
  check(gemm1(x, y, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32) == 0 && r == 1.0f,
        "FAST_TF32 rounds 1 + 2^-12 to 1");
  cudaMemcpy(y, &w, 4, cudaMemcpyHostToDevice);
  check(gemm1(x, y, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32) == 0 && r == w, "FAST_TF32 keeps 1 + 2^-9");
  check(gemm1(x, y, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF) == 0 && r == 1.0f,
        "FAST_16BF rounds 1 + 2^-9 to 1");
  const __nv_bfloat16 hb[2] = {__float2bfloat16_rn(3.0f), __float2bfloat16_rn(w)};
  cudaMemcpy(x, hb, 4, cudaMemcpyHostToDevice);
  check(gemm1(x, reinterpret_cast<char*>(x) + 2, CUDA_R_16BF, CUBLAS_COMPUTE_32F) == 0 && r == 3.0f,
        "bf16 inputs: 3 x bf16(1 + 2^-9) = 3");
  check(gemm1(x, x, CUDA_R_16BF, CUBLAS_COMPUTE_32F_FAST_TF32) == CUBLAS_STATUS_NOT_SUPPORTED,
        "bf16 inputs with FAST_TF32: NOT_SUPPORTED");
  check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, &one, x, CUDA_R_32F, 1, y, CUDA_R_32F, 1,
                     &zero, z, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
            CUBLAS_STATUS_INVALID_VALUE, "lda < m: INVALID_VALUE");
  float host[4] = {};
  check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, x, CUDA_R_32F, 1, y, CUDA_R_32F, 1,
                     &zero, host, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
            CUBLAS_STATUS_EXECUTION_FAILED, "host C: EXECUTION_FAILED");
  check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, x, CUDA_R_32F, 1, y, CUDA_R_32F, 4,
                     &zero, z, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
            CUBLAS_STATUS_SUCCESS, "4 floats of a 4-float block: in bounds");
  check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 5, &one, x, CUDA_R_32F, 1, y, CUDA_R_32F, 5,
                     &zero, z, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
            CUBLAS_STATUS_EXECUTION_FAILED, "5 floats of a 4-float block: EXECUTION_FAILED");
  // the runtime
  float* fresh = dev(3);
  cudaMemcpy(host, fresh, 12, cudaMemcpyDeviceToHost);
  check(std::isnan(host[0]) && std::isnan(host[2]), "fresh device memory reads as NaN");
  check(cudaMemcpy(host, fresh, 12, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
        "H2D copy into host memory: invalid argument");
  check(cudaMemcpy(fresh, host, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
        "H2D copy past the end of a block: invalid argument");
  cudaGetLastError();
  // launches
  std::vector<float> ones(256, 1.0f);
  float *d = dev(256), *sums = dev(4);
  cudaMemcpy(d, ones.data(), 1024, cudaMemcpyHostToDevice);
  emu_launch(add_one_kernel, "add_one_kernel", dim3(3), dim3(100), d, 256);
  emu_launch(block_sum_kernel, "block_sum_kernel", dim3(2), dim3(128), sums, d);
  float hs[2];
  cudaMemcpy(hs, sums, 8, cudaMemcpyDeviceToHost);
  check(cudaGetLastError() == cudaSuccess && hs[0] == 256.0f && hs[1] == 256.0f,
        "kernels: plain threads, then shuffles and __syncthreads (block sums 256)");
  for (float& e : host) e = 0.0f;
  emu_launch(add_one_kernel, "add_one_kernel", dim3(1), dim3(4), host, 4);
  check(cudaGetLastError() == cudaErrorInvalidConfiguration && host[0] == 0.0f,
        "a host pointer to a kernel: launch error, kernel not run");
  emu_launch(add_one_kernel, "add_one_kernel", dim3(1), dim3(2048), d, 256);
  check(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads a block: launch error");
  {  // cuBLASLt: D[m,n] = A[m,k] B[k,n] + bias[m] per column (both N), fp32
    const int lm = 6, ln = 3, lk = 5;
    std::vector<float> a(lm * lk), b(lk * ln), bias(lm), want(lm * ln);
    for (std::size_t i = 0; i < a.size(); i++) a[i] = std::sin(float(i) + 1.0f);
    for (std::size_t i = 0; i < b.size(); i++) b[i] = std::cos(float(i) + 2.0f);
    for (int i = 0; i < lm; i++) bias[i] = float(i) - 2.5f;
    for (int j = 0; j < ln; j++)
      for (int i = 0; i < lm; i++) {
        double acc = 0;
        for (int l = 0; l < lk; l++) acc += double(a[l * lm + i]) * b[j * lk + l];
        want[j * lm + i] = float(acc) + bias[i];
      }
    float *da = dev(a.size()), *dbm = dev(b.size()), *dbias = dev(bias.size()), *dd = dev(want.size());
    cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dbm, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dbias, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice);
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld, lbad;
    cublasLtMatmulPreference_t pref;
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof(dbias));
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, lm, lk, lm);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, lk, ln, lk);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, lm, ln, lm);
    cublasLtMatrixLayoutCreate(&lbad, CUDA_R_32F, lk + 1, ln, lk + 1);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &found) ==
              CUBLAS_STATUS_SUCCESS && found == 1, "cuBLASLt heuristic: one algorithm");
    const float one = 1.0f, zero = 0.0f;
    check(cublasLtMatmul(lt, desc, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &res.algo, nullptr,
                         0, nullptr) == CUBLAS_STATUS_SUCCESS, "cuBLASLt matmul with the bias epilogue");
    std::vector<float> got(want.size());
    cudaMemcpy(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost);
    double err = 0;
    for (std::size_t i = 0; i < got.size(); i++) err = std::fmax(err, std::fabs(got[i] - want[i]));
    check(err <= 1e-6, "  D = A B + bias per row");
    check(cublasLtMatmul(lt, desc, &one, da, la, dbm, lbad, &zero, dd, ld, dd, ld, &res.algo, nullptr,
                         0, nullptr) == CUBLAS_STATUS_INVALID_VALUE, "  B's layout disagreeing with A's: INVALID_VALUE");
    {  // TRIDENT_CUDA_LT_TUNE's candidates: three, their config attributes, a rebuilt algorithm
      cublasLtMatmulHeuristicResult_t all[8]{};
      check(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, all, &found) ==
                CUBLAS_STATUS_SUCCESS && found == 3, "cuBLASLt heuristic: three candidates asked 8");
      std::int32_t ids[3] = {};
      std::uint32_t tile = 0;
      std::size_t written = 0;
      for (int i = 0; i < 3; i++)
        cublasLtMatmulAlgoConfigGetAttribute(&all[i].algo, CUBLASLT_ALGO_CONFIG_ID, &ids[i],
                                             sizeof(ids[i]), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&all[2].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                           sizeof(tile), &written);
      check(ids[0] == 11 && ids[1] == 12 && ids[2] == 13 && tile == 113 && written == 4,
            "  ids 11, 12, 13 (the first is requested = 1's), tile 100 + id");
      cublasLtMatmulAlgo_t rebuilt{};
      cublasLtMatmulHeuristicResult_t checked{};
      cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                             CUDA_R_32F, 13, &rebuilt);
      check(cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &rebuilt, &checked) ==
                CUBLAS_STATUS_INVALID_VALUE, "  AlgoInit alone (tile, stages unset): AlgoCheck refuses");
      const std::uint32_t stages = 213;
      auto set_tile_and_stages = [&](cublasLtMatmulAlgo_t& algo) {  // algorithm 13's
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                             sizeof(stages));
      };
      set_tile_and_stages(rebuilt);
      check(cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &rebuilt, &checked) ==
                    CUBLAS_STATUS_SUCCESS &&
                cublasLtMatmul(lt, desc, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &rebuilt,
                               nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS &&
                emu::lt_last_algo() == 13,
            "  with its tile and stages set: AlgoCheck accepts, the matmul runs it");
      cublasLtMatmulAlgo_t bf16_d{};  // the same configuration, made for bf16 C and D
      cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                             CUDA_R_16BF, CUDA_R_16BF, 13, &bf16_d);
      set_tile_and_stages(bf16_d);
      check(cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &bf16_d, &checked) ==
                    CUBLAS_STATUS_INVALID_VALUE &&
                cublasLtMatmul(lt, desc, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &bf16_d,
                               nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE,
            "  made for another D type (AlgoInit's): AlgoCheck and the matmul refuse it");
      setenv("TRIDENT_EMU_LT_INVALID_ALGO", "13", 1);
      check(cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &rebuilt, &checked) ==
                    CUBLAS_STATUS_NOT_SUPPORTED &&
                cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, all, &found) ==
                    CUBLAS_STATUS_SUCCESS && found == 2,
            "  TRIDENT_EMU_LT_INVALID_ALGO=13: refused, and the heuristic offers two");
      unsetenv("TRIDENT_EMU_LT_INVALID_ALGO");
    }
    {  // the heuristic takes the bias's alignment from the pointer set at the time
      cublasLtMatmulDesc_t bdesc;
      cublasLtMatmulDescCreate(&bdesc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      cublasLtMatmulDescSetAttribute(bdesc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
      cublasLtMatmulHeuristicResult_t any{};
      cublasLtMatmulAlgoGetHeuristic(lt, bdesc, la, lb, ld, ld, pref, 1, &any, &found);
      const float* odd_bias = dev(bias.size() + 1) + 1;  // 4-byte aligned
      cudaMemcpy(const_cast<float*>(odd_bias), bias.data(), bias.size() * 4, cudaMemcpyHostToDevice);
      cublasLtMatmulDescSetAttribute(bdesc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &odd_bias, sizeof(odd_bias));
      check(cublasLtMatmul(lt, bdesc, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &any.algo, nullptr,
                           0, nullptr) == CUBLAS_STATUS_EXECUTION_FAILED,
            "  a 4-byte aligned bias, the heuristic asked without it: EXECUTION_FAILED");
      cublasLtMatmulHeuristicResult_t odd{};
      cublasLtMatmulAlgoGetHeuristic(lt, bdesc, la, lb, ld, ld, pref, 1, &odd, &found);
      check(cublasLtMatmul(lt, bdesc, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &odd.algo, nullptr,
                           0, nullptr) == CUBLAS_STATUS_SUCCESS,
            "  the same bias set before the heuristic: runs");
      cublasLtMatmulDescDestroy(bdesc);
    }
    {  // the GELU epilogues (fp32 D, aux of D's type): GELU_AUX_BIAS then DGELU_BGRAD on its aux
      const std::int64_t aux_ld = 8;  // >= lm = 6, a multiple of 8
      float* daux = dev(std::size_t(aux_ld) * ln);
      float* dbg = dev(lm);
      auto gelu_desc = [&](cublasLtEpilogue_t e, const void* aux, std::int64_t ldx,
                           const void* vec) {
        cublasLtMatmulDesc_t g;
        cublasLtMatmulDescCreate(&g, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatmulDescSetAttribute(g, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
        if (vec) cublasLtMatmulDescSetAttribute(g, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec));
        if (aux) cublasLtMatmulDescSetAttribute(g, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
        cublasLtMatmulDescSetAttribute(g, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldx, sizeof(ldx));
        return g;
      };
      auto lt_gelu = [](double x) {
        return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
      };
      auto lt_dgelu = [](double x) {
        const double k = 0.7978845608028654, c = 0.044715, t = std::tanh(k * (x + c * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
      };
      check(std::fabs(lt_gelu(-1.0) - -0.158808) < 1e-5 && std::fabs(lt_gelu(1.0) - 0.841192) < 1e-5,
            "  GELU is the tanh form: gelu(-1) = -0.15881 (erf form: -0.15866)");
      cublasLtMatmulDesc_t g = gelu_desc(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, daux, aux_ld, dbias);
      cublasLtMatmulHeuristicResult_t gr{};
      check(cublasLtMatmulAlgoGetHeuristic(lt, g, la, lb, ld, ld, pref, 1, &gr, &found) ==
                CUBLAS_STATUS_SUCCESS && found == 1 &&
                cublasLtMatmul(lt, g, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &gr.algo,
                               nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS,
            "cuBLASLt GELU_AUX_BIAS runs");
      std::vector<float> aux(std::size_t(aux_ld) * ln), gd(want.size());
      cudaMemcpy(aux.data(), daux, aux.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(gd.data(), dd, gd.size() * 4, cudaMemcpyDeviceToHost);
      double aerr = 0, derr = 0;
      for (int j = 0; j < ln; j++)
        for (int i = 0; i < lm; i++) {
          aerr = std::fmax(aerr, std::fabs(aux[std::size_t(j * aux_ld + i)] - want[std::size_t(j * lm + i)]));
          derr = std::fmax(derr, std::fabs(gd[std::size_t(j * lm + i)] - lt_gelu(want[std::size_t(j * lm + i)])));
        }
      check(aerr <= 1e-6 && derr <= 1e-5, "  aux = A B + bias (ld 8), D = gelu(aux)");
      cublasLtMatmulDescDestroy(g);
      // DGELU_BGRAD on that aux: D = A B gelu'(aux), the bias pointer written with D's row sums
      std::vector<float> minus(lm, -99.0f);
      cudaMemcpy(dbg, minus.data(), minus.size() * 4, cudaMemcpyHostToDevice);
      g = gelu_desc(CUBLASLT_EPILOGUE_DGELU_BGRAD, daux, aux_ld, dbg);
      check(cublasLtMatmulAlgoGetHeuristic(lt, g, la, lb, ld, ld, pref, 1, &gr, &found) ==
                CUBLAS_STATUS_SUCCESS && found == 1 &&
                cublasLtMatmul(lt, g, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &gr.algo,
                               nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS,
            "cuBLASLt DGELU_BGRAD runs");
      std::vector<float> bg(lm);
      cudaMemcpy(gd.data(), dd, gd.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(bg.data(), dbg, bg.size() * 4, cudaMemcpyDeviceToHost);
      derr = 0;
      double berr = 0;
      for (int i = 0; i < lm; i++) {
        double sum = 0;
        for (int j = 0; j < ln; j++) {
          const double v = (double(want[std::size_t(j * lm + i)]) - bias[std::size_t(i)]) *
                           lt_dgelu(aux[std::size_t(j * aux_ld + i)]);
          sum += v;
          derr = std::fmax(derr, std::fabs(gd[std::size_t(j * lm + i)] - v));
        }
        berr = std::fmax(berr, std::fabs(bg[std::size_t(i)] - sum));
      }
      check(derr <= 1e-5 && berr <= 1e-5,
            "  D = A B gelu'(aux), the bias gradient D's row sums, overwritten (not added)");
      cublasLtMatmulDescDestroy(g);
      // what is refused: aux ld not a multiple of 8 or below the rows, another aux type, no aux
      g = gelu_desc(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, daux, 7, dbias);
      check(cublasLtMatmulAlgoGetHeuristic(lt, g, la, lb, ld, ld, pref, 1, &gr, &found) ==
                CUBLAS_STATUS_INVALID_VALUE, "  aux ld 7 (below the rows, not a multiple of 8): INVALID_VALUE");
      cublasLtMatmulDescDestroy(g);
      g = gelu_desc(CUBLASLT_EPILOGUE_DGELU_BGRAD, daux, 12, dbg);
      check(cublasLtMatmulAlgoGetHeuristic(lt, g, la, lb, ld, ld, pref, 1, &gr, &found) ==
                CUBLAS_STATUS_INVALID_VALUE, "  aux ld 12 (not a multiple of 8): INVALID_VALUE");
      cublasLtMatmulDescDestroy(g);
      g = gelu_desc(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, daux, aux_ld, dbias);
      const std::int32_t bf = CUDA_R_16BF;
      cublasLtMatmulDescSetAttribute(g, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &bf, sizeof(bf));
      check(cublasLtMatmulAlgoGetHeuristic(lt, g, la, lb, ld, ld, pref, 1, &gr, &found) ==
                CUBLAS_STATUS_INVALID_VALUE, "  an aux type other than D's: INVALID_VALUE");
      cublasLtMatmulDescDestroy(g);
      g = gelu_desc(CUBLASLT_EPILOGUE_DGELU_BGRAD, nullptr, aux_ld, dbg);
      check(cublasLtMatmulAlgoGetHeuristic(lt, g, la, lb, ld, ld, pref, 1, &gr, &found) ==
                CUBLAS_STATUS_SUCCESS &&
                cublasLtMatmul(lt, g, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &gr.algo,
                               nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE,
            "  DGELU_BGRAD without aux: INVALID_VALUE at the matmul");
      cublasLtMatmulDescDestroy(g);
      // aux's alignment: chosen at the heuristic, as the bias's
      float* odd_aux = dev(std::size_t(aux_ld) * ln + 1) + 1;
      g = gelu_desc(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, daux, aux_ld, dbias);
      cublasLtMatmulAlgoGetHeuristic(lt, g, la, lb, ld, ld, pref, 1, &gr, &found);
      cublasLtMatmulDescSetAttribute(g, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &odd_aux, sizeof(odd_aux));
      check(cublasLtMatmul(lt, g, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &gr.algo, nullptr,
                           0, nullptr) == CUBLAS_STATUS_EXECUTION_FAILED,
            "  a 4-byte aligned aux, the heuristic asked with a 16-byte one: EXECUTION_FAILED");
      cublasLtMatmulDescDestroy(g);
    }
    const float* host_bias = bias.data();
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &host_bias, sizeof(host_bias));
    check(cublasLtMatmul(lt, desc, &one, da, la, dbm, lb, &zero, dd, ld, dd, ld, &res.algo, nullptr,
                         0, nullptr) == CUBLAS_STATUS_EXECUTION_FAILED, "  a host bias: EXECUTION_FAILED");
    cublasLtMatmulPreferenceDestroy(pref);
    for (auto l : {la, lb, ld, lbad}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
  }
  cublasDestroy(h);
  {  // WMMA as CUDA documents it: A is M x K, B is K x N; row_major (r, c) at p[r * ldm + c],
     // col_major at p[c * ldm + r]; ldm in elements
    namespace wmma = nvcuda::wmma;
    constexpr int lda = 24, ldb = 40, ldc = 20, ldd = 28;
    alignas(32) static __nv_bfloat16 a[16 * lda], b[16 * ldb];
    alignas(32) static float c[16 * ldc], d[16 * ldd];
    float fa[16][16], fb[16][16];
    for (int r = 0; r < 16; r++)
      for (int k = 0; k < 16; k++) {
        a[r * lda + k] = __float2bfloat16_rn(fa[r][k] = std::sin(float(r * 16 + k)) * 3.0f);
        b[k * ldb + r] = __float2bfloat16_rn(fb[r][k] = std::cos(float(r * 7 + k)));  // B(r, k)
        c[k * ldc + r] = float(r - k);                                                // C(r, k)
      }
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fra;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> frc;
    wmma::load_matrix_sync(fra, a, lda);
    wmma::load_matrix_sync(frb, b, ldb);
    wmma::load_matrix_sync(frc, c, ldc, wmma::mem_col_major);
    wmma::mma_sync(frc, fra, frb, frc);
    for (auto& e : frc.x) e *= 2.0f;  // a uniform op on the elements
    wmma::store_matrix_sync(d, frc, ldd, wmma::mem_row_major);
    double err = 0;
    for (int r = 0; r < 16; r++)
      for (int n = 0; n < 16; n++) {
        double want = r - n;
        for (int k = 0; k < 16; k++)
          want += double(__bfloat162float(__float2bfloat16_rn(fa[r][k]))) *
                  __bfloat162float(__float2bfloat16_rn(fb[k][n]));
        err = std::fmax(err, std::fabs(2 * want - d[r * ldd + n]));
      }
    check(err < 1e-4, "wmma: D = 2 (A B + C), A row-major, B and C column-major, D row-major");
  }
  {  // __all_sync: per warp
    const auto all_kernel = [](float* out) {
      const unsigned t = threadIdx.x;
      out[t] = float(__all_sync(0xffffffffu, t != 40));  // false only in the second warp
    };
    float* dgot = dev(64);
    emu_launch(+all_kernel, "all_kernel", dim3(1), dim3(64), dgot);
    float got[64];
    cudaMemcpy(got, dgot, sizeof got, cudaMemcpyDeviceToHost);
    cudaFree(dgot);
    check(got[0] == 1 && got[31] == 1 && got[32] == 0 && got[63] == 0, "__all_sync per warp");
  }
  {  // 16-byte accesses (common.cuh's Packed128): aligned ones move the 16 bytes and are
     // counted; a misaligned one stops the run (it faults on a GPU), in a child process here
    alignas(16) static int buf[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const std::uint64_t before = emu::vector_accesses;
    const int4 v = __ldca(reinterpret_cast<const int4*>(buf + 4));
    __stwb(reinterpret_cast<int4*>(buf), v);
    check(buf[0] == 5 && buf[3] == 8 && buf[4] == 5 && emu::vector_accesses == before + 2,
          "__ldca / __stwb of an aligned int4: the 16 bytes, counted");
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
      std::freopen("/dev/null", "w", stderr);
      const int4 w = __ldca(reinterpret_cast<const int4*>(buf + 1));  // 4-byte aligned
      _exit(w.x == 2 ? 0 : 0);  // reached only if the check did not fire
    }
    int status = 0;
    waitpid(child, &status, 0);
    check(child > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0),
          "__ldca of an int4 4-byte aligned stops the run");
  }
  {  // Stream capture: recorded, not run; a launch replays kernels, copies, memsets and
     // cuBLAS with their values at the capture; a synchronization inside is refused
    cudaStream_t s;
    cudaStreamCreate(&s);
    cublasHandle_t hc;
    cublasCreate(&hc);
    cublasSetStream(hc, s);
    float* a = dev(4);
    float* b = dev(4);
    float* pinned = nullptr;
    cudaMallocHost(reinterpret_cast<void**>(&pinned), 4 * sizeof(float));
    const float init[4] = {1, 2, 3, 4};
    cudaMemcpy(a, init, sizeof init, cudaMemcpyHostToDevice);
    cudaMemset(b, 0, 4 * sizeof(float));
    float two = 2.0f, zero = 0.0f;
    // eager: b = 2 (a + 1), a += 1, pinned = b
    auto work = [&] {
      emu_launch(+add_one_kernel, "add_one_kernel", dim3(1), dim3(4), a, 4);
      cublasSgeam(hc, CUBLAS_OP_N, CUBLAS_OP_N, 4, 1, &two, a, 4, &zero, b, 4, b, 4);
      cudaMemcpyAsync(pinned, b, 4 * sizeof(float), cudaMemcpyDeviceToHost, s);
    };
    work();
    const float eager[4] = {pinned[0], pinned[1], pinned[2], pinned[3]};
    cudaMemcpy(a, init, sizeof init, cudaMemcpyHostToDevice);  // back to the start
    cudaStreamCaptureStatus st;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess &&
              cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive,
          "capture begins");
    pinned[0] = -1;
    work();
    two = 100.0f;  // after the call: the graph keeps 2
    float now[4];
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(s, &g) == cudaSuccess && g != nullptr, "capture ends with a graph");
    cudaMemcpy(now, a, sizeof now, cudaMemcpyDeviceToHost);
    check(now[0] == 1 && pinned[0] == -1, "nothing ran during the capture");
    cudaGraphExec_t ge = nullptr;
    check(cudaGraphInstantiateWithFlags(&ge, g, 0) == cudaSuccess && ge != nullptr, "instantiated");
    cudaGraphDestroy(g);
    check(cudaGraphLaunch(ge, s) == cudaSuccess && pinned[0] == eager[0] && pinned[3] == eager[3],
          "a launch replays the capture: the same results as eager (alpha as captured)");
    cudaGraphLaunch(ge, s);
    check(pinned[0] == 2 * (init[0] + 2) && pinned[3] == 2 * (init[3] + 2),
          "a second launch runs it again on the same buffers");
    cudaGraphExecDestroy(ge);
    // refused calls invalidate the capture
    const char* refused[] = {"cudaStreamSynchronize", "cudaMemcpy", "cudaMalloc", "cudaMemcpyAsync pageable"};
    for (int r = 0; r < 4; r++) {
      std::fflush(stdout);
      cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
      cudaError_t e = cudaSuccess;
      float host[4];
      void* p = nullptr;
      if (r == 0) e = cudaStreamSynchronize(s);
      if (r == 1) e = cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost);
      if (r == 2) e = cudaMalloc(&p, 16);
      if (r == 3) e = cudaMemcpyAsync(host, a, sizeof host, cudaMemcpyDeviceToHost, s);
      cudaGraph_t none = nullptr;
      const cudaError_t end = cudaStreamEndCapture(s, &none);
      cudaGetLastError();
      char what[160];
      std::snprintf(what, sizeof what, "%s inside a capture: refused, the capture invalidated",
                    refused[r]);
      check(e == cudaErrorStreamCaptureUnsupported && end == cudaErrorStreamCaptureInvalidated &&
                none == nullptr, what);
    }
    cudaFreeHost(pinned);
    cudaFree(a);
    cudaFree(b);
    cublasDestroy(hc);
    cudaStreamDestroy(s);
  }
  std::printf(bad ? "shim selftest: %d FAILED\n" : "shim selftest: all ok\n", bad);
  return bad != 0;
}
