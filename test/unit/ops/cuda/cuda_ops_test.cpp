// test/unit/ops/cuda/cuda_ops_test.cpp — every op of the CUDA backend against the CPU
// backend (make_cpu_ops, itself checked against double references and finite differences by
// forward_test/backward_test), in the spirit of ggml's test-backend-ops: one table of
// op x shape, odd shapes (rows and channels not multiples of 32, T not a power of two,
// vocabularies with padding columns and a nonzero shard start), run once per precision.
//
// Norm: for each output tensor, ||gpu - cpu||_inf <= tol * ||cpu||_inf (the largest error
// relative to the largest reference entry; NaN fails), printed with the worst element.
// tol = 0 means bitwise equal (pure data movement, and sums taken in the CPU's order).
//
// Tolerances (fp32: 1e-5 for everything that computes). The tf32 and bf16 ones apply to the
// ops that run matrix products (gemm, linear, attention); every other kernel is fp32 in all
// precisions and is checked once, under fp32. Bounds, for inputs rounded with unit roundoff u
// (tf32: 2^-11 = 4.9e-4; bf16: 2^-8 = 3.9e-3) and fp32 accumulation: each entry of a product
// errs by at most 2u * sum_p |a_p b_p|, and for the random normal inputs here sum_p |a_p b_p|
// is at most about 3 ||C||_inf (k <= 300: 0.64 k against ~4 sqrt(k)). So a product is within
// 6u ||C||_inf: 3e-3 (tf32), 2.3e-2 (bf16) -> tolerances 1e-2 and 3e-2. Attention chains two
// products and a softmax forward (four products backward), and the softmax turns the scores'
// absolute error into a relative error of the probabilities: twice the product tolerance
// (2e-2 tf32, 6e-2 bf16). These are worst-case bounds; typical errors are ~10x smaller.
// A wrong transpose, stride or mask errs by O(1) and fails at any of them.
//
// Without a GPU the binary exits with TRIDENT_SKIP_CODE, which CTest reports as skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../reference.hpp"
#include "trident/core/arena.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/device_memory.hpp"
#include "trident/ops/cuda.hpp"
#include "trident/ops/ops.hpp"
#include "../../../../src/ops/cuda/lt_tune_access.hpp"

#ifndef TRIDENT_SKIP_CODE
#define TRIDENT_SKIP_CODE 77
#endif

namespace trident::test {
namespace {

using ops::Ops;
using ops::Precision;
using IVec = std::vector<std::int32_t>;

// ---- the two backends and device copies ---------------------------------------------------

Ops& cpu() {
  static std::unique_ptr<Ops> ops = ops::make_cpu_ops(2);
  return *ops;
}

constexpr std::size_t kMiB = std::size_t(1) << 20;

// One CUDA backend per precision for the whole run (a cuBLAS handle is slow to create), each
// with an arena of its own that the tables' shapes fit in (the default, 90% of the free
// memory, would leave nothing for the second one).
Ops& gpu(Precision p) {
  static std::array<std::unique_ptr<Ops>, 3> ops;
  auto& o = ops[static_cast<std::size_t>(p)];
  if (!o) o = ops::make_cuda_ops(p, 512 * kMiB);
  return *o;
}

// A device copy of a host vector: a Buffer of the backend's memory(), read back with host().
template <typename T>
class DevVec {
 public:
  DevVec(Ops& ops, const std::vector<T>& h) : buf_(h.size(), ops.memory()) {
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

// ||got - want||_inf <= tol ||want||_inf (see the file comment); with scale > 0,
// <= tol * scale (one norm for a set of outputs).
::testing::AssertionResult near(const FVec& got, const FVec& want, double tol,
                                double scale = 0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  double ref = 0.0, err = 0.0;
  std::size_t worst = 0;
  bool nan = false;
  for (std::size_t i = 0; i < got.size(); i++) {
    ref = std::max(ref, std::abs(double(want[i])));
    const double e = std::abs(double(got[i]) - double(want[i]));
    if (std::isnan(e)) {  // a NaN on either side fails; the first one is reported
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

// ---- the table ----------------------------------------------------------------------------

// tol: what this check allows under the precision being run (see tolerance()).
struct CudaCase {
  std::string name;
  // runs matrix products large enough for the bound in the file comment (k >= 32): also
  // checked under tf32 and bf16. (In a tiny product one entry may nearly cancel, and its
  // rounding error is then large next to ||C||_inf; those shapes run under fp32 only.)
  bool products;
  bool attention;
  std::function<void(Ops& g, double tol)> check;
};
void PrintTo(const CudaCase& c, std::ostream* os) { *os << c.name; }

double tolerance(const CudaCase& c, Precision p) {
  switch (p) {
    case Precision::fp32: return 1e-5;
    case Precision::tf32: return c.attention ? 2e-2 : 1e-2;
    case Precision::bf16: return c.attention ? 6e-2 : 3e-2;
  }
  return 0.0;
}

void check_gemm(Ops& g, double tol, bool ta, bool tb, int m, int n, int k) {
  Rng r(1001u + unsigned(m * 31 + n * 7 + k + (ta ? 3 : 0) + (tb ? 5 : 0)));
  // leading dimensions wider than the matrices: strides must be honoured
  const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
  const FVec a = r.normal(std::size_t(ta ? k : m) * lda);
  const FVec b = r.normal(std::size_t(tb ? n : k) * ldb);
  const FVec c0 = r.normal(std::size_t(m) * ldc);
  FVec c = c0;
  cpu().gemm(ta, tb, m, n, k, 0.7f, a.data(), lda, b.data(), ldb, 0.3f, c.data(), ldc);
  DevVec<float> da(g, a), db(g, b), dc(g, c0);
  g.gemm(ta, tb, m, n, k, 0.7f, da.get(), lda, db.get(), ldb, 0.3f, dc.get(), ldc);
  const FVec got = dc.host();
  EXPECT_TRUE(near(got, c, tol)) << "C";
  // the padding columns of C are not touched
  for (int i = 0; i < m; i++)
    for (int j = n; j < ldc; j++)
      ASSERT_EQ(got[std::size_t(i) * ldc + j], c0[std::size_t(i) * ldc + j]) << "wrote past n";
}

void check_linear_forward(Ops& g, double tol, int n, int in, int out, bool bias) {
  Rng r(1101u + unsigned(n * 7 + in * 3 + out));
  const FVec x = r.normal(std::size_t(n) * in), w = r.normal(std::size_t(in) * out, 0.3);
  const FVec b = r.normal(out);
  FVec y(std::size_t(n) * out, 777.0f);
  cpu().linear_forward(y.data(), x.data(), w.data(), bias ? b.data() : nullptr, n, in, out);
  DevVec<float> dx(g, x), dw(g, w), dbias(g, b), dy(g, FVec(y.size(), 777.0f));
  g.linear_forward(dy.get(), dx.get(), dw.get(), bias ? dbias.get() : nullptr, n, in, out);
  EXPECT_TRUE(near(dy.host(), y, tol)) << "y";
}

void check_linear_backward(Ops& g, double tol, int n, int in, int out) {
  Rng r(1201u + unsigned(n * 7 + in * 3 + out));
  const FVec x = r.normal(std::size_t(n) * in), w = r.normal(std::size_t(in) * out, 0.3);
  const FVec dy = r.normal(std::size_t(n) * out);
  const FVec dw0 = r.normal(w.size()), db0 = r.normal(out);
  FVec dx(x.size(), 777.0f), dw = dw0, db = db0;
  cpu().linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in, out);
  DevVec<float> gx(g, x), gw(g, w), gdy(g, dy), gdx(g, FVec(x.size(), 777.0f)), gdw(g, dw0),
      gdb(g, db0);
  g.linear_backward(gdx.get(), gdw.get(), gdb.get(), gdy.get(), gx.get(), gw.get(), n, in, out);
  EXPECT_TRUE(near(gdx.host(), dx, tol)) << "dx";
  EXPECT_TRUE(near(gdw.host(), dw, tol)) << "dw (+=)";
  // db: fp32 sums in every precision (a GEMV, or under bf16 the dy conversion's column sums)
  EXPECT_TRUE(near(gdb.host(), db, 1e-5)) << "db (+=)";
  // again without dx and db: dw accumulates a second time, db stays
  cpu().linear_backward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out);
  g.linear_backward(nullptr, gdw.get(), nullptr, gdy.get(), gx.get(), gw.get(), n, in, out);
  EXPECT_TRUE(near(gdw.host(), dw, tol)) << "dw after two backwards";
  EXPECT_TRUE(near(gdb.host(), db, 1e-5)) << "db untouched when null";
}

void check_layernorm(Ops& g, double tol, int n, int c) {
  Rng r(1301u + unsigned(n * 5 + c));
  const FVec x = r.normal(std::size_t(n) * c, 2.0, 0.5), w = r.normal(c, 0.2, 1.0);
  const FVec b = r.normal(c, 0.5), dy = r.normal(x.size());
  const FVec dx0 = r.normal(x.size()), dw0 = r.normal(c), db0 = r.normal(c);
  FVec y(x.size()), mean(n), rstd(n), dx = dx0, dw = dw0, db = db0;
  cpu().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  cpu().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), n, c);
  DevVec<float> gx(g, x), gw(g, w), gb(g, b), gdy(g, dy), gy(g, FVec(y.size(), 777.0f)),
      gmean(g, FVec(n, 777.0f)), grstd(g, FVec(n, 777.0f)), gdx(g, dx0), gdw(g, dw0), gdb(g, db0);
  g.layernorm_forward(gy.get(), gmean.get(), grstd.get(), gx.get(), gw.get(), gb.get(), n, c);
  g.layernorm_backward(gdx.get(), gdw.get(), gdb.get(), gdy.get(), gx.get(), gw.get(), gmean.get(),
                       grstd.get(), n, c);
  EXPECT_TRUE(near(gy.host(), y, tol)) << "y";
  EXPECT_TRUE(near(gmean.host(), mean, tol)) << "mean";
  EXPECT_TRUE(near(grstd.host(), rstd, tol)) << "rstd";
  // C = 1: the exact dx increment is 0 (dn - mean(dn) = 0), but a fused multiply-add on either
  // side keeps the product's rounding error, times rstd = 1/sqrt(eps) = 316: ~1e-5 relative,
  // measured on the CPU backend (test/unit/ops/cuda/emulate). Only the forward is compared.
  if (c == 1) return;
  EXPECT_TRUE(near(gdx.host(), dx, tol)) << "dx (+=)";
  EXPECT_TRUE(near(gdw.host(), dw, tol)) << "dw (+=)";
  EXPECT_TRUE(near(gdb.host(), db, tol)) << "db (+=)";
  // deterministic: a second backward on the device gives what the first plus itself gives
  g.layernorm_backward(gdx.get(), gdw.get(), gdb.get(), gdy.get(), gx.get(), gw.get(), gmean.get(),
                       grstd.get(), n, c);
  cpu().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), n, c);
  EXPECT_TRUE(near(gdw.host(), dw, tol)) << "dw after two backwards";
}

void check_rmsnorm(Ops& g, double tol, int n, int c) {
  Rng r(1351u + unsigned(n * 5 + c));
  const FVec x = r.normal(std::size_t(n) * c, 2.0, 0.5), w = r.normal(c, 0.2, 1.0);
  const FVec dy = r.normal(x.size()), dx0 = r.normal(x.size()), dw0 = r.normal(c);
  FVec y(x.size()), rstd(n), dx = dx0, dw = dw0;
  cpu().rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, 1e-5f);
  cpu().rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c);
  DevVec<float> gx(g, x), gw(g, w), gdy(g, dy), gy(g, FVec(y.size(), 777.0f)),
      grstd(g, FVec(n, 777.0f)), gdx(g, dx0), gdw(g, dw0);
  g.rmsnorm_forward(gy.get(), grstd.get(), gx.get(), gw.get(), n, c, 1e-5f);
  g.rmsnorm_backward(gdx.get(), gdw.get(), gdy.get(), gx.get(), gw.get(), grstd.get(), n, c);
  EXPECT_TRUE(near(gy.host(), y, tol)) << "y";
  EXPECT_TRUE(near(grstd.host(), rstd, tol)) << "rstd";
  EXPECT_TRUE(near(gdx.host(), dx, tol)) << "dx (+=)";
  EXPECT_TRUE(near(gdw.host(), dw, tol)) << "dw (+=)";
}

