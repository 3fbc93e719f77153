// Ulysses attention (model/ulysses_attention.hpp) under mpirun on the CP group = the world: every
// rank draws the same whole-sequence q, k, v, dout; the single-rank flash attention on the
// whole sequence is the reference, read at this rank's global positions (cp_local_positions:
// chunks r and 2cp-1-r) for out, dq, dk, dv, and at this rank's heads over the whole sequence
// for lse ([B, NH/cp, T]: what Ulysses stores). Heads divisible by cp (4 and 8 heads of 8, GQA
// 8 of 4 kv heads), T divisible by 2cp but not by 64, padded row strides (the per-sequence
// packing path) and packed ones; and on cpu-guarded device memory with MPI staged through
// host copies (as on a GPU without a CUDA-aware MPI). Also Comm::all_to_all's blocks and bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cp_attention_check.hpp"

#include "trident/core/error.hpp"
#include "trident/model/ring_attention.hpp"
#include "trident/model/ulysses_attention.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/parallel/staging.hpp"

namespace model = trident::model;
namespace par = trident::parallel;
using trident::ops::Ops;
using cp_attention_check::FVec;

namespace {

using namespace cp_attention_check;

struct Case {
  int b, nh, nkv, hs;
  bool padded;   // row strides wider than the heads
  bool guarded;  // on cpu-guarded device memory, MPI staged through host copies
};

void check_ulysses(const Case& c) {
  par::Comm world = par::Comm::world();
  const int cp = world.size(), rank = world.rank();
  const int t_full = test_t(cp);
  const int tl = t_full / cp;
  Ops::AttentionShape full;
  full.b = c.b, full.t = t_full, full.nh = c.nh, full.nkv = c.nkv, full.hs = c.hs;
  const std::int64_t wq = std::int64_t(c.nh) * c.hs, wkv = std::int64_t(c.nkv) * c.hs;
  full.ld_q = wq + (c.padded ? 3 : 0);
  full.ld_k = wkv + (c.padded ? 1 : 0);
  full.ld_v = wkv + (c.padded ? 2 : 0);
  full.ld_o = wq + (c.padded ? 5 : 0);
  const std::size_t rows = std::size_t(c.b) * t_full;
  const unsigned seed = 17u + unsigned(c.nh * 7 + c.nkv + c.hs + (c.padded ? 100 : 0));
  const FVec q = normal(rows * full.ld_q, seed), k = normal(rows * full.ld_k, seed + 1),
             v = normal(rows * full.ld_v, seed + 2), dout = normal(rows * full.ld_o, seed + 3);

  auto ops = trident::ops::make_cpu_ops(1);
  FVec out(rows * full.ld_o, 0.0f), lse(std::size_t(c.b) * c.nh * t_full);
  FVec dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  ops->attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), full);
  ops->attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                          q.data(), k.data(), v.data(), full);

  const std::vector<int> pos = model::cp_local_positions(t_full, cp, rank);
  ASSERT_EQ(int(pos.size()), tl);
  Ops::AttentionShape local = full;
  local.t = tl;
  const FVec lq = gather_rows(q, c.b, t_full, full.ld_q, pos),
             lk = gather_rows(k, c.b, t_full, full.ld_k, pos),
             lv = gather_rows(v, c.b, t_full, full.ld_v, pos),
             ldout = gather_rows(dout, c.b, t_full, full.ld_o, pos);
  const FVec want_out = gather_rows(out, c.b, t_full, full.ld_o, pos),
             want_dq = gather_rows(dq, c.b, t_full, full.ld_q, pos),
             want_dk = gather_rows(dk, c.b, t_full, full.ld_k, pos),
             want_dv = gather_rows(dv, c.b, t_full, full.ld_v, pos);
  // this rank's heads [rank * nh/cp, (rank + 1) * nh/cp) over every position
  const int nh_r = c.nh / cp;
  FVec want_lse;
  for (int bb = 0; bb < c.b; bb++)
    for (int h = rank * nh_r; h < (rank + 1) * nh_r; h++) {
      const float* row = lse.data() + (std::size_t(bb) * c.nh + h) * t_full;
      want_lse.insert(want_lse.end(), row, row + t_full);
    }

  auto uly_ops = c.guarded ? trident::ops::make_guarded_ops(1, std::size_t(16) << 20)
                           : trident::ops::make_cpu_ops(1);
  trident::DeviceMemory* mem = uly_ops->memory();
  par::Comm cp_group = world.split(0, rank, "cp");
  if (c.guarded) cp_group.set_staging(std::make_shared<par::DeviceStaging>(mem, false));
  std::vector<trident::FloatBuffer> dev;
  auto on_dev = [&](const FVec& host) -> float* {
    if (!mem) return const_cast<float*>(host.data());
    dev.emplace_back(host.size(), mem);
    mem->to_device(dev.back().data(), host.data(), host.size() * sizeof(float));
    return dev.back().data();
  };
  auto back = [&](FVec& host, float* p) {
    if (mem) mem->to_host(host.data(), p, host.size() * sizeof(float));
  };
  model::UlyssesAttention uly(*uly_ops, cp_group, local);
  EXPECT_EQ(uly.buffer_bytes(),
            model::ulysses_floats(std::int64_t(c.b) * tl, c.nh, c.nkv, c.hs) * 4);
  FVec got_out(lq.size() / full.ld_q * full.ld_o, 0.0f), got_lse(want_lse.size(), 0.0f);
  FVec got_dq(lq.size(), 0.0f), got_dk(lk.size(), 0.0f), got_dv(lv.size(), 0.0f);
  float *d_out = on_dev(got_out), *d_lse = on_dev(got_lse), *d_q = on_dev(lq), *d_k = on_dev(lk),
        *d_v = on_dev(lv), *d_dout = on_dev(ldout), *d_dq = on_dev(got_dq),
        *d_dk = on_dev(got_dk), *d_dv = on_dev(got_dv);
  const double bytes0 = cp_group.counters().bytes;
  uly.forward(d_out, d_lse, d_q, d_k, d_v);
  uly.backward(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v);
  // Five all-to-alls, each (cp - 1)/cp of its buffer leaving the rank: q|k|v and out
  // (forward), out|dout, q|k|v and dq|dk|dv (backward).
  const double local_rows = double(c.b) * tl, f = double(cp - 1) / cp * 4.0;
  const double want_bytes = cp == 1 ? 0.0 : f * local_rows * double(3 * (wq + 2 * wkv) + 3 * wq);
  EXPECT_DOUBLE_EQ(cp_group.counters().bytes - bytes0, want_bytes);
  back(got_out, d_out), back(got_lse, d_lse), back(got_dq, d_dq), back(got_dk, d_dk),
      back(got_dv, d_dv);

  double sc[5];
  double err[5] = {max_err(got_out, want_out, full.ld_o, wq, &sc[0]),
                   max_err(got_lse, want_lse, 1, 1, &sc[1]),
                   max_err(got_dq, want_dq, full.ld_q, wq, &sc[2]),
                   max_err(got_dk, want_dk, full.ld_k, wkv, &sc[3]),
                   max_err(got_dv, want_dv, full.ld_v, wkv, &sc[4])};
  MPI_Allreduce(MPI_IN_PLACE, err, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, sc, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
  if (rank == 0)
    std::printf("ulysses cp %d b %d nh %d nkv %d hs %d T %d %s%s: max |err| out %.2e lse %.2e "
                "dq %.2e dk %.2e dv %.2e (max |ref| %.2f %.2f %.2f %.2f %.2f)\n",
                cp, c.b, c.nh, c.nkv, c.hs, t_full, c.padded ? "padded" : "packed",
                c.guarded ? " guarded" : "", err[0], err[1], err[2], err[3], err[4], sc[0], sc[1],
                sc[2], sc[3], sc[4]);
  // The same kernels over the same rows and heads (packed instead of strided): fp32 rounding
  // at most; a misplaced row or head is O(0.1..1).
  for (int i = 0; i < 5; i++) EXPECT_LE(err[i], 4e-6 * std::max(1.0, sc[i])) << names[i];
  // The padding columns are neither read nor written.
  for (std::size_t row = 0; row < got_dq.size() / std::size_t(full.ld_q); row++)
    for (std::int64_t col = wq; col < full.ld_q; col++)
      ASSERT_EQ(got_dq[row * full.ld_q + col], 0.0f) << "dq's padding was written";
}

}  // namespace

