// test/unit/ops/backward_test.cpp — every backward kernel of the CPU backend against
// central finite differences of L = sum(dy * f(x)), with f the double-precision reference
// (so the finite-difference error is far below the float error of the kernel under
// test). Parameter gradients and layernorm's dx start from nonzero values to check the
// += rule; written gradients start from garbage to check they are overwritten. Large
// shapes compare a spread sample of the entries.
#include <memory>
#include <string>
#include <tuple>

#include "reference.hpp"
#include "trident/ops/ops.hpp"

namespace trident::test {
namespace {

using ops::Ops;


constexpr std::size_t kSample = 240;  // finite-difference entries per tensor, at most

// got == base + fd at the sampled indices (base empty: 0), to rtol 1e-4 of the entry and
// 1e-5 of the gradient's scale.
::testing::AssertionResult grad_close(const FVec& got, const Vec& base, const Vec& fd,
                                      const std::vector<std::size_t>& idx) {
  Vec want = fd;
  if (!base.empty())
    for (std::size_t i = 0; i < want.size(); i++) want[i] += base[i];
  return close(pick(got, idx), pick(want, idx), 1e-4, 1e-5 * max_abs(fd) + 1e-7);
}

void check_linear(Ops& ops, int n, int in, int out, std::size_t samples) {
  Rng r(101u + unsigned(n * 7 + in * 3 + out));
  const FVec x = r.normal(std::size_t(n) * in), w = r.normal(std::size_t(in) * out, 0.3);
  const FVec b = r.normal(out), dy = r.normal(std::size_t(n) * out);
  const FVec dw0 = r.normal(w.size()), db0 = r.normal(b.size());
  FVec dx(x.size(), 777.0f), dw = dw0, db = db0;
  ops.linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in, out);

  const Vec X = to_double(x), W = to_double(w), B = to_double(b), DY = to_double(dy);
  // each loss evaluation is a whole N x in x out product: fewer samples for large shapes
  const auto ix = spread(X.size(), samples), iw = spread(W.size(), samples), ib = spread(B.size(), samples);
  const Vec gx = fd_grad(X, [&](const Vec& v) { return dot(DY, ref_linear(v, W, B, n, in, out)); }, 1e-3, ix);
  const Vec gw = fd_grad(W, [&](const Vec& v) { return dot(DY, ref_linear(X, v, B, n, in, out)); }, 1e-3, iw);
  const Vec gb = fd_grad(B, [&](const Vec& v) { return dot(DY, ref_linear(X, W, v, n, in, out)); }, 1e-3, ib);
  EXPECT_TRUE(grad_close(dx, {}, gx, ix)) << "dx";
  EXPECT_TRUE(grad_close(dw, to_double(dw0), gw, iw)) << "dw (+=)";
  EXPECT_TRUE(grad_close(db, to_double(db0), gb, ib)) << "db (+=)";

  // Again without dx and db: dw accumulates a second copy, db is left alone.
  ops.linear_backward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out);
  Vec gw2 = gw;
  for (auto& g : gw2) g *= 2.0;
  EXPECT_TRUE(grad_close(dw, to_double(dw0), gw2, iw)) << "dw after two backwards";
  EXPECT_TRUE(grad_close(db, to_double(db0), gb, ib)) << "db untouched when null";
}

void check_layernorm(Ops& ops, int n, int c) {
  Rng r(201u + unsigned(n * 5 + c));
  const FVec x = r.normal(std::size_t(n) * c, 2.0, 0.5), w = r.normal(c, 0.2, 1.0), b = r.normal(c, 0.5);
  const FVec dy = r.normal(x.size());
  const FVec dx0 = r.normal(x.size()), dw0 = r.normal(c), db0 = r.normal(c);
  FVec y(x.size()), mean(n), rstd(n);
  ops.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  FVec dx = dx0, dw = dw0, db = db0;
  ops.layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                         rstd.data(), n, c);

  const Vec X = to_double(x), W = to_double(w), B = to_double(b), DY = to_double(dy);
  const auto ix = spread(X.size(), kSample), iw = spread(W.size(), kSample);
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    return dot(DY, ref_layernorm(xx, ww, bb, n, c).y);
  };
  const Vec gx = fd_grad(X, [&](const Vec& v) { return loss(v, W, B); }, 1e-4, ix);
  const Vec gw = fd_grad(W, [&](const Vec& v) { return loss(X, v, B); }, 1e-4, iw);
  const Vec gb = fd_grad(B, [&](const Vec& v) { return loss(X, W, v); }, 1e-4, iw);
  EXPECT_TRUE(grad_close(dx, to_double(dx0), gx, ix)) << "dx (+=, the residual stream)";
  EXPECT_TRUE(grad_close(dw, to_double(dw0), gw, iw)) << "dw (+=)";
  EXPECT_TRUE(grad_close(db, to_double(db0), gb, iw)) << "db (+=)";

  // A second backward adds the same gradients again.
  ops.layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                         rstd.data(), n, c);
  Vec gx2 = gx, gw2 = gw, gb2 = gb;
  for (auto* g : {&gx2, &gw2, &gb2})
    for (auto& e : *g) e *= 2.0;
  EXPECT_TRUE(grad_close(dx, to_double(dx0), gx2, ix)) << "dx after two backwards";
  EXPECT_TRUE(grad_close(dw, to_double(dw0), gw2, iw)) << "dw after two backwards";
  EXPECT_TRUE(grad_close(db, to_double(db0), gb2, iw)) << "db after two backwards";
}