void check_rope(Ops& g, double tol, int b, int t, int ld, int heads, int hs, int pos0, float theta) {
  Rng r(1361u + unsigned(b * 1000 + t * 10 + ld + heads + hs + pos0));
  const FVec x = r.normal(std::size_t(b) * t * ld), dy = r.normal(x.size());
  FVec y = x, dx = dy;
  cpu().rope_forward(y.data(), b, t, ld, heads, hs, pos0, theta);
  cpu().rope_backward(dx.data(), b, t, ld, heads, hs, pos0, theta);
  DevVec<float> gy(g, x), gdx(g, dy);
  g.rope_forward(gy.get(), b, t, ld, heads, hs, pos0, theta);
  g.rope_backward(gdx.get(), b, t, ld, heads, hs, pos0, theta);
  EXPECT_TRUE(near(gy.host(), y, tol)) << "rotated (columns past the heads untouched: exact)";
  EXPECT_TRUE(near(gdx.host(), dx, tol)) << "backward";
}

void check_swiglu(Ops& g, double tol, int n, int f) {
  Rng r(1371u + unsigned(n * 3 + f));
  FVec gu = r.normal(std::size_t(n) * 2 * f, 3.0);
  const float special[] = {0.0f, 1e-4f, -1e-4f, 1.0f, -1.0f, 20.0f, -20.0f, 90.0f, -90.0f};
  for (std::size_t i = 0; i < sizeof special / sizeof special[0] && i < std::size_t(f); i++) gu[i] = special[i];
  const FVec dy = r.normal(std::size_t(n) * f);
  FVec y(dy.size()), dgu(gu.size());
  cpu().swiglu_forward(y.data(), gu.data(), n, f);
  cpu().swiglu_backward(dgu.data(), gu.data(), dy.data(), n, f);
  DevVec<float> ggu(g, gu), gdy(g, dy), gy(g, FVec(y.size(), 777.0f)), gdgu(g, FVec(gu.size(), 777.0f));
  g.swiglu_forward(gy.get(), ggu.get(), n, f);
  g.swiglu_backward(gdgu.get(), ggu.get(), gdy.get(), n, f);
  EXPECT_TRUE(near(gy.host(), y, tol)) << "y";
  EXPECT_TRUE(near(gdgu.host(), dgu, tol)) << "dgu";
}

void check_decode(Ops& g, double tol, int b, int s, int nh, int nkv, int hs) {
  Rng r(1381u + unsigned(b * 100 + s + nh * 7 + nkv));
  const int c = nh * hs, ckv = nkv * hs;
  const std::int64_t ld_kv = 2 * ckv + 3, kv_batch = (s + 2) * ld_kv, ld_q = c + 5;
  const FVec q = r.normal(std::size_t(b) * ld_q), kv = r.normal(std::size_t(b) * kv_batch, 1.5);
  const std::size_t scratch = std::size_t(ops::Ops::decode_scratch_floats(b, nh, s));
  FVec out(std::size_t(b) * (c + 1), 0.0f), sc(scratch);
  cpu().attention_decode(out.data(), sc.data(), q.data(), kv.data(), kv.data() + ckv, b, s, nh, nkv,
                         hs, ld_q, ld_kv, kv_batch, c + 1);
  DevVec<float> gq(g, q), gkv(g, kv), gout(g, FVec(out.size(), 0.0f)), gsc(g, FVec(scratch));
  g.attention_decode(gout.get(), gsc.get(), gq.get(), gkv.get(), gkv.get() + ckv, b, s, nh, nkv, hs,
                     ld_q, ld_kv, kv_batch, c + 1);
  EXPECT_TRUE(near(gout.host(), out, tol)) << "out (padding columns untouched: exact)";
}

void check_gelu(Ops& g, double tol, std::int64_t n) {
  Rng r(1401u + unsigned(n));
  FVec x = r.normal(std::size_t(n), 3.0);
  const float special[] = {0.0f, 1e-4f, -1e-4f, 1.0f, -1.0f, 3.0f, -3.0f, 10.0f, -10.0f, 20.0f, -20.0f};
  for (std::size_t i = 0; i < sizeof special / sizeof special[0] && i < x.size(); i++) x[i] = special[i];
  const FVec dy = r.normal(x.size());
  FVec y(x.size()), dx(x.size());
  cpu().gelu_forward(y.data(), x.data(), n);
  cpu().gelu_backward(dx.data(), x.data(), dy.data(), n);
  DevVec<float> gx(g, x), gdy(g, dy), gy(g, FVec(x.size(), 777.0f)), gdx(g, FVec(x.size(), 777.0f));
  g.gelu_forward(gy.get(), gx.get(), n);
  g.gelu_backward(gdx.get(), gx.get(), gdy.get(), n);
  EXPECT_TRUE(near(gy.host(), y, tol)) << "y";
  EXPECT_TRUE(near(gdx.host(), dx, tol)) << "dx";
}

void check_elementwise(Ops& g, double, std::int64_t n) {
  Rng r(1501u + unsigned(n));
  const FVec a = r.normal(std::size_t(n)), b = r.normal(std::size_t(n));
  FVec sum(a.size()), scaled = a;
  cpu().add(sum.data(), a.data(), b.data(), n);
  cpu().scale(scaled.data(), -0.37f, n);
  DevVec<float> ga(g, a), gb(g, b), gy(g, FVec(a.size(), 777.0f)), gs(g, a), gf(g, a), gc(g, b);
  g.add(gy.get(), ga.get(), gb.get(), n);
  g.scale(gs.get(), -0.37f, n);
  g.fill(gf.get(), 2.5f, n);
  g.copy(gc.get(), ga.get(), n);
  EXPECT_TRUE(near(gy.host(), sum, 0.0)) << "add";
  EXPECT_TRUE(near(gs.host(), scaled, 0.0)) << "scale";
  EXPECT_TRUE(near(gf.host(), FVec(a.size(), 2.5f), 0.0)) << "fill";
  EXPECT_TRUE(near(gc.host(), a, 0.0)) << "copy";
  g.add(ga.get(), ga.get(), gb.get(), n);  // y aliases a
  EXPECT_TRUE(near(ga.host(), sum, 0.0)) << "add in place";
}

// The bf16 storage conversions (the model's stash under bf16): bit for bit the CPU's,
// specials included (ties to even, overflow to inf, NaN kept, signed zero).
void check_bf16(Ops& g, double, std::int64_t n) {
  Rng r(1551u + unsigned(n));
  FVec x = r.normal(std::size_t(n), 30.0);
  const float special[] = {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.4028235e38f,
                           -std::numeric_limits<float>::infinity(), std::nanf(""), 1e-40f};
  for (std::size_t i = 0; i < sizeof special / sizeof special[0] && i < x.size(); i++) x[i] = special[i];
  std::vector<std::uint16_t> bits(x.size());
  FVec back(x.size());
  cpu().to_bf16(bits.data(), x.data(), n);
  cpu().from_bf16(back.data(), bits.data(), n);
  DevVec<float> gx(g, x), gback(g, FVec(x.size(), 777.0f));
  DevVec<std::uint16_t> gbits(g, std::vector<std::uint16_t>(x.size(), 0x1234));
  g.to_bf16(gbits.get(), gx.get(), n);
  EXPECT_EQ(gbits.host(), bits) << "to_bf16";
  DevVec<std::uint16_t> gin(g, bits);
  g.from_bf16(gback.get(), gin.get(), n);
  const FVec got = gback.host();
  EXPECT_EQ(std::memcmp(got.data(), back.data(), got.size() * sizeof(float)), 0) << "from_bf16";
}

void check_sum_squares(Ops& g, double, std::int64_t n) {
  Rng r(1601u + unsigned(n));
  const FVec x = r.normal(std::size_t(n), 3.0);
  const double want = cpu().sum_squares(x.data(), n);
  DevVec<float> gx(g, x);
  const double got = g.sum_squares(gx.get(), n);
  // products of floats are exact in double; only the order of the additions differs (both
  // sum short runs and then partials: ~1e-14 apart; 1e-10 still catches a lost element)
  EXPECT_NEAR(got, want, 1e-10 * want) << "sum of squares";
  EXPECT_EQ(g.sum_squares(gx.get(), n), got) << "not deterministic";
}

void check_attention(Ops& g, double tol, int b, int t, int c, int nh) {
  Rng r(1701u + unsigned(b * 1000 + t * 10 + c + nh));
  const FVec qkv = r.normal(std::size_t(b) * t * 3 * c), dout = r.normal(std::size_t(b) * t * c);
  FVec out(dout.size()), att(std::size_t(b) * nh * t * t), dqkv(qkv.size()), datt(att.size());
  cpu().attention_naive_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
  cpu().attention_naive_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), b, t, c, nh);
  DevVec<float> gqkv(g, qkv), gdout(g, dout), gout(g, FVec(out.size(), 777.0f)),
      gatt(g, FVec(att.size(), 777.0f)), gdqkv(g, FVec(qkv.size(), 777.0f)),
      gdatt(g, FVec(att.size(), 777.0f));
  g.attention_naive_forward(gout.get(), gatt.get(), gqkv.get(), b, t, c, nh);
  g.attention_naive_backward(gdqkv.get(), gdatt.get(), gdout.get(), gqkv.get(), gatt.get(), b, t, c, nh);
  const FVec got_att = gatt.host();
  EXPECT_TRUE(near(gout.host(), out, tol)) << "out";
  EXPECT_TRUE(near(got_att, att, tol)) << "att";
  EXPECT_TRUE(near(gdqkv.host(), dqkv, tol)) << "dqkv";
  std::size_t above = 0;
  for (int bh = 0; bh < b * nh; bh++)
    for (int i = 0; i < t; i++)
      for (int j = i + 1; j < t; j++) above += got_att[(std::size_t(bh) * t + i) * t + j] != 0.0f;
  EXPECT_EQ(above, 0u) << "att above the diagonal must be exactly 0";
}

double max_abs(const FVec& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(double(x)));
  return m;
}

// Flash attention's outputs against the CPU's. The fp32 kernels (fp32, tf32, and head sizes
// the tensor-core kernels do not take): out and lse within tol, the gradients within 10 tol.
// Under bf16 with hs a multiple of 16 up to 128 the backend runs flash_attention_tc.cu (bf16
// operands, fp32 accumulation), checked as test/unit/ops/cuda/emulate does: out and lse
// within 2e-2, the gradients within 3e-2 of the largest of dq, dk, dv (2e-2 on the stand-in,
// whose worst case is 1.0%; t = 1's dq and dk are 0 but for rounding); and out must err more
// than fp32 would, or the kernels did not run.
bool tensor_core_attention(const Ops& g, int hs) {
  return g.precision() == Precision::bf16 && hs % 16 == 0 && hs <= 128;
}
void expect_attention(bool tc, double tol, const FVec& gout, const FVec& out, const FVec& glse,
                      const FVec& lse, const FVec& gdq, const FVec& dq, const FVec& gdk,
                      const FVec& dk, const FVec& gdv, const FVec& dv) {
  if (!tc) {
    EXPECT_TRUE(near(gout, out, tol)) << "out";
    EXPECT_TRUE(near(glse, lse, tol)) << "lse";
    EXPECT_TRUE(near(gdq, dq, 10 * tol)) << "dq";
    EXPECT_TRUE(near(gdk, dk, 10 * tol)) << "dk";
    EXPECT_TRUE(near(gdv, dv, 10 * tol)) << "dv";
    return;
  }
  const double grads = std::max({max_abs(dq), max_abs(dk), max_abs(dv)});
  EXPECT_TRUE(near(gout, out, 2e-2)) << "out (tensor cores)";
  EXPECT_TRUE(near(glse, lse, 2e-2)) << "lse (tensor cores)";
  EXPECT_TRUE(near(gdq, dq, 3e-2, grads)) << "dq (tensor cores)";
  EXPECT_TRUE(near(gdk, dk, 3e-2, grads)) << "dk (tensor cores)";
  EXPECT_TRUE(near(gdv, dv, 3e-2, grads)) << "dv (tensor cores)";
  EXPECT_FALSE(near(gout, out, 1e-5)) << "out as exact as fp32: the tensor-core kernels did not run";
}

