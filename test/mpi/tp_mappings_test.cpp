// The four conjugate TP operators (parallel/tp_mappings.hpp) under mpirun, with
// rank-valued inputs whose results are known in closed form: rank r contributes
// (r + 1) * (j + 1) at element j, so a sum over p ranks is (j + 1) * p(p + 1)/2; gathers
// are checked with values that name their source rank (100 * rank + i).
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/tp_mappings.hpp"

namespace par = trident::parallel;

namespace {

constexpr std::int64_t kLocal = 6;  // elements of one rank's rows

struct World {
  par::Comm comm = par::Comm::world();
  int p = comm.size(), r = comm.rank();
  float tri() const { return float(p * (p + 1) / 2); }
  std::vector<float> rank_valued(std::int64_t n) const {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) v[std::size_t(j)] = float((r + 1) * (j + 1));
    return v;
  }
};

double ring_allreduce_bytes(int p, std::int64_t n) { return 2.0 * (p - 1) / p * 4.0 * double(n); }

}  // namespace

TEST(TpMappings, CopyIsIdentityForwardAllreduceBackward) {
  World w;
  par::TpMappings m(w.comm, false);
  std::vector<float> x(kLocal, 3.0f);
  m.enter_forward(x.data(), kLocal);
  for (float v : x) EXPECT_EQ(v, 3.0f);
  EXPECT_EQ(w.comm.counters().calls, 0);
  auto d = w.rank_valued(kLocal);
  const float* got = m.enter_backward(d.data(), nullptr, kLocal);
  EXPECT_EQ(got, d.data());
  for (std::int64_t j = 0; j < kLocal; ++j) EXPECT_EQ(got[j], float(j + 1) * w.tri());
  EXPECT_DOUBLE_EQ(w.comm.counters().bytes, ring_allreduce_bytes(w.p, kLocal));
}

TEST(TpMappings, ReduceIsAllreduceForwardIdentityBackward) {
  World w;
  par::TpMappings m(w.comm, false);
  auto y = w.rank_valued(kLocal);
  m.leave_forward(y.data(), y.data(), kLocal);
  for (std::int64_t j = 0; j < kLocal; ++j) EXPECT_EQ(y[j], float(j + 1) * w.tri());
  std::vector<float> d(kLocal, 5.0f);
  EXPECT_EQ(m.leave_backward(d.data(), nullptr, kLocal), d.data());
  EXPECT_EQ(w.comm.counters().calls, 1);
}

TEST(TpMappings, SequenceGatherIsAllGatherForwardReduceScatterBackward) {
  World w;
  par::TpMappings m(w.comm, true);
  ASSERT_EQ(m.sequence_parallel(), w.p > 1);
  if (w.p == 1) GTEST_SKIP() << "needs several ranks";
  EXPECT_EQ(m.local_rows(4 * w.p), 4);
  std::vector<float> full(static_cast<std::size_t>(kLocal * w.p), -1.0f);
  float* mine = m.local_part(full.data(), kLocal);
  EXPECT_EQ(mine, full.data() + w.r * kLocal);
  for (std::int64_t i = 0; i < kLocal; ++i) mine[i] = float(100 * w.r + i);
  m.enter_forward(full.data(), kLocal);
  for (int q = 0; q < w.p; ++q)
    for (std::int64_t i = 0; i < kLocal; ++i) EXPECT_EQ(full[q * kLocal + i], float(100 * q + i));

  auto dfull = w.rank_valued(kLocal * w.p);
  std::vector<float> dlocal(kLocal);
  const float* got = m.enter_backward(dfull.data(), dlocal.data(), kLocal);
  EXPECT_EQ(got, dlocal.data());
  for (std::int64_t i = 0; i < kLocal; ++i)
    EXPECT_EQ(got[i], float(w.r * kLocal + i + 1) * w.tri());
  // An all-gather and a reduce-scatter together move what one allreduce of the rows moves.
  EXPECT_DOUBLE_EQ(w.comm.counters().bytes, ring_allreduce_bytes(w.p, kLocal * w.p));
}

TEST(TpMappings, SequenceReduceScatterIsReduceScatterForwardAllGatherBackward) {
  World w;
  par::TpMappings m(w.comm, true);
  if (w.p == 1) GTEST_SKIP() << "needs several ranks";
  auto partial = w.rank_valued(kLocal * w.p);
  std::vector<float> local(kLocal);
  m.leave_forward(partial.data(), local.data(), kLocal);
  for (std::int64_t i = 0; i < kLocal; ++i)
    EXPECT_EQ(local[i], float(w.r * kLocal + i + 1) * w.tri());

  std::vector<float> dlocal(kLocal), dfull(static_cast<std::size_t>(kLocal * w.p), -1.0f);
  for (std::int64_t i = 0; i < kLocal; ++i) dlocal[i] = float(100 * w.r + i);
  const float* got = m.leave_backward(dlocal.data(), dfull.data(), kLocal);
  EXPECT_EQ(got, dfull.data());
  for (int q = 0; q < w.p; ++q)
    for (std::int64_t i = 0; i < kLocal; ++i) EXPECT_EQ(got[q * kLocal + i], float(100 * q + i));
}

TEST(TpMappings, SequenceParallelRowsMustDivide) {
  World w;
  par::TpMappings m(w.comm, true);
  if (w.p == 1) GTEST_SKIP() << "needs several ranks";
  EXPECT_THROW(m.local_rows(w.p + 1), trident::Error);
}

