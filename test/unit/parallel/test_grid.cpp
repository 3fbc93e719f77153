// The process grid's arithmetic: Megatron's 16-rank example and the formula on other shapes.
#include <gtest/gtest.h>

#include <set>

#include "trident/parallel/grid.hpp"

using namespace trident::parallel;
using Groups = std::vector<std::vector<int>>;

// A shape from its sizes by name (the struct's order is the rank order, tp, dp, pp).
GridShape shape(int tp, int pp, int dp) {
  GridShape s;
  s.tp = tp, s.pp = pp, s.dp = dp;
  return s;
}

TEST(Grid, MegatronSixteenRankExample) {
  const GridShape s = shape(/*tp=*/2, /*pp=*/4, /*dp=*/2);
  EXPECT_EQ(group_ranks(s, Axis::tp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(group_ranks(s, Axis::dp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(group_ranks(s, Axis::pp),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(embedding_group_ranks(s), (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  // zb-v's V placement: pp rank 0 holds the embedding and the head, alone in its group.
  EXPECT_EQ(embedding_group_ranks(s, trident::Placement::v_shape, 2),
            (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(embedding_group_ranks(s, trident::Placement::round_robin, 2),
            (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
}

TEST(Grid, CoordinatesFollowTheFormulaAndGroupsPartitionTheWorld) {
  for (GridShape s : {shape(1, 1, 1), shape(3, 2, 2), shape(1, 4, 3), shape(4, 1, 2),
                      shape(2, 3, 1)}) {  // (tp, pp, dp)
    for (int r = 0; r < s.world_size(); ++r) {
      GridCoord c = coord_of(s, r);
      EXPECT_EQ(r, c.tp + s.tp * (c.dp + s.dp * c.pp));
      EXPECT_EQ(rank_of(s, c), r);
    }
    for (Axis a : {Axis::tp, Axis::dp, Axis::pp}) {
      std::set<int> seen;
      for (const auto& g : group_ranks(s, a))
        for (int r : g) EXPECT_TRUE(seen.insert(r).second);
      EXPECT_EQ(int(seen.size()), s.world_size());
    }
  }
}

TEST(Grid, JsonListsEveryGroup) {
  EXPECT_EQ(groups_json(shape(/*tp=*/2, 1, 1)),
            "{\"tp\": [[0, 1]], \"dp\": [[0], [1]], \"pp\": [[0], [1]], \"embedding\": [[0], [1]]}");
}