void check_gelu(Ops& ops, std::int64_t n) {
  Rng r(301u + unsigned(n));
  FVec x = r.normal(std::size_t(n), 2.5);
  const float special[] = {0.0f, 1e-4f, -1e-4f, 1.0f, -1.0f, 3.0f, -3.0f, 6.0f, -6.0f};
  for (std::size_t i = 0; i < sizeof special / sizeof special[0] && i < x.size(); i++) x[i] = special[i];
  const FVec dy = r.normal(x.size());
  FVec dx(x.size(), 777.0f);
  ops.gelu_backward(dx.data(), x.data(), dy.data(), n);
  // L = sum dy * gelu(x) is separable: its finite difference is element by element.
  Vec fd(x.size());
  const double h = 1e-4;
  for (std::size_t i = 0; i < x.size(); i++) {
    const Vec p = ref_gelu({double(x[i]) + h, double(x[i]) - h});
    fd[i] = double(dy[i]) * (p[0] - p[1]) / (2 * h);
  }
  EXPECT_TRUE(close(dx, fd, 1e-4, 1e-6));
}

void check_attention(Ops& ops, int b, int t, int c, int nh) {
  Rng r(401u + unsigned(b * 1000 + t * 10 + c + nh));
  const FVec qkv = r.normal(std::size_t(b) * t * 3 * c);
  const FVec dout = r.normal(std::size_t(b) * t * c);
  FVec out(dout.size()), att(std::size_t(b) * nh * t * t);
  ops.attention_naive_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
  FVec dqkv(qkv.size(), 777.0f), datt(att.size(), 777.0f);
  ops.attention_naive_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), b, t, c, nh);

  const Vec Q = to_double(qkv), DO = to_double(dout);
  const auto iq = spread(Q.size(), kSample);
  const Vec g = fd_grad(Q, [&](const Vec& v) { return dot(DO, ref_attention(v, b, t, c, nh).out); }, 1e-4, iq);
  EXPECT_TRUE(grad_close(dqkv, {}, g, iq)) << "dqkv";
}

// Causality: with the loss on one position t0 of batch 0 only, no gradient reaches the
// keys and values of later positions, nor the queries of other positions, nor batch 1.
void check_attention_causal(Ops& ops, int t, int c, int nh, int t0) {
  const int b = 2;
  Rng r(501u + unsigned(t + t0));
  const FVec qkv = r.normal(std::size_t(b) * t * 3 * c);
  FVec dout(std::size_t(b) * t * c, 0.0f);
  for (int j = 0; j < c; j++) dout[std::size_t(t0) * c + j] = static_cast<float>(r.normal(1)[0]);
  FVec out(dout.size()), att(std::size_t(b) * nh * t * t);
  ops.attention_naive_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
  FVec dqkv(qkv.size(), 777.0f), datt(att.size(), 777.0f);
  ops.attention_naive_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), b, t, c, nh);
  std::size_t leaks = 0, live = 0;
  for (int bb = 0; bb < b; bb++)
    for (int p = 0; p < t; p++)
      for (int j = 0; j < 3 * c; j++) {
        const float g = dqkv[(std::size_t(bb) * t + p) * 3 * c + j];
        const bool is_q = j < c;
        const bool may_flow = bb == 0 && (is_q ? p == t0 : p <= t0);
        if (!may_flow) leaks += g != 0.0f;
        else live += g != 0.0f;
      }
  EXPECT_EQ(leaks, 0u) << "gradient reached future keys/values, other queries or batch 1";
  EXPECT_GT(live, 0u) << "no gradient where it should flow";
}