// The non-blocking calls on device memory an MPI cannot take (cpu-guarded: host code and MPI
// touching it crash): each request stages through host memory and puts its result back in
// the device buffer when it completes; the same closed forms as above.
TEST(Comm, NonBlockingCallsStageDeviceMemoryThroughTheirRequests) {
  World w;
  if (w.p == 1) GTEST_SKIP() << "needs several ranks";
  auto ops = trident::ops::make_guarded_ops(1, std::size_t(1) << 20);
  trident::DeviceMemory* mem = ops->memory();
  par::Comm c = w.comm.split(0, w.r, "staged");
  c.set_staging(std::make_shared<par::DeviceStaging>(mem, false));
  const std::int64_t n = kLocal * w.p;
  auto device = [&](const std::vector<float>& host) {
    trident::FloatBuffer b(host.size(), mem);
    mem->to_device(b.data(), host.data(), host.size() * sizeof(float));
    return b;
  };
  auto host = [&](const trident::FloatBuffer& b) {
    std::vector<float> v(b.size());
    mem->to_host(v.data(), b.data(), v.size() * sizeof(float));
    return v;
  };
  for (int round = 0; round < 2; ++round) {  // the second one on the pool's blocks
    trident::FloatBuffer sum = device(w.rank_valued(n)), part = device(std::vector<float>(kLocal));
    trident::FloatBuffer bucket = device(w.rank_valued(n));
    const trident::FloatBuffer out = device(w.rank_valued(kLocal));
    trident::FloatBuffer in = device(std::vector<float>(kLocal));
    const std::vector<int> counts(std::size_t(w.p), int(kLocal));
    std::vector<par::Request> rs;
    rs.push_back(c.iallreduce_sum(sum.data(), n));
    rs.push_back(c.ireduce_scatter_sum(bucket.data(), part.data(), counts.data(), n));
    rs.push_back(c.irecv(in.data(), kLocal, (w.r + w.p - 1) % w.p, 7));
    rs.push_back(c.isend(out.data(), kLocal, (w.r + 1) % w.p, 7));
    par::wait_all(rs, [] { return std::string("the staged test calls"); });
    const auto s = host(sum), q = host(part), got = host(in);
    for (std::int64_t j = 0; j < n; ++j) EXPECT_EQ(s[j], float(j + 1) * w.tri());
    for (std::int64_t j = 0; j < kLocal; ++j) {
      EXPECT_EQ(q[j], float(w.r * kLocal + j + 1) * w.tri());
      EXPECT_EQ(got[j], float(((w.r + w.p - 1) % w.p + 1) * (j + 1)));
    }
  }
}

// Collectives on staged device memory start once their input has come down the staging
// stream (cpu-guarded says "not yet" to each copy's first query), in the order they were
// made, whatever order they are tested or waited in, and before any other collective on the
// communicator: rank 0 alone tests the second until calls start, and a blocking allreduce
// and waits in reverse order follow; every rank's calls still pair. A deferred call dropped on every rank before it started
// leaves the communicator usable.
TEST(Comm, DeferredCollectivesStartInOrderBeforeAnyOther) {
  World w;
  if (w.p == 1) GTEST_SKIP() << "needs several ranks";
  auto ops = trident::ops::make_guarded_ops(1, std::size_t(1) << 20);
  trident::DeviceMemory* mem = ops->memory();
  par::Comm c = w.comm.split(0, w.r, "deferred");
  c.set_staging(std::make_shared<par::DeviceStaging>(mem, false));
  const std::int64_t n = kLocal * w.p;
  std::vector<trident::FloatBuffer> bufs;
  for (int k = 0; k < 3; ++k) {
    bufs.emplace_back(std::size_t(n), mem);
    std::vector<float> v = w.rank_valued(n);
    for (float& x : v) x *= float(k + 1);
    mem->to_device(bufs.back().data(), v.data(), v.size() * sizeof(float));
  }
  {
    par::Request dropped = c.iallreduce_sum(bufs[2].data(), n);  // never started: dropped
  }
  std::vector<par::Request> rs;
  rs.push_back(c.iallreduce_sum(bufs[0].data(), n));
  rs.push_back(c.iallreduce_sum(bufs[1].data(), n));
  EXPECT_FALSE(rs[1].test());  // its copy has not landed yet
  if (w.r == 0) {  // rank 0 alone sees the copies land and starts calls: the ranks differ
    rs[1].test();
    rs[1].test();
  }
  std::vector<double> blocking(3, double(w.r + 1));
  c.allreduce_sum(blocking.data(), 3);
  rs[1].wait([] { return std::string("the second deferred allreduce"); });
  rs[0].wait([] { return std::string("the first deferred allreduce"); });
  EXPECT_EQ(blocking[0], double(w.tri()));
  for (int k = 0; k < 2; ++k) {
    std::vector<float> got(static_cast<std::size_t>(n));
    mem->to_host(got.data(), bufs[std::size_t(k)].data(), got.size() * sizeof(float));
    for (std::int64_t j = 0; j < n; ++j)
      EXPECT_EQ(got[std::size_t(j)], float(k + 1) * float(j + 1) * w.tri()) << k << " " << j;
  }
  std::vector<float> untouched(static_cast<std::size_t>(n));
  mem->to_host(untouched.data(), bufs[2].data(), untouched.size() * sizeof(float));
  EXPECT_EQ(untouched[0], 3.0f * float(w.r + 1));
}
