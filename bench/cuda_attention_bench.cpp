// Causal attention on one GPU through the CUDA backend under bf16, forward and backward, by
// each of its three paths: cuDNN's fused flash attention (ops/cuda/cudnn_attention.hpp),
// trident's tensor-core kernels (flash_attention_tc.cu: TRIDENT_CUDNN=0) and its scalar fp32
// kernels (flash_attention.cu: TRIDENT_CUDNN=0, TRIDENT_CUDA_ATTENTION=scalar), at one shape
// (default GPT-2 small's: B 8, T 1024, NH 12, hs 64), q/k/v as strided views of a fused
// qkv [B, T, 3C] as the model gives them.
// Usage: trident_bench_cuda_attention [reps (10)] [B T NH HS]
// One JSON line per path: {"path": "cudnn" | "tc" | "scalar", "used": bool, "b", "t", "nh", "hs",
//  "fwd_ms", "bwd_ms", "fwd_tflops", "bwd_tflops"} — the median of reps after one warm-up;
// FLOPs of causal attention (half the T x T products): forward 2 * B NH T^2 hs (Q K^T and
// P V), backward 5 * B NH T^2 hs (S again, dV, dP, dQ, dK: 2.5x). "used": the path's rows
// in the per-op table (TRIDENT_OP_TIMING): cuDNN's "attention_forward cudnn" row for cudnn
// (false means it fell back: its stderr line says why), the plain row for the kernels.
// After each path's line, one for the bf16-I/O entry points on the same backend
// (CudaOps::attention_forward_bf16, the fused block's: bf16 qkv [B, T, 3C], out, dout and
// dqkv), path "cudnn-bf16io" | "tc-bf16io" | "scalar-bf16io" (the last runs the widening
// fallback), "used" from the rows "attention_forward bf16 cudnn" | "... tc" | "... widened".
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../src/ops/cuda/attention_bf16_access.hpp"
#include "trident/core/buffer.hpp"
#include "trident/ops/cuda.hpp"
#include "trident/ops/ops.hpp"

