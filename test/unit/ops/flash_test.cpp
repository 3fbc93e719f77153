// test/unit/ops/flash_test.cpp — the flash attention kernels (attention_forward/backward)
// against a double-precision reference, at odd tile remainders (T = 37, 256, 1000), head
// sizes 16/24/64, one and three heads, grouped-query heads (nkv < nh) and padded row strides;
// the reference's gradient itself is checked by finite differences at a small shape. Also:
// the same answers as the T x T reference path (attention_naive_*) on GPT's fused qkv. Ring
// attention's blocks: without the causal mask, with batch and lse strides, merged partials
// (attention_merge) and accumulated gradients.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "reference.hpp"
#include "trident/ops/ops.hpp"

namespace trident::test {
namespace {

using ops::Ops;
using Shape = Ops::AttentionShape;

// Separate q, k, v, out buffers with row strides wider than the heads (pad columns must be
// neither read nor written).
struct Problem {
  Shape s;
  Vec q, k, v, dout;  // [B*T, ld]
};

Problem make_problem(int b, int t, int nh, int nkv, int hs, unsigned seed, bool causal = true) {
  Problem p;
  p.s.b = b, p.s.t = t, p.s.nh = nh, p.s.nkv = nkv, p.s.hs = hs;
  p.s.causal = causal;
  p.s.ld_q = nh * hs + 3;
  p.s.ld_k = nkv * hs + 1;
  p.s.ld_v = nkv * hs + 5;
  p.s.ld_o = nh * hs + 2;
  Rng r(seed);
  const std::size_t rows = std::size_t(b) * t;
  p.q = to_double(r.normal(rows * p.s.ld_q));
  p.k = to_double(r.normal(rows * p.s.ld_k));
  p.v = to_double(r.normal(rows * p.s.ld_v));
  p.dout = to_double(r.normal(rows * p.s.ld_o));
  return p;
}

struct Ref {
  Vec out, lse, dq, dk, dv;
};

// Double reference (causal, or full with !s.causal): forward (out, lse) and the analytic backward of sum(dout * out).
Ref reference(const Problem& p, const Vec& q, const Vec& k, const Vec& v, bool backward) {
  const Shape& s = p.s;
  const int group = s.nh / s.nkv;
  const double scale = 1.0 / std::sqrt(double(s.hs));
  const std::size_t rows = std::size_t(s.b) * s.t;
  Ref r{Vec(rows * s.ld_o, 0.0), Vec(std::size_t(s.b) * s.nh * s.t, 0.0), Vec(q.size(), 0.0),
        Vec(k.size(), 0.0), Vec(v.size(), 0.0)};
  Vec pr(s.t), dp(s.t);
  for (int bb = 0; bb < s.b; bb++)
    for (int h = 0; h < s.nh; h++) {
      const int kh = h / group;
      auto at = [&](const Vec& x, std::int64_t ld, int row, int head) {
        return x.data() + (std::size_t(bb) * s.t + row) * ld + std::size_t(head) * s.hs;
      };
      for (int i = 0; i < s.t; i++) {
        const int jend = s.causal ? i + 1 : s.t;  // keys row i sees
        const double* qi = at(q, s.ld_q, i, h);
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < jend; j++) {
          const double* kj = at(k, s.ld_k, j, kh);
          double d = 0;
          for (int c = 0; c < s.hs; c++) d += qi[c] * kj[c];
          pr[j] = d * scale;
          mx = std::max(mx, pr[j]);
        }
        double sum = 0;
        for (int j = 0; j < jend; j++) sum += std::exp(pr[j] - mx);
        r.lse[(std::size_t(bb) * s.nh + h) * s.t + i] = mx + std::log(sum);
        for (int j = 0; j < jend; j++) pr[j] = std::exp(pr[j] - mx) / sum;
        double* o = r.out.data() + (std::size_t(bb) * s.t + i) * s.ld_o + std::size_t(h) * s.hs;
        for (int j = 0; j < jend; j++) {
          const double* vj = at(v, s.ld_v, j, kh);
          for (int c = 0; c < s.hs; c++) o[c] += pr[j] * vj[c];
        }
        if (!backward) continue;
        const double* doi = at(p.dout, s.ld_o, i, h);
        double delta = 0;
        for (int j = 0; j < jend; j++) {
          const double* vj = at(v, s.ld_v, j, kh);
          double d = 0;
          for (int c = 0; c < s.hs; c++) d += doi[c] * vj[c];
          dp[j] = d;
          delta += pr[j] * d;
        }
        double* dqi = r.dq.data() + (qi - q.data());
        for (int j = 0; j < jend; j++) {
          const double ds = pr[j] * (dp[j] - delta) * scale;
          const std::size_t koff = at(k, s.ld_k, j, kh) - k.data();
          const std::size_t voff = at(v, s.ld_v, j, kh) - v.data();
          for (int c = 0; c < s.hs; c++) {
            dqi[c] += ds * k[koff + c];
            r.dk[koff + c] += ds * qi[c];
            r.dv[voff + c] += pr[j] * doi[c];
          }
        }
      }
    }
  return r;
}

// Only the head columns of each row (the padding is neither input nor output).
Vec heads_only(const Vec& x, std::int64_t ld, int heads, int hs) {
  Vec r;
  for (std::size_t row = 0; row < x.size() / std::size_t(ld); row++)
    for (int c = 0; c < heads * hs; c++) r.push_back(x[row * ld + c]);
  return r;
}
FVec heads_only(const FVec& x, std::int64_t ld, int heads, int hs) {
  FVec r;
  for (std::size_t row = 0; row < x.size() / std::size_t(ld); row++)
    for (int c = 0; c < heads * hs; c++) r.push_back(x[row * ld + c]);
  return r;
}

// dq, dk, dv (their head columns) against the reference's, to 1e-3 relative and 1e-4 of
// the largest reference gradient.
void expect_grads_close(const FVec& dq, const FVec& dk, const FVec& dv, const Ref& want,
                        const Shape& s, int nh, int nkv, int hs) {
  const auto tol = [](const Vec& w) { return 1e-4 * max_abs(w) + 1e-6; };
  const Vec wq = heads_only(want.dq, s.ld_q, nh, hs), wk = heads_only(want.dk, s.ld_k, nkv, hs),
            wv = heads_only(want.dv, s.ld_v, nkv, hs);
  EXPECT_TRUE(close(heads_only(dq, s.ld_q, nh, hs), wq, 1e-3, tol(wq))) << "dq";
  EXPECT_TRUE(close(heads_only(dk, s.ld_k, nkv, hs), wk, 1e-3, tol(wk))) << "dk";
  EXPECT_TRUE(close(heads_only(dv, s.ld_v, nkv, hs), wv, 1e-3, tol(wv))) << "dv";
}

void check_flash(Ops& ops, int b, int t, int nh, int nkv, int hs, bool causal = true) {
  const Problem p =
      make_problem(b, t, nh, nkv, hs, 7u + unsigned(t * 31 + nh * 7 + nkv + hs), causal);
  const Shape& s = p.s;
  const FVec q = to_float(p.q), k = to_float(p.k), v = to_float(p.v), dout = to_float(p.dout);
  FVec out(q.size() / s.ld_q * s.ld_o, 777.0f), lse(std::size_t(b) * nh * t, 777.0f);
  ops.attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  const Ref want = reference(p, to_double(q), to_double(k), to_double(v), true);
  EXPECT_TRUE(close(heads_only(out, s.ld_o, nh, hs), heads_only(want.out, s.ld_o, nh, hs), 1e-4,
                    1e-5))
      << "out";
  for (std::size_t row = 0; row < out.size() / std::size_t(s.ld_o); row++)
    for (std::int64_t c = nh * hs; c < s.ld_o; c++)
      ASSERT_EQ(out[row * s.ld_o + c], 777.0f) << "out's padding was written";
  EXPECT_TRUE(close(lse, want.lse, 1e-5, 1e-5)) << "lse";

  FVec dq(q.size(), 555.0f), dk(k.size(), 555.0f), dv(v.size(), 555.0f);
  ops.attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                         q.data(), k.data(), v.data(), s);
  expect_grads_close(dq, dk, dv, want, s, nh, nkv, hs);
  for (std::size_t row = 0; row < dq.size() / std::size_t(s.ld_q); row++)
    for (std::int64_t c = nh * hs; c < s.ld_q; c++)
      ASSERT_EQ(dq[row * s.ld_q + c], 555.0f) << "dq's padding was written";
}

