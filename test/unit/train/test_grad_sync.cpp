// Unit tests of the DP bucket layout (trident/train/grad_sync.hpp) on one rank: buckets of
// whole tensors from the end of the flat buffer, within the size cap, and the owned
// segments covering the buffer once; and ZeRO-1's split of a bucket over the DP ranks.
// (Communication and sharding over several ranks: test/mpi/three_d.py.)
#include <gtest/gtest.h>

#include "trident/model/gpt.hpp"
#include "trident/ops/ops.hpp"
#include "trident/train/grad_sync.hpp"

namespace trident::train {
namespace {

TEST(GradSync, SplitCountsAreContiguousAndBalanced) {
  for (std::int64_t n : {1, 7, 8, 9, 2621, 100003}) {
    for (int p : {1, 2, 3, 4, 8}) {
      const std::vector<int> c = split_counts(n, p);
      ASSERT_EQ(int(c.size()), p);
      std::int64_t sum = 0;
      for (int k = 0; k < p; ++k) {
        sum += c[k];
        EXPECT_LE(c[0] - c[k], 1) << n << " over " << p;
        if (k) EXPECT_GE(c[k - 1], c[k]);
      }
      EXPECT_EQ(sum, n);
    }
  }
}

TEST(GradSync, BucketsOfWholeTensorsCoverTheBufferOnce) {
  parallel::ParallelState ps;  // every communicator of size 1
  auto ops = ops::make_ops("cpu", 1);
  model::ModelConfig cfg{101, 16, 3, 4, 32};
  model::GptChunk chunk(cfg, model::StageLayout{0, 3, true, true}, ps, *ops, 2);
  for (double mb : {1e-9, 0.005, 0.02, 25.0}) {
    GradSync sync(chunk, ps.dp, mb, /*zero=*/true);  // ZeRO-1 at dp = 1: a no-op
    EXPECT_FALSE(sync.active());
    EXPECT_FALSE(sync.zero());
    EXPECT_EQ(sync.shard_numel(), chunk.num_params());
    const auto& segs = sync.segments();
    ASSERT_EQ(segs.size(), chunk.specs().size()) << mb;
    std::int64_t at = 0;
    for (std::size_t i = 0; i < segs.size(); ++i) {
      EXPECT_EQ(segs[i].offset, at);
      EXPECT_EQ(segs[i].shard, at);  // without ZeRO the shard layout is the flat one
      EXPECT_EQ(segs[i].spec, &chunk.specs()[i]);
      EXPECT_EQ(segs[i].count, chunk.specs()[i].local_numel());
      at += segs[i].count;
    }
    EXPECT_EQ(at, chunk.num_params());
    if (mb < 1e-6) EXPECT_EQ(sync.num_buckets(), int(chunk.specs().size()));  // one per tensor
    if (mb >= 25.0) EXPECT_EQ(sync.num_buckets(), 1);
  }
}

}  // namespace
}  // namespace trident::train
