// The GPU's GEMM ceiling for trident: the rate cuBLAS reaches on GPT-2 small's and medium's
// largest products (B*T = 8192 tokens), in each arithmetic trident's CUDA backend offers,
// plus the square 8192^3 bf16 product as the chip's reference. Depends on cuBLAS and the CUDA
// runtime only (no trident library), so bench/gpu_check.sh can also build it with a bare
// `nvcc ... -lcublas` where trident's other dependencies are missing.
// Usage: trident_bench_cublas [repetitions (20)] [--mode MODE[,MODE...]]
//                             [--shape NAME=MxNxK[,ta][,tb]]...
//   --mode   only these modes (default: all four, below)
//   --shape  only these products instead of the built-in table (repeatable); ta / tb: op(A) =
//            A^T (A stored [k,m]) / op(B) = B^T (B stored [n,k]), e.g. an LM head
//            --shape lm_head=8192x50304x768,tb
// Prints one JSON object per line: first {"device", "sm", "cc"}, then per product and mode
//   {"gemm": NAME, "mode": MODE, "m": M, "n": N, "k": K, "median_ms": ..., "tflops": ...}
// Row-major C[m,n] = op(A)[m,k] op(B)[k,n] as trident calls it (C^T = B^T A^T in cuBLAS);
// FLOPs = 2 m n k; each repetition timed alone with CUDA events, the median reported.
// Modes: fp32 (CUBLAS_COMPUTE_32F), tf32 (32F_FAST_TF32), bf16 (bf16 A and B, fp32 C, fp32
// accumulation: what the backend's bf16 products run after converting their inputs), and
// fp32in_fast16bf (fp32 A and B, CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS rounds the inputs).
// defines: main
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "cublas bench: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CHECK_CUBLAS(call)                                                                     \
  do {                                                                                         \
    cublasStatus_t s_ = (call);                                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      std::fprintf(stderr, "cublas bench: %s failed: %s\n", #call, cublasGetStatusString(s_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

struct Shape {
  std::string name;
  int m, n, k;
  bool ta, tb;
};

// GPT-2 small (C 768) and medium (C 1024), 8192 tokens, vocabulary padded to 50304.
const std::vector<Shape> kShapes = {
    {"square_8192", 8192, 8192, 8192, false, false},
    {"small_qkv_fwd", 8192, 2304, 768, false, false},
    {"small_fc_fwd", 8192, 3072, 768, false, false},
    {"small_proj_fwd", 8192, 768, 3072, false, false},
    {"small_lm_head_fwd", 8192, 50304, 768, false, true},  // logits = x @ wte^T
    {"medium_fc_fwd", 8192, 4096, 1024, false, false},     // [8192,1024] x [1024,4096]
    {"medium_fc_bwd_dx", 8192, 1024, 4096, false, true},   // dx = dy @ w^T
    {"medium_fc_bwd_dw", 1024, 4096, 8192, true, false},   // dw = x^T @ dy
    {"medium_lm_head_fwd", 8192, 50304, 1024, false, true},
};

enum class Mode { fp32, tf32, bf16, fp32in_fast16bf };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::fp32: return "fp32";
    case Mode::tf32: return "tf32";
    case Mode::bf16: return "bf16";
    case Mode::fp32in_fast16bf: return "fp32in_fast16bf";
  }
  return "?";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Uniform values in [-1, 1) from a 64-bit LCG (fast enough for a few hundred million).
void fill_random(std::vector<float>& v, std::uint64_t seed) {
  std::uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) / float(1 << 23);
  }
}

std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> r(v.size());
  for (std::size_t i = 0; i < v.size(); i++) {
    std::uint32_t u;
    std::memcpy(&u, &v[i], 4);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
    r[i] = static_cast<std::uint16_t>(u >> 16);
  }
  return r;
}

[[noreturn]] void usage(const char* argv0, const std::string& why) {
  std::fprintf(stderr,
               "cublas bench: %s\nusage: %s [repetitions >= 1] [--mode fp32,tf32,bf16,"
               "fp32in_fast16bf] [--shape NAME=MxNxK[,ta][,tb]]...\n",
               why.c_str(), argv0);
  std::exit(2);
}

