// test/mpi/cp_attention_check.hpp — what the context-parallel attention tests
// (ring_attention_test.cpp, ulysses_attention_test.cpp) share: the whole-sequence inputs they
// draw and the reference's rows at a rank's global positions, the error measure, and the bf16
// wire's check (Ops::BlockAttention's bf16_exact: the same bits as the fp32 wire).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "trident/ops/ops.hpp"

namespace cp_attention_check {

using FVec = std::vector<float>;

inline FVec normal(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  FVec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// The rows of a [B, T, ld] tensor at `pos` of every sequence: [B, pos.size(), ld].
inline FVec gather_rows(const FVec& x, int b, int t, std::int64_t ld, const std::vector<int>& pos) {
  FVec r;
  for (int bb = 0; bb < b; bb++)
    for (int p : pos) {
      const float* row = x.data() + (std::int64_t(bb) * t + p) * ld;
      r.insert(r.end(), row, row + ld);
    }
  return r;
}
// lse [B, NH, T] at `pos`: [B, NH, pos.size()].
inline FVec gather_lse(const FVec& x, int b, int nh, int t, const std::vector<int>& pos) {
  FVec r;
  for (int bh = 0; bh < b * nh; bh++)
    for (int p : pos) r.push_back(x[std::size_t(bh) * t + p]);
  return r;
}

// max |got - want| over the head columns (width) of rows of stride ld; *scale: max |want|.
inline double max_err(const FVec& got, const FVec& want, std::int64_t ld, std::int64_t width,
                      double* scale = nullptr) {
  double e = 0, m = 0;
  for (std::size_t row = 0; row < want.size() / std::size_t(ld); row++)
    for (std::int64_t c = 0; c < width; c++) {
      const std::size_t i = row * ld + c;
      e = std::max(e, double(std::fabs(got[i] - want[i])));
      m = std::max(m, double(std::fabs(want[i])));
    }
  if (scale) *scale = m;
  return e;
}

// x as bf16 bits, and bf16 bits widened (ops: the CPU backend).
inline std::vector<std::uint16_t> bits_of(trident::ops::Ops& ops, const FVec& x) {
  std::vector<std::uint16_t> h(x.size());
  ops.to_bf16(h.data(), x.data(), std::int64_t(x.size()));
  return h;
}
inline FVec widen(trident::ops::Ops& ops, const std::vector<std::uint16_t>& h) {
  FVec r(h.size());
  ops.from_bf16(r.data(), h.data(), std::int64_t(h.size()));
  return r;
}
// x rounded to bf16 and widened back, as the CUDA bf16 block rounds.
inline FVec round_bf16(trident::ops::Ops& ops, const FVec& x) {
  return widen(ops, bits_of(ops, x));
}

// The full sequence length of the CP tests at cp ranks: divisible by 2cp, not by 64.
inline int test_t(int cp) { return cp == 2 ? 24 : cp == 4 ? 40 : 12 * cp; }

// A rank's local shape (b sequences of t rows, nh query and nkv key-value heads of hs) with
// its row strides padded by pad_q, pad_k, pad_v, pad_o elements.
inline trident::ops::Ops::AttentionShape strided_shape(int b, int t, int nh, int nkv, int hs,
                                                       int pad_q, int pad_k, int pad_v,
                                                       int pad_o) {
  trident::ops::Ops::AttentionShape s;
  s.b = b, s.t = t, s.nh = nh, s.nkv = nkv, s.hs = hs;
  const std::int64_t wkv = std::int64_t(nkv) * hs;
  s.ld_q = std::int64_t(nh) * hs + pad_q, s.ld_k = wkv + pad_k, s.ld_v = wkv + pad_v;
  s.ld_o = std::int64_t(nh) * hs + pad_o;
  return s;
}

// q, k, v, dout of shape s drawn from `seed` and rounded to bf16 (bf16-exact operands).
struct Operands {
  FVec q, k, v, dout;
};
inline Operands bf16_exact_operands(trident::ops::Ops& ops,
                                    const trident::ops::Ops::AttentionShape& s, unsigned seed) {
  const std::size_t rows = std::size_t(s.b) * std::size_t(s.t);
  return {round_bf16(ops, normal(rows * s.ld_q, seed)),
          round_bf16(ops, normal(rows * s.ld_k, seed + 1)),
          round_bf16(ops, normal(rows * s.ld_v, seed + 2)),
          round_bf16(ops, normal(rows * s.ld_o, seed + 3))};
}

// Where a and b differ in their bits ("" if nowhere).
inline std::string first_difference(const FVec& a, const FVec& b) {
  if (a.size() != b.size()) return "sizes differ";
  for (std::size_t i = 0; i < a.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " against " +
             std::to_string(b[i]);
  return "";
}

// What the CUDA bf16 block gets from its hook, on host memory: out (rounded), lse, then dq, dk,
// dv (rounded) from the rounded out, as the block hands them back (q, k, v, dout bf16-exact).
struct BlockSees {
  FVec out, lse, dq, dk, dv;
};
template <class Attention>
BlockSees as_the_block_sees(Attention& attention, trident::ops::Ops& host_ops,
                            const trident::ops::Ops::AttentionShape& s, const FVec& q,
                            const FVec& k, const FVec& v, const FVec& dout, bool bf16_exact) {
  BlockSees r;
  r.out.assign(std::size_t(s.b) * s.t * std::size_t(s.ld_o), 0.0f);
  r.lse.assign(std::size_t(s.b) * s.nh * s.t, 0.0f);
  r.dq.assign(q.size(), 0.0f), r.dk.assign(k.size(), 0.0f), r.dv.assign(v.size(), 0.0f);
  attention.forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), bf16_exact);
  r.out = round_bf16(host_ops, r.out);
  attention.backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), r.out.data(),
                     r.lse.data(), q.data(), k.data(), v.data(), bf16_exact);
  r.dq = round_bf16(host_ops, r.dq), r.dk = round_bf16(host_ops, r.dk);
  r.dv = round_bf16(host_ops, r.dv);
  return r;
}

