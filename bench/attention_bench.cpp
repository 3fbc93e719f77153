// bench/attention_bench.cpp — causal attention forward + backward through the CPU backend:
// the flash path (attention_forward/backward) and the T x T reference path
// (attention_naive_*), on GPT's fused qkv[B,T,3C]. One JSON object per line:
//   {"t": T, "path": "flash"|"naive", "ms": median fwd+bwd, "fwd_ms": ..., "bytes": the
//    attention's own buffers (the stash it keeps for the backward plus its scratch)}
// usage: trident_bench_attention [--threads N] [--b B] [--c C] [--nh NH] [--reps R]
//        [--naive-max-t T] T...   (naive runs only up to --naive-max-t: it stores 2 x T x T
//        per head)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "trident/ops/ops.hpp"

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, b = 1, c = 768, nh = 12, reps = 5, naive_max_t = 4096;
  std::vector<int> ts;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--threads") threads = next();
    else if (a == "--b") b = next();
    else if (a == "--c") c = next();
    else if (a == "--nh") nh = next();
    else if (a == "--reps") reps = next();
    else if (a == "--naive-max-t") naive_max_t = next();
    else ts.push_back(std::atoi(a.c_str()));
  }
  if (ts.empty()) ts = {512, 1024, 2048, 4096};
  auto ops = trident::ops::make_cpu_ops(threads);
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int t : ts) {
    const std::size_t n = std::size_t(b) * t;
    std::vector<float> qkv(n * 3 * c), dout(n * c), out(n * c), dqkv(n * 3 * c);
    for (auto& x : qkv) x = nd(g);
    for (auto& x : dout) x = nd(g);
    for (const char* path : {"flash", "naive"}) {
      const bool flash = std::strcmp(path, "flash") == 0;
      if (!flash && t > naive_max_t) continue;
      const std::size_t stash = flash ? std::size_t(b) * nh * t : std::size_t(b) * nh * t * t;
      std::vector<float> keep(stash), scratch(flash ? 0 : stash);
      const trident::ops::Ops::AttentionShape s = trident::ops::attention_shape_qkv(b, t, c, nh);
      const float* q = qkv.data();
      std::vector<double> total, fwd;
      for (int r = 0; r < reps + 1; r++) {  // the first is a warm-up
        const double t0 = now_ms();
        if (flash)
          ops->attention_forward(out.data(), keep.data(), q, q + c, q + 2 * c, s);
        else
          ops->attention_naive_forward(out.data(), keep.data(), q, b, t, c, nh);
        const double t1 = now_ms();
        if (flash)
          ops->attention_backward(dqkv.data(), dqkv.data() + c, dqkv.data() + 2 * c, dout.data(),
                                  out.data(), keep.data(), q, q + c, q + 2 * c, s);
        else
          ops->attention_naive_backward(dqkv.data(), scratch.data(), dout.data(), q, keep.data(),
                                        b, t, c, nh);
        const double t2 = now_ms();
        if (r > 0) {
          total.push_back(t2 - t0);
          fwd.push_back(t1 - t0);
        }
      }
      std::printf("{\"t\": %d, \"path\": \"%s\", \"ms\": %.3f, \"fwd_ms\": %.3f, \"bytes\": %zu}\n",
                  t, path, median(total), median(fwd), (stash + scratch.size()) * sizeof(float));
      std::fflush(stdout);
    }
  }
  return 0;
}
