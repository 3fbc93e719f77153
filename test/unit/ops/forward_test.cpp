// test/unit/ops/forward_test.cpp — every forward kernel of the CPU backend against the naive
// double-precision references, over a table of odd and larger shapes (the larger ones
// exercise the multi-threaded paths), at 1 and 2 threads. In the spirit of ggml's
// test-backend-ops: one table, one check per row.
#include <cmath>
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

void check_rmsnorm(Ops& ops, int n, int c, float eps) {
  Rng r(27u + unsigned(n * 5 + c));
  const FVec x = r.normal(std::size_t(n) * c, 2.0, 0.5);
  const FVec w = r.normal(c, 0.2, 1.0);
  FVec y(std::size_t(n) * c, 777.0f), rstd(n, 777.0f);
  ops.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, c, eps);
  const RmsOut want = ref_rmsnorm(to_double(x), to_double(w), n, c, eps);
  EXPECT_TRUE(close(y, want.y, 1e-5, 1e-5 * max_abs(want.y))) << "y";
  EXPECT_TRUE(close(rstd, want.rstd, 1e-5, 0.0)) << "rstd";
  FVec y2(y.size(), 777.0f);  // rstd may be null
  ops.rmsnorm_forward(y2.data(), nullptr, x.data(), w.data(), n, c, eps);
  EXPECT_TRUE(close(y2, y, 0.0, 0.0)) << "y without rstd";
}

// In place on x[B,T,ld] with heads * hs < ld: the columns past the heads stay as they were.
// Positions up to pos0 + t: angles of thousands of radians at the lowest frequency.
void check_rope(Ops& ops, int b, int t, int ld, int heads, int hs, int pos0, float theta) {
  Rng r(37u + unsigned(b * 1000 + t * 10 + ld + heads + hs + pos0));
  const FVec x0 = r.normal(std::size_t(b) * t * ld);
  FVec x = x0;
  ops.rope_forward(x.data(), b, t, ld, heads, hs, pos0, theta);
  const Vec want = ref_rope(to_double(x0), b, t, ld, heads, hs, pos0, theta);
  EXPECT_TRUE(close(x, want, 1e-5, 2e-6 * max_abs(want))) << "rotated";
  std::size_t touched = 0;
  for (std::size_t row = 0; row < std::size_t(b) * t; row++)
    for (int j = heads * hs; j < ld; j++) touched += x[row * ld + j] != x0[row * ld + j];
  EXPECT_EQ(touched, 0u) << "columns past heads * hs must be untouched";
  // the backward is the inverse rotation: it takes the rotated values back
  ops.rope_backward(x.data(), b, t, ld, heads, hs, pos0, theta);
  EXPECT_TRUE(close(x, x0, 1e-5, 1e-6 * max_abs(to_double(x0)))) << "backward(forward(x)) = x";
}

// The last row of full causal attention, from a cache: q of sequence b's last position
// against its s keys. With nkv < nh the reference sees each kv head repeated (a qkv of
// nh heads built by copying), so the GQA mapping h -> h / (nh / nkv) is checked too. The
// cache rows are wider than the heads (ld_kv) and sequences sit kv_batch apart.
void check_decode(Ops& ops, int b, int s, int nh, int nkv, int hs) {
  Rng r(47u + unsigned(b * 100 + s + nh * 7 + nkv));
  const int c = nh * hs, ckv = nkv * hs, rep = nh / nkv;
  const std::int64_t ld_kv = 2 * ckv + 3, kv_batch = (s + 2) * ld_kv, ld_q = c + 5;
  const FVec q = r.normal(std::size_t(b) * ld_q), kv = r.normal(std::size_t(b) * kv_batch, 1.5);
  FVec out(std::size_t(b) * (c + 1), 777.0f), scratch(std::size_t(ops::Ops::decode_scratch_floats(b, nh, s)));
  ops.attention_decode(out.data(), scratch.data(), q.data(), kv.data(), kv.data() + ckv, b, s, nh,
                       nkv, hs, ld_q, ld_kv, kv_batch, c + 1);
  for (int bb = 0; bb < b; bb++) {
    Vec qkv(std::size_t(s) * 3 * c, 0.0);  // one sequence, the query at its last position
    for (int j = 0; j < s; j++)
      for (int h = 0; h < nh; h++)
        for (int d = 0; d < hs; d++) {
          const std::size_t row = std::size_t(j) * 3 * c + std::size_t(h) * hs + d;
          const std::size_t cache = std::size_t(bb) * kv_batch + std::size_t(j) * ld_kv + std::size_t(h / rep) * hs + d;
          if (j == s - 1) qkv[row] = q[std::size_t(bb) * ld_q + std::size_t(h) * hs + d];
          qkv[row + c] = kv[cache];
          qkv[row + 2 * c] = kv[cache + ckv];
        }
    const AttOut want = ref_attention(qkv, 1, s, c, nh);
    const Vec last(want.out.end() - c, want.out.end());
    const FVec got(out.begin() + std::ptrdiff_t(bb) * (c + 1), out.begin() + std::ptrdiff_t(bb) * (c + 1) + c);
    EXPECT_TRUE(close(got, last, 1e-5, 1e-6)) << "sequence " << bb;
    EXPECT_EQ(out[std::size_t(bb) * (c + 1) + c], 777.0f) << "wrote past the heads";
  }
}