// The bf16 wire's case: a rank's local shape (b sequences of t rows, nh query and nkv key-value
// heads of hs) with every row stride padded, so that the wire's packing meets strided rows.
inline trident::ops::Ops::AttentionShape padded_shape(int b, int t, int nh, int nkv, int hs) {
  return strided_shape(b, t, nh, nkv, hs, 3, 1, 2, 5);
}
// The block's view of `attention` with the fp32 wire, then the bf16 wire, on bf16-exact
// operands drawn from `seed` (ops: the CPU backend); bytes(): what the attention has sent so
// far. What differs between the two views ("" if nothing: the wire's promise) and the bytes each
// sent.
struct WireRuns {
  std::string difference;
  double bytes32 = 0, bytes16 = 0;
};
template <class Attention, class Bytes>
WireRuns run_both_wires(Attention& attention, trident::ops::Ops& ops,
                        const trident::ops::Ops::AttentionShape& s, unsigned seed, Bytes bytes) {
  const auto [q, k, v, dout] = bf16_exact_operands(ops, s, seed);
  WireRuns r;
  const double before = bytes();
  const BlockSees fp32 = as_the_block_sees(attention, ops, s, q, k, v, dout, false);
  r.bytes32 = bytes() - before;
  const BlockSees bf16 = as_the_block_sees(attention, ops, s, q, k, v, dout, true);
  r.bytes16 = bytes() - before - r.bytes32;
  const std::pair<const char*, std::string> diffs[] = {
      {"out", first_difference(bf16.out, fp32.out)}, {"lse", first_difference(bf16.lse, fp32.lse)},
      {"dq", first_difference(bf16.dq, fp32.dq)},    {"dk", first_difference(bf16.dk, fp32.dk)},
      {"dv", first_difference(bf16.dv, fp32.dv)}};
  for (const auto& [name, d] : diffs)
    if (!d.empty()) r.difference += std::string(r.difference.empty() ? "" : "; ") + name + ": " + d;
  return r;
}

