// Ring attention (model/ring_attention.hpp) under mpirun on the CP group = the world: every
// rank draws the same whole-sequence q, k, v, dout; the single-rank flash attention on the
// whole sequence (Ops::attention_forward/backward) is the reference, read at this rank's
// global positions (cp_local_positions: chunks r and 2cp-1-r). out, lse, dq, dk, dv must
// match to fp32 rounding. Odd shapes: 3 heads of 8, T divisible by 2cp but not by 64, GQA
// (nh 4, nkv 2), padded row strides (the per-row packing path) and packed ones; and the ring on
// cpu-guarded device memory with MPI staged through host copies (as on a GPU without a
// CUDA-aware MPI).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cp_attention_check.hpp"

#include "trident/model/ring_attention.hpp"
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
  bool guarded;  // the ring on cpu-guarded device memory, MPI staged through host copies
};

void check_ring(const Case& c) {
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
  const unsigned seed = 91u + unsigned(c.nh * 7 + c.nkv + c.hs + (c.padded ? 100 : 0));
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
             want_lse = gather_lse(lse, c.b, c.nh, t_full, pos),
             want_dq = gather_rows(dq, c.b, t_full, full.ld_q, pos),
             want_dk = gather_rows(dk, c.b, t_full, full.ld_k, pos),
             want_dv = gather_rows(dv, c.b, t_full, full.ld_v, pos);

  // On cpu-guarded memory host code and MPI touching a device pointer crash: every copy of
  // the ring must go through the backend or the staged requests.
  auto ring_ops = c.guarded ? trident::ops::make_guarded_ops(1, std::size_t(16) << 20)
                            : trident::ops::make_cpu_ops(1);
  trident::DeviceMemory* mem = ring_ops->memory();
  // the CP group (made after the backend, so that its staging goes before the memory does)
  par::Comm cp_group = world.split(0, rank, "cp");
  if (c.guarded) cp_group.set_staging(std::make_shared<par::DeviceStaging>(mem, false));
  std::vector<trident::FloatBuffer> dev;
  auto on_ring = [&](const FVec& host) -> float* {
    if (!mem) return const_cast<float*>(host.data());
    dev.emplace_back(host.size(), mem);
    mem->to_device(dev.back().data(), host.data(), host.size() * sizeof(float));
    return dev.back().data();
  };
  auto back = [&](FVec& host, float* p) {
    if (mem) mem->to_host(host.data(), p, host.size() * sizeof(float));
  };
  model::RingAttention ring(*ring_ops, cp_group, local);
  // out starts as NaN: the first merge into lse = -inf must not read it
  FVec got_out(lq.size() / full.ld_q * full.ld_o, std::nanf("")), got_lse(want_lse.size(), 0.0f);
  FVec got_dq(lq.size(), 0.0f), got_dk(lk.size(), 0.0f), got_dv(lv.size(), 0.0f);
  float *d_out = on_ring(got_out), *d_lse = on_ring(got_lse), *d_q = on_ring(lq),
        *d_k = on_ring(lk), *d_v = on_ring(lv), *d_dout = on_ring(ldout), *d_dq = on_ring(got_dq),
        *d_dk = on_ring(got_dk), *d_dv = on_ring(got_dv);
  const model::RingAttention::Stats before = model::RingAttention::process_stats();
  ring.forward(d_out, d_lse, d_q, d_k, d_v);
  ring.backward(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v);
  // The counters: a key/value block is b * tl rows of keys and values; the forward sends it
  // cp - 1 times, the backward cp - 1 times more and its gradient cp times (the last hop
  // home). The waits are part of the calls' time; the messages alone count nowhere.
  const model::RingAttention::Stats& st = ring.stats();
  const std::int64_t messages = cp == 1 ? 0 : 3 * cp - 2;
  const double block_bytes = double(c.b) * tl * 2 * wkv * sizeof(float);
  EXPECT_EQ(st.forward_calls, 1);
  EXPECT_EQ(st.backward_calls, 1);
  EXPECT_EQ(st.messages, messages);
  EXPECT_EQ(st.bytes, double(messages) * block_bytes);
  EXPECT_GE(st.forward_wait_s, 0.0);
  EXPECT_LE(st.forward_wait_s, st.forward_s);
  EXPECT_GE(st.backward_wait_s, 0.0);
  EXPECT_LE(st.backward_wait_s, st.backward_s);
  EXPECT_LE(st.forward_wait_cpu_s, st.forward_cpu_s);
  EXPECT_LE(st.backward_wait_cpu_s, st.backward_cpu_s);
  const model::RingAttention::Stats after = model::RingAttention::process_stats();
  EXPECT_EQ(after.messages - before.messages, messages);
  EXPECT_EQ(after.bytes - before.bytes, st.bytes);
  EXPECT_EQ(after.buffer_bytes, st.buffer_bytes);  // the one ring alive
  EXPECT_GE(ring.forward_messages_alone() + ring.backward_messages_alone(), 0.0);
  EXPECT_EQ(ring.stats().messages, messages);
  EXPECT_EQ(model::RingAttention::process_stats().bytes, after.bytes);
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
    std::printf("ring cp %d b %d nh %d nkv %d hs %d T %d %s%s: max |err| out %.2e lse %.2e dq %.2e "
                "dk %.2e dv %.2e (max |ref| %.2f %.2f %.2f %.2f %.2f)\n",
                cp, c.b, c.nh, c.nkv, c.hs, t_full, c.padded ? "padded" : "packed",
                c.guarded ? " guarded" : "", err[0],
                err[1], err[2], err[3], err[4], sc[0], sc[1], sc[2], sc[3], sc[4]);
  // fp32 rounding of a differently ordered sum; an error in masking or merging is O(0.1..1)
  for (int i = 0; i < 5; i++) EXPECT_LE(err[i], 4e-6 * std::max(1.0, sc[i])) << names[i];
  // The padding columns are neither read nor written.
  for (std::size_t row = 0; row < got_dq.size() / std::size_t(full.ld_q); row++)
    for (std::int64_t col = wq; col < full.ld_q; col++)
      ASSERT_EQ(got_dq[row * full.ld_q + col], 0.0f) << "dq's padding was written";
}

}  // namespace

