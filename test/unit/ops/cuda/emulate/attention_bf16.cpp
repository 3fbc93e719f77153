// test/unit/ops/cuda/emulate/attention_bf16.cpp — CudaOps::attention_forward_bf16 and
// attention_backward_bf16 themselves (src/ops/cuda/attention_bf16.cpp: the path choice, the
// op scratch, the widening and narrowing with batch strides) on the CPU stand-in, against the
// CPU backend's fp32 attention on the same bf16 inputs. cuDNN refuses on the stand-in, so the
// calls take the tensor-core kernels (bf16, hs % 16 == 0) or the widened fp32 kernels (other
// head sizes, fp32 products, TRIDENT_CUDA_BASELINE=1); which one ran is read from the per-op
// table. Tolerances as run.sh's driver: 2e-2 of the largest (the gradients: of dq, dk, dv's).
// train.sh builds it with the backend's objects and runs it (a few seconds).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention_bf16_access.hpp"
#include "device_copy.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/cuda.hpp"
#include "trident/ops/ops.hpp"

namespace {

using trident::ops::Ops;
using trident::ops::Precision;
using Bf16 = trident::ops::cuda::AttentionBf16Access;
using V = std::vector<float>;
using H = std::vector<std::uint16_t>;

std::mt19937 rng(11);  // NOLINT: one generator for the run
int bad = 0;

V normal(std::size_t n, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  V v(n);
  for (float& x : v) x = d(rng);
  return v;
}
std::uint16_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
H to_bits(const V& x) {
  H h(x.size());
  for (std::size_t i = 0; i < x.size(); i++) h[i] = bits(x[i]);
  return h;
}
V widen(const H& h) {
  V x(h.size());
  for (std::size_t i = 0; i < h.size(); i++) {
    const std::uint32_t u = std::uint32_t(h[i]) << 16;
    std::memcpy(&x[i], &u, 4);
  }
  return x;
}
void cmp(const std::string& what, const V& got, const V& want, double tol, double scale) {
  double e = 0;
  bool nan = false;
  for (std::size_t i = 0; i < got.size(); i++) {
    const double d = std::fabs(double(got[i]) - want[i]);
    if (std::isnan(d)) nan = true;
    e = std::max(e, d);
  }
  const bool ok = !nan && e <= tol * scale;
  if (!ok) bad++;
  std::printf("%-58s %s  err %.2e  ref %.2e\n", what.c_str(), ok ? "ok  " : "BAD ", e, scale);
}
double maxabs(const V& x) {
  double m = 0;
  for (float f : x) m = std::max(m, double(std::fabs(f)));
  return m;
}

struct Case {
  int b, t, nh, nkv, hs;
  bool causal, fused, blocks;  // fused: GPT's qkv; blocks: ring attention's batch strides
};

void check(Ops& gpu, Ops& cpu, const Case& c, const char* label) {
  Ops::AttentionShape s;
  s.b = c.b, s.t = c.t, s.nh = c.nh, s.nkv = c.nkv, s.hs = c.hs, s.causal = c.causal;
  const std::int64_t cq = std::int64_t(c.nh) * c.hs, ckv = std::int64_t(c.nkv) * c.hs;
  const std::size_t span = c.blocks ? 2 * std::size_t(c.t) : std::size_t(c.t);
  const std::size_t rows = std::size_t(c.b) * span;
  const int nbuf = c.fused ? 1 : 3;
  std::size_t off[3] = {0, 0, 0};
  H in16[3];
  if (c.fused) {
    s.ld_q = s.ld_k = s.ld_v = cq + 2 * ckv;
    s.ld_o = cq;
    in16[0] = to_bits(normal(rows * std::size_t(s.ld_q), 1.5f));
    off[1] = std::size_t(cq), off[2] = std::size_t(cq + ckv);
  } else {
    s.ld_q = cq + 3, s.ld_k = ckv + 1, s.ld_v = ckv + 2, s.ld_o = cq + 1;
    in16[0] = to_bits(normal(rows * std::size_t(s.ld_q), 1.5f));
    in16[1] = to_bits(normal(rows * std::size_t(s.ld_k), 1.5f));
    in16[2] = to_bits(normal(rows * std::size_t(s.ld_v), 1.0f));
  }
  if (c.blocks) {
    const auto sp = std::int64_t(span);
    s.bs_q = sp * s.ld_q, s.bs_k = sp * s.ld_k, s.bs_v = sp * s.ld_v, s.bs_o = sp * s.ld_o;
    s.bs_lse = sp;
  }
  const float pad = 0.0078125f;
  const H dout16 = to_bits(normal(rows * std::size_t(s.ld_o), 1.0f));
  V in[3];
  for (int x = 0; x < nbuf; x++) in[x] = widen(in16[x]);
  const auto at = [&](auto* bufs, int x) { return bufs[c.fused ? 0 : x].data() + off[x]; };
  const std::size_t lse_n = std::size_t(c.b) * c.nh * span;
  // the stand-in's backend
  std::unique_ptr<Dev<std::uint16_t>> gin[3], gg[3];
  for (int x = 0; x < nbuf; x++) {
    gin[x] = std::make_unique<Dev<std::uint16_t>>(gpu, in16[x]);
    gg[x] = std::make_unique<Dev<std::uint16_t>>(gpu, H(in16[x].size(), bits(pad)));
  }
  Dev<std::uint16_t> gdout(gpu, dout16), gout(gpu, H(rows * std::size_t(s.ld_o), bits(pad)));
  Dev<float> glse(gpu, V(lse_n, pad));
  const auto gp = [&](std::unique_ptr<Dev<std::uint16_t>>* d, int x) {
    return d[c.fused ? 0 : x]->p + off[x];
  };
  Bf16::forward(gpu, gout.p, glse.p, gp(gin, 0), gp(gin, 1), gp(gin, 2), s);
  Bf16::backward(gpu, gp(gg, 0), gp(gg, 1), gp(gg, 2), gdout.p, gout.p, glse.p, gp(gin, 0),
                 gp(gin, 1), gp(gin, 2), s);
  // the CPU
  const V dout = widen(dout16);
  V out(rows * std::size_t(s.ld_o), pad), lse(lse_n, pad), g[3];
  for (int x = 0; x < nbuf; x++) g[x] = V(in[x].size(), pad);
  cpu.attention_forward(out.data(), lse.data(), at(in, 0), at(in, 1), at(in, 2), s);
  cpu.attention_backward(at(g, 0), at(g, 1), at(g, 2), dout.data(), out.data(), lse.data(),
                         at(in, 0), at(in, 1), at(in, 2), s);
  char name[160];
  std::snprintf(name, sizeof name, "%s b%d t%d nh%d nkv%d hs%d%s%s%s out", label, c.b, c.t,
                c.nh, c.nkv, c.hs, c.causal ? "" : " full", c.fused ? " gpt-qkv" : "",
                c.blocks ? " blocks" : "");
  cmp(name, widen(gout.host()), out, 2e-2, maxabs(out));
  cmp("  lse", glse.host(), lse, 2e-2, maxabs(lse));
  double sc = 0;
  for (int x = 0; x < nbuf; x++) sc = std::max(sc, maxabs(g[x]));
  const char* gname[3] = {"  dq", "  dk", "  dv"};
  for (int x = 0; x < nbuf; x++)
    cmp(nbuf == 1 ? "  dqkv" : gname[x], widen(gg[x]->host()), g[x], 2e-2, sc);
}

std::string read_all(const std::string& path) {
  std::string s;
  if (std::FILE* f = std::fopen(path.c_str(), "r")) {
    for (int ch; (ch = std::fgetc(f)) != EOF;) s += char(ch);
    std::fclose(f);
  }
  return s;
}

// One backend (precision p, the environment as set), the cases, then its per-op table must
// have `row` and lack `absent`.
void run(Precision p, const char* label, const std::vector<Case>& cases, const char* row,
         const char* absent) {
  const std::string table = "/tmp/trident_emu_attention_bf16_" + std::string(label) + ".json";
  std::remove(table.c_str());
  setenv("TRIDENT_OP_TIMING", table.c_str(), 1);
  auto gpu = trident::ops::make_cuda_ops(p, std::size_t(256) << 20);
  unsetenv("TRIDENT_OP_TIMING");
  auto cpu = trident::ops::make_cpu_ops(1);
  for (const Case& c : cases) check(*gpu, *cpu, c, label);
  gpu.reset();
  const std::string json = read_all(table);
  const bool ran = json.find(std::string("\"") + row + "\"") != std::string::npos;
  const bool other = absent && json.find(std::string("\"") + absent + "\"") != std::string::npos;
  if (!ran || other) bad++;
  std::printf("%-58s %s\n", (std::string("  per-op table: ") + row).c_str(),
              ran && !other ? "ok  " : "BAD ");
}

}  // namespace