TEST(CommAllToAll, BlockRGoesToRankR) {
  par::Comm world = par::Comm::world();
  const int p = world.size(), r = world.rank(), n = 3;
  FVec send(std::size_t(p) * n), recv(send.size(), -1.0f);
  for (int j = 0; j < p; j++)
    for (int i = 0; i < n; i++) send[std::size_t(j) * n + i] = float(100 * r + 10 * j + i);
  const double bytes0 = world.counters().bytes;
  world.all_to_all(send.data(), recv.data(), n);
  for (int j = 0; j < p; j++)
    for (int i = 0; i < n; i++)
      EXPECT_EQ(recv[std::size_t(j) * n + i], float(100 * j + 10 * r + i)) << j << " " << i;
  EXPECT_DOUBLE_EQ(world.counters().bytes - bytes0, p == 1 ? 0.0 : double(p - 1) * n * 4);
}

TEST(UlyssesAttention, MatchesWholeSequenceFlash) { check_ulysses({2, 4, 4, 8, false, false}); }
TEST(UlyssesAttention, MatchesWholeSequenceFlashPadded) {
  check_ulysses({2, 4, 4, 8, true, false});
}
TEST(UlyssesAttention, GroupedQueryHeads) { check_ulysses({2, 8, 4, 8, false, false}); }
TEST(UlyssesAttention, GroupedQueryHeadsPadded) { check_ulysses({1, 8, 4, 8, true, false}); }
TEST(UlyssesAttention, OnDeviceMemoryStagedMpi) { check_ulysses({2, 8, 4, 8, true, true}); }
TEST(UlyssesAttention, HeadsNotDivisibleByCpAreRefused) {
  par::Comm world = par::Comm::world();
  if (world.size() == 1) GTEST_SKIP() << "every head count divides cp = 1";
  Ops::AttentionShape s;
  s.b = 1, s.t = 2, s.nh = 3, s.nkv = 3, s.hs = 4, s.ld_q = s.ld_k = s.ld_v = s.ld_o = 12;
  auto ops = trident::ops::make_cpu_ops(1);
  EXPECT_THROW(model::UlyssesAttention(*ops, world, s), trident::Error);
}