void check_swiglu(Ops& ops, int n, int f) {
  Rng r(43u + unsigned(n * 3 + f));
  FVec gu = r.normal(std::size_t(n) * 2 * f, 3.0);
  const float special[] = {0.0f, 1e-4f, -1e-4f, 1.0f, -1.0f, 20.0f, -20.0f, 90.0f, -90.0f};
  for (std::size_t i = 0; i < sizeof special / sizeof special[0] && i < std::size_t(f); i++)
    gu[i] = special[i];  // gates of row 0
  FVec y(std::size_t(n) * f, 777.0f);
  ops.swiglu_forward(y.data(), gu.data(), n, f);
  const Vec want = ref_swiglu(to_double(gu), n, f);
  EXPECT_TRUE(close(y, want, 1e-5, 1e-7 * max_abs(want)));
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
  const int rms_shapes[][2] = {{5, 12}, {3, 1}, {7, 33}, {300, 130}, {64, 256}};
  for (auto& s : rms_shapes)
    for (int e : {5, 6})  // eps = 1e-5, 1e-6
      cs.push_back({name_of("rmsnorm_n%d_c%d_eps1e%d", s[0], s[1], e),
                    [=](Ops& o) { check_rmsnorm(o, s[0], s[1], float(std::pow(10.0, -e))); }});
  // b, t, ld, heads, hs, pos0, theta: q and k of a qkv row side by side (ld = 3 heads' worth),
  // one head of width 2, and positions far from 0 (Llama 3's theta too)
  struct RopeShape { int b, t, ld, heads, hs, pos0; float theta; };
  const RopeShape rope_shapes[] = {{2, 7, 36, 6, 4, 0, 10000.0f}, {1, 5, 2, 1, 2, 0, 10000.0f},
                                   {3, 33, 50, 3, 16, 4093, 10000.0f}, {1, 1, 64, 2, 32, 700, 500000.0f},
                                   {4, 130, 200, 6, 32, 0, 10000.0f}};
  for (auto s : rope_shapes)
    cs.push_back({name_of("rope_b%d_t%d_ld%d_h%d_hs%d_p%d_th%g", s.b, s.t, s.ld, s.heads, s.hs, s.pos0, double(s.theta)),
                  [=](Ops& o) { check_rope(o, s.b, s.t, s.ld, s.heads, s.hs, s.pos0, s.theta); }});
  const int decode_shapes[][5] = {{1, 1, 2, 2, 4}, {2, 9, 4, 2, 8}, {3, 37, 6, 1, 4}, {1, 130, 4, 4, 16}};
  for (auto& s : decode_shapes)
    cs.push_back({name_of("decode_b%d_s%d_nh%d_nkv%d_hs%d", s[0], s[1], s[2], s[3], s[4]),
                  [=](Ops& o) { check_decode(o, s[0], s[1], s[2], s[3], s[4]); }});
  const int swiglu_shapes[][2] = {{3, 11}, {1, 1}, {40, 172}, {130, 300}};
  for (auto& s : swiglu_shapes)
    cs.push_back({name_of("swiglu_n%d_f%d", s[0], s[1]), [=](Ops& o) { check_swiglu(o, s[0], s[1]); }});
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
