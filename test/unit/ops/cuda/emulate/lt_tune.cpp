// test/unit/ops/cuda/emulate/lt_tune.cpp — TRIDENT_CUDA_LT_TUNE (src/ops/cuda/lt_tune.hpp) on
// the CPU stand-in: CudaOps::bias_lt's plans (through lt_tune_access.hpp's LtTuneAccess) with
// the shim's three candidate algorithms (identical math; shim/cublasLt.h), one or two of them
// made slow (TRIDENT_EMU_LT_SLOW_ALGO) so that the fastest is known. Checked, per product kind
// (bf16 D + bias; fp32 D + bias + residual out of place; the same accumulating in place, D = C;
// GELU_AUX_BIAS; DGELU_BGRAD):
//   - tuned outputs equal the untuned bit for bit, and every plan keeps the fast candidate;
//   - the accumulating products against a double-precision oracle (a candidate run into the
//     caller's D would add the product again: D = C in place), and C left as it was;
//   - the file: written with one entry per plan; read back by a second object, which then runs
//     no candidate but the stored one (the slow knob moved, so tuning would choose another);
//     a stored algorithm this "cuBLASLt" lacks (TRIDENT_EMU_LT_INVALID_ALGO) or entries of
//     another device, or unreadable lines: those shapes tuned again, the results unchanged.
// And Ops::gemm under bf16 (gemm_rm16's products without a bias, cuBLASLt plans when tuned):
// transposes, padding, alpha, beta 1 in place, bit for bit with cublasGemmEx and against double.
// And gemm_rm16_to16 (the fused blocks' bf16-output products; bf16-D plans when tuned): the
// blocks' NT and NN and a TN, padded, each after a gemm_rm16 of the same shape, operands and
// alignments into fp32 D (the plan key's D bit keeps them apart: plans, file entries), bit for
// bit with cublasGemmEx, against double, D's padding untouched, and the file round trip.
// train.sh builds it with the backend's objects and runs it (a few seconds).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_ops.hpp"
#include "device_copy.hpp"
#include "lt_tune.hpp"
#include "lt_tune_access.hpp"
#include "trident/ops/ops.hpp"

namespace emu {
int lt_last_algo();
std::uint64_t lt_matmuls_with(int algo_id);
}  // namespace emu

namespace {

using trident::ops::Ops;
using trident::ops::Precision;
using Access = trident::ops::cuda::LtTuneAccess;
using H = std::vector<std::uint16_t>;
using V = std::vector<float>;

int bad = 0;
std::string sci(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2e", x);
  return b;
}
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "BAD ", what.c_str());
  if (!ok) bad++;
}

