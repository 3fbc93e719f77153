// test/unit/ops/cuda/fused_block_check.hpp — the fused GPT-2 block of a device backend
// (Ops::gpt2_block_forward / backward with a bf16 stash) against the CPU backend's composition
// (ops/fused_block.cpp, fp32): output, input gradient and every parameter gradient, each
// max |got - want| / max |want|. Shared by the stand-in's program (emulate/fused_block.cpp)
// and the GPU test (fused_block_test.cpp). Also the split backward (Split: B with a W stash,
// then the weight pass; Ops::BlockWStash) and selective recompute (Recompute:
// Ops::gpt2_block_recompute between them).
// defines: trident::test::fused_block::Shape, Split, Recompute, Result, run, compare,
//          random_case,
//          same_bits, OwnAttention
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/device_memory.hpp"
#include "trident/ops/ops.hpp"

namespace trident::test::fused_block {

using ops::Ops;

// The attention hook of the checks (context parallelism's, Ops::BlockAttention): the backend's
// own fp32 attention, a one-rank stand-in for the ring, so that a block runs its hook path
// (CUDA: the fp32 copies around it) on one process.
using OwnAttention = Ops::OwnAttention;

struct Shape {
  int b, t, c, nh;
  bool hook = false;  // attention through the shape's hook (OwnAttention)
  int f() const { return 4 * c; }
  int n() const { return b * t; }
  // the parameters' sizes in Gpt2BlockParams' order
  std::vector<std::int64_t> params() const {
    const std::int64_t C = c, F = f();
    return {C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * F, F, F * C, C};
  }
  std::int64_t param_count() const {
    std::int64_t s = 0;
    for (std::int64_t p : params()) s += p;
    return s;
  }
  // the stash's floats when fp32 (the larger)
  std::int64_t stash_floats() const {
    return 15LL * n() * c + 4LL * n() + std::int64_t(b) * nh * t;
  }
};

// The parameters (or gradients) in one flat buffer, in Gpt2BlockParams' order.
inline Ops::Gpt2BlockParams views(const Shape& s, float* base) {
  float* v[12];
  const std::vector<std::int64_t> sizes = s.params();
  for (int i = 0; i < 12; ++i) {
    v[i] = base;
    base += sizes[std::size_t(i)];
  }
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
}

// The stash carved as the model does (fp32, or bf16 halves for ln1 qkv atty ln2 fch fch_gelu).
inline Ops::Gpt2BlockStash carve(const Shape& s, float* p, bool bf16) {
  auto take = [&p](std::int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  auto big = [&](std::int64_t n) { return take(bf16 ? (n + 1) / 2 : n); };
  const std::int64_t N = s.n(), C = s.c, F = s.f();
  Ops::Gpt2BlockStash la{};
  la.ln1 = big(N * C), la.ln1_mean = take(N), la.ln1_rstd = take(N), la.qkv = big(N * 3 * C);
  la.atty = big(N * C), la.lse = take(std::int64_t(s.b) * s.nh * s.t), la.res2 = take(N * C);
  la.ln2 = big(N * C), la.ln2_mean = take(N), la.ln2_rstd = take(N), la.fch = big(N * F);
  la.fch_gelu = big(N * F);
  la.bf16 = bf16;
  return la;
}

struct Case {
  std::vector<float> w, x, dout;
};

// Weights as GPT-2's (LayerNorm weights near 1, small biases and matrices), x ~ N(0, 1),
// d loss / d out ~ N(0, 0.01).
inline Case random_case(const Shape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case k;
  k.w.resize(std::size_t(s.param_count()));
  k.x.resize(std::size_t(s.n()) * std::size_t(s.c));
  k.dout.resize(k.x.size());
  std::int64_t off = 0;
  const std::vector<std::int64_t> sizes = s.params();
  for (int i = 0; i < 12; ++i) {
    const bool norm_w = i == 0 || i == 6, norm_b = i == 1 || i == 7;
    for (std::int64_t j = 0; j < sizes[std::size_t(i)]; ++j)
      k.w[std::size_t(off + j)] = norm_w   ? 1.0f + 0.1f * normal(rng)
                                  : norm_b ? 0.1f * normal(rng)
                                           : 0.05f * normal(rng);
    off += sizes[std::size_t(i)];
  }
  for (float& v : k.x) v = normal(rng);
  for (float& v : k.dout) v = 0.01f * normal(rng);
  return k;
}

struct Result {
  std::vector<float> out, dx, grads;
};
inline bool same_bits(const Result& a, const Result& b) {
  return a.out == b.out && a.dx == b.dx && a.grads == b.grads;
}

// The split backward (the zero-bubble B, then W): B with a W stash, then the weight pass.
// in_place: the W stash is the layer's own qkv and fch (GptChunk's with its stash kept);
// separate: a buffer of its own (full recompute's); broken: in place, and overwritten between
// B and W (a check must fail). Between B and W the backward's scratch and the stash tensors W
// must not read (atty, res2, fch_gelu) are NaN, as other microbatches' B and a recomputation
// may leave them.
enum class Split { none, in_place, separate, broken };

// Selective recompute (Gpt2BlockStash::recomputed): between the forward and the backward the
// shared atty, lse and fch_gelu are overwritten by the next layer's forward (the block again,
// on this one's output, into a stash sharing them), then gpt2_block_recompute fills them
// again; kept: the stash marked recomputed, nothing overwritten (the forward's own values);
// skipped: overwritten and not refilled (the next layer's values), which a check must catch.
enum class Recompute { none, selective, kept, skipped };

// The split's poison: n floats of NaN at p on `ops`.
inline void poison(Ops& ops, float* p, std::int64_t n) {
  ops.fill(p, std::numeric_limits<float>::quiet_NaN(), n);
}

// One forward and backward on `ops` (weights, x, dout from the host), the results to the host.
// break_stash: la.fch overwritten (with x's bytes) between forward and backward; dres_scale
// multiplies d loss / d out: the broken runs a check must catch. microbatches > 1: that many
// forward and backward passes into the same gradients (as a step's microbatches), the
// gradients returned divided by it (exact for powers of two): a gradient written rather than
// added shows. split: the backward split into B and W (Split).
inline Result run(Ops& ops, const Shape& s, bool bf16, const Case& k, bool break_stash = false,
                  float dres_scale = 1.0f, int microbatches = 1, Split split = Split::none,
                  Recompute recompute = Recompute::none) {
  DeviceMemory* mem = ops.memory();
  const std::int64_t P = s.param_count();
  const std::size_t nc = std::size_t(s.n()) * std::size_t(s.c);
  const std::size_t nf = std::size_t(s.n()) * std::size_t(s.f());
  FloatBuffer params(std::size_t(P), mem), grads(std::size_t(P), mem);
  FloatBuffer xb(nc, mem), out(nc, mem), dres(nc, mem);
  FloatBuffer stash(std::size_t(s.stash_floats()), mem);
  const bool next_layer = recompute == Recompute::selective || recompute == Recompute::skipped;
  FloatBuffer next_stash(next_layer ? std::size_t(s.stash_floats()) : 0, mem);
  FloatBuffer dbuf(nc, mem), dqkv(3 * nc, mem), dfch(nf, mem), dact(nf, mem);
  FloatBuffer w_own(split == Split::separate ? nf + 3 * nc : 0, mem);  // fp32's (the larger)
  copy_to_device(mem, params.data(), k.w.data(), k.w.size() * 4);
  copy_to_device(mem, xb.data(), k.x.data(), k.x.size() * 4);
  std::vector<float> d = k.dout;
  for (float& v : d) v *= dres_scale;
  ops.fill(grads.data(), 0.0f, P);
  ops.set_weights(params.data(), P);
  OwnAttention own(ops);
  Ops::Gpt2BlockShape shape{s.b, s.t, s.c, s.nh, s.f()};
  if (s.hook) shape.attention = &own;
  Ops::Gpt2BlockStash la = carve(s, stash.data(), bf16);
  la.recomputed = recompute != Recompute::none;
  Ops::BlockWStash w{la.fch, la.qkv};
  if (split == Split::separate) w = {w_own.data(), w_own.data() + nf};
  const std::int64_t big = bf16 ? 2 : 1;  // elements a float holds
  for (int mb = 0; mb < microbatches; ++mb) {
    copy_to_device(mem, dres.data(), d.data(), d.size() * 4);
    ops.gpt2_block_forward(shape, views(s, params.data()), xb.data(), out.data(), la);
    if (break_stash) ops.copy(la.fch, xb.data(), std::int64_t(nc));
    if (recompute == Recompute::selective || recompute == Recompute::skipped) {
      Ops::Gpt2BlockStash next = carve(s, next_stash.data(), bf16);
      next.atty = la.atty, next.lse = la.lse, next.fch_gelu = la.fch_gelu;
      next.recomputed = true;
      ops.gpt2_block_forward(shape, views(s, params.data()), out.data(), dbuf.data(), next);
      if (recompute == Recompute::selective) ops.gpt2_block_recompute(shape, la);
    }
    ops.gpt2_block_backward(shape, views(s, params.data()), views(s, grads.data()), xb.data(),
                            dres.data(), la, {dbuf.data(), dqkv.data(), dfch.data(), dact.data()},
                            split == Split::none ? nullptr : &w);
    if (split == Split::none) continue;
    for (FloatBuffer* b : {&dbuf, &dqkv, &dfch, &dact})
      poison(ops, b->data(), std::int64_t(b->size()));
    poison(ops, la.atty, std::int64_t(nc) / big);
    poison(ops, la.fch_gelu, std::int64_t(nf) / big);
    poison(ops, la.res2, std::int64_t(nc));
    if (split == Split::broken) ops.copy(w.dqkv, xb.data(), std::int64_t(nc) / 4);  // fits bf16
    ops.gpt2_block_backward_weights(shape, views(s, params.data()), views(s, grads.data()), la, w);
  }
  Result r;
  r.out.resize(nc), r.dx.resize(nc), r.grads.resize(std::size_t(P));
  copy_to_host(mem, r.out.data(), out.data(), nc * 4);
  copy_to_host(mem, r.dx.data(), dres.data(), nc * 4);
  copy_to_host(mem, r.grads.data(), grads.data(), r.grads.size() * 4);
  for (float& g : r.grads) g /= float(microbatches);
  ops.set_weights(nullptr, 0);
  return r;
}

// max |a - b| / max |b| over [off, off + n)
inline double rel(const std::vector<float>& a, const std::vector<float>& b, std::int64_t off,
                  std::int64_t n) {
  double diff = 0, big = 0;
  for (std::int64_t i = off; i < off + n; ++i) {
    const double d = std::fabs(double(a[std::size_t(i)]) - double(b[std::size_t(i)]));
    diff = std::isnan(d) ? INFINITY : std::fmax(diff, d);
    big = std::fmax(big, std::fabs(double(b[std::size_t(i)])));
  }
  return big > 0 ? diff / big : diff;
}

// Every tensor of got against want, printed; the worst of them (NaN: infinity).
inline double compare(const char* what, const Shape& s, const Result& got, const Result& want,
                      double tol, bool quiet = false) {
  static const char* names[12] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
                                  "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};
  double worst = 0;
  std::string line;
  auto check = [&](const char* name, double r) {
    worst = std::isnan(r) ? INFINITY : std::fmax(worst, r);
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s %.1e", name, r);
    line += buf;
  };
  const std::int64_t nc = std::int64_t(s.n()) * s.c;
  check("out", rel(got.out, want.out, 0, nc));
  check("dx", rel(got.dx, want.dx, 0, nc));
  std::int64_t off = 0;
  const std::vector<std::int64_t> sizes = s.params();
  for (int i = 0; i < 12; ++i) {
    check(names[i], rel(got.grads, want.grads, off, sizes[std::size_t(i)]));
    off += sizes[std::size_t(i)];
  }
  if (!quiet) std::printf("fused block: %s:%s\n", what, line.c_str());
  std::printf("fused block: %s: worst %.2e (tolerance %.1e) %s\n", what, worst, tol,
              worst <= tol ? "agree" : "MISMATCH");
  return worst;
}

}  // namespace trident::test::fused_block
