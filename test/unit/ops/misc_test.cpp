// test/unit/ops/misc_test.cpp — the CPU backend's remaining contracts: gemm in all four
// transpose combinations with padded leading dimensions, the cross-entropy passes over a
// vocabulary split into two shards (as tensor parallelism uses them), AdamW against
// torch.optim.AdamW, the small pointwise ops, determinism, and backend selection.
#include <cmath>
#include <memory>
#include <string>
#include <tuple>

#include "reference.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/ops.hpp"

namespace trident::test {
namespace {

using ops::Ops;

// ---- gemm -------------------------------------------------------------------------------

struct GemmCase {
  bool ta, tb;
  int m, n, k;
  int pad;  // extra columns in every stored matrix: lda/ldb/ldc exceed the used width
};

void PrintTo(const GemmCase& g, std::ostream* os) {
  *os << (g.ta ? "T" : "N") << (g.tb ? "T" : "N") << " m" << g.m << " n" << g.n << " k" << g.k;
}

class Gemm : public ::testing::TestWithParam<std::tuple<GemmCase, int>> {};

TEST_P(Gemm, MatchesReferenceAndKeepsPadding) {
  const auto& [g, threads] = GetParam();
  auto ops = ops::make_cpu_ops(threads);
  Rng r(900u + unsigned(g.m * 31 + g.n * 7 + g.k));
  // stored shapes: A is [m,k] or [k,m] (transposed), B is [k,n] or [n,k]
  const int a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
  const int b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
  const int lda = a_cols + g.pad, ldb = b_cols + g.pad + 1, ldc = g.n + g.pad + 2;
  const FVec a = r.normal(std::size_t(a_rows) * lda), b = r.normal(std::size_t(b_rows) * ldb);
  const FVec c0 = r.normal(std::size_t(g.m) * ldc);
  const float alpha = 0.7f, beta = -0.3f;
  FVec c = c0;
  ops->gemm(g.ta, g.tb, g.m, g.n, g.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  Vec want = to_double(c0);
  ref_gemm(g.ta, g.tb, g.m, g.n, g.k, alpha, to_double(a), lda, to_double(b), ldb, beta, want, ldc);
  // padding columns of C were copied into `want` unchanged, so they must match exactly
  // up to the tolerance, which is far below their size
  EXPECT_TRUE(close(c, want, 1e-5, 1e-5 * std::sqrt(double(g.k))));
  for (int i = 0; i < g.m; i++)
    for (int j = g.n; j < ldc; j++)
      ASSERT_EQ(c[std::size_t(i) * ldc + j], c0[std::size_t(i) * ldc + j]) << "C padding written";

  // beta = 0 overwrites C, whatever it held
  FVec c2(c0.size(), 1e3f);
  ops->gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c2.data(), ldc);
  Vec want2(c0.size(), 1e3);
  for (int i = 0; i < g.m; i++)
    for (int j = 0; j < g.n; j++) want2[std::size_t(i) * ldc + j] = 0.0;
  ref_gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0, to_double(a), lda, to_double(b), ldb, 0.0, want2, ldc);
  EXPECT_TRUE(close(c2, want2, 1e-5, 1e-5 * std::sqrt(double(g.k))));
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cs;
  // small (one call on the calling thread), and two large enough to be split over
  // threads: one along the rows of C (m >= n), one along its columns
  const int shapes[][3] = {{5, 7, 11}, {1, 9, 4}, {130, 75, 110}, {60, 141, 130}};
  for (auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) cs.push_back({ta, tb, s[0], s[1], s[2], 3});
  return cs;
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Gemm, ::testing::Combine(::testing::ValuesIn(gemm_cases()), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<Gemm::ParamType>& info) {
      const GemmCase& g = std::get<0>(info.param);
      return name_of("%s%s_m%d_n%d_k%d_threads%d", g.ta ? "T" : "N", g.tb ? "T" : "N", g.m, g.n,
                     g.k, std::get<1>(info.param));
    });

// ---- cross-entropy over a vocabulary split in two shards -------------------------------

// Full vocabulary of 23 columns; shard 0 owns [0, 12), shard 1 owns [12, 23), each stored
// with row stride 16 (padding after the real columns).
TEST(CrossEntropy, TwoShardsCombineToTheFullLogSumExp) {
  auto ops = ops::make_cpu_ops(2);
  const int n = 6, V = 23, ld = 16;
  const int start[2] = {0, 12}, width[2] = {12, 11};
  Rng r(1234);
  const FVec full = r.normal(std::size_t(n) * V, 3.0, 5.0);
  std::vector<std::int32_t> tg = {0, 11, 12, 22, 5, 17};
  FVec shard[2];
  for (int s = 0; s < 2; s++) {
    shard[s].assign(std::size_t(n) * ld, -1e4f);  // padding garbage
    for (int i = 0; i < n; i++)
      for (int j = 0; j < width[s]; j++) shard[s][std::size_t(i) * ld + j] = full[std::size_t(i) * V + start[s] + j];
  }
  const Vec want = ref_xent(to_double(full), tg, n, V, V, 0);

  // (a) each shard on its own statistics, combined by hand: max, then rescaled sums
  FVec mx[2], se[2], tl[2];
  for (int s = 0; s < 2; s++) {
    mx[s].resize(n), se[s].resize(n), tl[s].resize(n);
    ops->xent_row_max(mx[s].data(), shard[s].data(), n, ld, width[s]);
    ops->xent_sumexp(se[s].data(), tl[s].data(), shard[s].data(), mx[s].data(), tg.data(), n, ld, width[s],
                     start[s]);
  }
  FVec M(n), S(n), TL(n), loss(n);
  for (int i = 0; i < n; i++) {
    M[i] = std::max(mx[0][i], mx[1][i]);
    S[i] = se[0][i] * std::exp(mx[0][i] - M[i]) + se[1][i] * std::exp(mx[1][i] - M[i]);
    TL[i] = tl[0][i] + tl[1][i];  // only the owning shard contributes
  }
  ops->xent_loss(loss.data(), M.data(), S.data(), TL.data(), n);
  EXPECT_TRUE(close(loss, want, 1e-5, 1e-5)) << "combined by hand";

  // (b) the tensor-parallel way: MAX-reduce the row max first, then SUM-reduce sumexp
  FVec se_g[2], tl_g[2];
  for (int s = 0; s < 2; s++) {
    se_g[s].resize(n), tl_g[s].resize(n);
    ops->xent_sumexp(se_g[s].data(), tl_g[s].data(), shard[s].data(), M.data(), tg.data(), n, ld, width[s],
                     start[s]);
  }
  for (int i = 0; i < n; i++) S[i] = se_g[0][i] + se_g[1][i], TL[i] = tl_g[0][i] + tl_g[1][i];
  ops->xent_loss(loss.data(), M.data(), S.data(), TL.data(), n);
  EXPECT_TRUE(close(loss, want, 1e-5, 1e-5)) << "global max, summed";

  // each shard's backward with the global statistics is its slice of the full gradient
  const float scale = 0.25f;
  for (int s = 0; s < 2; s++) {
    FVec g = shard[s];
    ops->xent_backward(g.data(), M.data(), S.data(), tg.data(), n, ld, width[s], start[s], scale);
    Vec want_g(g.size(), 0.0);
    for (int i = 0; i < n; i++) {
      double m = -1e300, z = 0.0;
      for (int j = 0; j < V; j++) m = std::max(m, double(full[std::size_t(i) * V + j]));
      for (int j = 0; j < V; j++) z += std::exp(double(full[std::size_t(i) * V + j]) - m);
      for (int j = 0; j < width[s]; j++) {
        const int col = start[s] + j;
        want_g[std::size_t(i) * ld + j] =
            scale * (std::exp(double(full[std::size_t(i) * V + col]) - m) / z - (tg[i] == col ? 1.0 : 0.0));
      }
    }
    EXPECT_TRUE(close(g, want_g, 1e-5, 1e-7)) << "shard " << s << " gradient";
  }
}

// ---- AdamW ------------------------------------------------------------------------------

// Reference numbers from torch 1.13: torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.95),
// eps=1e-8, weight_decay=0.1), three steps with the gradients below (float32).
TEST(AdamW, MatchesTorchOverThreeSteps) {
  auto ops = ops::make_cpu_ops(1);
  FVec p = {0.5f, -1.25f, 3.0f, 1e-3f, -2e-4f, 0.0f, 7.0f, -0.75f};
  const FVec grads[3] = {
      {0.00644217664f, 0.0909297392f, -0.157745689f, -9.93690968f, -0.00373876654f, 0.0793667883f,
       0.798487127f, -3.66479135f},
      {0.00985449739f, 0.0427379869f, -0.756802499f, -8.32267475f, 0.00311541371f, 0.0998941362f,
       0.222889915f, -8.79695797f},
      {0.00863209367f, -0.0255541094f, -0.999923229f, -2.79415488f, 0.0085043665f, 0.0734397098f,
       -0.457535893f, -9.79177761f}};
  const FVec torch_p = {0.468778312f, -1.27096534f, 3.01854134f, 0.0298611987f, 0.00484485691f,
                        -0.0298304111f, 6.95783806f, -0.718853891f};
  const FVec torch_m = {0.00227193045f, 0.00865631551f, -0.180881947f, -1.83334589f, 0.000827983837f,
                        0.0227631517f, 0.038983956f, -2.06775212f};
  const FVec torch_v = {1.02111917e-05f, 0.000492514402f, 0.0783208236f, 8.13628387f, 4.70801251e-06f,
                        0.00102791062f, 0.0415976271f, 9.07586288f};
  FVec m(p.size(), 0.0f), v(p.size(), 0.0f);
  const float b1 = 0.9f, b2 = 0.95f;
  for (int step = 1; step <= 3; step++) {
    const float bc1 = static_cast<float>(1.0 - std::pow(0.9, step));
    const float bc2 = static_cast<float>(1.0 - std::pow(0.95, step));
    ops->adamw(p.data(), grads[step - 1].data(), m.data(), v.data(), std::int64_t(p.size()), 0.01f, b1, b2,
               1e-8f, 0.1f, bc1, bc2);
  }
  EXPECT_TRUE(close(p, torch_p, 1e-5, 1e-7)) << "p";
  EXPECT_TRUE(close(m, torch_m, 1e-5, 1e-9)) << "exp_avg";
  EXPECT_TRUE(close(v, torch_v, 1e-5, 1e-12)) << "exp_avg_sq";
}

// beta2 = 0.999 (torch's default): 1 - beta2 must be formed from the decimal 0.999, not
// from the float nearest to it, or exp_avg_sq is 1.3e-5 off. torch 1.13 reference:
// AdamW(lr=6e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), same gradients.
TEST(AdamW, MatchesTorchWithBeta2Of0999) {
  auto ops = ops::make_cpu_ops(1);
  FVec p = {0.5f, -1.25f, 3.0f, 1e-3f, -2e-4f, 0.0f, 7.0f, -0.75f};
  FVec m(p.size(), 0.0f), v(p.size(), 0.0f);
  const FVec torch_p = {0.498200566f, -1.25145161f, 3.00161338f, 0.00272524403f, 9.89398395e-05f,
                        -0.00179263402f, 6.99860907f, -0.748239517f};
  const FVec torch_v = {2.12945736e-07f, 1.07294118e-05f, 0.00159685791f, 0.175549746f, 9.59707833e-08f,
                        2.16487479e-05f, 0.000895276549f, 0.186591849f};
  for (int step = 1; step <= 3; step++) {
    FVec g(p.size());
    for (std::size_t i = 0; i < g.size(); i++)
      g[i] = static_cast<float>(std::sin(1.3 * double(i) + 0.7 * step) * std::pow(10.0, double(i % 4) - 2.0));
    const float bc1 = static_cast<float>(1.0 - std::pow(0.9, step));
    const float bc2 = static_cast<float>(1.0 - std::pow(0.999, step));
    ops->adamw(p.data(), g.data(), m.data(), v.data(), std::int64_t(p.size()), 6e-4f, 0.9f, 0.999f, 1e-8f,
               0.01f, bc1, bc2);
  }
  EXPECT_TRUE(close(p, torch_p, 1e-5, 1e-7)) << "p";
  EXPECT_TRUE(close(v, torch_v, 1e-5, 1e-12)) << "exp_avg_sq";
}

// The header's formula, re-implemented in double, over a long vector (the threaded path).
TEST(AdamW, MatchesScalarFormulaOnLongVector) {
  auto ops = ops::make_cpu_ops(2);
  const std::int64_t n = 100003;
  Rng r(77);
  FVec p = r.normal(std::size_t(n), 0.5), m(std::size_t(n), 0.0f), v(std::size_t(n), 0.0f);
  Vec P = to_double(p), Mv(std::size_t(n), 0.0), Vv(std::size_t(n), 0.0);
  const double lr = 3e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  for (int step = 1; step <= 3; step++) {
    const FVec g = r.normal(std::size_t(n), 0.01);
    const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
    ops->adamw(p.data(), g.data(), m.data(), v.data(), n, float(lr), float(b1), float(b2), float(eps),
               float(wd), float(bc1), float(bc2));
    for (std::int64_t i = 0; i < n; i++) {
      P[i] *= 1.0 - lr * wd;
      Mv[i] = b1 * Mv[i] + (1.0 - b1) * g[i];
      Vv[i] = b2 * Vv[i] + (1.0 - b2) * double(g[i]) * g[i];
      P[i] -= (lr / bc1) * Mv[i] / (std::sqrt(Vv[i]) / std::sqrt(bc2) + eps);
    }
  }
  // m can cancel to ~0 (b1 m and (1 - b1) g of opposite signs): an absolute floor of a
  // float rounding of its typical size
  EXPECT_TRUE(close(p, P, 1e-5, 1e-7)) << "p";
  EXPECT_TRUE(close(m, Mv, 1e-5, 1e-6 * max_abs(Mv))) << "m";
  EXPECT_TRUE(close(v, Vv, 1e-5, 1e-6 * max_abs(Vv))) << "v";
}

// The optimizer step over many tensors (Ops::adamw_segments, sum_squares_spans): a zero
// gradient leaves a segment without weight decay exactly as it was and scales one with it by
// exactly 1 - lr * wd; the clip's grad_scale of 0.5 (exact in float) gives what gradients
// halved beforehand give; the spans' sums are each span's sum of squares (in double: exact
// for these small integers).
TEST(AdamW, SegmentsTakeTheirDecayAndTheClipsScale) {
  auto ops = ops::make_cpu_ops(1);
  const float lr = 0.01f, wd = 0.1f, bc1 = 0.1f, bc2 = 0.05f;
  FVec p = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f}, g(5, 0.0f), m(5, 0.0f), v(5, 0.0f);
  ops->adamw_segments({{p.data(), g.data(), m.data(), v.data(), 2, false},
                       {p.data() + 2, g.data() + 2, m.data() + 2, v.data() + 2, 3, true}},
                      0.37f, lr, 0.9f, 0.95f, 1e-8f, wd, bc1, bc2);
  const float decay = float(1.0 - double(lr) * double(wd));
  EXPECT_EQ(p, (FVec{1.0f, 2.0f, 3.0f * decay, 4.0f * decay, 5.0f * decay}));
  Rng r(91);
  const FVec p0 = r.normal(7), g0 = r.normal(7);
  FVec half = g0;
  for (float& x : half) x *= 0.5f;
  FVec pa = p0, ga = g0, ma(7, 0.0f), va(7, 0.0f), pb = p0, mb(7, 0.0f), vb(7, 0.0f);
  ops->adamw_segments({{pa.data(), ga.data(), ma.data(), va.data(), 7, true}}, 0.5f, lr, 0.9f,
                      0.95f, 1e-8f, wd, bc1, bc2);
  ops->adamw_segments({{pb.data(), half.data(), mb.data(), vb.data(), 7, true}}, 1.0f, lr, 0.9f,
                      0.95f, 1e-8f, wd, bc1, bc2);
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(ma, mb);
  EXPECT_NE(pa, p0);
  const FVec x = {1.0f, -2.0f, 3.0f, 4.0f};
  std::vector<double> sums(3, -1.0);
  ops->sum_squares_spans({{x.data(), 1}, {x.data() + 1, 0}, {x.data() + 1, 3}}, sums.data());
  EXPECT_EQ(sums, (std::vector<double>{1.0, 0.0, 29.0}));
}

