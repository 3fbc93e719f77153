// The ceiling trident's CPU step is measured against: OpenBLAS SGEMM GFLOP/s on the model's
// own GEMM shapes, with the same thread count, in the same run (bench/run.sh).
// Usage: trident_bench_sgemm [threads] [repetitions] — prints one JSON object per shape:
// (`trident_bench_sgemm --corename` prints the kernel family OpenBLAS chose, and exits)
//   {"gemm": NAME, "m": M, "n": N, "k": K, "median_s": ..., "gflops": ...}
// Row-major C[m, n] = op(A)[m, k] @ op(B)[k, n]; FLOPs = 2 m n k.
// defines: main
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct Shape {
  const char* name;
  int m, n, k;
  bool trans_b;  // B stored [n, k] (the tied LM head reads wte [V, C] transposed)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--corename") {
    std::printf("%s\n", openblas_get_corename());
    return 0;
  }
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  if (threads < 1 || reps < 1) {
    std::fprintf(stderr, "usage: %s [threads >= 1] [repetitions >= 1]\n", argv[0]);
    return 2;
  }
  openblas_set_num_threads(threads);

  // The bench model: B*T = 8*128 = 1024 tokens, C = 256, V = 4096, 4C = 1024.
  const Shape shapes[] = {
      {"lm_head_fwd", 1024, 4096, 256, true},   // logits[BT, V] = x[BT, C] @ wte^T
      {"mlp_c_fc_fwd", 1024, 1024, 256, false},  // h[BT, 4C] = x[BT, C] @ W[C, 4C]
      {"lm_head_bwd_dx", 1024, 256, 4096, false},  // dx[BT, C] = dlogits[BT, V] @ wte[V, C]
  };
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& s : shapes) {
    std::vector<float> a(std::size_t(s.m) * s.k), b(std::size_t(s.k) * s.n),
        c(std::size_t(s.m) * s.n);
    for (float& x : a) x = dist(gen);
    for (float& x : b) x = dist(gen);
    const int ldb = s.trans_b ? s.k : s.n;
    const auto tb = s.trans_b ? CblasTrans : CblasNoTrans;
    std::vector<double> times;
    for (int r = 0; r < reps + 3; ++r) {  // 3 warm-up calls (thread pool, page faults)
      const auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, s.m, s.n, s.k, 1.0f, a.data(), s.k,
                  b.data(), ldb, 0.0f, c.data(), s.n);
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 3) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    const double t = median(times);
    const double flops = 2.0 * s.m * s.n * s.k;
    std::printf("{\"gemm\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"threads\": %d, "
                "\"median_s\": %.6e, \"gflops\": %.3f, \"openblas\": \"%s\"}\n",
                s.name, s.m, s.n, s.k, threads, t, flops / t * 1e-9, openblas_get_corename());
  }
  return 0;
}