int main() {
  // cuDNN is tried first under bf16: the stand-in refuses it (its one stderr line), and the
  // calls go on to trident's kernels.
  const std::vector<Case> tc = {{2, 37, 3, 3, 64, true, true, false},
                                {1, 100, 4, 2, 64, true, false, false},
                                {2, 40, 2, 1, 32, false, false, true},
                                {1, 77, 2, 2, 128, true, true, false}};
  const std::vector<Case> widened = {{2, 37, 3, 3, 24, true, true, false},
                                     {1, 50, 4, 2, 40, true, false, false},
                                     {2, 29, 2, 2, 8, false, false, true}};
  run(Precision::bf16, "bf16 tc", tc, "attention_backward bf16 tc",
      "attention_forward bf16 widened");
  run(Precision::bf16, "bf16 widened", widened, "attention_backward bf16 widened",
      "attention_forward bf16 tc");
  run(Precision::fp32, "fp32 widened", {tc[0], tc[2]}, "attention_backward bf16 widened",
      "attention_forward bf16 tc");
  setenv("TRIDENT_CUDA_BASELINE", "1", 1);
  run(Precision::bf16, "baseline widened", {tc[1]}, "attention_forward bf16 widened",
      "attention_forward bf16 tc");
  unsetenv("TRIDENT_CUDA_BASELINE");
  // gradients are written: accumulate is refused with an error naming the entry point
  {
    auto gpu = trident::ops::make_cuda_ops(Precision::bf16, std::size_t(64) << 20);
    Ops::AttentionShape s;
    s.b = 1, s.t = 4, s.nh = s.nkv = 1, s.hs = 16, s.ld_q = s.ld_k = s.ld_v = 48, s.ld_o = 16;
    s.accumulate = true;
    bool refused = false;
    try {
      Bf16::backward(*gpu, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                     nullptr, nullptr, s);
    } catch (const trident::Error& e) {
      refused = std::string(e.what()).find("attention_backward_bf16") != std::string::npos;
      std::printf("%-58s %s  (%s)\n", "accumulate refused", refused ? "ok  " : "BAD ", e.what());
    }
    if (!refused) bad++;
  }
  std::printf(bad ? "%d MISMATCHES\n" : "the bf16 attention entry points agree with the CPU\n",
              bad);
  return bad != 0;
}