// The reference's backward against finite differences of its forward (GQA, two batches).
TEST(FlashReference, BackwardMatchesFiniteDifferences) {
  const Problem p = make_problem(2, 9, 4, 2, 5, 99u);
  const Ref r = reference(p, p.q, p.k, p.v, true);
  auto loss_q = [&](const Vec& x) { return dot(p.dout, reference(p, x, p.k, p.v, false).out); };
  auto loss_k = [&](const Vec& x) { return dot(p.dout, reference(p, p.q, x, p.v, false).out); };
  auto loss_v = [&](const Vec& x) { return dot(p.dout, reference(p, p.q, p.k, x, false).out); };
  const Vec gq = fd_grad(p.q, loss_q, 1e-5), gk = fd_grad(p.k, loss_k, 1e-5),
            gv = fd_grad(p.v, loss_v, 1e-5);
  EXPECT_TRUE(close(to_float(r.dq), gq, 1e-4, 1e-6)) << "dq";
  EXPECT_TRUE(close(to_float(r.dk), gk, 1e-4, 1e-6)) << "dk";
  EXPECT_TRUE(close(to_float(r.dv), gv, 1e-4, 1e-6)) << "dv";
}

// On GPT's fused qkv, flash and the T x T path agree (out and dqkv).
void check_matches_naive(Ops& ops, int b, int t, int c, int nh) {
  Rng r(3u + unsigned(t + c));
  const FVec qkv = r.normal(std::size_t(b) * t * 3 * c), dout = r.normal(std::size_t(b) * t * c);
  FVec out1(dout.size()), att(std::size_t(b) * nh * t * t), dqkv1(qkv.size()), datt(att.size());
  ops.attention_naive_forward(out1.data(), att.data(), qkv.data(), b, t, c, nh);
  ops.attention_naive_backward(dqkv1.data(), datt.data(), dout.data(), qkv.data(), att.data(), b,
                               t, c, nh);
  const Shape s = ops::attention_shape_qkv(b, t, c, nh);
  FVec out2(dout.size(), 777.0f), lse(std::size_t(b) * nh * t), dqkv2(qkv.size(), 777.0f);
  ops.attention_forward(out2.data(), lse.data(), qkv.data(), qkv.data() + c, qkv.data() + 2 * c,
                        s);
  ops.attention_backward(dqkv2.data(), dqkv2.data() + c, dqkv2.data() + 2 * c, dout.data(),
                         out2.data(), lse.data(), qkv.data(), qkv.data() + c, qkv.data() + 2 * c,
                         s);
  EXPECT_TRUE(close(out2, out1, 1e-4, 1e-5)) << "out";
  EXPECT_TRUE(close(dqkv2, dqkv1, 1e-3, 1e-4)) << "dqkv";
}

