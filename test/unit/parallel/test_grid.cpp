// The process grid's arithmetic: Megatron's 16-rank example and the formula on other shapes.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "trident/parallel/grid.hpp"

using namespace trident::parallel;
using Groups = std::vector<std::vector<int>>;

// A shape from its sizes by name (the struct's order is the rank order, tp, cp, dp, pp).
GridShape shape(int tp, int pp, int dp, int cp = 1) {
  GridShape s;
  s.tp = tp, s.pp = pp, s.dp = dp, s.cp = cp;
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
            "{\"tp\": [[0, 1]], \"cp\": [[0], [1]], \"dp\": [[0], [1]], \"pp\": [[0], [1]], "
            "\"dp_cp\": [[0], [1]], \"embedding\": [[0], [1]]}");
  EXPECT_EQ(groups_json(shape(/*tp=*/1, /*pp=*/1, /*dp=*/2, /*cp=*/2)),
            "{\"tp\": [[0], [1], [2], [3]], \"cp\": [[0, 1], [2, 3]], \"dp\": [[0, 2], [1, 3]], "
            "\"pp\": [[0], [1], [2], [3]], \"dp_cp\": [[0, 1, 2, 3]], "
            "\"embedding\": [[0], [1], [2], [3]]}");
}

// The 16-rank example with context parallelism, TP=2, CP=2, DP=2, PP=2, spelled out
// from world_rank = tp + 2 * (cp + 2 * (dp + 2 * pp)) (grid.hpp's worked example).
TEST(Grid, ContextParallelSixteenRankExample) {
  const GridShape s = shape(/*tp=*/2, /*pp=*/2, /*dp=*/2, /*cp=*/2);
  EXPECT_EQ(s.world_size(), 16);
  EXPECT_EQ(group_ranks(s, Axis::tp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(group_ranks(s, Axis::cp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(group_ranks(s, Axis::dp),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(group_ranks(s, Axis::pp),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(group_ranks(s, Axis::dp_cp),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  // One embedding group per (tp, cp, dp) position: each CP rank ties its own slice's wte.
  EXPECT_EQ(embedding_group_ranks(s),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  GridCoord c = coord_of(s, 13);  // 13 = 1 + 2 * (0 + 2 * (1 + 2 * 1))
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
}

// cp = 1 leaves every rank where it was: the same groups as the three-axis formula, and
// dp_cp is dp.
TEST(Grid, CpOneIsTheThreeAxisGrid) {
  for (GridShape s : {shape(2, 4, 2), shape(3, 2, 2), shape(1, 1, 5)}) {
    for (int r = 0; r < s.world_size(); ++r) {
      const GridCoord c = coord_of(s, r);
      EXPECT_EQ(c.cp, 0);
      EXPECT_EQ(r, c.tp + s.tp * (c.dp + s.dp * c.pp));
    }
    EXPECT_EQ(group_ranks(s, Axis::dp_cp), group_ranks(s, Axis::dp));
  }
}

// Random four-axis shapes: coord_of and rank_of invert each other, every axis's groups (and
// DP×CP's) partition the world, and each group's members differ only along their axes.
TEST(Grid, RandomShapesRoundTripAndPartition) {
  std::mt19937 rng(30);
  std::uniform_int_distribution<int> size(1, 4);
  for (int trial = 0; trial < 200; ++trial) {
    const GridShape s = shape(size(rng), size(rng), size(rng), size(rng));
    for (int r = 0; r < s.world_size(); ++r) {
      const GridCoord c = coord_of(s, r);
      EXPECT_TRUE(c.tp < s.tp && c.cp < s.cp && c.dp < s.dp && c.pp < s.pp);
      EXPECT_EQ(r, c.tp + s.tp * (c.cp + s.cp * (c.dp + s.dp * c.pp)));
      EXPECT_EQ(rank_of(s, c), r);
    }
    for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp, Axis::dp_cp}) {
      const int extent = a == Axis::tp   ? s.tp
                         : a == Axis::cp ? s.cp
                         : a == Axis::dp ? s.dp
                         : a == Axis::pp ? s.pp
                                         : s.dp * s.cp;
      std::set<int> seen;
      const Groups groups = group_ranks(s, a);
      EXPECT_EQ(int(groups.size()) * extent, s.world_size());
      for (const auto& g : groups) {
        ASSERT_EQ(int(g.size()), extent);
        const GridCoord lead = coord_of(s, g.front());
        for (std::size_t i = 0; i < g.size(); ++i) {
          EXPECT_TRUE(seen.insert(g[i]).second);
          const GridCoord c = coord_of(s, g[i]);
          // Fixed off the axis; along it, the i-th member has index i (dp_cp: cp fastest).
          EXPECT_EQ(c.tp, a == Axis::tp ? int(i) : lead.tp);
          EXPECT_EQ(c.pp, a == Axis::pp ? int(i) : lead.pp);
          if (a == Axis::dp_cp) {
            EXPECT_EQ(c.cp + s.cp * c.dp, int(i));
          } else {
            EXPECT_EQ(c.cp, a == Axis::cp ? int(i) : lead.cp);
            EXPECT_EQ(c.dp, a == Axis::dp ? int(i) : lead.dp);
          }
        }
      }
      EXPECT_EQ(int(seen.size()), s.world_size());
    }
  }
}
