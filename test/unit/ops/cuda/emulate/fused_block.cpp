// emulate/fused_block.cpp — the CUDA backend's fused GPT-2 block (src/ops/cuda/fused_block.cpp:
// bf16 activations inside, Ops::gpt2_block_forward / backward with a bf16 stash) against the
// CPU backend's composition (ops/fused_block.cpp, fp32), on the CPU stand-in (train.sh builds
// and runs it with the backend's host code). Checked: the output, the input gradient and every
// parameter gradient within bf16 tolerance relative to the tensor's largest value; the same
// for the CUDA backend's own composition (fp32 stash, bf16 products) as a second reference;
// and two broken runs that must fail (a stash tensor overwritten between forward and backward,
// the residual gradient perturbed), so that the tolerance can catch a wrong step.
// usage: fused_block  (exit 0: all agree)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/device_memory.hpp"
#include "trident/ops/ops.hpp"

using trident::FloatBuffer;
using trident::ops::Ops;

namespace {

constexpr int B = 2, T = 32, C = 64, NH = 4, F = 4 * C;  // heads of 16: the tensor-core kernels
constexpr int N = B * T;
// bf16 rounds each activation a product or attention reads to 8 significant bits; the
// measured worst on the stand-in is 5.5e-3 of the largest value (ln1_w's gradient).
constexpr double kTol = 1.5e-2;

struct Sizes {
  std::vector<std::int64_t> params{C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * F, F, F * C, C};
};

// The parameters (or gradients) in one flat buffer, in Gpt2BlockParams' order.
Ops::Gpt2BlockParams views(float* base) {
  Sizes s;
  float* v[12];
  for (int i = 0; i < 12; ++i) {
    v[i] = base;
    base += s.params[std::size_t(i)];
  }
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
}
std::int64_t param_count() {
  std::int64_t n = 0;
  for (std::int64_t p : Sizes{}.params) n += p;
  return n;
}

// The stash carved as the model does (fp32, or bf16 halves for ln1 qkv atty ln2 fch fch_gelu).
Ops::Gpt2BlockStash carve(float* p, bool bf16) {
  auto take = [&p](std::int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  auto big = [&](std::int64_t n) { return take(bf16 ? (n + 1) / 2 : n); };
  Ops::Gpt2BlockStash la{};
  la.ln1 = big(N * C), la.ln1_mean = take(N), la.ln1_rstd = take(N), la.qkv = big(N * 3 * C);
  la.atty = big(N * C), la.lse = take(B * NH * T), la.res2 = take(N * C), la.ln2 = big(N * C);
  la.ln2_mean = take(N), la.ln2_rstd = take(N), la.fch = big(N * F), la.fch_gelu = big(N * F);
  la.bf16 = bf16;
  return la;
}
std::int64_t stash_floats() { return 15LL * N * C + 4 * N + B * NH * T; }  // fp32: the larger

struct Result {
  std::vector<float> out, dx, grads;
};

// One forward and backward on `ops` (weights, x, dout from the host), the results to the host.
// break_stash: overwrite la.fch (bf16 halves) with x's bytes before the backward.
Result run(Ops& ops, bool bf16, const std::vector<float>& w, const std::vector<float>& x,
           const std::vector<float>& dout, bool break_stash = false, float dres_scale = 1.0f) {
  trident::DeviceMemory* mem = ops.memory();
  const std::int64_t P = param_count();
  FloatBuffer params(std::size_t(P), mem), grads(std::size_t(P), mem);
  const std::size_t nc = std::size_t(N) * C;
  FloatBuffer xb(nc, mem), out(nc, mem), dres(nc, mem);
  FloatBuffer stash(std::size_t(stash_floats()), mem);
  FloatBuffer dbuf(std::size_t(N) * C, mem), dqkv(std::size_t(N) * 3 * C, mem);
  FloatBuffer dfch(std::size_t(N) * F, mem), dact(std::size_t(N) * F, mem);
  trident::copy_to_device(mem, params.data(), w.data(), w.size() * 4);
  trident::copy_to_device(mem, xb.data(), x.data(), x.size() * 4);
  std::vector<float> d = dout;
  for (float& v : d) v *= dres_scale;
  trident::copy_to_device(mem, dres.data(), d.data(), d.size() * 4);
  ops.fill(grads.data(), 0.0f, P);
  ops.set_weights(params.data(), P);
  const Ops::Gpt2BlockShape s{B, T, C, NH, F};
  const Ops::Gpt2BlockStash la = carve(stash.data(), bf16);
  ops.gpt2_block_forward(s, views(params.data()), xb.data(), out.data(), la);
  if (break_stash) ops.copy(la.fch, xb.data(), std::int64_t(N) * C);
  ops.gpt2_block_backward(s, views(params.data()), views(grads.data()), xb.data(), dres.data(), la,
                          {dbuf.data(), dqkv.data(), dfch.data(), dact.data()});
  Result r;
  r.out.resize(std::size_t(N) * C), r.dx.resize(std::size_t(N) * C), r.grads.resize(std::size_t(P));
  trident::copy_to_host(mem, r.out.data(), out.data(), r.out.size() * 4);
  trident::copy_to_host(mem, r.dx.data(), dres.data(), r.dx.size() * 4);
  trident::copy_to_host(mem, r.grads.data(), grads.data(), r.grads.size() * 4);
  ops.set_weights(nullptr, 0);
  return r;
}

// max |a - b| / max |b| over [off, off + n)
double rel(const std::vector<float>& a, const std::vector<float>& b, std::int64_t off,
           std::int64_t n) {
  double diff = 0, big = 0;
  for (std::int64_t i = off; i < off + n; ++i) {
    diff = std::fmax(diff, std::fabs(double(a[std::size_t(i)]) - double(b[std::size_t(i)])));
    big = std::fmax(big, std::fabs(double(b[std::size_t(i)])));
  }
  return big > 0 ? diff / big : diff;
}

// Every tensor of got against want; prints each; true when all are within kTol.
bool compare(const char* what, const Result& got, const Result& want, bool quiet = false) {
  static const char* names[12] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
                                  "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};
  bool ok = true;
  double worst = 0;
  std::string line;
  auto check = [&](const char* name, double r) {
    worst = std::fmax(worst, r);
    if (!(r <= kTol)) ok = false;
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s %.1e", name, r);
    line += buf;
  };
  check("out", rel(got.out, want.out, 0, N * C));
  check("dx", rel(got.dx, want.dx, 0, N * C));
  std::int64_t off = 0;
  for (int i = 0; i < 12; ++i) {
    const std::int64_t n = Sizes{}.params[std::size_t(i)];
    check(names[i], rel(got.grads, want.grads, off, n));
    off += n;
  }
  if (!quiet) std::printf("fused block: %s:%s\n", what, line.c_str());
  std::printf("fused block: %s: worst %.2e (tolerance %.1e) %s\n", what, worst, kTol,
              ok ? "agree" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  std::mt19937 rng(27);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t P = param_count();
  std::vector<float> w(static_cast<std::size_t>(P)), x(static_cast<std::size_t>(N * C)),
      dout(static_cast<std::size_t>(N * C));
  {
    Sizes s;
    std::int64_t off = 0;
    for (int i = 0; i < 12; ++i) {
      const bool norm_w = i == 0 || i == 6, norm_b = i == 1 || i == 7;
      for (std::int64_t j = 0; j < s.params[std::size_t(i)]; ++j)
        w[std::size_t(off + j)] = norm_w ? 1.0f + 0.1f * normal(rng)
                                  : norm_b ? 0.1f * normal(rng)
                                           : 0.05f * normal(rng);
      off += s.params[std::size_t(i)];
    }
  }
  for (float& v : x) v = normal(rng);
  for (float& v : dout) v = 0.01f * normal(rng);

  auto cpu = trident::ops::make_cpu_ops(1);
  auto cuda = trident::ops::make_ops("cuda", 1, trident::ops::Precision::bf16);
  if (!cuda->gpt2_block_stash_bf16()) {
    std::printf("fused block: the CUDA backend keeps no bf16 block stash "
                "(TRIDENT_CUDA_FUSED_BLOCK=0 or TRIDENT_CUDA_BASELINE=1): nothing to check\n");
    return 0;
  }
  const Result want = run(*cpu, false, w, x, dout);
  const Result fused = run(*cuda, true, w, x, dout);
  const Result composed = run(*cuda, false, w, x, dout);
  bool ok = compare("fused CUDA bf16 vs CPU fp32 composition", fused, want);
  ok = compare("CUDA bf16 composition vs CPU fp32 composition", composed, want) && ok;
  ok = compare("fused vs CUDA composition", fused, composed) && ok;
  // The tolerance must catch a wrong step: a stale stash tensor, a wrong residual gradient.
  const bool stale = compare("broken on purpose: la.fch overwritten before the backward",
                             run(*cuda, true, w, x, dout, true), want, true);
  const bool scaled = compare("broken on purpose: the residual gradient times 1.05",
                              run(*cuda, true, w, x, dout, false, 1.05f), want, true);
  if (stale || scaled) {
    std::printf("fused block: a broken run passed: the check cannot fail\n");
    ok = false;
  }
  std::printf("fused block: %s\n", ok ? "all agree" : "FAILED");
  return ok ? 0 : 1;
}