void check_embedding(Ops& ops, int n, int c, int vocab_start, int v) {
  Rng r(601u + unsigned(n + c));
  const FVec wte = r.normal(std::size_t(v) * c), dx = r.normal(std::size_t(n) * c);
  std::vector<std::int32_t> tok(n);
  for (int i = 0; i < n; i++) tok[i] = r.integer(vocab_start - 3, vocab_start + v + 2);
  tok[0] = vocab_start - 1;
  if (n > 2) tok[1] = tok[2] = vocab_start + 1;  // a repeated token accumulates twice
  if (n > 3) tok[3] = vocab_start + v;
  const FVec dwte0 = r.normal(wte.size());
  FVec dwte = dwte0;
  FVec guarded(dwte0.size() + std::size_t(c), 5.0f);  // one row past the shard must stay untouched
  std::copy(dwte0.begin(), dwte0.end(), guarded.begin());
  ops.embedding_backward(guarded.data(), dx.data(), tok.data(), n, c, vocab_start, v);
  for (std::size_t j = dwte0.size(); j < guarded.size(); j++) ASSERT_EQ(guarded[j], 5.0f) << "wrote past row v";
  ops.embedding_backward(dwte.data(), dx.data(), tok.data(), n, c, vocab_start, v);
  const Vec DX = to_double(dx);
  const auto iw = spread(wte.size(), kSample);
  const Vec g = fd_grad(to_double(wte), [&](const Vec& w) { return dot(DX, ref_embedding(tok, w, n, c, vocab_start, v)); },
                        1e-3, iw);
  EXPECT_TRUE(grad_close(dwte, to_double(dwte0), g, iw)) << "dwte (+=)";
  ops.embedding_backward(dwte.data(), dx.data(), tok.data(), n, c, vocab_start, v);
  Vec g2 = g;
  for (auto& e : g2) e *= 2.0;
  EXPECT_TRUE(grad_close(dwte, to_double(dwte0), g2, iw)) << "dwte after two backwards";
}

void check_position(Ops& ops, int b, int t, int c) {
  Rng r(701u + unsigned(b + t + c));
  const FVec x = r.normal(std::size_t(b) * t * c), wpe = r.normal(std::size_t(t) * c), dx = r.normal(x.size());
  const FVec dwpe0 = r.normal(wpe.size());
  FVec dwpe = dwpe0;
  ops.position_backward(dwpe.data(), dx.data(), b, t, c);
  const Vec X = to_double(x), DX = to_double(dx);
  const auto iw = spread(wpe.size(), kSample);
  const Vec g = fd_grad(to_double(wpe), [&](const Vec& w) { return dot(DX, ref_position(X, w, b, t, c)); }, 1e-3, iw);
  EXPECT_TRUE(grad_close(dwpe, to_double(dwpe0), g, iw)) << "dwpe (+=)";
  ops.position_backward(dwpe.data(), dx.data(), b, t, c);
  Vec g2 = g;
  for (auto& e : g2) e *= 2.0;
  EXPECT_TRUE(grad_close(dwpe, to_double(dwpe0), g2, iw)) << "dwpe after two backwards";
}

// The gradient of the mean loss, scale * sum_i loss_i with scale = 1/N, with respect to the
// logits is scale * (softmax - onehot(target)); padding columns get exactly 0.
void check_xent(Ops& ops, int n, int ld, int v_valid, int vocab_start) {
  Rng r(801u + unsigned(n + ld + v_valid));
  FVec logits = r.normal(std::size_t(n) * ld, 2.0);
  for (int i = 0; i < n; i++)
    for (int j = v_valid; j < ld; j++) logits[std::size_t(i) * ld + j] = 1e4f;
  std::vector<std::int32_t> tg(n);
  for (int i = 0; i < n; i++) tg[i] = vocab_start + r.integer(0, v_valid - 1);
  tg[0] = vocab_start + v_valid + 3;  // a target in another shard: no onehot term here
  const float scale = 1.0f / static_cast<float>(n);
  FVec row_max(n), sumexp(n), target_logit(n);
  ops.xent_row_max(row_max.data(), logits.data(), n, ld, v_valid);
  ops.xent_sumexp(sumexp.data(), target_logit.data(), logits.data(), row_max.data(), tg.data(), n, ld,
                  v_valid, vocab_start);
  const Vec L = to_double(logits);
  FVec grad = logits;
  ops.xent_backward(grad.data(), row_max.data(), sumexp.data(), tg.data(), n, ld, v_valid, vocab_start, scale);

  // finite differences over the real columns only
  std::vector<std::size_t> real;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < v_valid; j++) real.push_back(std::size_t(i) * ld + j);
  std::vector<std::size_t> idx;
  for (std::size_t k : spread(real.size(), kSample)) idx.push_back(real[k]);
  auto mean_loss = [&](const Vec& l) {
    double s = 0.0;
    for (double e : ref_xent(l, tg, n, ld, v_valid, vocab_start)) s += e;
    return double(scale) * s;
  };
  const Vec g = fd_grad(L, mean_loss, 1e-4, idx);
  EXPECT_TRUE(grad_close(grad, {}, g, idx)) << "d mean loss / d logits";

  // the closed form, everywhere
  Vec want(L.size(), 0.0);
  for (int i = 0; i < n; i++) {
    const double* l = L.data() + std::size_t(i) * ld;
    double mx = -1e300, s = 0.0;
    for (int j = 0; j < v_valid; j++) mx = std::max(mx, l[j]);
    for (int j = 0; j < v_valid; j++) s += std::exp(l[j] - mx);
    for (int j = 0; j < v_valid; j++) {
      const bool hot = tg[i] - vocab_start == j;
      want[std::size_t(i) * ld + j] = scale * (std::exp(l[j] - mx) / s - (hot ? 1.0 : 0.0));
    }
  }
  EXPECT_TRUE(close(grad, want, 1e-5, 1e-6 * scale)) << "scale * (softmax - onehot)";
  std::size_t pad_nonzero = 0;
  for (int i = 0; i < n; i++)
    for (int j = v_valid; j < ld; j++) pad_nonzero += grad[std::size_t(i) * ld + j] != 0.0f;
  EXPECT_EQ(pad_nonzero, 0u) << "padding columns must get exactly 0";
}

