// test/unit/ops/cuda/attention_bf16_test.cpp — attention on bf16 activations (CudaOps::
// attention_forward_bf16 / attention_backward_bf16, src/ops/cuda/attention_bf16.cpp), each of
// its three paths, against the CPU backend's fp32 attention on the same bf16 inputs (widened
// exactly); the path that ran is read from the per-op table (TRIDENT_OP_TIMING: the rows
// "attention_forward bf16 cudnn|tc|widened"). Norm as cuda_ops_test.cpp's: ||gpu - cpu||_inf
// <= tol ||cpu||_inf, the gradients against the largest of dq, dk, dv. Output buffers start
// at a pad value beside what the call writes; the pad must stay.
//   tc       bf16 products: out and lse within 2e-2, gradients 3e-2 (the tc flash cases' own);
//   widened  the fp32 kernels between exact widening and bf16 rounding; under fp32 products,
//            with the CPU's backward fed the GPU's out and lse, only the outputs' rounding
//            remains: half an ulp, at most 2^-8 of the largest (5e-3 with fp32's margin);
//   cudnn    bf16 products, 3e-2 (cuDNN's own test's); the backward bit for bit twice.
// Part of trident_unit_ops_cuda (its main() turns cuDNN off; the cuDNN case turns it on).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../../../src/ops/cuda/attention_bf16_access.hpp"
#include "../reference.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/cuda.hpp"
#include "trident/ops/ops.hpp"

