// test/unit/ops/cuda/llama_block_check.hpp — the fused Llama block of a device backend
// (Ops::llama_block_forward / backward with a bf16 stash) against the CPU backend's
// composition (ops/fused_block.cpp, fp32): output, input gradient and every parameter
// gradient, each max |got - want| / max |want| (fused_block_check.hpp's Case, Result, rel).
// Run by the stand-in's program (emulate/llama_block.cpp). The split backward as
// fused_block_check.hpp's (Split), and selective recompute (its Recompute:
// Ops::llama_block_recompute between the forward and the backward).
// defines: trident::test::llama_block::Shape, run, compare, random_case
#pragma once

#include "fused_block_check.hpp"

namespace trident::test::llama_block {

using fused_block::Case;
using fused_block::OwnAttention;
using fused_block::Recompute;
using fused_block::Result;
using fused_block::Split;
using ops::Ops;

struct Shape {
  int b, t, c, nh, nkv, f;
  // Context parallelism: the rows' positions (RoPE per run) and, with hook, attention through
  // the shape's BlockAttention (OwnAttention: the backend's own fp32 attention_forward /
  // backward, as a one-rank stand-in for the ring).
  ops::CpSlice slice{};
  bool hook = false;
  int n() const { return b * t; }
  int hs() const { return c / nh; }
  std::int64_t c3() const { return c + 2LL * nkv * hs(); }
  // the parameters' sizes in LlamaBlockParams' order
  std::vector<std::int64_t> params() const {
    const std::int64_t C = c, F = f;
    return {C, c3() * C, C * C, C, 2 * F * C, C * F};
  }
  std::int64_t param_count() const {
    std::int64_t s = 0;
    for (std::int64_t p : params()) s += p;
    return s;
  }
  // the stash's floats when fp32 (the larger)
  std::int64_t stash_floats() const {
    const std::int64_t N = n();
    return 4 * N * c + N * c3() + 3 * N * f + 2 * N + std::int64_t(b) * nh * t;
  }
  Ops::LlamaBlockShape shape() const {
    Ops::LlamaBlockShape s;
    s.b = b, s.t = t, s.c = c, s.nh = nh, s.nkv = nkv, s.f = f;
    s.eps = 1e-5f, s.theta = 10000.0f;
    s.slice = slice;
    return s;
  }
};


inline Ops::LlamaBlockParams views(const Shape& s, float* base) {
  float* v[6];
  const std::vector<std::int64_t> sizes = s.params();
  for (int i = 0; i < 6; ++i) {
    v[i] = base;
    base += sizes[std::size_t(i)];
  }
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

// The stash carved as the model does (fp32, or bf16 halves for ln1 qkv atty ln2 fch fch_gelu).
inline Ops::LlamaBlockStash carve(const Shape& s, float* p, bool bf16) {
  auto take = [&p](std::int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  auto big = [&](std::int64_t n) { return take(bf16 ? (n + 1) / 2 : n); };
  const std::int64_t N = s.n(), C = s.c, F = s.f;
  Ops::LlamaBlockStash la{};
  la.ln1 = big(N * C), la.ln1_rstd = take(N), la.qkv = big(N * s.c3()), la.atty = big(N * C);
  la.lse = take(std::int64_t(s.b) * s.nh * s.t), la.res2 = take(N * C), la.ln2 = big(N * C);
  la.ln2_rstd = take(N), la.fch = big(N * 2 * F), la.fch_gelu = big(N * F);
  la.bf16 = bf16;
  return la;
}

// RMSNorm weights near 1, small matrices, x ~ N(0, 1), d loss / d out ~ N(0, 0.01).
inline Case random_case(const Shape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case k;
  k.w.resize(std::size_t(s.param_count()));
  k.x.resize(std::size_t(s.n()) * std::size_t(s.c));
  k.dout.resize(k.x.size());
  std::int64_t off = 0;
  const std::vector<std::int64_t> sizes = s.params();
  for (int i = 0; i < 6; ++i) {
    const bool norm_w = i == 0 || i == 3;
    for (std::int64_t j = 0; j < sizes[std::size_t(i)]; ++j)
      k.w[std::size_t(off + j)] = norm_w ? 1.0f + 0.1f * normal(rng) : 0.05f * normal(rng);
    off += sizes[std::size_t(i)];
  }
  for (float& v : k.x) v = normal(rng);
  for (float& v : k.dout) v = 0.01f * normal(rng);
  return k;
}

// One forward and backward on `ops`; break_stash overwrites la.fch between them, dres_scale
// multiplies d loss / d out: the broken runs a check must catch. split: the backward split
// into B and W (fused_block::Split). recompute (fused_block::Recompute): selective and skipped
// run the next layer's forward (the block again on this one's output, into a stash sharing
// la's atty, lse and fch_gelu) between the forward and the backward, selective then
// llama_block_recompute; Llama's forward is the same for a recomputed stash, so kept is none.
inline Result run(Ops& ops, const Shape& s, bool bf16, const Case& k, bool break_stash = false,
                  float dres_scale = 1.0f, Split split = Split::none,
                  Recompute recompute = Recompute::none) {
  DeviceMemory* mem = ops.memory();
  OwnAttention own(ops);
  Ops::LlamaBlockShape shape = s.shape();
  if (s.hook) shape.attention = &own;
  const std::int64_t P = s.param_count();
  const std::size_t nc = std::size_t(s.n()) * std::size_t(s.c);
  const std::size_t nf = std::size_t(s.n()) * std::size_t(s.f);
  FloatBuffer params(std::size_t(P), mem), grads(std::size_t(P), mem);
  FloatBuffer xb(nc, mem), out(nc, mem), dres(nc, mem);
  FloatBuffer stash(std::size_t(s.stash_floats()), mem);
  const bool next_layer = recompute == Recompute::selective || recompute == Recompute::skipped;
  FloatBuffer next_stash(next_layer ? std::size_t(s.stash_floats()) : 0, mem);
  FloatBuffer dbuf(nc, mem), dqkv(std::size_t(s.n()) * std::size_t(s.c3()), mem);
  FloatBuffer dfch(2 * nf, mem), dact(nf, mem);
  const std::size_t nqkv = std::size_t(s.n()) * std::size_t(s.c3());
  FloatBuffer w_own(split == Split::separate ? 2 * nf + nqkv : 0, mem);  // fp32's (the larger)
  copy_to_device(mem, params.data(), k.w.data(), k.w.size() * 4);
  copy_to_device(mem, xb.data(), k.x.data(), k.x.size() * 4);
  std::vector<float> d = k.dout;
  for (float& v : d) v *= dres_scale;
  copy_to_device(mem, dres.data(), d.data(), d.size() * 4);
  ops.fill(grads.data(), 0.0f, P);
  ops.set_weights(params.data(), P);
  const Ops::LlamaBlockStash la = carve(s, stash.data(), bf16);
  ops.llama_block_forward(shape, views(s, params.data()), xb.data(), out.data(), la);
  if (break_stash) ops.copy(la.fch, xb.data(), std::int64_t(nc));
  if (next_layer) {
    Ops::LlamaBlockStash next = carve(s, next_stash.data(), bf16);
    next.atty = la.atty, next.lse = la.lse, next.fch_gelu = la.fch_gelu;
    ops.llama_block_forward(shape, views(s, params.data()), out.data(), dbuf.data(), next);
    if (recompute == Recompute::selective) ops.llama_block_recompute(shape, la);
  }
  Ops::BlockWStash w{la.fch, la.qkv};
  if (split == Split::separate) w = {w_own.data(), w_own.data() + 2 * nf};
  ops.llama_block_backward(shape, views(s, params.data()), views(s, grads.data()),
                           xb.data(), dres.data(), la,
                           {dbuf.data(), dqkv.data(), dfch.data(), dact.data()},
                           split == Split::none ? nullptr : &w);
  if (split != Split::none) {
    const std::int64_t big = bf16 ? 2 : 1;  // elements a float holds
    for (FloatBuffer* b : {&dbuf, &dqkv, &dfch, &dact})
      fused_block::poison(ops, b->data(), std::int64_t(b->size()));
    fused_block::poison(ops, la.atty, std::int64_t(nc) / big);
    fused_block::poison(ops, la.fch_gelu, std::int64_t(nf) / big);
    fused_block::poison(ops, la.res2, std::int64_t(nc));
    if (split == Split::broken) ops.copy(w.dqkv, xb.data(), std::int64_t(nc) / 4);  // fits bf16
    ops.llama_block_backward_weights(shape, views(s, params.data()), views(s, grads.data()),
                                     la, w);
  }
  Result r;
  r.out.resize(nc), r.dx.resize(nc), r.grads.resize(std::size_t(P));
  copy_to_host(mem, r.out.data(), out.data(), nc * 4);
  copy_to_host(mem, r.dx.data(), dres.data(), nc * 4);
  copy_to_host(mem, r.grads.data(), grads.data(), r.grads.size() * 4);
  ops.set_weights(nullptr, 0);
  return r;
}

// Every tensor of got against want, printed; the worst of them (NaN: infinity).
inline double compare(const char* what, const Shape& s, const Result& got, const Result& want,
                      double tol, bool quiet = false) {
  static const char* names[6] = {"ln1_w", "qkv_w", "o_w", "ln2_w", "gateup_w", "down_w"};
  double worst = 0;
  std::string line;
  auto check = [&](const char* name, double r) {
    worst = std::isnan(r) ? INFINITY : std::fmax(worst, r);
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s %.1e", name, r);
    line += buf;
  };
  const std::int64_t nc = std::int64_t(s.n()) * s.c;
  check("out", fused_block::rel(got.out, want.out, 0, nc));
  check("dx", fused_block::rel(got.dx, want.dx, 0, nc));
  std::int64_t off = 0;
  const std::vector<std::int64_t> sizes = s.params();
  for (int i = 0; i < 6; ++i) {
    check(names[i], fused_block::rel(got.grads, want.grads, off, sizes[std::size_t(i)]));
    off += sizes[std::size_t(i)];
  }
  if (!quiet) std::printf("llama block: %s:%s\n", what, line.c_str());
  std::printf("llama block: %s: worst %.2e (tolerance %.1e) %s\n", what, worst, tol,
              worst <= tol ? "agree" : "MISMATCH");
  return worst;
}

}  // namespace trident::test::llama_block