// The bf16 entry points' case (Ops::BlockAttention::forward_bf16 / backward_bf16, what the
// CUDA bf16 block calls): row strides padded by even amounts (bf16 rows move as float pairs),
// out packed as the block's atty is.
inline trident::ops::Ops::AttentionShape bf16_shape(int b, int t, int nh, int nkv, int hs) {
  return strided_shape(b, t, nh, nkv, hs, 2, 4, 6, 0);
}
// The bf16 entry points of `bf16` against the fp32 ones of `fp32` (made for the same group and
// shape) as the block sees them, on bf16-exact operands drawn from `seed`: the largest error
// of each result over its largest reference value (out, lse, dq, dk, dv), whether the bf16
// run left the padding columns of dq, dk, dv alone (`untouched`), and its bytes sent.
struct Bf16Runs {
  double rel[5] = {0, 0, 0, 0, 0};
  bool untouched = true;
  double bytes16 = 0;
  bool same_bits = true;  // every result's head columns equal to the fp32 one's
};
template <class Attention32, class Attention16, class Bytes>
Bf16Runs run_bf16_entry_points(Attention32& fp32, Attention16& bf16, trident::ops::Ops& ops,
                               const trident::ops::Ops::AttentionShape& s, unsigned seed,
                               Bytes bytes) {
  const std::size_t rows = std::size_t(s.b) * std::size_t(s.t);
  const auto [q, k, v, dout] = bf16_exact_operands(ops, s, seed);
  const BlockSees want = as_the_block_sees(fp32, ops, s, q, k, v, dout, false);
  const std::vector<std::uint16_t> q16 = bits_of(ops, q), k16 = bits_of(ops, k),
                                   v16 = bits_of(ops, v), dout16 = bits_of(ops, dout);
  const std::uint16_t sentinel = 0x7fc1;  // a NaN: padding must keep it
  std::vector<std::uint16_t> out16(rows * s.ld_o, sentinel), dq16(q.size(), sentinel),
      dk16(k.size(), sentinel), dv16(v.size(), sentinel);
  FVec lse(std::size_t(s.b) * s.nh * s.t, 0.0f);
  Bf16Runs r;
  const double before = bytes();
  bf16.forward_bf16(out16.data(), lse.data(), q16.data(), k16.data(), v16.data());
  bf16.backward_bf16(dq16.data(), dk16.data(), dv16.data(), dout16.data(), out16.data(),
                     lse.data(), q16.data(), k16.data(), v16.data());
  r.bytes16 = bytes() - before;
  const FVec got[5] = {widen(ops, out16), lse, widen(ops, dq16), widen(ops, dk16),
                       widen(ops, dv16)};
  const FVec* ref[5] = {&want.out, &want.lse, &want.dq, &want.dk, &want.dv};
  const std::int64_t ld[5] = {s.ld_o, s.t, s.ld_q, s.ld_k, s.ld_v};
  const std::int64_t width[5] = {std::int64_t(s.nh) * s.hs, s.t, std::int64_t(s.nh) * s.hs,
                                 std::int64_t(s.nkv) * s.hs, std::int64_t(s.nkv) * s.hs};
  for (int i = 0; i < 5; i++) {
    double scale = 0;
    const double e = max_err(got[i], *ref[i], ld[i], width[i], &scale);
    r.rel[i] = e / std::max(scale, 1e-30);
    if (!(e == 0)) r.same_bits = false;  // (over the head columns; NaN: not the same)
  }
  const std::vector<std::uint16_t>* grads[3] = {&dq16, &dk16, &dv16};
  for (int i = 0; i < 3; i++)
    for (std::size_t row = 0; row < rows; row++)
      for (std::int64_t c = width[2 + i]; c < ld[2 + i]; c++)
        if ((*grads[i])[row * ld[2 + i] + c] != sentinel) r.untouched = false;
  return r;
}

}  // namespace cp_attention_check