// Flash attention: q, k, v with padded strides and grouped-query heads, against the CPU
// backend's flash path.
// tc: 1 or 0 says which kernels g runs (TRIDENT_CUDA_ATTENTION); -1: by precision and hs.
void check_flash(Ops& g, double tol, int b, int t, int nh, int nkv, int hs, bool causal = true,
                 int tc = -1) {
  Rng r(1801u + unsigned(t * 13 + nh * 5 + nkv + hs));
  Ops::AttentionShape s;
  s.b = b, s.t = t, s.nh = nh, s.nkv = nkv, s.hs = hs;
  s.causal = causal;
  s.ld_q = nh * hs + 3, s.ld_k = nkv * hs + 1, s.ld_v = nkv * hs + 2, s.ld_o = nh * hs + 1;
  const std::size_t rows = std::size_t(b) * t;
  const FVec q = r.normal(rows * s.ld_q), k = r.normal(rows * s.ld_k), v = r.normal(rows * s.ld_v),
             dout = r.normal(rows * s.ld_o);
  FVec out(rows * s.ld_o, 0.0f), lse(std::size_t(b) * nh * t), dq(q.size(), 0.0f),
      dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  cpu().attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  cpu().attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                           q.data(), k.data(), v.data(), s);
  DevVec<float> gq(g, q), gk(g, k), gv(g, v), gdout(g, dout), gout(g, FVec(out.size(), 0.0f)),
      glse(g, FVec(lse.size(), 777.0f)), gdq(g, FVec(q.size(), 0.0f)), gdk(g, FVec(k.size(), 0.0f)),
      gdv(g, FVec(v.size(), 0.0f));
  g.attention_forward(gout.get(), glse.get(), gq.get(), gk.get(), gv.get(), s);
  g.attention_backward(gdq.get(), gdk.get(), gdv.get(), gdout.get(), gout.get(), glse.get(),
                       gq.get(), gk.get(), gv.get(), s);
  expect_attention(tc < 0 ? tensor_core_attention(g, hs) : tc == 1, tol, gout.host(), out,
                   glse.host(), lse, gdq.host(), dq, gdk.host(), dk, gdv.host(), dv);
}

// Ring attention's blocks (model/ring_attention.cpp): a sequence of 2t rows as blocks of t
// through batch and lse strides; the second half's queries against the first half's keys
// (full) and its own (causal), merged by attention_merge (its first merge into lse = -inf),
// and the backward of each block accumulating into dq, dk, dv from the merged out and lse;
// against the CPU backend doing the same.
void check_flash_blocks(Ops& g, double tol, int b, int t, int nh, int nkv, int hs) {
  Rng r(1901u + unsigned(t * 13 + nh * 5 + nkv + hs));
  Ops::AttentionShape s;
  s.b = b, s.t = t, s.nh = nh, s.nkv = nkv, s.hs = hs;
  s.ld_q = nh * hs + 1, s.ld_k = nkv * hs + 2, s.ld_v = nkv * hs, s.ld_o = nh * hs + 3;
  s.bs_q = 2 * t * s.ld_q, s.bs_k = 2 * t * s.ld_k, s.bs_v = 2 * t * s.ld_v;
  s.bs_o = 2 * t * s.ld_o, s.bs_lse = 2 * t;
  s.accumulate = true;
  Ops::AttentionShape full = s;
  full.causal = false;
  const std::size_t rows = std::size_t(b) * 2 * t;
  const FVec q = r.normal(rows * s.ld_q), k = r.normal(rows * s.ld_k), v = r.normal(rows * s.ld_v),
             dout = r.normal(rows * s.ld_o), grad0 = r.normal(rows * s.ld_q);
  const std::int64_t tq = t * s.ld_q, tk = t * s.ld_k, tv = t * s.ld_v, to = t * s.ld_o;
  const float ninf = -std::numeric_limits<float>::infinity();
  auto run = [&](Ops& o, float* out, float* lse, float* part, float* plse, float* dq, float* dk,
                 float* dv, const float* q_, const float* k_, const float* v_, const float* do_) {
    o.fill(lse, ninf, std::int64_t(b) * nh * 2 * t);
    for (int half = 0; half < 2; half++) {  // query half: its blocks merged into lse = -inf
      for (int kb = 0; kb <= half; kb++) {
        const Ops::AttentionShape& sh = kb == half ? s : full;
        o.attention_forward(part + half * to, plse + half * t, q_ + half * tq, k_ + kb * tk,
                            v_ + kb * tv, sh);
        o.attention_merge(out + half * to, lse + half * t, part + half * to, plse + half * t, sh);
      }
    }
    for (int half = 0; half < 2; half++)
      for (int kb = 0; kb <= half; kb++)
        o.attention_backward(dq + half * tq, dk + kb * tk, dv + kb * tv, do_ + half * to,
                             out + half * to, lse + half * t, q_ + half * tq, k_ + kb * tk,
                             v_ + kb * tv, kb == half ? s : full);
  };
  FVec out(rows * s.ld_o, 0.0f), lse(std::size_t(b) * nh * 2 * t), part(out.size()),
      plse(lse.size()), dq = grad0, dk(k.size(), 0.5f), dv(v.size(), -0.5f);
  run(cpu(), out.data(), lse.data(), part.data(), plse.data(), dq.data(), dk.data(), dv.data(),
      q.data(), k.data(), v.data(), dout.data());
  DevVec<float> gq(g, q), gk(g, k), gv(g, v), gdout(g, dout), gout(g, FVec(out.size(), 0.0f)),
      glse(g, FVec(lse.size(), 0.0f)), gpart(g, FVec(out.size(), 0.0f)),
      gplse(g, FVec(lse.size(), 0.0f)), gdq(g, grad0), gdk(g, FVec(k.size(), 0.5f)),
      gdv(g, FVec(v.size(), -0.5f));
  run(g, gout.get(), glse.get(), gpart.get(), gplse.get(), gdq.get(), gdk.get(), gdv.get(),
      gq.get(), gk.get(), gv.get(), gdout.get());
  expect_attention(tensor_core_attention(g, hs), tol, gout.host(), out, glse.host(), lse,
                   gdq.host(), dq, gdk.host(), dk, gdv.host(), dv);
}

void check_embedding(Ops& g, double tol, int n, int c, int vocab_start, int v) {
  Rng r(1801u + unsigned(n + c));
  const FVec wte = r.normal(std::size_t(v) * c), dx = r.normal(std::size_t(n) * c);
  IVec tok(n);
  for (int i = 0; i < n; i++) tok[i] = r.integer(vocab_start - 3, vocab_start + v + 2);
  tok[0] = vocab_start - 1;
  if (n > 3) tok[1] = tok[2] = vocab_start + 1;  // a repeated token: two atomic adds
  if (n > 4) tok[3] = vocab_start + v, tok[4] = vocab_start + v - 1;
  const FVec dwte0 = r.normal(wte.size());
  FVec x(std::size_t(n) * c), dwte = dwte0;
  cpu().embedding_forward(x.data(), tok.data(), wte.data(), n, c, vocab_start, v);
  cpu().embedding_backward(dwte.data(), dx.data(), tok.data(), n, c, vocab_start, v);
  FVec guarded0 = dwte0;
  guarded0.resize(dwte0.size() + std::size_t(c), 5.0f);  // one row past the shard
  DevVec<float> gwte(g, wte), gdx(g, dx), gx(g, FVec(x.size(), 777.0f)), gdwte(g, guarded0);
  DevVec<std::int32_t> gtok(g, tok);
  g.embedding_forward(gx.get(), gtok.get(), gwte.get(), n, c, vocab_start, v);
  g.embedding_backward(gdwte.get(), gdx.get(), gtok.get(), n, c, vocab_start, v);
  EXPECT_TRUE(near(gx.host(), x, 0.0)) << "x (a copy)";
  FVec got = gdwte.host();
  for (std::size_t j = dwte0.size(); j < got.size(); j++) ASSERT_EQ(got[j], 5.0f) << "wrote past row v";
  got.resize(dwte0.size());
  // Grouped by row, each row's adds in token order: the CPU's bits. The baseline's atomicAdd
  // scatter adds a repeated row's gradients in no fixed order.
  const bool atomic = std::getenv("TRIDENT_CUDA_BASELINE") != nullptr;
  EXPECT_TRUE(near(got, dwte, atomic ? tol : 0.0)) << "dwte (+=)";
}

void check_position(Ops& g, double, int b, int t, int c) {
  Rng r(1901u + unsigned(b + t + c));
  const FVec x0 = r.normal(std::size_t(b) * t * c), wpe = r.normal(std::size_t(t) * c);
  const FVec dx = r.normal(x0.size()), dwpe0 = r.normal(wpe.size());
  FVec x = x0, dwpe = dwpe0;
  cpu().position_forward(x.data(), wpe.data(), b, t, c);
  cpu().position_backward(dwpe.data(), dx.data(), b, t, c);
  DevVec<float> gx(g, x0), gwpe(g, wpe), gdx(g, dx), gdwpe(g, dwpe0);
  g.position_forward(gx.get(), gwpe.get(), b, t, c);
  g.position_backward(gdwpe.get(), gdx.get(), b, t, c);
  EXPECT_TRUE(near(gx.host(), x, 0.0)) << "x += wpe (one rounding)";
  EXPECT_TRUE(near(gdwpe.host(), dwpe, 0.0)) << "dwpe (+=, the CPU's order of additions)";
}

void check_xent(Ops& g, double tol, int n, int ld, int v_valid, int vocab_start, double offset,
                double sd) {
  Rng r(2001u + unsigned(n + ld + v_valid));
  FVec logits = r.normal(std::size_t(n) * ld, sd, offset);
  for (int i = 0; i < n; i++)
    for (int j = v_valid; j < ld; j++) logits[std::size_t(i) * ld + j] = 1e4f;  // padding
  IVec tg(n);
  for (int i = 0; i < n; i++) tg[i] = vocab_start + r.integer(0, v_valid - 1);
  tg[0] = vocab_start - 1;  // targets in other shards
  if (n > 1) tg[1] = vocab_start + v_valid;
  const float scale = 1.0f / static_cast<float>(n);
  FVec row_max(n), sumexp(n), tl(n), loss(n), grad = logits;
  cpu().xent_row_max(row_max.data(), logits.data(), n, ld, v_valid);
  cpu().xent_sumexp(sumexp.data(), tl.data(), logits.data(), row_max.data(), tg.data(), n, ld,
                    v_valid, vocab_start);
  cpu().xent_loss(loss.data(), row_max.data(), sumexp.data(), tl.data(), n);
  cpu().xent_backward(grad.data(), row_max.data(), sumexp.data(), tg.data(), n, ld, v_valid,
                      vocab_start, scale);
  DevVec<float> gl(g, logits), gmax(g, FVec(n, 777.0f)), gsum(g, FVec(n, 777.0f)),
      gtl(g, FVec(n, 777.0f)), gloss(g, FVec(n, 777.0f));
  DevVec<std::int32_t> gtg(g, tg);
  g.xent_row_max(gmax.get(), gl.get(), n, ld, v_valid);
  g.xent_sumexp(gsum.get(), gtl.get(), gl.get(), gmax.get(), gtg.get(), n, ld, v_valid, vocab_start);
  g.xent_loss(gloss.get(), gmax.get(), gsum.get(), gtl.get(), n);
  g.xent_backward(gl.get(), gmax.get(), gsum.get(), gtg.get(), n, ld, v_valid, vocab_start, scale);
  EXPECT_TRUE(near(gmax.host(), row_max, 0.0)) << "row_max";
  EXPECT_TRUE(near(gtl.host(), tl, 0.0)) << "target_logit";
  EXPECT_TRUE(near(gsum.host(), sumexp, tol)) << "sumexp";
  // the loss is log(sumexp) + max - target: compare its error to the loss's own scale
  EXPECT_TRUE(near(gloss.host(), loss, tol)) << "loss";
  const FVec got = gl.host();
  EXPECT_TRUE(near(got, grad, tol)) << "scale * (softmax - onehot)";
  std::size_t pad = 0;
  for (int i = 0; i < n; i++)
    for (int j = v_valid; j < ld; j++) pad += got[std::size_t(i) * ld + j] != 0.0f;
  EXPECT_EQ(pad, 0u) << "padding columns must get exactly 0";
}