std::vector<OpCase> backward_cases() {
  std::vector<OpCase> cs;
  // the last two are large enough for the threaded paths (split sgemm, db over 2 threads)
  const int linear_shapes[][4] = {{5, 7, 11, 1000}, {1, 3, 1, 1000}, {33, 9, 20, 1000}, {260, 64, 130, 40}, {64, 256, 48, 40}};
  for (auto& s : linear_shapes)
    cs.push_back({name_of("linear_n%d_in%d_out%d", s[0], s[1], s[2]),
                  [=](Ops& o) { check_linear(o, s[0], s[1], s[2], std::size_t(s[3])); }});
  const int ln_shapes[][2] = {{5, 12}, {7, 33}, {300, 130}};
  for (auto& s : ln_shapes)
    cs.push_back({name_of("layernorm_n%d_c%d", s[0], s[1]), [=](Ops& o) { check_layernorm(o, s[0], s[1]); }});
  for (std::int64_t n : {13, 40001})
    cs.push_back({name_of("gelu_n%lld", (long long)n), [=](Ops& o) { check_gelu(o, n); }});
  const int att_shapes[][4] = {{2, 7, 12, 3}, {1, 40, 16, 2}, {2, 67, 16, 4}};
  for (auto& s : att_shapes)
    cs.push_back({name_of("attention_b%d_t%d_c%d_nh%d", s[0], s[1], s[2], s[3]),
                  [=](Ops& o) { check_attention(o, s[0], s[1], s[2], s[3]); }});
  const int causal[][4] = {{7, 12, 3, 3}, {45, 16, 2, 35}, {45, 16, 2, 0}};
  for (auto& s : causal)
    cs.push_back({name_of("attention_causal_t%d_c%d_nh%d_at%d", s[0], s[1], s[2], s[3]),
                  [=](Ops& o) { check_attention_causal(o, s[0], s[1], s[2], s[3]); }});
  const int emb_shapes[][4] = {{9, 5, 10, 6}, {300, 130, 1000, 57}};
  for (auto& s : emb_shapes)
    cs.push_back({name_of("embedding_n%d_c%d_vs%d_v%d", s[0], s[1], s[2], s[3]),
                  [=](Ops& o) { check_embedding(o, s[0], s[1], s[2], s[3]); }});
  const int pos_shapes[][3] = {{2, 7, 12}, {4, 64, 130}};
  for (auto& s : pos_shapes)
    cs.push_back({name_of("position_b%d_t%d_c%d", s[0], s[1], s[2]), [=](Ops& o) { check_position(o, s[0], s[1], s[2]); }});
  cs.push_back({"xent_n5_ld13_v11_vs20", [](Ops& o) { check_xent(o, 5, 13, 11, 20); }});
  cs.push_back({"xent_n40_ld1008_v1000_vs0", [](Ops& o) { check_xent(o, 40, 1008, 1000, 0); }});
  return cs;
}

class Backward : public ::testing::TestWithParam<std::tuple<OpCase, int>> {};

TEST_P(Backward, MatchesFiniteDifferences) {
  const auto& [c, threads] = GetParam();
  auto ops = ops::make_cpu_ops(threads);
  c.check(*ops);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Backward, ::testing::Combine(::testing::ValuesIn(backward_cases()), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<Backward::ParamType>& info) {
      return std::get<0>(info.param).name + "_threads" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace trident::test