TEST(RingAttention, LocalPositionsPartitionTheSequence) {
  par::Comm world = par::Comm::world();
  const int cp = world.size(), t = 8 * cp;
  const std::vector<int> mine = model::cp_local_positions(t, cp, world.rank());
  std::vector<int> all(static_cast<std::size_t>(t));
  MPI_Allgather(mine.data(), int(mine.size()), MPI_INT, all.data(), int(mine.size()), MPI_INT,
                MPI_COMM_WORLD);
  std::vector<int> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < t; i++) ASSERT_EQ(sorted[std::size_t(i)], i);
  // rank 0 holds the first and the last chunk (the load balance)
  const int chunk = t / (2 * cp);
  EXPECT_EQ(all[0], 0);
  EXPECT_EQ(all[std::size_t(chunk)], t - chunk);
  EXPECT_THROW(model::cp_local_positions(2 * cp + 1, cp, 0), std::exception);
}

TEST(RingAttention, MatchesWholeSequenceFlash) { check_ring({2, 3, 3, 8, false, false}); }
TEST(RingAttention, MatchesWholeSequenceFlashPadded) { check_ring({2, 3, 3, 8, true, false}); }
TEST(RingAttention, GroupedQueryHeads) { check_ring({2, 4, 2, 8, false, false}); }
TEST(RingAttention, GroupedQueryHeadsPadded) { check_ring({1, 4, 2, 8, true, false}); }
TEST(RingAttention, OnDeviceMemoryStagedMpi) { check_ring({2, 4, 2, 8, true, true}); }