// The one-pass forward (online max and sum of exponentials) against the CPU's three passes;
// `ascending` makes every row increase, so each thread's running max grows at every element.
void check_xent_forward(Ops& g, double tol, int n, int ld, int v_valid, int vocab_start,
                        double offset, double sd, bool ascending) {
  Rng r(2003u + unsigned(n + ld + v_valid));
  FVec logits = r.normal(std::size_t(n) * ld, sd, offset);
  if (ascending)
    for (int i = 0; i < n; i++)
      for (int j = 0; j < ld; j++) logits[std::size_t(i) * ld + j] = 0.01f * float(j) + float(i);
  for (int i = 0; i < n; i++)
    for (int j = v_valid; j < ld; j++) logits[std::size_t(i) * ld + j] = 1e4f;  // padding
  IVec tg(n);
  for (int i = 0; i < n; i++) tg[i] = vocab_start + r.integer(0, v_valid - 1);
  tg[0] = vocab_start - 1;  // a target in another shard
  FVec row_max(n), sumexp(n), tl(n), loss(n);
  cpu().xent_forward(loss.data(), row_max.data(), sumexp.data(), tl.data(), logits.data(),
                     tg.data(), n, ld, v_valid, vocab_start);
  DevVec<float> gl(g, logits), gmax(g, FVec(n, 777.0f)), gsum(g, FVec(n, 777.0f)),
      gtl(g, FVec(n, 777.0f)), gloss(g, FVec(n, 777.0f));
  DevVec<std::int32_t> gtg(g, tg);
  g.xent_forward(gloss.get(), gmax.get(), gsum.get(), gtl.get(), gl.get(), gtg.get(), n, ld,
                 v_valid, vocab_start);
  EXPECT_TRUE(near(gmax.host(), row_max, 0.0)) << "row_max";
  EXPECT_TRUE(near(gtl.host(), tl, 0.0)) << "target_logit";
  EXPECT_TRUE(near(gsum.host(), sumexp, tol)) << "sumexp";
  EXPECT_TRUE(near(gloss.host(), loss, tol)) << "loss";
  EXPECT_TRUE(near(gl.host(), logits, 0.0)) << "the logits are only read";
}

// A vocabulary in two shards, as under TP (vocab_parallel_xent_forward): each shard's one-pass
// stats, the global max (here on the host), each shard's sum rescaled on the device, summed;
// against the CPU's unsharded forward. Shard 1 holds one row's max far above the rest.
void check_xent_shards(Ops& g, double tol, int n, int v0, int v1) {
  const int ld = v0 + v1;
  Rng r(2005u + unsigned(n + ld));
  FVec logits = r.normal(std::size_t(n) * ld, 2.0, 1.0);
  logits[std::size_t(n / 2) * ld + v0 + v1 / 2] = 40.0f;
  IVec tg(n);
  for (int i = 0; i < n; i++) tg[i] = r.integer(0, ld - 1);
  FVec row_max(n), sumexp(n), tl(n), loss(n);
  cpu().xent_forward(loss.data(), row_max.data(), sumexp.data(), tl.data(), logits.data(),
                     tg.data(), n, ld, ld, 0);
  DevVec<float> gl(g, logits), m0(g, FVec(n, 7.0f)), s0(g, FVec(n, 7.0f)), t0(g, FVec(n, 7.0f)),
      m1(g, FVec(n, 7.0f)), s1(g, FVec(n, 7.0f)), t1(g, FVec(n, 7.0f));
  DevVec<std::int32_t> gtg(g, tg);
  g.xent_shard_stats(m0.get(), s0.get(), t0.get(), gl.get(), gtg.get(), n, ld, v0, 0);
  g.xent_shard_stats(m1.get(), s1.get(), t1.get(), gl.get() + v0, gtg.get(), n, ld, v1, v0);
  const FVec hm0 = m0.host(), hm1 = m1.host();
  FVec gm(n);
  for (int i = 0; i < n; i++) gm[i] = std::max(hm0[i], hm1[i]);
  DevVec<float> ggm(g, gm);
  g.xent_rescale_sumexp(s0.get(), m0.get(), ggm.get(), n);
  g.xent_rescale_sumexp(s1.get(), m1.get(), ggm.get(), n);
  const FVec hs0 = s0.host(), hs1 = s1.host(), ht0 = t0.host(), ht1 = t1.host();
  FVec ss(n), ts(n);
  for (int i = 0; i < n; i++) ss[i] = hs0[i] + hs1[i], ts[i] = ht0[i] + ht1[i];
  EXPECT_TRUE(near(gm, row_max, 0.0)) << "global max";
  EXPECT_TRUE(near(ts, tl, 0.0)) << "target logit (one shard holds it)";
  EXPECT_TRUE(near(ss, sumexp, tol)) << "sum of exponentials at the global max";
}

