// trident/parallel/grid.hpp — the process grid as pure arithmetic (no MPI here).
// defines: trident::parallel::GridShape, GridCoord, Axis, coord_of, rank_of, group_ranks,
//          embedding_group_ranks, groups_json
//
// Megatron-LM's order, TP fastest, then CP (context parallelism), then DP, then PP
// (DESIGN.md, decision 1):
//     world_rank = tp_rank + TP * (cp_rank + CP * (dp_rank + DP * pp_rank))
// TP neighbours are adjacent ranks, i.e. on the same node with the fastest links; CP's
// ring exchanges come next. Worked example, 16 ranks, TP=2, CP=2, DP=2, PP=2:
//     TP groups    [0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]
//     CP groups    [0,2] [1,3] [4,6] [5,7] [8,10] [9,11] [12,14] [13,15]
//     DP groups    [0,4] [1,5] [2,6] [3,7] [8,12] [9,13] [10,14] [11,15]
//     PP groups    [0,8] [1,9] [2,10] [3,11] [4,12] [5,13] [6,14] [7,15]
//     DP×CP groups [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15]
// (the ranks that hold the same shard of the weights: where gradients are reduced).
// With CP=1 the order is the earlier tp + TP * (dp + DP * pp), rank for rank.
#pragma once

#include <string>
#include <vector>

#include "trident/core/placement.hpp"

namespace trident::parallel {

// Sizes and coordinates in the rank order (tp fastest, then cp, then dp, then pp). Set them
// by name (`GridShape s; s.tp = 2; s.pp = 4;`), never by position: an axis added later goes
// in its place in the order.
struct GridShape {
  int tp = 1;
  int cp = 1;
  int dp = 1;
  int pp = 1;
  int world_size() const { return tp * cp * dp * pp; }
};

struct GridCoord {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
};

// dp_cp: the ranks that differ only in their cp and dp coordinates (a model replica's
// shard of the weights, DP × CP ranks in world order); the same groups as dp when cp == 1.
enum class Axis { tp, cp, dp, pp, dp_cp };

GridCoord coord_of(const GridShape& shape, int world_rank);
int rank_of(const GridShape& shape, const GridCoord& coord);

// All groups along `axis`, each a list of world ranks in the order of the axis index
// (dp_cp: in world order, cp fastest); groups are ordered by the smallest rank they contain.
std::vector<std::vector<int>> group_ranks(const GridShape& shape, Axis axis);

// The embedding group of each pipeline: the ranks holding its first and its last virtual
// stage under `placement` with vpp chunks per rank (round robin: the first and last pp
// rank; zb-v's V: pp rank 0 alone; one rank when pp == 1), for every (tp, cp, dp) position.
std::vector<std::vector<int>> embedding_group_ranks(
    const GridShape& shape, Placement placement = Placement::round_robin, int vpp = 1);

// {"tp": [[0,1],...], "cp": [...], "dp": [...], "pp": [...], "dp_cp": [...],
//  "embedding": [...]} on one line.
std::string groups_json(const GridShape& shape);

}  // namespace trident::parallel