// The bf16 wire (bf16_exact, as the CUDA bf16 block calls the ring): on bf16-exact q, k, v,
// dout, the block's out and lse, and its dq, dk, dv after its rounding, are the fp32 wire's
// bits; the key/value blocks and each gradient's last hop travel at 2 bytes a value, the
// gradient partials summed hop by hop at 4 (the forward's and backward's cp - 1 blocks and
// cp - 1 partials and a last hop: 2cp - 3/2 blocks of fp32's 3cp - 2).
TEST(RingAttention, Bf16WireSameBits) {
  par::Comm world = par::Comm::world();
  const int cp = world.size(), rank = world.rank();
  const int tl = test_t(cp) / cp;
  const Ops::AttentionShape local = padded_shape(2, tl, 4, 2, 8);
  auto ops = trident::ops::make_cpu_ops(1);
  par::Comm cp_group = world.split(0, rank, "cp");
  model::RingAttention ring(*ops, cp_group, local);
  const WireRuns w = run_both_wires(ring, *ops, local, 300u + 10u * unsigned(rank),
                                    [&] { return ring.stats().bytes; });
  EXPECT_EQ(w.difference, "");
  const double block = double(local.b) * tl * 2 * double(local.nkv * local.hs) * sizeof(float);
  EXPECT_EQ(w.bytes32, cp == 1 ? 0.0 : (3 * cp - 2) * block);
  EXPECT_EQ(w.bytes16, cp == 1 ? 0.0 : (2 * cp - 1.5) * block);
  if (rank == 0)
    std::printf("ring cp %d: the bf16 wire sent %.0f B, the fp32 wire %.0f B\n", cp, w.bytes16,
                w.bytes32);
}

// The bf16 entry points (the CUDA bf16 block's: key/value blocks held and sent as bf16, each
// block's partial output rounded to bf16 before the merge, partial gradients widened into fp32
// sums) against the fp32 ones on bf16-exact operands, as the block sees both: within bf16's
// rounding (not the same bits: the partials are rounded once more); the padding columns of
// dq, dk, dv untouched; the bf16 wire's bytes.
TEST(RingAttention, Bf16EntryPointsMatchFp32) {
  par::Comm world = par::Comm::world();
  const int cp = world.size(), rank = world.rank();
  const int tl = test_t(cp) / cp;
  const Ops::AttentionShape local = bf16_shape(2, tl, 4, 2, 8);
  auto ops = trident::ops::make_cpu_ops(1);
  par::Comm cp_group = world.split(0, rank, "cp");
  model::RingAttention ring32(*ops, cp_group, local);
  model::RingAttention ring16(*ops, cp_group, local, true);
  EXPECT_LT(ring16.stats().buffer_bytes, ring32.stats().buffer_bytes);
  const Bf16Runs r = run_bf16_entry_points(ring32, ring16, *ops, local, 900u + 10u * unsigned(rank),
                                           [&] { return ring16.stats().bytes; });
  const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++) EXPECT_LT(r.rel[i], i == 1 ? 1e-6 : 2e-2) << names[i];
  EXPECT_TRUE(r.untouched);
  const double block = double(local.b) * tl * 2 * double(local.nkv * local.hs) * sizeof(float);
  EXPECT_EQ(r.bytes16, cp == 1 ? 0.0 : (2 * cp - 1.5) * block);
  if (rank == 0)
    std::printf("ring cp %d bf16 entry points: relative errors out %.2e lse %.2e dq %.2e dk %.2e "
                "dv %.2e; sent %.0f B; buffers %lld B (fp32 %lld B)\n",
                cp, r.rel[0], r.rel[1], r.rel[2], r.rel[3], r.rel[4], r.bytes16,
                static_cast<long long>(ring16.stats().buffer_bytes),
                static_cast<long long>(ring32.stats().buffer_bytes));
}