void check_adamw(Ops& g, double tol, std::int64_t n) {
  Rng r(2101u + unsigned(n));
  const FVec p0 = r.normal(std::size_t(n)), m0 = r.normal(std::size_t(n), 0.1);
  const FVec v0 = r.uniform(std::size_t(n), 0.0, 0.01);
  FVec p = p0, m = m0, v = v0;
  DevVec<float> gp(g, p0), gm(g, m0), gv(g, v0);
  for (int step = 1; step <= 3; step++) {
    const FVec grad = r.normal(std::size_t(n), 0.5);
    const float bc1 = 1.0f - std::pow(0.9f, float(step)), bc2 = 1.0f - std::pow(0.95f, float(step));
    cpu().adamw(p.data(), grad.data(), m.data(), v.data(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2);
    DevVec<float> gg(g, grad);
    g.adamw(gp.get(), gg.get(), gm.get(), gv.get(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2);
  }
  EXPECT_TRUE(near(gp.host(), p, tol)) << "p";
  EXPECT_TRUE(near(gm.host(), m, tol)) << "m";
  EXPECT_TRUE(near(gv.host(), v, tol)) << "v";
}

// The optimizer step over many tensors: segments of odd counts at scattered offsets of one
// parameter buffer and one shard buffer (as AdamW::step's), weight decay on every other one.
struct OptimizerLayout {
  std::vector<std::int64_t> counts, at_p, at_s;
  std::int64_t np = 5, nsh = 3;
  explicit OptimizerLayout(std::vector<std::int64_t> c) : counts(std::move(c)) {
    for (std::size_t i = 0; i < counts.size(); i++) {
      at_p.push_back(np), at_s.push_back(nsh);
      np += counts[i] + 2 + std::int64_t(i % 3), nsh += counts[i] + 1;
    }
  }
};

// sum_squares_spans against sum_squares span by span on the same backend (bit for bit: the
// same reductions) and against the CPU's (1e-10, as check_sum_squares).
void check_sum_squares_spans(Ops& g, double, std::vector<std::int64_t> counts) {
  const OptimizerLayout l(std::move(counts));
  Rng r(1611u + unsigned(l.nsh));
  const FVec x = r.normal(std::size_t(l.nsh), 2.0);
  DevVec<float> gx(g, x);
  std::vector<Ops::Span> spans, host_spans;
  for (std::size_t i = 0; i < l.counts.size(); i++) {
    spans.push_back({gx.get() + l.at_s[i], l.counts[i]});
    host_spans.push_back({x.data() + l.at_s[i], l.counts[i]});
  }
  std::vector<double> got(spans.size(), -1), want(spans.size(), -1);
  g.sum_squares_spans(spans, got.data());
  cpu().sum_squares_spans(host_spans, want.data());
  for (std::size_t i = 0; i < spans.size(); i++) {
    EXPECT_EQ(got[i], g.sum_squares(spans[i].x, spans[i].n)) << "span " << i;
    EXPECT_NEAR(got[i], want[i], 1e-10 * want[i]) << "span " << i;
  }
  g.sum_squares_spans(spans, want.data());
  EXPECT_EQ(got, want) << "not deterministic";
}

// adamw_segments over three steps (the clip's scale in the second) against scale + adamw per
// segment on the same backend (bit for bit) and against the CPU's adamw_segments (tol).
void check_adamw_segments(Ops& g, double tol, std::vector<std::int64_t> counts) {
  const OptimizerLayout l(std::move(counts));
  Rng r(2111u + unsigned(l.np));
  const FVec p0 = r.normal(std::size_t(l.np)), m0 = r.normal(std::size_t(l.nsh), 0.1);
  const FVec v0 = r.uniform(std::size_t(l.nsh), 0.0, 0.01);
  FVec p = p0, m = m0, v = v0;
  DevVec<float> gp(g, p0), gm(g, m0), gv(g, v0), lp(g, p0), lm(g, m0), lv(g, v0);
  for (int step = 1; step <= 3; step++) {
    const float clip = step == 2 ? 0.37f : 1.0f;
    const FVec grad = r.normal(std::size_t(l.nsh), 0.5);
    FVec hg = grad;
    DevVec<float> gg(g, grad), lg(g, grad);
    const float bc1 = 1.0f - std::pow(0.9f, float(step)), bc2 = 1.0f - std::pow(0.95f, float(step));
    std::vector<Ops::AdamWSegment> host, fused;
    for (std::size_t i = 0; i < l.counts.size(); i++) {
      const std::int64_t n = l.counts[i], a = l.at_p[i], s = l.at_s[i];
      const bool decay = i % 2 == 0;
      host.push_back({p.data() + a, hg.data() + s, m.data() + s, v.data() + s, n, decay});
      fused.push_back({gp.get() + a, gg.get() + s, gm.get() + s, gv.get() + s, n, decay});
      if (clip != 1.0f) g.scale(lg.get() + s, clip, n);
      g.adamw(lp.get() + a, lg.get() + s, lm.get() + s, lv.get() + s, n, 6e-4f, 0.9f, 0.95f,
              1e-8f, decay ? 0.1f : 0.0f, bc1, bc2);
    }
    cpu().adamw_segments(host, clip, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2);
    g.adamw_segments(fused, clip, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2);
  }
  const FVec got_p = gp.host();
  EXPECT_TRUE(near(got_p, lp.host(), 0.0)) << "p: one launch against the per-segment ones";
  EXPECT_TRUE(near(gm.host(), lm.host(), 0.0)) << "m";
  EXPECT_TRUE(near(gv.host(), lv.host(), 0.0)) << "v";
  EXPECT_TRUE(near(got_p, p, tol)) << "p against the CPU";
  EXPECT_TRUE(near(gm.host(), m, tol)) << "m against the CPU";
  EXPECT_TRUE(near(gv.host(), v, tol)) << "v against the CPU";
  EXPECT_GT(std::abs(got_p[std::size_t(l.at_p[0])] - p0[std::size_t(l.at_p[0])]), 0.0f);
}

std::vector<CudaCase> cases() {
  std::vector<CudaCase> cs;
  const int gemm_shapes[][3] = {{5, 7, 11}, {1, 1, 1}, {129, 70, 300}, {64, 33, 257}};
  for (auto& s : gemm_shapes)
    for (int t = 0; t < 4; t++) {
      const bool ta = t & 1, tb = t & 2;
      cs.push_back({name_of("gemm_%s%s_m%d_n%d_k%d", ta ? "T" : "N", tb ? "T" : "N", s[0], s[1], s[2]),
                    s[2] >= 32, false, [=](Ops& g, double tol) { check_gemm(g, tol, ta, tb, s[0], s[1], s[2]); }});
    }
  const int linear_shapes[][3] = {{5, 7, 11}, {1, 3, 1}, {129, 70, 300}, {100, 256, 48}};
  for (auto& s : linear_shapes) {
    for (bool bias : {true, false})
      cs.push_back({name_of("linear_forward_n%d_in%d_out%d_%s", s[0], s[1], s[2], bias ? "bias" : "nobias"),
                    s[1] >= 32, false, [=](Ops& g, double tol) { check_linear_forward(g, tol, s[0], s[1], s[2], bias); }});
    cs.push_back({name_of("linear_backward_n%d_in%d_out%d", s[0], s[1], s[2]), s[1] >= 32, false,
                  [=](Ops& g, double tol) { check_linear_backward(g, tol, s[0], s[1], s[2]); }});
  }
  const int att_shapes[][4] = {{2, 7, 12, 3}, {1, 1, 4, 1}, {1, 40, 16, 2}, {3, 33, 8, 1}, {2, 67, 16, 4}, {1, 97, 24, 3}};
  for (auto& s : att_shapes)
    cs.push_back({name_of("attention_b%d_t%d_c%d_nh%d", s[0], s[1], s[2], s[3]), true, true,
                  [=](Ops& g, double tol) { check_attention(g, tol, s[0], s[1], s[2], s[3]); }});
  // (bf16: hs 64, 128, 32, 16 on the tensor cores, t = 1 and t off their tiles)
  const int flash_shapes[][5] = {{2, 37, 3, 3, 24}, {1, 256, 12, 12, 64}, {2, 1000, 4, 2, 128},
                                 {1, 45, 6, 1, 7}, {1, 1, 2, 1, 64}, {2, 130, 4, 2, 64},
                                 {1, 1024, 12, 12, 64}, {2, 77, 2, 2, 32}};
  for (auto& s : flash_shapes)
    cs.push_back({name_of("flash_b%d_t%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]), true, true,
                  [=](Ops& g, double tol) { check_flash(g, tol, s[0], s[1], s[2], s[3], s[4]); }});
  const int full_shapes[][5] = {{2, 37, 3, 3, 24}, {1, 70, 4, 2, 16}, {1, 100, 4, 2, 64},
                                {1, 45, 2, 2, 128}};
  for (auto& s : full_shapes)
    cs.push_back({name_of("flash_full_b%d_t%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]), true, true,
                  [=](Ops& g, double tol) { check_flash(g, tol, s[0], s[1], s[2], s[3], s[4], false); }});
  const int block_shapes[][5] = {{2, 12, 3, 3, 8}, {1, 37, 4, 2, 16}, {1, 75, 4, 2, 64}};
  for (auto& s : block_shapes)
    cs.push_back({name_of("flash_blocks_b%d_t%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]), true, true,
                  [=](Ops& g, double tol) { check_flash_blocks(g, tol, s[0], s[1], s[2], s[3], s[4]); }});
  const int ln_shapes[][2] = {{5, 12}, {3, 1}, {7, 33}, {300, 130}, {1000, 768}};
  for (auto& s : ln_shapes)
    cs.push_back({name_of("layernorm_n%d_c%d", s[0], s[1]), false, false,
                  [=](Ops& g, double tol) { check_layernorm(g, tol, s[0], s[1]); }});
  const int rms_shapes[][2] = {{5, 12}, {3, 1}, {7, 33}, {300, 130}, {1000, 768}};
  for (auto& s : rms_shapes)
    cs.push_back({name_of("rmsnorm_n%d_c%d", s[0], s[1]), false, false,
                  [=](Ops& g, double tol) { check_rmsnorm(g, tol, s[0], s[1]); }});
  struct RopeShape { int b, t, ld, heads, hs, pos0; float theta; };
  const RopeShape rope_shapes[] = {{2, 7, 36, 6, 4, 0, 10000.0f}, {3, 33, 50, 3, 16, 4093, 10000.0f},
                                   {4, 130, 200, 6, 32, 0, 500000.0f}, {2, 1, 384, 8, 32, 1000, 10000.0f}};
  for (auto s : rope_shapes)
    cs.push_back({name_of("rope_b%d_t%d_ld%d_h%d_hs%d_p%d", s.b, s.t, s.ld, s.heads, s.hs, s.pos0), false, false,
                  [=](Ops& g, double tol) { check_rope(g, tol, s.b, s.t, s.ld, s.heads, s.hs, s.pos0, s.theta); }});
  const int decode_shapes[][5] = {{1, 1, 2, 2, 4}, {2, 9, 4, 2, 8}, {3, 37, 6, 1, 4}, {1, 1000, 12, 4, 64}};
  for (auto& s : decode_shapes)
    cs.push_back({name_of("decode_b%d_s%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]), false, false,
                  [=](Ops& g, double tol) { check_decode(g, tol, s[0], s[1], s[2], s[3], s[4]); }});
  const int swiglu_shapes[][2] = {{3, 11}, {1, 1}, {130, 172}, {64, 2048}};
  for (auto& s : swiglu_shapes)
    cs.push_back({name_of("swiglu_n%d_f%d", s[0], s[1]), false, false,
                  [=](Ops& g, double tol) { check_swiglu(g, tol, s[0], s[1]); }});
  for (std::int64_t n : {11, 40001})
    cs.push_back({name_of("gelu_n%lld", (long long)n), false, false,
                  [=](Ops& g, double tol) { check_gelu(g, tol, n); }});
  for (std::int64_t n : {7, 40001})
    cs.push_back({name_of("add_scale_fill_copy_n%lld", (long long)n), false, false,
                  [=](Ops& g, double tol) { check_elementwise(g, tol, n); }});
  for (std::int64_t n : {1, 8, 40001})
    cs.push_back({name_of("bf16_convert_n%lld", (long long)n), false, false,
                  [=](Ops& g, double tol) { check_bf16(g, tol, n); }});
  for (std::int64_t n : {1, 1000, 3000017})
    cs.push_back({name_of("sum_squares_n%lld", (long long)n), false, false,
                  [=](Ops& g, double tol) { check_sum_squares(g, tol, n); }});
  // the last: 4100 tokens on 3 rows and out of range (long rows, many blocks)
  const int emb_shapes[][4] = {
      {9, 5, 10, 6}, {7, 12, 0, 20}, {300, 130, 1000, 57}, {4100, 40, 5, 3}};
  for (auto& s : emb_shapes)
    cs.push_back({name_of("embedding_n%d_c%d_vs%d_v%d", s[0], s[1], s[2], s[3]), false, false,
                  [=](Ops& g, double tol) { check_embedding(g, tol, s[0], s[1], s[2], s[3]); }});
  const int pos_shapes[][3] = {{2, 7, 12}, {4, 65, 130}};
  for (auto& s : pos_shapes)
    cs.push_back({name_of("position_b%d_t%d_c%d", s[0], s[1], s[2]), false, false,
                  [=](Ops& g, double tol) { check_position(g, tol, s[0], s[1], s[2]); }});
  cs.push_back({"xent_n5_ld13_v11_vs20", false, false,
                [](Ops& g, double tol) { check_xent(g, tol, 5, 13, 11, 20, 0.0, 1.0); }});
  cs.push_back({"xent_n64_ld1008_v1000_offset80", false, false,
                [](Ops& g, double tol) { check_xent(g, tol, 64, 1008, 1000, 0, 80.0, 5.0); }});
  cs.push_back({"xent_n3_ld50304_v50257_vs50257", false, false,
                [](Ops& g, double tol) { check_xent(g, tol, 3, 50304, 50257, 50257, -30.0, 3.0); }});
  cs.push_back({"xent_forward_n5_ld13_v11_vs20", false, false,
                [](Ops& g, double tol) { check_xent_forward(g, tol, 5, 13, 11, 20, 0.0, 1.0, false); }});
  cs.push_back({"xent_forward_n64_ld50304_v50257_offset80", false, false,
                [](Ops& g, double tol) { check_xent_forward(g, tol, 64, 50304, 50257, 0, 80.0, 5.0, false); }});
  cs.push_back({"xent_forward_n4_ld5000_v4999_ascending", false, false,
                [](Ops& g, double tol) { check_xent_forward(g, tol, 4, 5000, 4999, 7, 0.0, 1.0, true); }});
  cs.push_back({"xent_shards_n6_v700_5", false, false,
                [](Ops& g, double tol) { check_xent_shards(g, tol, 6, 700, 5); }});
  cs.push_back({"xent_shards_n16_v25152_25152", false, false,
                [](Ops& g, double tol) { check_xent_shards(g, tol, 16, 25152, 25152); }});
  for (std::int64_t n : {5, 100003})
    cs.push_back({name_of("adamw_n%lld", (long long)n), false, false,
                  [=](Ops& g, double tol) { check_adamw(g, tol, n); }});
  const std::vector<std::int64_t> segment_counts[] = {{1, 0, 7, 4096, 4097, 255, 300001, 3},
                                                      {768}};
  for (const auto& c : segment_counts) {
    cs.push_back({name_of("sum_squares_spans_%zu", c.size()), false, false,
                  [=](Ops& g, double tol) { check_sum_squares_spans(g, tol, c); }});
    cs.push_back({name_of("adamw_segments_%zu", c.size()), false, false,
                  [=](Ops& g, double tol) { check_adamw_segments(g, tol, c); }});
  }
  return cs;
}

std::vector<CudaCase> product_cases() {
  std::vector<CudaCase> cs;
  for (auto& c : cases())
    if (c.products) cs.push_back(c);
  return cs;
}

class CudaVsCpu : public ::testing::TestWithParam<std::tuple<CudaCase, Precision>> {};

TEST_P(CudaVsCpu, Matches) {
  const auto& [c, p] = GetParam();
  c.check(gpu(p), tolerance(c, p));
}

std::string case_name(const ::testing::TestParamInfo<CudaVsCpu::ParamType>& info) {
  return std::get<0>(info.param).name + "_" + ops::precision_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Fp32, CudaVsCpu,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(Precision::fp32)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Fast, CudaVsCpu,
                         ::testing::Combine(::testing::ValuesIn(product_cases()),
                                            ::testing::Values(Precision::tf32, Precision::bf16)),
                         case_name);

// ---- the backend's own contract ----------------------------------------------------------

TEST(CudaOps, NameAndDevice) {
  Ops& g = gpu(Precision::bf16);
  EXPECT_EQ(g.device(), Device::cuda);
  EXPECT_NE(g.name().find("bf16"), std::string::npos) << g.name();
  auto o = ops::make_cuda_ops(Precision::tf32, 64 * kMiB);
  EXPECT_NE(o->name().find("tf32"), std::string::npos) << o->name();
  EXPECT_THROW(ops::make_ops("cpu", 1, Precision::bf16), Error) << "the CPU has fp32 only";
}

// Which flash kernels run, read when the backend is made: TRIDENT_CUDA_ATTENTION=scalar and
// TRIDENT_CUDA_BASELINE=1 keep bf16 on the fp32 kernels (fp32's tolerance holds), =tc puts
// fp32 on the tensor cores; another value is refused.
TEST(CudaOps, AttentionKernelChoice) {
  struct Unset {
    ~Unset() {
      unsetenv("TRIDENT_CUDA_ATTENTION");
      unsetenv("TRIDENT_CUDA_BASELINE");
    }
  } unset;
  setenv("TRIDENT_CUDA_ATTENTION", "scalar", 1);
  check_flash(*ops::make_cuda_ops(Precision::bf16, 64 * kMiB), 1e-5, 2, 100, 2, 2, 64, true, 0);
  setenv("TRIDENT_CUDA_ATTENTION", "tc", 1);
  check_flash(*ops::make_cuda_ops(Precision::fp32, 64 * kMiB), 1e-5, 2, 100, 2, 2, 64, true, 1);
  setenv("TRIDENT_CUDA_ATTENTION", "tensor", 1);
  EXPECT_THROW(ops::make_cuda_ops(Precision::bf16, 64 * kMiB), Error);
  unsetenv("TRIDENT_CUDA_ATTENTION");
  setenv("TRIDENT_CUDA_BASELINE", "1", 1);
  check_flash(*ops::make_cuda_ops(Precision::bf16, 64 * kMiB), 1e-5, 2, 100, 2, 2, 64, true, 0);
}

TEST(CudaOps, SelectDevice) {
  const int n = ops::cuda_device_count();
  EXPECT_EQ(ops::cuda_select_device(0), 0);
  EXPECT_EQ(ops::cuda_select_device(n), 0);  // wraps around
  EXPECT_EQ(ops::cuda_select_device(2 * n + 1), 1 % n);
  EXPECT_THROW(ops::cuda_select_device(-1), Error);
  ops::cuda_select_device(0);
}

// ---- cuDNN attention ------------------------------------------------------------------------

// cuDNN's fused flash attention (src/ops/cuda/cudnn_attention.hpp), which a bf16 backend tries
// first for causal attention: against the CPU backend's flash path (bf16 product tolerance;
// padded strides: the bf16 copies and the widened outputs honour them) at GPT-2 small's heads
// and T 1024 and at an odd small shape; the backward bit for bit the same twice (the default
// deterministic graph); and proof that cuDNN ran: its rows in the per-op table
// (TRIDENT_OP_TIMING). Skipped where cuDNN is unavailable, unless TRIDENT_TEST_EXPECT_CUDNN=1
// (bench/gpu_check.sh sets it when trident_cudnn_probe made both plans): then it fails.
TEST(CudnnAttention, MatchesTheCpuIsDeterministicAndRuns) {
  const std::string table = ::testing::TempDir() + "cudnn_attention_ops.json";
  std::remove(table.c_str());
  setenv("TRIDENT_OP_TIMING", table.c_str(), 1);
  // main() turns cuDNN off for the other tests; this backend loads it (at its first question)
  const std::string cudnn_setting = std::getenv("TRIDENT_CUDNN") ? std::getenv("TRIDENT_CUDNN") : "";
  unsetenv("TRIDENT_CUDNN");
  auto o = ops::make_cuda_ops(Precision::bf16, 1024 * kMiB);
  unsetenv("TRIDENT_OP_TIMING");
  Ops::AttentionShape gpt2;  // GPT-2 small's attention at B 8: what trident trains
  gpt2.b = 8, gpt2.t = 1024, gpt2.nh = gpt2.nkv = 12, gpt2.hs = 64;
  gpt2.ld_q = gpt2.ld_k = gpt2.ld_v = 3 * 768, gpt2.ld_o = 768;
  const std::int64_t bytes = o->fused_attention_bytes(gpt2);
  if (!cudnn_setting.empty()) setenv("TRIDENT_CUDNN", cudnn_setting.c_str(), 1);
  std::printf("cuDNN attention scratch at B 8, T 1024, NH 12, hs 64: %lld bytes\n",
              static_cast<long long>(bytes));
  if (bytes <= 0) {
    const char* expect = std::getenv("TRIDENT_TEST_EXPECT_CUDNN");
    if (expect && std::string(expect) == "1")
      FAIL() << "cuDNN attention unavailable (its reason is the line on stderr)";
    GTEST_SKIP() << "cuDNN attention unavailable here (the line on stderr says why)";
  }
  const double tol = 3e-2;
  check_flash(*o, tol, 1, 1024, 12, 12, 64);
  check_flash(*o, tol, 3, 77, 2, 2, 40);
  {
    Rng r(4242u);
    Ops::AttentionShape s;
    s.b = 2, s.t = 256, s.nh = 4, s.nkv = 4, s.hs = 64;
    s.ld_q = s.ld_k = s.ld_v = s.ld_o = 3 * s.nh * s.hs;  // views of a fused qkv
    const std::size_t n = std::size_t(s.b) * s.t * s.ld_q;
    DevVec<float> q(*o, r.normal(n)), k(*o, r.normal(n)), v(*o, r.normal(n)),
        dout(*o, r.normal(n)), out(*o, FVec(n, 0.0f)),
        lse(*o, FVec(std::size_t(s.b) * s.nh * s.t, 0.0f));
    o->attention_forward(out.get(), lse.get(), q.get(), k.get(), v.get(), s);
    std::array<FVec, 3> first;
    for (int run = 0; run < 2; run++) {
      DevVec<float> dq(*o, FVec(n, 0.0f)), dk(*o, FVec(n, 0.0f)), dv(*o, FVec(n, 0.0f));
      o->attention_backward(dq.get(), dk.get(), dv.get(), dout.get(), out.get(), lse.get(),
                            q.get(), k.get(), v.get(), s);
      const std::array<FVec, 3> got = {dq.host(), dk.host(), dv.host()};
      if (run == 0) first = got;
      const char* det = std::getenv("TRIDENT_CUDNN_DETERMINISTIC");
      if (run == 1 && !(det && std::string(det) == "0"))
        for (int i = 0; i < 3; i++)
          EXPECT_TRUE(std::memcmp(got[i].data(), first[i].data(), got[i].size() * 4) == 0)
              << "d" << "qkv"[i] << " differs between two identical backward calls";
    }
  }
  o.reset();  // writes the per-op table
  std::FILE* f = std::fopen(table.c_str(), "r");
  ASSERT_NE(f, nullptr) << table;
  std::string json;
  for (int ch; (ch = std::fgetc(f)) != EOF;) json += char(ch);
  std::fclose(f);
  EXPECT_NE(json.find("\"attention_forward cudnn\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"attention_backward cudnn\""), std::string::npos) << json;
}

// ---- CudaMemory: the one device arena behind memory() --------------------------------------

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CudaMemory, AllocatesAlignedBlocksInsideTheArenaAndTakesThemBack) {
  auto o = ops::make_cuda_ops(Precision::fp32, 64 * kMiB);
  DeviceMemory* mem = o->memory();
  ASSERT_NE(mem, nullptr);
  EXPECT_TRUE(contains(mem->where(), "cuda:")) << mem->where();
  EXPECT_EQ(mem->capacity(), 64 * kMiB);
  const std::size_t base_use = mem->used();  // the backend's own: cuBLAS workspace, partials
  EXPECT_GE(base_use, 32 * kMiB);
  EXPECT_LT(base_use, 33 * kMiB);
  char* a = static_cast<char*>(mem->allocate(10));
  char* b = static_cast<char*>(mem->allocate(1));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % ArenaAllocator::kAlign, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % ArenaAllocator::kAlign, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(mem->used(), base_use + 2 * ArenaAllocator::kAlign);
  EXPECT_TRUE(mem->holds(a));
  EXPECT_TRUE(mem->holds(b + 255));
  int on_stack = 0;
  EXPECT_FALSE(mem->holds(&on_stack));
  EXPECT_FALSE(mem->holds(nullptr));
  std::vector<float> host(4);
  EXPECT_FALSE(mem->holds(host.data()));
  mem->release(a);
  mem->release(b);
  mem->release(nullptr);  // does nothing
  EXPECT_EQ(mem->used(), base_use);
  // The space is merged again: the whole rest of the arena is one block.
  void* big = mem->allocate(mem->capacity() - base_use);
  EXPECT_TRUE(mem->holds(big));
  mem->release(big);
}

TEST(CudaMemory, RoundTripsThroughDeviceMemoryAndPinnedHost) {
  Ops& g = gpu(Precision::fp32);
  DeviceMemory* mem = g.memory();
  const std::size_t n = 100003;
  FloatBuffer dev(n, mem);
  EXPECT_TRUE(mem->holds(dev.data()));
  EXPECT_TRUE(dev.on_device());
  std::vector<float> src(n), back(n, -1.0f);
  for (std::size_t i = 0; i < n; i++) src[i] = float(i) * 0.5f - 7.0f;
  mem->to_device(dev.data(), src.data(), n * sizeof(float));  // pageable host memory
  mem->to_host(back.data(), dev.data(), n * sizeof(float));
  EXPECT_EQ(back, src);
  // pinned host memory, after a kernel queued on the stream (the copy waits for it)
  auto* pinned = static_cast<float*>(mem->allocate_host(n * sizeof(float)));
  ASSERT_NE(pinned, nullptr);
  g.scale(dev.data(), 2.0f, std::int64_t(n));
  mem->to_host(pinned, dev.data(), n * sizeof(float));
  for (std::size_t i = 0; i < n; i++) ASSERT_EQ(pinned[i], 2.0f * src[i]) << i;
  for (std::size_t i = 0; i < n; i++) pinned[i] = float(i);
  mem->to_device(dev.data(), pinned, n * sizeof(float));
  mem->synchronize();
  EXPECT_EQ(g.sum_squares(dev.data(), 3), 0.0 + 1.0 + 4.0);
  mem->release_host(pinned);
  // the generic helpers (trident/core/device_memory.hpp) take the same route
  std::fill(back.begin(), back.end(), 0.0f);
  copy_to_device(mem, dev.data(), src.data(), n * sizeof(float));
  copy_to_host(mem, back.data(), dev.data(), n * sizeof(float));
  EXPECT_EQ(back, src);
  // and so do the older entry points
  std::fill(back.begin(), back.end(), 0.0f);
  ops::cuda_upload(g, dev.data(), src.data(), n * sizeof(float));
  ops::cuda_synchronize(g);
  ops::cuda_download(g, back.data(), dev.data(), n * sizeof(float));
  EXPECT_EQ(back, src);
}

TEST(CudaMemory, AFullArenaIsAnErrorNamingTheSizes) {
  auto o = ops::make_cuda_ops(Precision::fp32, 40 * kMiB);
  DeviceMemory* mem = o->memory();
  try {
    FloatBuffer too_big(std::size_t(16) << 20, mem);  // 64 MiB
    FAIL() << "64 MiB from a 40 MiB arena";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "cuda:")) << what;
    EXPECT_TRUE(contains(what, "67108864 bytes asked for")) << what;
    EXPECT_TRUE(contains(what, "of 41943040")) << what;
  }
  // an arena too small for the backend's own workspace
  try {
    ops::make_cuda_ops(Precision::fp32, kMiB);
    FAIL() << "a 1 MiB arena holds the 32 MiB cuBLAS workspace";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "bytes asked for")) << e.what();
  }
  // an arena larger than the device: the cudaMalloc fails, the message names the sizes
  try {
    ops::make_cuda_ops(Precision::fp32, std::size_t(1) << 50);
    FAIL() << "a 1 PiB arena";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "cannot allocate the device arena of 1125899906842624 bytes"))
        << what;
    EXPECT_TRUE(contains(what, "free of")) << what;
  }
}