// Attention over a sequence of 2t rows as blocks of t, the way ring attention runs it: the
// second half's queries against the first half's keys (full) and its own (causal) through
// batch strides (2t rows) and lse's row stride (2t), the two partials merged by
// attention_merge; the first half alone (causal). Out and lse must be the whole causal
// attention's; the backward of the blocks, accumulating from the merged out and lse, must add
// up to its dq, dk, dv.
void check_blocks_merge(Ops& ops, int b, int t, int nh, int nkv, int hs) {
  const Problem p = make_problem(b, 2 * t, nh, nkv, hs, 11u + unsigned(t * 3 + nh + nkv + hs));
  const Shape& s = p.s;
  const FVec q = to_float(p.q), k = to_float(p.k), v = to_float(p.v), dout = to_float(p.dout);
  const Ref want = reference(p, to_double(q), to_double(k), to_double(v), true);
  Shape blk = s;
  blk.t = t;
  blk.bs_q = 2 * t * s.ld_q, blk.bs_k = 2 * t * s.ld_k, blk.bs_v = 2 * t * s.ld_v;
  blk.bs_o = 2 * t * s.ld_o, blk.bs_lse = 2 * t;
  Shape full = blk;
  full.causal = false;
  const std::int64_t tq = t * s.ld_q, tk = t * s.ld_k, tv = t * s.ld_v, to = t * s.ld_o;
  FVec out(q.size() / s.ld_q * s.ld_o, 777.0f), lse(std::size_t(b) * nh * 2 * t, 777.0f);
  FVec part(out.size(), 0.0f), part_lse(lse.size(), 0.0f);
  // first half: causal on its own
  ops.attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), blk);
  // second half: the full block written, then the causal one merged in
  ops.attention_forward(out.data() + to, lse.data() + t, q.data() + tq, k.data(), v.data(), full);
  ops.attention_forward(part.data() + to, part_lse.data() + t, q.data() + tq, k.data() + tk,
                        v.data() + tv, blk);
  ops.attention_merge(out.data() + to, lse.data() + t, part.data() + to, part_lse.data() + t, blk);
  EXPECT_TRUE(close(heads_only(out, s.ld_o, nh, hs), heads_only(want.out, s.ld_o, nh, hs), 1e-4,
                    1e-5))
      << "merged out";
  EXPECT_TRUE(close(lse, want.lse, 1e-5, 1e-5)) << "merged lse";

  FVec dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  for (Shape* sh : {&blk, &full}) sh->accumulate = true;
  ops.attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                         q.data(), k.data(), v.data(), blk);
  ops.attention_backward(dq.data() + tq, dk.data(), dv.data(), dout.data() + to, out.data() + to,
                         lse.data() + t, q.data() + tq, k.data(), v.data(), full);
  ops.attention_backward(dq.data() + tq, dk.data() + tk, dv.data() + tv, dout.data() + to,
                         out.data() + to, lse.data() + t, q.data() + tq, k.data() + tk,
                         v.data() + tv, blk);
  expect_grads_close(dq, dk, dv, want, s, nh, nkv, hs);
}