namespace {

using trident::ops::Ops;
using trident::ops::Precision;

std::string read_file(const std::string& path) {
  std::string s;
  if (std::FILE* f = std::fopen(path.c_str(), "r")) {
    for (int ch; (ch = std::fgetc(f)) != EOF;) s += char(ch);
    std::fclose(f);
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(const std::string& path, int reps, int b, int t, int nh, int hs) {
  const bool cudnn = path == "cudnn";
  const std::string table = "/tmp/trident_cuda_attention_bench_" + path + ".json";
  std::remove(table.c_str());
  setenv("TRIDENT_OP_TIMING", table.c_str(), 1);
  if (!cudnn) setenv("TRIDENT_CUDNN", "0", 1);
  // the backend reads TRIDENT_CUDA_ATTENTION when it is made: "tc" under bf16 is its default
  setenv("TRIDENT_CUDA_ATTENTION", path == "scalar" ? "scalar" : "tc", 1);
  auto ops = trident::ops::make_cuda_ops(Precision::bf16);
  const std::int64_t c = std::int64_t(nh) * hs, rows = std::int64_t(b) * t;
  Ops::AttentionShape s;
  s.b = b, s.t = t, s.nh = nh, s.nkv = nh, s.hs = hs;
  s.ld_q = s.ld_k = s.ld_v = 3 * c, s.ld_o = c;
  ops->fused_attention_bytes(s);  // loads (or refuses) cuDNN now, under this environment
  unsetenv("TRIDENT_OP_TIMING");
  unsetenv("TRIDENT_CUDNN");
  unsetenv("TRIDENT_CUDA_ATTENTION");
  std::vector<float> h(std::size_t(rows * 3 * c));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : h) x = normal(rng);
  double f_ms = 0.0, b_ms = 0.0, f16_ms = 0.0, b16_ms = 0.0;
  {
    trident::FloatBuffer qkv(h.size(), ops->memory()), dqkv(h.size(), ops->memory());
    trident::FloatBuffer out(std::size_t(rows * c), ops->memory()),
        dout(std::size_t(rows * c), ops->memory()),
        lse(std::size_t(std::int64_t(b) * nh * t), ops->memory());
    ops->memory()->to_device(qkv.data(), h.data(), h.size() * sizeof(float));
    ops->memory()->to_device(dout.data(), h.data(), std::size_t(rows * c) * sizeof(float));
    float *q = qkv.data(), *k = q + c, *v = q + 2 * c;
    float *dq = dqkv.data(), *dk = dq + c, *dv = dq + 2 * c;
    std::vector<double> fwd, bwd;
    for (int r = 0; r <= reps; r++) {
      ops->memory()->synchronize();
      auto t0 = std::chrono::steady_clock::now();
      ops->attention_forward(out.data(), lse.data(), q, k, v, s);
      ops->memory()->synchronize();
      auto t1 = std::chrono::steady_clock::now();
      ops->attention_backward(dq, dk, dv, dout.data(), out.data(), lse.data(), q, k, v, s);
      ops->memory()->synchronize();
      auto t2 = std::chrono::steady_clock::now();
      if (r == 0) continue;  // warm-up: plans, scratch growth
      fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    f_ms = median(fwd);
    b_ms = median(bwd);
  }
  {  // the bf16-I/O entry points: the same values rounded to bf16
    using Bf16 = trident::ops::cuda::AttentionBf16Access;
    std::vector<std::uint16_t> h16(h.size());
    for (std::size_t i = 0; i < h.size(); i++) {
      std::uint32_t u;
      std::memcpy(&u, &h[i], 4);
      h16[i] = std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    trident::Buffer<std::uint16_t> qkv(h.size(), ops->memory()), dqkv(h.size(), ops->memory());
    trident::Buffer<std::uint16_t> out(std::size_t(rows * c), ops->memory()),
        dout(std::size_t(rows * c), ops->memory());
    trident::FloatBuffer lse(std::size_t(std::int64_t(b) * nh * t), ops->memory());
    ops->memory()->to_device(qkv.data(), h16.data(), h16.size() * 2);
    ops->memory()->to_device(dout.data(), h16.data(), std::size_t(rows * c) * 2);
    std::uint16_t *q = qkv.data(), *k = q + c, *v = q + 2 * c;
    std::uint16_t *dq = dqkv.data(), *dk = dq + c, *dv = dq + 2 * c;
    std::vector<double> fwd, bwd;
    for (int r = 0; r <= reps; r++) {
      ops->memory()->synchronize();
      auto t0 = std::chrono::steady_clock::now();
      Bf16::forward(*ops, out.data(), lse.data(), q, k, v, s);
      ops->memory()->synchronize();
      auto t1 = std::chrono::steady_clock::now();
      Bf16::backward(*ops, dq, dk, dv, dout.data(), out.data(), lse.data(), q, k, v, s);
      ops->memory()->synchronize();
      auto t2 = std::chrono::steady_clock::now();
      if (r == 0) continue;
      fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    f16_ms = median(fwd);
    b16_ms = median(bwd);
  }
  const double flop = double(b) * nh * double(t) * t * hs;
  ops.reset();  // after the buffers: writes the table
  const std::string tab = read_file(table);
    const bool used = cudnn ? tab.find("\"attention_forward cudnn\"") != std::string::npos
                            : tab.find("\"attention_forward\"") != std::string::npos;
    std::printf("{\"path\": \"%s\", \"used\": %s, \"b\": %d, \"t\": %d, \"nh\": %d, \"hs\": %d, "
                "\"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_tflops\": %.2f, \"bwd_tflops\": %.2f}\n",
                path.c_str(), used ? "true" : "false", b, t, nh, hs, f_ms, b_ms,
                2 * flop / (f_ms * 1e9), 5 * flop / (b_ms * 1e9));
    const std::string row16 = std::string("\"attention_forward bf16 ") +
                              (cudnn ? "cudnn" : path == "tc" ? "tc" : "widened") + "\"";
    std::printf("{\"path\": \"%s-bf16io\", \"used\": %s, \"b\": %d, \"t\": %d, \"nh\": %d, "
                "\"hs\": %d, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_tflops\": %.2f, "
                "\"bwd_tflops\": %.2f}\n",
                path.c_str(), tab.find(row16) != std::string::npos ? "true" : "false", b, t, nh,
                hs, f16_ms, b16_ms, 2 * flop / (f16_ms * 1e9), 5 * flop / (b16_ms * 1e9));
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  int shape[4] = {8, 1024, 12, 64};
  if (argc == 6)
    for (int i = 0; i < 4; i++) shape[i] = std::atoi(argv[i + 2]);
  if (reps < 1 || (argc != 1 && argc != 2 && argc != 6)) {
    std::fprintf(stderr, "usage: trident_bench_cuda_attention [reps (10)] [B T NH HS]\n");
    return 2;
  }
  try {
    for (const char* path : {"cudnn", "tc", "scalar"})
      run(path, reps, shape[0], shape[1], shape[2], shape[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident_bench_cuda_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