std::uint16_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float widen(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr int N = 24, IN = 40, OUT = 16;  // OUT: aux's leading dimension, a multiple of 8

struct Inputs {
  H x16, w16, aux16;
  V bias, residual;
};
Inputs make_inputs() {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Inputs in;
  for (int i = 0; i < N * IN; i++) in.x16.push_back(bits(nd(rng)));
  for (int i = 0; i < IN * OUT; i++) in.w16.push_back(bits(0.2f * nd(rng)));
  for (int i = 0; i < N * OUT; i++) in.aux16.push_back(bits(nd(rng)));
  for (int i = 0; i < OUT; i++) in.bias.push_back(nd(rng));
  for (int i = 0; i < N * OUT; i++) in.residual.push_back(nd(rng));
  return in;
}

// Every product kind once on a fresh backend; all outputs, as fp32 (bf16 widened), in order.
struct Outputs {
  std::vector<V> v;
  std::vector<int> algos;
  V residual_after;  // the out-of-place C after its product
};
Outputs run_all(const Inputs& in) {
  auto o = trident::ops::make_ops("cuda", 1, Precision::bf16);
  Dev<std::uint16_t> x(*o, in.x16), w(*o, in.w16), aux(*o, in.aux16);
  Dev<float> bias(*o, in.bias), residual(*o, in.residual);
  Dev<std::uint16_t> d16(*o, H(std::size_t(N) * OUT, 0)), aux_out(*o, H(std::size_t(N) * OUT, 0));
  Dev<float> d32(*o, V(std::size_t(N) * OUT, 0.0f)), inplace(*o, in.residual),
      bgrad(*o, V(OUT, 0.0f));
  Outputs r;
  const auto widened = [](const H& h) {
    V v;
    for (std::uint16_t b : h) v.push_back(widen(b));
    return v;
  };
  bool ran = true;
  // bf16 D + fp32 bias (c_attn, c_fc without GELU)
  ran &= Access::bias_lt(*o, d16.p, true, nullptr, x.p, w.p, bias.p, N, IN, OUT, 0, nullptr, nullptr);
  r.v.push_back(widened(d16.host()));
  // fp32 D + bias + residual, out of place (the fused block's c_projs)
  ran &= Access::bias_lt(*o, d32.p, false, residual.p, x.p, w.p, bias.p, N, IN, OUT, 0, nullptr,
                         nullptr);
  r.v.push_back(d32.host());
  r.residual_after = residual.host();
  // the same in place: D = C, beta = 1 (no bias: a plan of its own)
  ran &= Access::bias_lt(*o, inplace.p, false, inplace.p, x.p, w.p, nullptr, N, IN, OUT, 0,
                         nullptr, nullptr);
  r.v.push_back(inplace.host());
  // GELU_AUX_BIAS: D = gelu(xw + b), aux = xw + b
  ran &= Access::bias_lt(*o, d16.p, true, nullptr, x.p, w.p, bias.p, N, IN, OUT, 1, aux_out.p,
                         nullptr);
  r.v.push_back(widened(d16.host()));
  r.v.push_back(widened(aux_out.host()));
  // DGELU_BGRAD: D = xw * gelu'(aux), bias gradient = D's column sums
  ran &= Access::bias_lt(*o, d16.p, true, nullptr, x.p, w.p, nullptr, N, IN, OUT, 2, aux.p,
                         bgrad.p);
  r.v.push_back(widened(d16.host()));
  r.v.push_back(bgrad.host());
  check(ran, "every product ran through cuBLASLt (no plan declined)");
  r.algos = Access::algos(*o);
  return r;  // the backend's destructor says its tuning line
}

bool same(const Outputs& a, const Outputs& b) {
  if (a.v.size() != b.v.size()) return false;
  for (std::size_t i = 0; i < a.v.size(); i++)
    if (a.v[i].size() != b.v[i].size() ||
        std::memcmp(a.v[i].data(), b.v[i].data(), a.v[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}
bool all_algos(const Outputs& r, int id) {
  if (r.algos.size() != 5) return false;
  for (int a : r.algos)
    if (a != id) return false;
  return true;
}
std::string ids(const Outputs& r) {
  std::string s;
  for (int a : r.algos) s += std::to_string(a) + " ";
  return s;
}

// The double-precision oracle of the accumulating products: residual + x w (+ bias).
void check_accumulating(const Inputs& in, const Outputs& r, const std::string& label) {
  double worst_out = 0, worst_in = 0;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < OUT; j++) {
      double p = 0;
      for (int k = 0; k < IN; k++)
        p += double(widen(in.x16[std::size_t(i) * IN + k])) * widen(in.w16[std::size_t(k) * OUT + j]);
      const std::size_t at = std::size_t(i) * OUT + j;
      const double c = in.residual[at];
      worst_out = std::max(worst_out, std::fabs(r.v[1][at] - (c + p + in.bias[std::size_t(j)])));
      worst_in = std::max(worst_in, std::fabs(r.v[2][at] - (c + p)));
    }
  check(worst_out < 1e-4, label + ": out-of-place D = C + xw + b against double (" +
                              sci(worst_out) + ")");
  check(worst_in < 1e-4,
        label + ": in-place D = C + xw against double, the product added once (" +
            sci(worst_in) + ")");
  check(std::memcmp(r.residual_after.data(), in.residual.data(), in.residual.size() * 4) == 0,
        label + ": the out-of-place C is left as it was");
}

// Ops::gemm under bf16 (gemm_rm16: cublasGemmEx untuned, gemm_lt16's tuned cuBLASLt plans) in
// the four transpose cases, padded leading dimensions, alpha 0.5, beta 0 and 1 (C = D, in place:
// a tuning run into it would add the product again). Results in order, and the worst error
// against double on the bf16-rounded operands.
struct GemmCase {
  bool ta, tb;
  float beta;
};
const GemmCase kGemms[] = {{false, false, 0.0f}, {false, true, 1.0f}, {true, false, 1.0f},
                           {true, true, 0.0f}};
std::vector<V> run_gemms(double& worst) {
  auto o = trident::ops::make_ops("cuda", 1, Precision::bf16);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int m = 12, n = 20, k = 28, pad = 3;
  std::vector<V> out;
  worst = 0;
  for (const GemmCase& g : kGemms) {
    const int lda = (g.ta ? m : k) + pad, ldb = (g.tb ? k : n) + pad, ldc = n + pad;
    V a(std::size_t(g.ta ? k : m) * lda), b(std::size_t(g.tb ? n : k) * ldb), c(std::size_t(m) * ldc);
    for (float& x : a) x = widen(bits(nd(rng)));  // bf16 values: the oracle sees what the GPU does
    for (float& x : b) x = widen(bits(nd(rng)));
    for (float& x : c) x = nd(rng);
    Dev<float> da(*o, a), db(*o, b), dc(*o, c);
    o->gemm(g.ta, g.tb, m, n, k, 0.5f, da.p, lda, db.p, ldb, g.beta, dc.p, ldc);
    out.push_back(dc.host());
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double p = 0;
        for (int l = 0; l < k; l++)
          p += double(g.ta ? a[std::size_t(l) * lda + i] : a[std::size_t(i) * lda + l]) *
               (g.tb ? b[std::size_t(j) * ldb + l] : b[std::size_t(l) * ldb + j]);
        const std::size_t at = std::size_t(i) * ldc + j;
        worst = std::max(worst, std::fabs(out.back()[at] - (0.5 * p + g.beta * c[at])));
      }
  }
  return out;
}

// gemm_rm16_to16 in the shapes the fused blocks give it: NT (GPT-2's c_proj backward, dres16
// [n, C] @ w[Ca, C]^T), NN (Llama's o and down, dres16 @ w[C, F]), and TN; pad: added to each
// leading dimension. With fp32_first each runs after a gemm_rm16 (fp32 D, beta 0) of the same
// shape on the same operands with an fp32 D as aligned as the bf16 one: a plan key without the
// D bit would hand that fp32-D plan to the bf16 D. Returns every bf16 D whole (padding
// included, which must keep its fill), the worst relative error against double, and whether
// the two Ds' alignments (256-byte) matched so that such a collision was possible.
struct To16Case {
  bool ta, tb;
  int m, n, k, pad;
};
const To16Case kTo16[] = {{false, true, 24, 32, 40, 0}, {false, true, 24, 32, 40, 8},
                          {false, false, 24, 48, 32, 0}, {false, false, 24, 48, 32, 5},
                          {true, false, 16, 24, 40, 3}};
constexpr int kTo16Cases = int(sizeof(kTo16) / sizeof(kTo16[0]));
constexpr std::uint16_t kFill = 0x40e0;  // 7.0 in bf16: D's padding before and after
struct To16Run {
  std::vector<H> d;
  std::vector<int> algos;
  double worst = 0;
  bool aligned_alike = true;
  bool threw = false;
};
To16Run run_to16(bool fp32_first) {
  auto o = trident::ops::make_ops("cuda", 1, Precision::bf16);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  To16Run r;
  for (const To16Case& g : kTo16) {
    const int ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k, br = g.tb ? g.n : g.k,
              bc = g.tb ? g.k : g.n;
    const int lda = ac + g.pad, ldb = bc + g.pad, ldc = g.n + g.pad;
    H a(std::size_t(ar) * lda), b(std::size_t(br) * ldb);
    for (auto& x : a) x = bits(nd(rng));
    for (auto& x : b) x = bits(0.3f * nd(rng));
    Dev<std::uint16_t> da(*o, a), db(*o, b), dc(*o, H(std::size_t(g.m) * ldc, kFill));
    Dev<float> d32(*o, V(std::size_t(g.m) * ldc, 0.0f));
    const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 256; };
    r.aligned_alike = r.aligned_alike && at(d32.p) == 0 && at(dc.p) == 0;
    try {
      if (fp32_first)
        Access::gemm_rm16(*o, g.ta, g.tb, g.m, g.n, g.k, 1.0f, da.p, lda, db.p, ldb, 0.0f, d32.p,
                          ldc);
      Access::gemm_rm16_to16(*o, g.ta, g.tb, g.m, g.n, g.k, da.p, lda, db.p, ldb, dc.p, ldc);
    } catch (const std::exception& e) {
      std::printf("     threw: %s\n", e.what());
      r.threw = true;
    }
    r.d.push_back(dc.host());
    const H& d = r.d.back();
    for (int i = 0; i < g.m; i++)
      for (int j = 0; j < ldc; j++) {
        const std::uint16_t got = d[std::size_t(i) * ldc + j];
        if (j >= g.n) {  // padding
          if (got != kFill) r.worst = std::max(r.worst, 1e9);
          continue;
        }
        double p = 0;
        for (int l = 0; l < g.k; l++)
          p += double(widen(g.ta ? a[std::size_t(l) * lda + i] : a[std::size_t(i) * lda + l])) *
               widen(g.tb ? b[std::size_t(j) * ldb + l] : b[std::size_t(l) * ldb + j]);
        const double err = std::fabs(double(widen(got)) - p) / std::max(std::fabs(p), 1e-3);
        r.worst = std::max(r.worst, std::isnan(err) ? 1e9 : err);
      }
  }
  r.algos = Access::algos(*o);
  return r;
}
bool same_to16(const To16Run& a, const To16Run& b) {
  if (a.d.size() != b.d.size()) return false;
  for (std::size_t i = 0; i < a.d.size(); i++)
    if (a.d[i] != b.d[i]) return false;
  return true;
}
// The largest bf16 ulp-distance between two runs' Ds (how far a broken variant lands).
int to16_ulps(const To16Run& a, const To16Run& b) {
  int worst = 0;
  for (std::size_t i = 0; i < a.d.size() && i < b.d.size(); i++)
    for (std::size_t j = 0; j < a.d[i].size() && j < b.d[i].size(); j++)
      worst = std::max(worst, std::abs(int(std::int16_t(a.d[i][j])) - int(std::int16_t(b.d[i][j]))));
  return worst;
}
bool all_ids(const std::vector<int>& algos, std::size_t count, int id) {
  if (algos.size() != count) return false;
  for (int a : algos)
    if (a != id) return false;
  return true;
}
std::string ids(const std::vector<int>& algos) {
  std::string s;
  for (int a : algos) s += std::to_string(a) + " ";
  return s;
}
// The file's entries whose key (fields 3..7) is a gemm_lt16 one (bit 62) with bf16 D (bit 29).
int count_to16_entries(const std::string& file) {
  std::ifstream f(file);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string device;
    long long version = 0, key[5] = {};
    fields >> device >> version;
    for (auto& k : key) fields >> k;
    n += (key[4] >> 62 & 1) && (key[4] >> 29 & 1);
  }
  return n;
}