std::vector<OpCase> flash_cases() {
  std::vector<OpCase> cs;
  // b, t, nh, nkv, hs
  const int shapes[][5] = {{2, 37, 1, 1, 16},  {1, 37, 3, 3, 24},  {2, 256, 3, 3, 16},
                           {1, 256, 1, 1, 64}, {1, 1000, 3, 3, 8}, {1, 1000, 1, 1, 16},
                           {2, 70, 4, 2, 16},  {1, 65, 6, 1, 12},  {1, 1, 2, 1, 4},
                           {1, 70, 2, 1, 80}};
  for (auto& s : shapes)
    cs.push_back({name_of("flash_b%d_t%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]),
                  [=](Ops& o) { check_flash(o, s[0], s[1], s[2], s[3], s[4]); }});
  // Without the causal mask (ring attention's blocks against earlier keys)
  const int full[][5] = {{2, 37, 3, 3, 24}, {2, 70, 4, 2, 16}, {1, 130, 3, 1, 8}, {1, 1, 2, 1, 4}};
  for (auto& s : full)
    cs.push_back({name_of("flash_full_b%d_t%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]),
                  [=](Ops& o) { check_flash(o, s[0], s[1], s[2], s[3], s[4], false); }});
  const int blocks[][5] = {{2, 24, 3, 3, 8}, {1, 70, 4, 2, 16}, {2, 5, 4, 1, 8}};
  for (auto& s : blocks)
    cs.push_back({name_of("flash_blocks_b%d_t%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]),
                  [=](Ops& o) { check_blocks_merge(o, s[0], s[1], s[2], s[3], s[4]); }});
  const int fused[][4] = {{2, 67, 48, 3}, {1, 130, 64, 1}};
  for (auto& s : fused)
    cs.push_back({name_of("flash_vs_naive_b%d_t%d_c%d_nh%d", s[0], s[1], s[2], s[3]),
                  [=](Ops& o) { check_matches_naive(o, s[0], s[1], s[2], s[3]); }});
  return cs;
}

class Flash : public ::testing::TestWithParam<std::tuple<OpCase, int>> {};

TEST_P(Flash, MatchesDoubleReference) {
  const auto& [c, threads] = GetParam();
  auto ops = ops::make_cpu_ops(threads);
  c.check(*ops);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Flash, ::testing::Combine(::testing::ValuesIn(flash_cases()), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<Flash::ParamType>& info) {
      return std::get<0>(info.param).name + "_threads" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace trident::test