// ---- pointwise, reductions, determinism ------------------------------------------------

class Pointwise : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(Pointwise, AddScaleFillCopySumSquares) {
  const std::int64_t n = GetParam();
  auto ops = ops::make_cpu_ops(2);
  Rng r(5u + unsigned(n));
  const FVec a = r.normal(std::size_t(n)), b = r.normal(std::size_t(n));
  FVec y(std::size_t(n), 777.0f);
  ops->add(y.data(), a.data(), b.data(), n);
  FVec want(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < want.size(); i++) want[i] = a[i] + b[i];
  EXPECT_TRUE(close(y, want, 0.0, 0.0)) << "add";
  FVec ya = a;
  ops->add(ya.data(), ya.data(), b.data(), n);  // y aliases a
  EXPECT_TRUE(close(ya, want, 0.0, 0.0)) << "add in place";

  FVec s = a;
  ops->scale(s.data(), -0.37f, n);
  for (std::size_t i = 0; i < want.size(); i++) want[i] = a[i] * -0.37f;
  EXPECT_TRUE(close(s, want, 0.0, 0.0)) << "scale";

  FVec f(std::size_t(n) + 1, 5.0f);
  ops->fill(f.data(), -2.5f, n);
  for (std::int64_t i = 0; i < n; i++) ASSERT_EQ(f[std::size_t(i)], -2.5f);
  EXPECT_EQ(f[std::size_t(n)], 5.0f) << "fill wrote past n";