TEST(CudaMemory, DefaultArenaIsAnEqualShareOfTheGpuCappedByWhatIsFree) {
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  auto expect = [&](int ranks) {
    return std::min(0.85 * double(total) / std::max(1, ranks), 0.9 * double(free));
  };
  const std::size_t got = ops::cuda_default_arena_bytes(4);
  EXPECT_NEAR(double(got), expect(4), 64.0 * kMiB);
  EXPECT_EQ(got % ArenaAllocator::kAlign, 0u);
  // ranks_per_device < 1 counts as 1
  EXPECT_NEAR(double(ops::cuda_default_arena_bytes(0)), expect(1), 64.0 * kMiB);
  // and make_cuda_ops(…, 0, 4) takes about that (cuBLAS's handle takes a little first)
  auto o = ops::make_cuda_ops(Precision::fp32, 0, 4);
  EXPECT_NEAR(double(o->memory()->capacity()), expect(4), 512.0 * kMiB);
  // A second rank on the same GPU gets the same share, not 90% of what the first left.
  auto second = ops::make_cuda_ops(Precision::fp32, 0, 4);
  EXPECT_EQ(second->memory()->capacity(), o->memory()->capacity());
}

TEST(CudaMemory, BuffersOfOpsMemoryFeedTheKernels) {
  Ops& g = gpu(Precision::bf16);
  DeviceMemory* mem = g.memory();
  const int n = 67, in = 96, out = 80;
  Rng r(4242u);
  const FVec x = r.normal(std::size_t(n) * in), w = r.normal(std::size_t(in) * out, 0.3),
             b = r.normal(std::size_t(out));
  FVec want(std::size_t(n) * out);
  cpu().linear_forward(want.data(), x.data(), w.data(), b.data(), n, in, out);
  FloatBuffer dx(x.size(), mem), dw(w.size(), mem), db(b.size(), mem), dy(want.size(), mem);
  copy_to_device(mem, dx.data(), x.data(), x.size() * sizeof(float));
  copy_to_device(mem, dw.data(), w.data(), w.size() * sizeof(float));
  copy_to_device(mem, db.data(), b.data(), b.size() * sizeof(float));
  const std::size_t before = mem->used();
  g.linear_forward(dy.data(), dx.data(), dw.data(), db.data(), n, in, out);
  FVec got(want.size());
  mem->to_host(got.data(), dy.data(), got.size() * sizeof(float));
  EXPECT_TRUE(near(got, want, 3e-2));
  // bf16 products convert their inputs in scratch, which comes from the same arena
  EXPECT_GE(mem->used(), before);
  // the GELU of the result, in place, against the CPU
  FVec gelu_want(want.size());
  cpu().gelu_forward(gelu_want.data(), got.data(), std::int64_t(got.size()));
  g.gelu_forward(dy.data(), dy.data(), std::int64_t(got.size()));
  FVec gelu_got(want.size());
  mem->to_host(gelu_got.data(), dy.data(), gelu_got.size() * sizeof(float));
  EXPECT_TRUE(near(gelu_got, gelu_want, 1e-5));
}