int count_entries(const std::string& file) {
  std::ifstream f(file);
  std::string line;
  int n = 0;
  while (std::getline(f, line))
    if (!line.empty() && line[0] != '#') n++;
  return n;
}
std::uint64_t candidate_runs(int id) { return emu::lt_matmuls_with(id); }

}  // namespace

int main() {
  const Inputs in = make_inputs();
  unsetenv("TRIDENT_CUDA_LT_TUNE");
  unsetenv("TRIDENT_EMU_LT_SLOW_ALGO");
  unsetenv("TRIDENT_EMU_LT_INVALID_ALGO");
  const std::uint64_t runs12 = candidate_runs(12), runs13 = candidate_runs(13);
  const Outputs ref = run_all(in);
  check(all_algos(ref, 11), "untuned: every plan on the heuristic's first (11): " + ids(ref));
  check(candidate_runs(12) == runs12 && candidate_runs(13) == runs13,
        "untuned: no other candidate ran");
  check_accumulating(in, ref, "untuned");

  setenv("TRIDENT_CUDA_LT_TUNE", "1", 1);
  setenv("TRIDENT_EMU_LT_SLOW_ALGO", "11,12", 1);
  const Outputs tuned = run_all(in);
  check(all_algos(tuned, 13), "tuned (11, 12 slow): every plan keeps 13: " + ids(tuned));
  check(same(tuned, ref), "tuned: every output equals the untuned bit for bit");
  check_accumulating(in, tuned, "tuned");

  // the bf16 products without a bias: cublasGemmEx untuned, tuned cuBLASLt plans under the knob
  double worst_plain = 0, worst_tuned = 0;
  unsetenv("TRIDENT_CUDA_LT_TUNE");
  const std::uint64_t lt_before = candidate_runs(11) + candidate_runs(12) + candidate_runs(13);
  const std::vector<V> gemm_plain = run_gemms(worst_plain);
  check(candidate_runs(11) + candidate_runs(12) + candidate_runs(13) == lt_before,
        "gemm untuned: cublasGemmEx (no cuBLASLt matmul)");
  setenv("TRIDENT_CUDA_LT_TUNE", "1", 1);
  const std::uint64_t fast_before = candidate_runs(13);
  const std::vector<V> gemm_tuned = run_gemms(worst_tuned);
  check(candidate_runs(13) >= fast_before + 4 * (1 + trident::ops::cuda::LtTuner::kRuns + 1),
        "gemm tuned: 4 cuBLASLt plans, each timing 13 and then running it");
  bool gemm_same = gemm_plain.size() == gemm_tuned.size();
  for (std::size_t i = 0; gemm_same && i < gemm_plain.size(); i++)
    gemm_same = std::memcmp(gemm_plain[i].data(), gemm_tuned[i].data(), gemm_plain[i].size() * 4) == 0;
  check(gemm_same, "gemm tuned (NN, NT, TN, TT; alpha 0.5; beta 0 and 1 in place): equal to "
                   "cublasGemmEx's bit for bit");
  check(worst_plain < 1e-4 && worst_tuned < 1e-4,
        "gemm against double, the in-place product added once (" + sci(worst_plain) +
            ", " + sci(worst_tuned) + ")");

  // gemm_rm16_to16: cublasGemmEx untuned, bf16-D cuBLASLt plans of their own when tuned
  unsetenv("TRIDENT_CUDA_LT_TUNE");
  const std::uint64_t lt_before16 = candidate_runs(11) + candidate_runs(12) + candidate_runs(13);
  const To16Run to16_plain = run_to16(false);
  check(candidate_runs(11) + candidate_runs(12) + candidate_runs(13) == lt_before16 &&
            to16_plain.algos.empty() && !to16_plain.threw,
        "to16 untuned: cublasGemmEx (no cuBLASLt plan or matmul)");
  check(to16_plain.worst < 1.0 / 256,
        "to16 untuned against double: within bf16's rounding, padding kept (" +
            sci(to16_plain.worst) + ")");
  setenv("TRIDENT_CUDA_LT_TUNE", "1", 1);
  const std::uint64_t fast16 = candidate_runs(13);
  const To16Run to16_tuned = run_to16(true);
  check(to16_tuned.aligned_alike, "to16 tuned: the fp32 and bf16 Ds equally aligned (the keys "
                                  "differ by the D bit only)");
  check(all_ids(to16_tuned.algos, 2 * kTo16Cases, 13),
        "to16 tuned: an fp32-D and a bf16-D plan per shape (" +
            std::to_string(to16_tuned.algos.size()) + " of " + std::to_string(2 * kTo16Cases) +
            "), each on 13: " + ids(to16_tuned.algos));
  check(candidate_runs(13) == fast16 + 2 * kTo16Cases * (1 + trident::ops::cuda::LtTuner::kRuns + 1),
        "to16 tuned: every plan timed 13 and then ran it");
  check(!to16_tuned.threw && same_to16(to16_tuned, to16_plain),
        "to16 tuned (NT, NN, TN; padded): equal to cublasGemmEx's bit for bit (" +
            std::to_string(to16_ulps(to16_tuned, to16_plain)) + " bf16 ulps apart)");
  check(to16_tuned.worst < 1.0 / 256,
        "to16 tuned against double, padding kept (" + sci(to16_tuned.worst) + ")");
  {
    const std::string file16 = "lt_tune_to16.txt";
    std::remove(file16.c_str());
    setenv("TRIDENT_CUDA_LT_TUNE", file16.c_str(), 1);
    const To16Run first16 = run_to16(true);
    check(same_to16(first16, to16_plain) && count_entries(file16) == 2 * kTo16Cases &&
              count_to16_entries(file16) == kTo16Cases,
          "to16 file: same outputs, " + std::to_string(count_entries(file16)) + " entries, " +
              std::to_string(count_to16_entries(file16)) + " with bf16 D (of " +
              std::to_string(2 * kTo16Cases) + ", " + std::to_string(kTo16Cases) + ")");
    setenv("TRIDENT_EMU_LT_SLOW_ALGO", "11,13", 1);  // tuning would now keep 12
    const std::uint64_t runs12_16 = candidate_runs(12);
    const To16Run again16 = run_to16(true);
    check(all_ids(again16.algos, 2 * kTo16Cases, 13) && same_to16(again16, to16_plain) &&
              candidate_runs(12) == runs12_16,
          "to16 file read back: every plan on 13, none timed, outputs unchanged (" +
              ids(again16.algos) + ")");
    setenv("TRIDENT_EMU_LT_SLOW_ALGO", "11,12", 1);
    std::remove(file16.c_str());
  }

  // the file round trip
  const std::string file = "lt_tune_choices.txt";
  std::remove(file.c_str());
  setenv("TRIDENT_CUDA_LT_TUNE", file.c_str(), 1);
  const Outputs first = run_all(in);
  check(all_algos(first, 13) && same(first, ref), "file: tuned as without it");
  check(count_entries(file) == 5, "file: one entry per plan (" +
                                      std::to_string(count_entries(file)) + " of 5)");
  setenv("TRIDENT_EMU_LT_SLOW_ALGO", "11,13", 1);  // tuning would now keep 12
  const std::uint64_t before12 = candidate_runs(12);
  const Outputs again = run_all(in);
  check(all_algos(again, 13) && same(again, ref), "file read back: every plan on 13 (" + ids(again) +
                                                      "), outputs unchanged");
  check(candidate_runs(12) == before12, "file read back: no candidate timed");
  setenv("TRIDENT_EMU_LT_INVALID_ALGO", "13", 1);  // the stored algorithm is gone here
  const Outputs invalid = run_all(in);
  check(all_algos(invalid, 12) && same(invalid, ref),
        "stored algorithm refused by AlgoCheck: tuned again, 12 kept (" + ids(invalid) + ")");
  unsetenv("TRIDENT_EMU_LT_INVALID_ALGO");
  check(count_entries(file) == 5, "file rewritten with the new choices, 5 entries");
  {  // another device's entries and an unreadable line: kept aside, tuned again
    std::ifstream f(file);
    std::stringstream text;
    text << f.rdbuf();
    std::string s = text.str(), out;
    std::istringstream lines(s);
    std::string line;
    while (std::getline(lines, line)) {
      if (!line.empty() && line[0] != '#') line = "other_card" + line.substr(line.find(' '));
      out += line + "\n";
    }
    std::ofstream(file, std::ios::trunc) << out << "not an entry\n";
  }
  setenv("TRIDENT_EMU_LT_SLOW_ALGO", "12,13", 1);
  const Outputs foreign = run_all(in);
  check(all_algos(foreign, 11) && same(foreign, ref),
        "foreign and unreadable entries: tuned again, 11 kept (" + ids(foreign) + ")");
  check(count_entries(file) == 10, "file keeps the other device's 5 entries beside ours 5 (" +
                                       std::to_string(count_entries(file)) + ")");
  std::remove(file.c_str());
  std::printf("lt_tune: %s\n", bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