  FVec c(std::size_t(n), 0.0f);
  ops->copy(c.data(), a.data(), n);
  EXPECT_TRUE(close(c, a, 0.0, 0.0)) << "copy";

  double ss = 0.0;
  for (float x : a) ss += double(x) * double(x);
  EXPECT_NEAR(ops->sum_squares(a.data(), n), ss, 1e-12 * ss);
}

// copy_rows: a column block between strided rows (the ring's keys out of a fused qkv), the
// CPU's one loop and the base class's row-by-row default alike; nothing outside the block
// is written.
TEST(Pointwise, CopyRowsCopiesTheBlockOnly) {
  const std::int64_t rows = 37, width = 5, ld_src = 12, ld_dst = 7;
  Rng r(41);
  const FVec src = r.normal(std::size_t(rows * ld_src));
  auto cpu_ops = ops::make_cpu_ops(2);
  for (ops::Ops* o : {cpu_ops.get(), static_cast<ops::Ops*>(nullptr)}) {
    FVec dst(std::size_t(rows * ld_dst), 9.0f);
    if (o) {
      o->copy_rows(dst.data(), ld_dst, src.data() + 3, ld_src, rows, width);
    } else {
      cpu_ops->ops::Ops::copy_rows(dst.data(), ld_dst, src.data() + 3, ld_src, rows, width);
    }
    for (std::int64_t i = 0; i < rows; i++)
      for (std::int64_t j = 0; j < ld_dst; j++)
        ASSERT_EQ(dst[std::size_t(i * ld_dst + j)], j < width ? src[std::size_t(i * ld_src + 3 + j)] : 9.0f)
            << (o ? "cpu" : "default") << " row " << i << " column " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Pointwise, ::testing::Values(std::int64_t(1), std::int64_t(37), std::int64_t(100003)));

TEST(Determinism, RepeatedCallsAreBitwiseEqual) {
  auto ops = ops::make_cpu_ops(2);
  const int n = 300, c = 130;
  Rng r(99);
  const FVec x = r.normal(std::size_t(n) * c), w = r.normal(c, 0.2, 1.0), b = r.normal(c), dy = r.normal(x.size());
  FVec y(x.size()), mean(n), rstd(n);
  ops->layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  FVec dx[2], dw[2], db[2];
  for (int rep = 0; rep < 2; rep++) {
    dx[rep].assign(x.size(), 0.0f), dw[rep].assign(c, 0.0f), db[rep].assign(c, 0.0f);
    ops->layernorm_backward(dx[rep].data(), dw[rep].data(), db[rep].data(), dy.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), n, c);
  }
  EXPECT_EQ(dx[0], dx[1]);
  EXPECT_EQ(dw[0], dw[1]);
  EXPECT_EQ(db[0], db[1]);
  const double s0 = ops->sum_squares(x.data(), std::int64_t(x.size()));
  EXPECT_EQ(s0, ops->sum_squares(x.data(), std::int64_t(x.size())));
}

TEST(Backend, SelectionAndErrors) {
  auto cpu = ops::make_ops("cpu", 2);
  EXPECT_EQ(cpu->device(), Device::cpu);
  EXPECT_NE(cpu->name().find("cpu"), std::string::npos);
  try {
    ops::make_ops("tpu", 1);
    FAIL() << "make_ops(\"tpu\") did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tpu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::make_cpu_ops(0), Error);
}

}  // namespace
}  // namespace trident::test