TEST(CudaMemory, ScratchGrowsInsideTheArena) {
  auto o = ops::make_cuda_ops(Precision::bf16, 128 * kMiB);
  DeviceMemory* mem = o->memory();
  const int m = 1024, n = 1024, k = 1024;  // 4 MiB of bf16 copies: beyond the first scratch
  FloatBuffer a(std::size_t(m) * k, mem), b(std::size_t(k) * n, mem), c(std::size_t(m) * n, mem);
  o->fill(a.data(), 1.0f, std::int64_t(a.size()));
  o->fill(b.data(), 0.5f, std::int64_t(b.size()));
  const std::size_t before = mem->used();
  std::size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  o->gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  o->gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(mem->used(), before + 4 * kMiB) << "the scratch is a block of the arena";
  EXPECT_EQ(free_after, free_before) << "no cudaMalloc after start-up";
  std::vector<float> h(4);
  mem->to_host(h.data(), c.data(), sizeof(float) * h.size());
  for (float v : h) EXPECT_EQ(v, 512.0f);
  // an op whose scratch does not fit what is left is an Error naming the sizes: a product
  // that needs 8 MiB of bf16 copies when about 6 MiB are free (the 5 MiB scratch + 1 MiB)
  FloatBuffer a2(std::size_t(2048) * k, mem), b2(std::size_t(k) * 2048, mem),
      c2(std::size_t(2048) * 2048, mem);
  void* filler = mem->allocate(mem->capacity() - mem->used() - kMiB);
  try {
    o->gemm(false, false, 2048, 2048, k, 1.0f, a2.data(), k, b2.data(), 2048, 0.0f, c2.data(),
            2048);
    ADD_FAILURE() << "8 MiB of scratch from about 6 MiB free";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "scratch")) << e.what();
    EXPECT_TRUE(contains(e.what(), "bytes asked for")) << e.what();
  }
  mem->release(filler);
  // and with the room back, the same product runs
  o->gemm(false, false, 2048, 2048, k, 1.0f, a2.data(), k, b2.data(), 2048, 0.0f, c2.data(), 2048);
  ops::cuda_synchronize(*o);
}

// The LM head's weight gradient against the CPU's: what was added to dwte (bf16's tolerance),
// and the padding rows past v_valid untouched (a zero gradient).
void expect_head_weight_gradient(const FVec& got_dw, const FVec& dw, const FVec& dw0, int v_valid,
                                 int c) {
  FVec add(dw.size()), got_add(dw.size());
  for (std::size_t i = 0; i < dw.size(); i++)
    add[i] = dw[i] - dw0[i], got_add[i] = got_dw[i] - dw0[i];
  EXPECT_TRUE(near(got_add, add, 3e-2)) << "what was added to dwte";
  const std::size_t pad = std::size_t(v_valid) * c;
  EXPECT_TRUE(near(FVec(got_dw.begin() + std::ptrdiff_t(pad), got_dw.end()),
                   FVec(dw0.begin() + std::ptrdiff_t(pad), dw0.end()), 0.0))
      << "dwte's padding rows: zero gradient";
}

// The LM head under bf16 (Ops::lm_head: bf16 logits from the product, the fused classifier,
// the two products on the bf16 dlogits) against the CPU's composition on the same
// bf16-rounded lnf and wte: loss within 1e-2 of its scale (the logits' one bf16 rounding);
// dlnf and what was added to dwte within the bf16 products' 3e-2; dwte's padding rows
// unchanged bit for bit; without the backward dwte untouched. Shapes: GPT-2's vocabulary
// (16-byte rows, 47 padding columns), an odd one, and a width that is not a multiple of 8
// (the scalar path). wte from scratch, then from the weight cache (set_weights).
// TRIDENT_CUDA_FUSED_HEAD=0 and fp32 run the composition (fused_lm_head() false).
void check_lm_head(Ops& g, int n, int c, int v, int v_valid, bool backward, bool cached) {
  Rng r(4001u + unsigned(n + c + v + v_valid));
  FVec lnf = r.normal(std::size_t(n) * c), wte = r.normal(std::size_t(v) * c, 0.1),
       dw0 = r.normal(wte.size(), 0.01);
  std::vector<std::uint16_t> bits(std::max(lnf.size(), wte.size()));
  for (FVec* x : {&lnf, &wte}) {  // rounded as the backend's copies are: the same operands
    cpu().to_bf16(bits.data(), x->data(), std::int64_t(x->size()));
    cpu().from_bf16(x->data(), bits.data(), std::int64_t(x->size()));
  }
  IVec tg(n);
  for (int i = 0; i < n; i++) tg[i] = r.integer(0, v_valid - 1);
  const float scale = 1.0f / float(n);
  FVec loss(n), dlnf(lnf.size()), dw = dw0, logits(std::size_t(n) * v), mx(n), st(2 * n);
  cpu().lm_head(loss.data(), dlnf.data(), dw.data(), logits.data(), mx.data(), st.data(),
                lnf.data(), wte.data(), tg.data(), n, c, v, v_valid, scale, backward, 0, nullptr);
  const double total = cpu().take_loss();
  DevVec<float> gl(g, FVec(logits.size(), 7.0f)), gloss(g, FVec(n, 7.0f)), glnf(g, lnf),
      gwte(g, wte), gdlnf(g, FVec(lnf.size(), 7.0f)), gdw(g, dw0), gmx(g, FVec(n)),
      gst(g, FVec(2 * n));
  DevVec<std::int32_t> gtg(g, tg);
  if (cached) g.set_weights(gwte.get(), std::int64_t(wte.size()));
  g.take_loss();
  g.lm_head(gloss.get(), gdlnf.get(), gdw.get(), gl.get(), gmx.get(), gst.get(), glnf.get(),
            gwte.get(), gtg.get(), n, c, v, v_valid, scale, backward, 0, nullptr);
  const double got_total = g.take_loss();
  if (cached) g.set_weights(nullptr, 0);
  EXPECT_TRUE(near(gloss.host(), loss, 1e-2)) << "loss";
  EXPECT_NEAR(got_total, total, 1e-2 * std::abs(total)) << "the loss total (add_loss)";
  const FVec got_dw = gdw.host();
  if (!backward) {
    EXPECT_TRUE(near(got_dw, dw0, 0.0)) << "dwte untouched without the backward";
    return;
  }
  EXPECT_TRUE(near(gdlnf.host(), dlnf, 3e-2)) << "dlnf";
  expect_head_weight_gradient(got_dw, dw, dw0, v_valid, c);
}

// Ops::lm_head over a vocabulary in two shards (TP 2), both in this process: each shard runs
// three times with collectives that record what it reduces and hand back what the two
// records give once known (the max in the 2nd run, the max and the sums in the 3rd; as
// emulate/driver.cpp on the stand-in), against the CPU's head over the whole (padded)
// vocabulary on the same bf16-rounded operands: each shard's loss, the shards' dlnf
// partials summed, dwte's increment (check_lm_head's tolerances), its padding rows unchanged.
// lnf >= 0 and shard 1's wte rows shifted up: shard 1 holds the larger logits, so sums left
// at a shard's own max are far off.
struct ReplayedCollectives final : Ops::HeadCollectives {
  explicit ReplayedCollectives(Ops& o) : ops(o) {}
  void allreduce_max(float* x, std::int64_t n) override { io(x, n, max_in, max_out); }
  void allreduce_sum(float* x, std::int64_t n) override { io(x, n, sum_in, sum_out); }
  void io(float* x, std::int64_t n, FVec& in, const FVec* out) {
    in.resize(std::size_t(n));
    ops.memory()->to_host(in.data(), x, in.size() * sizeof(float));
    if (out) ops.memory()->to_device(x, out->data(), in.size() * sizeof(float));
  }
  Ops& ops;
  FVec max_in, sum_in;
  const FVec* max_out = nullptr;
  const FVec* sum_out = nullptr;
};

void check_lm_head_shards(Ops& g, int n, int c, int v_valid) {
  const int vl = (v_valid + 1) / 2, v = 2 * vl;
  Rng r(4101u + unsigned(n + c + v_valid));
  FVec lnf = r.uniform(std::size_t(n) * c, 0.0, 2.0), wte = r.normal(std::size_t(v) * c, 0.1),
       dw0 = r.normal(wte.size(), 0.01);
  for (std::size_t i = std::size_t(vl) * c; i < wte.size(); i++) wte[i] += 0.05f;
  std::vector<std::uint16_t> bits(std::max(lnf.size(), wte.size()));
  for (FVec* x : {&lnf, &wte}) {
    cpu().to_bf16(bits.data(), x->data(), std::int64_t(x->size()));
    cpu().from_bf16(x->data(), bits.data(), std::int64_t(x->size()));
  }
  IVec tg(n);
  for (int i = 0; i < n; i++) tg[i] = i % 2 ? r.integer(vl, v_valid - 1) : r.integer(0, vl - 1);
  const float scale = 1.0f / float(n);
  FVec loss(n), dlnf(lnf.size()), dw = dw0, logits(std::size_t(n) * v), mx(n), st(2 * n);
  cpu().lm_head(loss.data(), dlnf.data(), dw.data(), logits.data(), mx.data(), st.data(),
                lnf.data(), wte.data(), tg.data(), n, c, v, v_valid, scale, true, 0, nullptr);
  cpu().take_loss();
  DevVec<float> gl(g, FVec(std::size_t(n) * vl, 7.0f)), gloss(g, FVec(n)), glnf(g, lnf),
      gwte(g, wte), gdlnf(g, FVec(lnf.size())), gmx(g, FVec(n)), gst(g, FVec(2 * n));
  DevVec<std::int32_t> gtg(g, tg);
  ReplayedCollectives rp[2] = {ReplayedCollectives(g), ReplayedCollectives(g)};
  FVec gmax(n), gsum(2 * std::size_t(n)), got_loss[2], got_dlnf(lnf.size(), 0.0f), got_dw = dw0;
  for (int run = 0; run < 3; run++) {
    for (int i = 0; run == 1 && i < n; i++) gmax[i] = std::max(rp[0].max_in[i], rp[1].max_in[i]);
    for (std::size_t i = 0; run == 2 && i < gsum.size(); i++)
      gsum[i] = rp[0].sum_in[i] + rp[1].sum_in[i];
    for (int s = 0; s < 2; s++) {
      rp[s].max_out = run >= 1 ? &gmax : nullptr;
      rp[s].sum_out = run == 2 ? &gsum : nullptr;
      const int start = s * vl, valid = std::clamp(v_valid - start, 0, vl);
      const std::size_t rows = std::size_t(start) * c;
      DevVec<float> gdw(g, dw0);
      g.lm_head(gloss.get(), gdlnf.get(), gdw.get() + rows, gl.get(), gmx.get(), gst.get(),
                glnf.get(), gwte.get() + rows, gtg.get(), n, c, vl, valid, scale, true, start,
                &rp[s]);
      g.take_loss();
      if (run < 2) continue;
      got_loss[s] = gloss.host();
      const FVec part = gdlnf.host(), w = gdw.host();
      for (std::size_t i = 0; i < part.size(); i++) got_dlnf[i] += part[i];
      std::copy(w.begin() + std::ptrdiff_t(rows),
                w.begin() + std::ptrdiff_t(rows + std::size_t(vl) * c),
                got_dw.begin() + std::ptrdiff_t(rows));
    }
  }
  EXPECT_TRUE(near(got_loss[0], loss, 1e-2)) << "loss (shard 0)";
  EXPECT_TRUE(near(got_loss[1], loss, 1e-2)) << "loss (shard 1)";
  EXPECT_TRUE(near(got_dlnf, dlnf, 3e-2)) << "dlnf: the shards' partials summed";
  expect_head_weight_gradient(got_dw, dw, dw0, v_valid, c);
}