// "NAME=MxNxK[,ta][,tb]" -> Shape
Shape parse_shape(const char* argv0, const std::string& arg) {
  const std::size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) usage(argv0, "--shape " + arg + ": expected NAME=MxNxK");
  Shape s{arg.substr(0, eq), 0, 0, 0, false, false};
  std::string rest = arg.substr(eq + 1);
  char tail[64] = "";
  const int got = std::sscanf(rest.c_str(), "%dx%dx%d%63s", &s.m, &s.n, &s.k, tail);
  if (got < 3 || s.m < 1 || s.n < 1 || s.k < 1)
    usage(argv0, "--shape " + arg + ": expected positive MxNxK");
  for (std::string t = tail; !t.empty();) {
    if (t.rfind(",ta", 0) == 0) s.ta = true;
    else if (t.rfind(",tb", 0) == 0) s.tb = true;
    else usage(argv0, "--shape " + arg + ": after MxNxK only ,ta and ,tb");
    t = t.substr(3);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::vector<Shape> shapes;
  std::vector<Mode> modes;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if ((a == "--shape" || a == "--mode") && i + 1 >= argc) usage(argv[0], a + " needs a value");
    if (a == "--shape") {
      shapes.push_back(parse_shape(argv[0], argv[++i]));
    } else if (a == "--mode") {
      std::string list = argv[++i];
      for (std::size_t start = 0; start <= list.size();) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        const std::string word = list.substr(start, comma - start);
        bool found = false;
        for (Mode m : {Mode::fp32, Mode::tf32, Mode::bf16, Mode::fp32in_fast16bf})
          if (word == mode_name(m)) modes.push_back(m), found = true;
        if (!found) usage(argv[0], "--mode: unknown mode \"" + word + "\"");
        start = comma + 1;
      }
    } else if (i == 1 && !a.empty() && a[0] != '-') {
      reps = std::atoi(a.c_str());
      if (reps < 1) usage(argv[0], "repetitions must be >= 1");
    } else {
      usage(argv[0], "unknown argument \"" + a + "\"");
    }
  }
  if (shapes.empty()) shapes = kShapes;
  if (modes.empty()) modes = {Mode::fp32, Mode::tf32, Mode::bf16, Mode::fp32in_fast16bf};
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("{\"device\": \"%s\", \"sm\": %d, \"cc\": \"%d.%d\"}\n", prop.name,
              prop.multiProcessorCount, prop.major, prop.minor);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t h;
  CHECK_CUBLAS(cublasCreate(&h));
  CHECK_CUBLAS(cublasSetStream(h, stream));
  void* workspace = nullptr;
  const std::size_t ws_bytes = std::size_t(32) << 20;
  CHECK_CUDA(cudaMalloc(&workspace, ws_bytes));
  CHECK_CUBLAS(cublasSetWorkspace(h, workspace, ws_bytes));
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));

  for (const Shape& s : shapes) {
    const std::size_t na = std::size_t(s.m) * s.k, nb = std::size_t(s.k) * s.n,
                      nc = std::size_t(s.m) * s.n;
    std::vector<float> ha(na), hb(nb);
    fill_random(ha, 1);
    fill_random(hb, 2);
    const std::vector<std::uint16_t> ha16 = to_bf16_bits(ha), hb16 = to_bf16_bits(hb);
    void *a32, *b32, *a16, *b16, *c;
    CHECK_CUDA(cudaMalloc(&a32, na * 4));
    CHECK_CUDA(cudaMalloc(&b32, nb * 4));
    CHECK_CUDA(cudaMalloc(&a16, na * 2));
    CHECK_CUDA(cudaMalloc(&b16, nb * 2));
    CHECK_CUDA(cudaMalloc(&c, nc * 4));
    CHECK_CUDA(cudaMemcpy(a32, ha.data(), na * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(b32, hb.data(), nb * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(a16, ha16.data(), na * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(b16, hb16.data(), nb * 2, cudaMemcpyHostToDevice));
    // row-major leading dimensions of the stored operands
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n, ldc = s.n;
    const cublasOperation_t opa = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    for (Mode mode : modes) {
      const bool bf16_inputs = mode == Mode::bf16;
      const cudaDataType_t ab = bf16_inputs ? CUDA_R_16BF : CUDA_R_32F;
      const cublasComputeType_t compute =
          mode == Mode::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
          : mode == Mode::fp32in_fast16bf ? CUBLAS_COMPUTE_32F_FAST_16BF
                                          : CUBLAS_COMPUTE_32F;
      const void* a = bf16_inputs ? a16 : a32;
      const void* b = bf16_inputs ? b16 : b32;
      const float alpha = 1.0f, beta = 0.0f;
      auto run = [&] {
        CHECK_CUBLAS(cublasGemmEx(h, opb, opa, s.n, s.m, s.k, &alpha, b, ab, ldb, a, ab, lda,
                                  &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
      };
      for (int i = 0; i < 3; i++) run();
      std::vector<double> ms;
      for (int i = 0; i < reps; i++) {
        CHECK_CUDA(cudaEventRecord(t0, stream));
        run();
        CHECK_CUDA(cudaEventRecord(t1, stream));
        CHECK_CUDA(cudaEventSynchronize(t1));
        float e = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&e, t0, t1));
        ms.push_back(e);
      }
      const double med = median(ms);
      const double tflops = 2.0 * s.m * double(s.n) * s.k / (med * 1e-3) / 1e12;
      std::printf("{\"gemm\": \"%s\", \"mode\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
                  "\"trans_a\": %s, \"trans_b\": %s, \"median_ms\": %.4f, \"tflops\": %.1f}\n",
                  s.name.c_str(), mode_name(mode), s.m, s.n, s.k, s.ta ? "true" : "false",
                  s.tb ? "true" : "false", med, tflops);
      std::fflush(stdout);
    }
    for (void* p : {a32, b32, a16, b16, c}) CHECK_CUDA(cudaFree(p));
  }
  CHECK_CUBLAS(cublasDestroy(h));
  CHECK_CUDA(cudaFree(workspace));
  return 0;
}
