// ShardSpec geometry: offsets pack the flat buffer, shards tile the logical tensor.
#include <gtest/gtest.h>

#include <set>

#include "trident/model/spec.hpp"

using namespace trident::model;

TEST(Spec, SerialSpecsPackTheFlatBuffer) {
  ModelConfig cfg{50, 16, 2, 2, 8};
  auto specs = gpt_param_specs(cfg, StageLayout{0, 2, true, true}, 0, 1);
  ASSERT_EQ(specs.size(), 2 + 2 * 12 + 2u);
  std::int64_t off = 0;
  for (const auto& s : specs) {
    EXPECT_EQ(s.offset, off) << s.name;
    EXPECT_EQ(s.local_numel(), s.numel()) << s.name;
    off += s.local_numel();
  }
  EXPECT_EQ(specs[0].name, "wte");
  EXPECT_EQ(specs.back().name, "ln_f.bias");
}

TEST(Spec, TensorShardsTileEveryLogicalTensorExactlyOnce) {
  ModelConfig cfg{51, 16, 1, 4, 16};  // vocabulary not a multiple of tp: padding rows
  for (int tp : {1, 2, 4}) {
    std::vector<std::vector<ShardSpec>> per_rank;
    for (int r = 0; r < tp; ++r)
      per_rank.push_back(gpt_param_specs(cfg, StageLayout{0, 1, true, true}, r, tp));
    for (std::size_t p = 0; p < per_rank[0].size(); ++p) {
      std::multiset<std::int64_t> seen;
      for (int r = 0; r < tp; ++r) {
        const auto& s = per_rank[r][p];
        if (s.tp_replicated() && r > 0) continue;
        for_each_local_element(s, [&](std::int64_t local, std::int64_t global) {
          EXPECT_LT(local, s.local_numel());
          seen.insert(global);
        });
      }
      const auto& s0 = per_rank[0][p];
      ASSERT_EQ(std::int64_t(seen.size()), s0.numel()) << s0.name << " tp=" << tp;
      EXPECT_EQ(std::int64_t(std::set<std::int64_t>(seen.begin(), seen.end()).size()), s0.numel())
          << s0.name;
    }
  }
}