// adamw_segments writes the weight cache's copy of what it updates (CudaOps::set_weights,
// bf16): after an update of the parameters in two segments (and one outside the range), a
// product reading them from the cache gives what the same product gives on a copy outside
// the range (converted per call): the cache holds the new weights, not the old ones (lr 0.05
// moves them by far more than the tolerance, and the check that they moved says so).
TEST(CudaOps, AdamWSegmentsKeepTheWeightCacheFresh) {
  auto o = ops::make_cuda_ops(Precision::bf16, 64 * kMiB);
  DeviceMemory* mem = o->memory();
  const int n = 64, in = 96, out = 80;
  const std::size_t nw = std::size_t(in) * out, np = nw + 40, half = nw / 2;
  Rng r(5151u);
  const FVec x = r.normal(std::size_t(n) * in), w = r.normal(np, 0.3), grad = r.normal(np + 100);
  FloatBuffer dx(x.size(), mem), dp(np, mem), dcopy(nw, mem), dm(np + 100, mem),
      dv(np + 100, mem), dg(np + 100, mem), dother(100, mem), dy0(std::size_t(n) * out, mem),
      dy1(dy0.size(), mem), dy2(dy0.size(), mem);
  copy_to_device(mem, dx.data(), x.data(), x.size() * sizeof(float));
  copy_to_device(mem, dp.data(), w.data(), w.size() * sizeof(float));
  copy_to_device(mem, dg.data(), grad.data(), grad.size() * sizeof(float));
  o->fill(dm.data(), 0.0f, std::int64_t(dm.size()));
  o->fill(dv.data(), 0.0f, std::int64_t(dv.size()));
  o->fill(dother.data(), 1.0f, 100);
  o->set_weights(dp.data(), std::int64_t(np));
  o->linear_forward(dy0.data(), dx.data(), dp.data(), nullptr, n, in, out);  // the cache, fresh
  const std::int64_t h = std::int64_t(half), rest = std::int64_t(np - half);
  const std::vector<Ops::AdamWSegment> segments = {
      {dp.data(), dg.data(), dm.data(), dv.data(), h, true},
      {dp.data() + half, dg.data() + half, dm.data() + half, dv.data() + half, rest, false},
      {dother.data(), dg.data() + np, dm.data() + np, dv.data() + np, 100, true}};
  o->adamw_segments(segments, 0.5f, 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f);
  o->copy(dcopy.data(), dp.data(), std::int64_t(nw));  // outside the cache's range
  o->linear_forward(dy1.data(), dx.data(), dp.data(), nullptr, n, in, out);
  o->linear_forward(dy2.data(), dx.data(), dcopy.data(), nullptr, n, in, out);
  FVec y0(dy0.size()), y1(dy0.size()), y2(dy0.size());
  mem->to_host(y0.data(), dy0.data(), y0.size() * sizeof(float));
  mem->to_host(y1.data(), dy1.data(), y1.size() * sizeof(float));
  mem->to_host(y2.data(), dy2.data(), y2.size() * sizeof(float));
  o->set_weights(nullptr, 0);
  EXPECT_TRUE(near(y1, y2, 1e-6)) << "the product on the cached weights after the update";
  EXPECT_FALSE(near(y0, y2, 1e-2)) << "the update moved the weights (else this proves nothing)";
}

TEST(CudaOps, LmHeadFusedMatchesTheCpuComposition) {
  Ops& g = gpu(Precision::bf16);
  ASSERT_TRUE(g.fused_lm_head());
  EXPECT_FALSE(gpu(Precision::fp32).fused_lm_head());
  for (bool backward : {true, false}) {
    SCOPED_TRACE(backward ? "with the backward" : "loss only");
    check_lm_head(g, 64, 96, 50304, 50257, backward, false);
    check_lm_head(g, 37, 40, 104, 97, backward, false);
    check_lm_head(g, 21, 48, 53, 50, backward, false);
    check_lm_head(g, 37, 40, 104, 97, backward, true);
  }
  check_lm_head(gpu(Precision::fp32), 37, 40, 104, 97, true, false);
  setenv("TRIDENT_CUDA_FUSED_HEAD", "0", 1);
  auto off = ops::make_cuda_ops(Precision::bf16, 256 * kMiB);
  unsetenv("TRIDENT_CUDA_FUSED_HEAD");
  EXPECT_FALSE(off->fused_lm_head());
  check_lm_head(*off, 37, 40, 104, 97, true, false);
}

// The fused head on each of two vocabulary shards (TP 2; fused_head.hpp's two passes), and
// fp32's composition (Ops::vocab_parallel_xent_forward on the backend's kernels) the same way.
// Shapes: GPT-2's vocabulary (shards of 25129 columns: the scalar path), 16-byte rows with
// padding, an odd one.
TEST(CudaOps, LmHeadOverTwoVocabularyShardsMatchesTheWholeVocabulary) {
  Ops& g = gpu(Precision::bf16);
  ASSERT_TRUE(g.fused_lm_head());
  check_lm_head_shards(g, 64, 96, 50257);
  check_lm_head_shards(g, 24, 16, 95);
  check_lm_head_shards(g, 10, 12, 41);
  check_lm_head_shards(gpu(Precision::fp32), 37, 40, 97);
}

// TRIDENT_CUDA_LT_TUNE (src/ops/cuda/lt_tune.hpp): tuned products (linear_forward's bias
// epilogue; Ops::gemm through gemm_lt16 with beta = 1 in place, dw's accumulation; the fused
// blocks' gemm_rm16_to16 with bf16 D, GPT-2's c_proj NT form) agree with the untuned ones to fp32
// summation order (bf16 D: to a bf16 rounding; a tuning run into the accumulating output would
// add the product again: off by the product's size); a second backend reading the first one's
// file replays its algorithms, bit for bit the same outputs.
TEST(CudaOps, LtTuneAgreesAndReplaysItsFile) {
  const std::string file = ::testing::TempDir() + "lt_tune_choices.txt";
  std::remove(file.c_str());
  struct Unset {
    ~Unset() { unsetenv("TRIDENT_CUDA_LT_TUNE"); }
  } unset;
  unsetenv("TRIDENT_CUDA_LT_TUNE");
  const int n = 256, in = 768, out = 2304;
  Rng r(2727u);
  const FVec x = r.normal(std::size_t(n) * in), w = r.normal(std::size_t(in) * out, 0.05),
             b = r.normal(std::size_t(out)), dy = r.normal(std::size_t(n) * out),
             dw0 = r.normal(std::size_t(in) * out);
  using H16 = std::vector<std::uint16_t>;
  H16 dy16(dy.size()), w16(w.size());
  cpu().to_bf16(dy16.data(), dy.data(), std::int64_t(dy.size()));
  cpu().to_bf16(w16.data(), w.data(), std::int64_t(w.size()));
  struct Outs {
    FVec y, dw, dx;  // dx: gemm_rm16_to16's bf16 D, widened
  };
  const auto run = [&] {
    auto o = ops::make_cuda_ops(Precision::bf16, 256 * kMiB);
    DevVec<float> dx(*o, x), dwt(*o, w), db(*o, b), ddy(*o, dy), ddw(*o, dw0),
        dyv(*o, FVec(std::size_t(n) * out, 0.0f));
    o->linear_forward(dyv.get(), dx.get(), dwt.get(), db.get(), n, in, out);
    o->gemm(true, false, in, out, n, 1.0f, dx.get(), in, ddy.get(), out, 1.0f, ddw.get(), out);
    // dx16[n, in] = dy16[n, out] w16[in, out]^T, bf16 D (the fused block's c_proj backward)
    DevVec<std::uint16_t> gdy16(*o, dy16), gw16(*o, w16),
        gdx16(*o, H16(std::size_t(n) * in, 0x7fc0));
    ops::cuda::LtTuneAccess::gemm_rm16_to16(*o, false, true, n, in, out, gdy16.get(), out,
                                            gw16.get(), out, gdx16.get(), in);
    FVec dx_wide(std::size_t(n) * in);
    cpu().from_bf16(dx_wide.data(), gdx16.host().data(), std::int64_t(dx_wide.size()));
    return Outs{dyv.host(), ddw.host(), dx_wide};
  };
  const Outs plain = run();
  setenv("TRIDENT_CUDA_LT_TUNE", file.c_str(), 1);
  const Outs tuned = run();
  const Outs replay = run();
  EXPECT_TRUE(near(tuned.y, plain.y, 1e-3)) << "linear_forward, tuned vs not";
  EXPECT_TRUE(near(tuned.dw, plain.dw, 1e-3)) << "dw += x^T dy in place, tuned vs not";
  EXPECT_TRUE(near(tuned.dx, plain.dx, 1e-2)) << "gemm_rm16_to16 (bf16 D), tuned vs not";
  EXPECT_TRUE(tuned.y == replay.y && tuned.dw == replay.dw && tuned.dx == replay.dx)
      << "the file's algorithms replayed bit for bit";
  std::ifstream f(file);
  int entries = 0;
  for (std::string line; std::getline(f, line);) entries += !line.empty() && line[0] != '#';
  EXPECT_EQ(entries, 3) << "one entry per plan in " << file;
}

TEST(CudaOps, CopiesRefuseTheCpuBackend) {
  float x = 0.0f;
  EXPECT_THROW(ops::cuda_upload(cpu(), &x, &x, sizeof x), Error);
}

}  // namespace
}  // namespace trident::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // The op tests check trident's own kernels: cuDNN would take their bf16 causal attention
  // calls (the tensor-core cases among them). CudnnAttention turns it on for its backend.
  setenv("TRIDENT_CUDNN", "0", 0);
#ifdef GTEST_FLAG_GET
  const bool listing = GTEST_FLAG_GET(list_tests);
#else
  const bool listing = ::testing::GTEST_FLAG(list_tests);
#endif
  if (trident::ops::cuda_device_count() == 0 && !listing) {
    std::printf("no CUDA device visible: the CUDA op tests are skipped\n");
    return TRIDENT_SKIP_CODE;
  }
  return RUN_ALL_TESTS();
}