namespace trident::test {
namespace {

using ops::Ops;
using ops::Precision;
using ops::cuda::AttentionBf16Access;
using HVec = std::vector<std::uint16_t>;

constexpr std::size_t kMiB = std::size_t(1) << 20;
constexpr float kPad = 0.0078125f;  // 2^-7: exact in bf16, small beside the values

Ops& cpu_ops() {
  static std::unique_ptr<Ops> ops = ops::make_cpu_ops(2);
  return *ops;
}

std::uint16_t bf16_bits(float f) {  // round to nearest even (no NaN here)
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
HVec to_bits(const FVec& x) {
  HVec h(x.size());
  for (std::size_t i = 0; i < x.size(); i++) h[i] = bf16_bits(x[i]);
  return h;
}
FVec widen(const HVec& h) {
  FVec x(h.size());
  for (std::size_t i = 0; i < h.size(); i++) {
    const std::uint32_t u = std::uint32_t(h[i]) << 16;
    std::memcpy(&x[i], &u, 4);
  }
  return x;
}

template <typename T>
class Dev {
 public:
  Dev(Ops& ops, const std::vector<T>& h) : buf_(h.size(), ops.memory()) {
    buf_.memory()->to_device(buf_.data(), h.data(), h.size() * sizeof(T));
  }
  T* get() { return buf_.data(); }
  std::vector<T> host() const {
    std::vector<T> h(buf_.size());
    buf_.memory()->to_host(h.data(), buf_.data(), h.size() * sizeof(T));
    return h;
  }

 private:
  Buffer<T> buf_;
};

::testing::AssertionResult near(const FVec& got, const FVec& want, double tol, double scale = 0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  double ref = 0.0, err = 0.0;
  std::size_t worst = 0;
  bool nan = false;
  for (std::size_t i = 0; i < got.size(); i++) {
    ref = std::max(ref, std::abs(double(want[i])));
    const double e = std::abs(double(got[i]) - double(want[i]));
    if (std::isnan(e)) {
      if (!nan) worst = i;
      nan = true;
    } else if (!nan && e > err) {
      err = e;
      worst = i;
    }
  }
  if (scale > 0) ref = scale;
  if (!nan && err <= tol * ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << (nan ? "NaN; " : "") << "max |gpu - cpu| = " << err << " > " << tol
         << " * max |cpu| = " << tol * ref << "; worst [" << worst << "]: gpu " << got[worst]
         << ", cpu " << want[worst];
}

struct Case {
  int b, t, nh, nkv, hs;
  bool causal;
  bool fused;  // GPT's fused qkv [B, T, 3C] (dq|dk|dv into one dqkv, out ld C); else
               // separate buffers with padded strides (multiples of 8)
};
struct Tol {
  double out, lse, grad;
  bool cpu_backward_from_gpu;  // the CPU's backward from the GPU's out and lse
};

// One forward and backward through the bf16 entry points against the CPU; `twice`: the
// backward again, bit for bit the same.
void check_case(Ops& g, const Case& c, const Tol& tol, bool twice = false) {
  SCOPED_TRACE("b " + std::to_string(c.b) + " t " + std::to_string(c.t) + " nh " +
               std::to_string(c.nh) + " nkv " + std::to_string(c.nkv) + " hs " +
               std::to_string(c.hs) + (c.causal ? "" : " full") + (c.fused ? " fused qkv" : ""));
  Rng r(2701u + unsigned(c.t * 13 + c.nh * 5 + c.nkv + c.hs));
  Ops::AttentionShape s;
  s.b = c.b, s.t = c.t, s.nh = c.nh, s.nkv = c.nkv, s.hs = c.hs, s.causal = c.causal;
  const std::int64_t cq = std::int64_t(c.nh) * c.hs, ckv = std::int64_t(c.nkv) * c.hs;
  const std::size_t rows = std::size_t(c.b) * c.t;
  const int nbuf = c.fused ? 1 : 3;
  std::size_t off[3] = {0, 0, 0};
  HVec in16[3];
  if (c.fused) {
    s.ld_q = s.ld_k = s.ld_v = cq + 2 * ckv;
    s.ld_o = cq;
    in16[0] = to_bits(r.normal(rows * std::size_t(s.ld_q), 1.5));
    off[1] = std::size_t(cq), off[2] = std::size_t(cq + ckv);
  } else {
    s.ld_q = cq + 8, s.ld_k = ckv + 16, s.ld_v = ckv + 8, s.ld_o = cq + 8;
    in16[0] = to_bits(r.normal(rows * std::size_t(s.ld_q), 1.5));
    in16[1] = to_bits(r.normal(rows * std::size_t(s.ld_k), 1.5));
    in16[2] = to_bits(r.normal(rows * std::size_t(s.ld_v)));
  }
  const HVec dout16 = to_bits(r.normal(rows * std::size_t(s.ld_o)));
  FVec in[3];
  for (int x = 0; x < nbuf; x++) in[x] = widen(in16[x]);
  const auto at = [&](auto* bufs, int x) { return bufs[c.fused ? 0 : x].data() + off[x]; };
  const std::size_t lse_n = std::size_t(c.b) * c.nh * c.t;
  // the GPU
  Dev<std::uint16_t> gin[3] = {Dev<std::uint16_t>(g, in16[0]),
                               Dev<std::uint16_t>(g, c.fused ? HVec(1) : in16[1]),
                               Dev<std::uint16_t>(g, c.fused ? HVec(1) : in16[2])};
  Dev<std::uint16_t> gdout(g, dout16), gout(g, HVec(rows * std::size_t(s.ld_o), bf16_bits(kPad)));
  Dev<float> glse(g, FVec(lse_n, kPad));
  const auto gptr = [&](int x) { return gin[c.fused ? 0 : x].get() + off[x]; };
  AttentionBf16Access::forward(g, gout.get(), glse.get(), gptr(0), gptr(1), gptr(2), s);
  std::vector<HVec> first;
  for (int run = 0; run < (twice ? 2 : 1); run++) {
    const std::uint16_t pad = bf16_bits(kPad);
    Dev<std::uint16_t> gg[3] = {Dev<std::uint16_t>(g, HVec(in16[0].size(), pad)),
                                Dev<std::uint16_t>(g, HVec(c.fused ? 1 : in16[1].size(), pad)),
                                Dev<std::uint16_t>(g, HVec(c.fused ? 1 : in16[2].size(), pad))};
    const auto gd = [&](int x) { return gg[c.fused ? 0 : x].get() + off[x]; };
    AttentionBf16Access::backward(g, gd(0), gd(1), gd(2), gdout.get(), gout.get(), glse.get(),
                                  gptr(0), gptr(1), gptr(2), s);
    std::vector<HVec> got;
    for (int x = 0; x < nbuf; x++) got.push_back(gg[x].host());
    if (run == 1) {
      for (int x = 0; x < nbuf; x++)
        EXPECT_TRUE(got[std::size_t(x)] == first[std::size_t(x)])
            << "gradient " << x << " differs between two identical backward calls";
      break;
    }
    first = got;
  }
  const FVec out_gpu = widen(gout.host()), lse_gpu = glse.host();
  // the CPU on the same bf16 inputs
  const FVec dout = widen(dout16);
  FVec out(out_gpu.size(), kPad), lse(lse_n, kPad), grads[3];
  for (int x = 0; x < nbuf; x++) grads[x] = FVec(in[x].size(), kPad);
  cpu_ops().attention_forward(out.data(), lse.data(), at(in, 0), at(in, 1), at(in, 2), s);
  const FVec& ob = tol.cpu_backward_from_gpu ? out_gpu : out;
  const FVec& lb = tol.cpu_backward_from_gpu ? lse_gpu : lse;
  cpu_ops().attention_backward(at(grads, 0), at(grads, 1), at(grads, 2), dout.data(), ob.data(),
                               lb.data(), at(in, 0), at(in, 1), at(in, 2), s);
  EXPECT_TRUE(near(out_gpu, out, tol.out)) << "out";
  EXPECT_TRUE(near(lse_gpu, lse, tol.lse)) << "lse";
  double scale = 0;
  for (int x = 0; x < nbuf; x++)
    for (float v : grads[x]) scale = std::max(scale, std::abs(double(v)));
  for (int x = 0; x < nbuf; x++)
    EXPECT_TRUE(near(widen(first[std::size_t(x)]), grads[x], tol.grad, scale))
        << (c.fused ? "dqkv" : x == 0 ? "dq" : x == 1 ? "dk" : "dv");
}

// A bf16-entry backend with the per-op table on; the table's text once it is destroyed.
struct Timed {
  std::string path;
  std::unique_ptr<Ops> ops;
  Timed(Precision p, const std::string& name) : path(::testing::TempDir() + name) {
    std::remove(path.c_str());
    setenv("TRIDENT_OP_TIMING", path.c_str(), 1);
    ops = ops::make_cuda_ops(p, 1024 * kMiB);
    unsetenv("TRIDENT_OP_TIMING");
  }
  std::string table() {
    ops.reset();
    std::string json;
    if (std::FILE* f = std::fopen(path.c_str(), "r")) {
      for (int ch; (ch = std::fgetc(f)) != EOF;) json += char(ch);
      std::fclose(f);
    }
    return json;
  }
};
bool has_row(const std::string& json, const std::string& row) {
  return json.find("\"" + row + "\"") != std::string::npos;
}

TEST(AttentionBf16, TensorCoreAndWidenedPathsMatchTheCpu) {
  Timed o(Precision::bf16, "attention_bf16_tc.json");  // cuDNN off (main)
  const Tol tc{2e-2, 2e-2, 3e-2, false};
  check_case(*o.ops, {2, 256, 4, 4, 64, true, true}, tc);    // GPT's fused qkv
  check_case(*o.ops, {1, 100, 4, 2, 64, true, false}, tc);   // grouped-query heads
  check_case(*o.ops, {1, 77, 2, 2, 128, true, true}, tc);    // t off every tile
  check_case(*o.ops, {2, 45, 4, 1, 16, false, false}, tc);
  check_case(*o.ops, {1, 1, 2, 2, 32, true, true}, tc);
  // head sizes the tensor-core kernels lack: widened to fp32, rounded back
  check_case(*o.ops, {1, 77, 2, 2, 40, true, true}, tc);
  check_case(*o.ops, {1, 50, 4, 2, 24, true, false}, tc);
  Ops::AttentionShape acc;
  acc.b = 1, acc.t = 4, acc.nh = acc.nkv = 1, acc.hs = 16, acc.ld_q = acc.ld_k = acc.ld_v = 48;
  acc.ld_o = 16, acc.accumulate = true;
  EXPECT_THROW(AttentionBf16Access::backward(*o.ops, nullptr, nullptr, nullptr, nullptr, nullptr,
                                             nullptr, nullptr, nullptr, nullptr, acc),
               Error);
  const std::string json = o.table();
  for (const char* row : {"attention_forward bf16 tc", "attention_backward bf16 tc",
                          "attention_forward bf16 widened", "attention_backward bf16 widened"})
    EXPECT_TRUE(has_row(json, row)) << row << " missing from " << json;
  EXPECT_FALSE(has_row(json, "attention_forward bf16 cudnn")) << json;
}

TEST(AttentionBf16, WidenedUnderFp32IsTheFp32KernelsRounded) {
  Timed o(Precision::fp32, "attention_bf16_fp32.json");
  const Tol widened{5e-3, 1e-5, 5e-3, true};
  check_case(*o.ops, {2, 130, 4, 4, 64, true, true}, widened);
  check_case(*o.ops, {1, 100, 4, 2, 32, false, false}, widened);
  const std::string json = o.table();
  EXPECT_TRUE(has_row(json, "attention_forward bf16 widened")) << json;
  EXPECT_FALSE(has_row(json, "attention_forward bf16 tc")) << json;
}

// cuDNN on the caller's strided bf16 tensors (no copies). Skipped where cuDNN is unavailable,
// unless TRIDENT_TEST_EXPECT_CUDNN=1 (bench/gpu_check.sh: trident_cudnn_probe made its plans).
TEST(AttentionBf16, CudnnPathMatchesTheCpuAndIsDeterministic) {
  const char* setting = std::getenv("TRIDENT_CUDNN");
  const std::string cudnn_setting = setting ? setting : "";
  unsetenv("TRIDENT_CUDNN");
  Timed o(Precision::bf16, "attention_bf16_cudnn.json");
  Ops::AttentionShape gpt2;
  gpt2.b = 1, gpt2.t = 1024, gpt2.nh = gpt2.nkv = 12, gpt2.hs = 64;
  gpt2.ld_q = gpt2.ld_k = gpt2.ld_v = 3 * 768, gpt2.ld_o = 768;
  const std::int64_t bytes = o.ops->fused_attention_bytes(gpt2);  // loads cuDNN
  if (!cudnn_setting.empty()) setenv("TRIDENT_CUDNN", cudnn_setting.c_str(), 1);
  if (bytes <= 0) {
    const char* expect = std::getenv("TRIDENT_TEST_EXPECT_CUDNN");
    if (expect && std::string(expect) == "1")
      FAIL() << "cuDNN attention unavailable (its reason is the line on stderr)";
    GTEST_SKIP() << "cuDNN attention unavailable here (the line on stderr says why)";
  }
  const char* det = std::getenv("TRIDENT_CUDNN_DETERMINISTIC");
  const bool deterministic = !(det && std::string(det) == "0");
  const Tol tol{3e-2, 3e-2, 3e-2, false};
  check_case(*o.ops, {1, 1024, 12, 12, 64, true, true}, tol, deterministic);  // GPT-2 small's
  check_case(*o.ops, {3, 77, 2, 2, 40, true, true}, tol, deterministic);
  check_case(*o.ops, {2, 256, 4, 4, 64, true, false}, tol);
  const std::string json = o.table();
  EXPECT_TRUE(has_row(json, "attention_forward bf16 cudnn") &&
              has_row(json, "attention_backward bf16 cudnn"))
      << "cuDNN took the packed graphs but not the bf16 ones on the caller's strides (the "
         "stderr line and trident_cudnn_probe's 'bf16 fused qkv' sections say why): "
      << json;
}

}  // namespace
}  // namespace trident::test