// The bf16 wire (bf16_exact, as the CUDA bf16 block calls Ulysses): on bf16-exact q, k, v, dout,
// the block's out and lse, and its dq, dk, dv after its rounding, are the fp32 wire's bits;
// every all-to-all moves half the bytes (operands, and results only permuted after them).
TEST(UlyssesAttention, Bf16WireSameBits) {
  par::Comm world = par::Comm::world();
  const int cp = world.size(), rank = world.rank();
  const int tl = test_t(cp) / cp;
  const Ops::AttentionShape local = padded_shape(2, tl, 8, 4, 8);
  auto ops = trident::ops::make_cpu_ops(1);
  par::Comm cp_group = world.split(0, rank, "cp");
  model::UlyssesAttention uly(*ops, cp_group, local);
  const WireRuns w = run_both_wires(uly, *ops, local, 700u + 10u * unsigned(rank),
                                    [&] { return cp_group.counters().bytes; });
  EXPECT_EQ(w.difference, "");
  EXPECT_EQ(w.bytes16 * 2, w.bytes32);
  if (cp > 1) EXPECT_GT(w.bytes16, 0.0);
  if (rank == 0)
    std::printf("ulysses cp %d: the bf16 wire sent %.0f B, the fp32 wire %.0f B\n", cp,
                w.bytes16, w.bytes32);
}

// The bf16 entry points (the CUDA bf16 block's: every all-to-all on bf16 buffers, the attention
// on the gathered bf16) against the fp32 ones on bf16-exact operands, as the block sees both:
// on the CPU the same bits (Ops' default bf16 attention widens exactly and rounds once, where
// the block rounds the fp32 path's results); padding columns untouched; the bf16 wire's bytes
// (half the fp32 wire's); buffers half the fp32 object's.
TEST(UlyssesAttention, Bf16EntryPointsMatchFp32) {
  par::Comm world = par::Comm::world();
  const int cp = world.size(), rank = world.rank();
  const int tl = test_t(cp) / cp;
  const Ops::AttentionShape local = bf16_shape(2, tl, 8, 4, 8);
  auto ops = trident::ops::make_cpu_ops(1);
  par::Comm cp_group = world.split(0, rank, "cp");
  model::UlyssesAttention uly32(*ops, cp_group, local);
  model::UlyssesAttention uly16(*ops, cp_group, local, true);
  EXPECT_EQ(uly16.buffer_bytes() * 2, uly32.buffer_bytes());
  const WireRuns w32 = run_both_wires(uly32, *ops, local, 1100u + 10u * unsigned(rank),
                                      [&] { return cp_group.counters().bytes; });
  const Bf16Runs r = run_bf16_entry_points(uly32, uly16, *ops, local, 1100u + 10u * unsigned(rank),
                                           [&] { return cp_group.counters().bytes; });
  EXPECT_TRUE(r.same_bits) << "out " << r.rel[0] << " lse " << r.rel[1] << " dq " << r.rel[2]
                           << " dk " << r.rel[3] << " dv " << r.rel[4];
  EXPECT_TRUE(r.untouched);
  EXPECT_EQ(r.bytes16, w32.bytes16);  // the fp32 object's bf16 wire: the same messages
  if (cp > 1) EXPECT_EQ(r.bytes16 * 2, w32.bytes32);
  if (rank == 0)
    std::printf("ulysses cp %d bf16 entry points: same bits %d; sent %.0f B (fp32 wire %.0f B); "
                "buffers %lld B (fp32 %lld B)\n", cp, int(r.same_bits), r.bytes16, w32.bytes32,
                static_cast<long long>(uly16.buffer_bytes()),
                static_cast<long long>(uly32.buffer_bytes()));
}
