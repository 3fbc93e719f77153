// test/unit/ops/forward_test.cpp — every forward kernel of the CPU backend against the naive
// double-precision references, over a table of odd and larger shapes (the larger ones
// exercise the multi-threaded paths), at 1 and 2 threads. In the spirit of ggml's
// test-backend-ops: one table, one check per row.
#include <memory>
#include <string>
#include <tuple>

#include "reference.hpp"
#include "trident/ops/ops.hpp"

namespace trident::test {
namespace {

using ops::Ops;


void check_linear(Ops& ops, int n, int in, int out, bool bias) {
  Rng r(11u + unsigned(n * 7 + in * 3 + out));
  const FVec x = r.normal(std::size_t(n) * in);
  const FVec w = r.normal(std::size_t(in) * out, 0.3);
  const FVec b = r.normal(out);
  FVec y(std::size_t(n) * out, 777.0f);  // garbage: y is written, not accumulated
  ops.linear_forward(y.data(), x.data(), w.data(), bias ? b.data() : nullptr, n, in, out);
  const Vec want = ref_linear(to_double(x), to_double(w), bias ? to_double(b) : Vec{}, n, in, out);
  EXPECT_TRUE(close(y, want, 1e-5, 1e-5 * max_abs(want)));
}

void check_layernorm(Ops& ops, int n, int c) {
  Rng r(23u + unsigned(n * 5 + c));
  const FVec x = r.normal(std::size_t(n) * c, 2.0, 0.5);  // a mean the kernel must remove
  const FVec w = r.normal(c, 0.2, 1.0);
  const FVec b = r.normal(c, 0.5);
  FVec y(std::size_t(n) * c, 777.0f), mean(n), rstd(n);
  ops.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  const LnOut want = ref_layernorm(to_double(x), to_double(w), to_double(b), n, c);
  EXPECT_TRUE(close(y, want.y, 1e-5, 1e-5 * max_abs(want.y))) << "y";
  EXPECT_TRUE(close(mean, want.mean, 1e-5, 1e-6)) << "mean";
  EXPECT_TRUE(close(rstd, want.rstd, 1e-5, 0.0)) << "rstd";
}

void check_gelu(Ops& ops, std::int64_t n) {
  Rng r(31u + unsigned(n));
  FVec x = r.normal(std::size_t(n), 3.0);
  const float special[] = {0.0f, 1e-4f, -1e-4f, 1.0f, -1.0f, 3.0f, -3.0f, 10.0f, -10.0f, 20.0f, -20.0f};
  for (std::size_t i = 0; i < sizeof special / sizeof special[0] && i < x.size(); i++)
    x[i] = special[i];
  FVec y(x.size(), 777.0f);
  ops.gelu_forward(y.data(), x.data(), n);
  EXPECT_TRUE(close(y, ref_gelu(to_double(x)), 1e-5, 1e-7));
}

void check_attention(Ops& ops, int b, int t, int c, int nh) {
  Rng r(41u + unsigned(b * 1000 + t * 10 + c + nh));
  const FVec qkv = r.normal(std::size_t(b) * t * 3 * c);
  FVec out(std::size_t(b) * t * c, 777.0f), att(std::size_t(b) * nh * t * t, 777.0f);
  ops.attention_naive_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
  const AttOut want = ref_attention(to_double(qkv), b, t, c, nh);
  EXPECT_TRUE(close(out, want.out, 1e-5, 1e-6)) << "out";
  EXPECT_TRUE(close(att, want.att, 1e-5, 1e-7)) << "att";
  std::size_t nonzero_above = 0;
  for (int bh = 0; bh < b * nh; bh++)
    for (int i = 0; i < t; i++)
      for (int j = i + 1; j < t; j++)
        nonzero_above += att[(std::size_t(bh) * t + i) * t + j] != 0.0f;
  EXPECT_EQ(nonzero_above, 0u) << "att above the diagonal must be exactly 0";
}

void check_embedding(Ops& ops, int n, int c, int vocab_start, int v) {
  Rng r(51u + unsigned(n + c));
  const FVec wte = r.normal(std::size_t(v) * c);
  std::vector<std::int32_t> tok(n);
  for (int i = 0; i < n; i++) tok[i] = r.integer(vocab_start - 3, vocab_start + v + 2);
  tok[0] = vocab_start - 1;  // just below the shard
  if (n > 1) tok[1] = vocab_start + v;  // just above
  if (n > 2) tok[2] = vocab_start;
  if (n > 3) tok[3] = vocab_start + v - 1;
  FVec x(std::size_t(n) * c, 777.0f);
  ops.embedding_forward(x.data(), tok.data(), wte.data(), n, c, vocab_start, v);
  EXPECT_TRUE(close(x, ref_embedding(tok, to_double(wte), n, c, vocab_start, v), 0.0, 0.0));
}

void check_position(Ops& ops, int b, int t, int c) {
  Rng r(61u + unsigned(b + t + c));
  const FVec x0 = r.normal(std::size_t(b) * t * c);
  const FVec wpe = r.normal(std::size_t(t) * c);
  FVec x = x0;
  ops.position_forward(x.data(), wpe.data(), b, t, c);
  // one float rounding of an exact double sum: equal to the rounded reference
  EXPECT_TRUE(close(x, to_float(ref_position(to_double(x0), to_double(wpe), b, t, c)), 0.0, 0.0));
}

void check_xent(Ops& ops, int n, int ld, int v_valid, int vocab_start, double offset, double sd) {
  Rng r(71u + unsigned(n + ld + v_valid));
  FVec logits = r.normal(std::size_t(n) * ld, sd, offset);
  for (int i = 0; i < n; i++)  // padding holds garbage that must be ignored
    for (int j = v_valid; j < ld; j++) logits[std::size_t(i) * ld + j] = 1e4f;
  std::vector<std::int32_t> tg(n);
  for (int i = 0; i < n; i++) tg[i] = vocab_start + r.integer(0, v_valid - 1);
  tg[0] = vocab_start - 1;  // targets outside this shard: target_logit 0
  if (n > 1) tg[1] = vocab_start + v_valid;
  FVec row_max(n), sumexp(n), target_logit(n, 777.0f), loss(n);
  ops.xent_row_max(row_max.data(), logits.data(), n, ld, v_valid);
  ops.xent_sumexp(sumexp.data(), target_logit.data(), logits.data(), row_max.data(), tg.data(), n,
                  ld, v_valid, vocab_start);
  ops.xent_loss(loss.data(), row_max.data(), sumexp.data(), target_logit.data(), n);

  const Vec l = to_double(logits);
  Vec want_max(n), want_sum(n), want_tl(n);
  for (int i = 0; i < n; i++) {
    double mx = -1e300;
    for (int j = 0; j < v_valid; j++) mx = std::max(mx, l[std::size_t(i) * ld + j]);
    double s = 0.0;
    for (int j = 0; j < v_valid; j++) s += std::exp(l[std::size_t(i) * ld + j] - mx);
    const int t = tg[i] - vocab_start;
    want_max[i] = mx;
    want_sum[i] = s;
    want_tl[i] = (t >= 0 && t < v_valid) ? l[std::size_t(i) * ld + t] : 0.0;
  }
  EXPECT_TRUE(close(row_max, want_max, 0.0, 0.0)) << "row_max";
  EXPECT_TRUE(close(sumexp, want_sum, 1e-5, 0.0)) << "sumexp";
  EXPECT_TRUE(close(target_logit, want_tl, 0.0, 0.0)) << "target_logit";
  const Vec want_loss = ref_xent(l, tg, n, ld, v_valid, vocab_start);
  EXPECT_TRUE(close(loss, want_loss, 1e-5, 1e-5 * (1.0 + std::abs(offset)))) << "loss";
}

std::vector<OpCase> forward_cases() {
  std::vector<OpCase> cs;
  const int linear_shapes[][3] = {{5, 7, 11}, {1, 3, 1}, {2, 1, 9}, {129, 70, 300}, {64, 256, 48}, {300, 40, 33}};
  for (auto& s : linear_shapes)
    for (bool bias : {true, false})
      cs.push_back({name_of("linear_n%d_in%d_out%d_%s", s[0], s[1], s[2], bias ? "bias" : "nobias"),
                    [=](Ops& o) { check_linear(o, s[0], s[1], s[2], bias); }});
  const int ln_shapes[][2] = {{5, 12}, {3, 1}, {7, 33}, {300, 130}, {64, 256}};
  for (auto& s : ln_shapes)
    cs.push_back({name_of("layernorm_n%d_c%d", s[0], s[1]), [=](Ops& o) { check_layernorm(o, s[0], s[1]); }});
  for (std::int64_t n : {11, 1000, 40001})
    cs.push_back({name_of("gelu_n%lld", (long long)n), [=](Ops& o) { check_gelu(o, n); }});
  const int att_shapes[][4] = {{2, 7, 12, 3}, {1, 1, 4, 1}, {1, 40, 16, 2}, {3, 33, 8, 1}, {2, 64, 32, 4}, {1, 97, 24, 3}};
  for (auto& s : att_shapes)
    cs.push_back({name_of("attention_b%d_t%d_c%d_nh%d", s[0], s[1], s[2], s[3]),
                  [=](Ops& o) { check_attention(o, s[0], s[1], s[2], s[3]); }});
  const int emb_shapes[][4] = {{9, 5, 10, 6}, {7, 12, 0, 20}, {300, 130, 1000, 57}};
  for (auto& s : emb_shapes)
    cs.push_back({name_of("embedding_n%d_c%d_vs%d_v%d", s[0], s[1], s[2], s[3]),
                  [=](Ops& o) { check_embedding(o, s[0], s[1], s[2], s[3]); }});
  const int pos_shapes[][3] = {{2, 7, 12}, {4, 64, 130}};
  for (auto& s : pos_shapes)
    cs.push_back({name_of("position_b%d_t%d_c%d", s[0], s[1], s[2]),
                  [=](Ops& o) { check_position(o, s[0], s[1], s[2]); }});
  cs.push_back({"xent_n5_ld13_v11_vs20", [](Ops& o) { check_xent(o, 5, 13, 11, 20, 0.0, 1.0); }});
  cs.push_back({"xent_n64_ld1008_v1000_offset80", [](Ops& o) { check_xent(o, 64, 1008, 1000, 0, 80.0, 5.0); }});
  cs.push_back({"xent_n3_ld4096_v4096_vs4096", [](Ops& o) { check_xent(o, 3, 4096, 4096, 4096, -30.0, 3.0); }});
  return cs;
}

class Forward : public ::testing::TestWithParam<std::tuple<OpCase, int>> {};

TEST_P(Forward, MatchesDoubleReference) {
  const auto& [c, threads] = GetParam();
  auto ops = ops::make_cpu_ops(threads);
  c.check(*ops);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Forward, ::testing::Combine(::testing::ValuesIn(forward_cases()), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<Forward::ParamType>& info) {
      return std::get<0>(info.param).name + "_threads" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace trident::test
