// Rank arithmetic of the process grid (see trident/parallel/grid.hpp).
#include "trident/parallel/grid.hpp"

#include <algorithm>
#include <sstream>

#include "trident/core/error.hpp"

namespace trident::parallel {

GridCoord coord_of(const GridShape& s, int r) {
  TRIDENT_CHECK(r >= 0 && r < s.world_size(), "rank ", r, " outside a world of ", s.world_size());
  GridCoord c;
  c.tp = r % s.tp;
  r /= s.tp;
  c.cp = r % s.cp;
  r /= s.cp;
  c.dp = r % s.dp;
  c.pp = r / s.dp;
  return c;
}

int rank_of(const GridShape& s, const GridCoord& c) {
  return c.tp + s.tp * (c.cp + s.cp * (c.dp + s.dp * c.pp));
}

std::vector<std::vector<int>> group_ranks(const GridShape& s, Axis axis) {
  std::vector<std::vector<int>> groups;
  if (axis == Axis::dp_cp) {  // cp fastest, then dp: world order within the group
    for (const auto& cp_group : group_ranks(s, Axis::cp)) {
      const GridCoord lead = coord_of(s, cp_group.front());
      if (lead.dp != 0) continue;
      std::vector<int> g;
      for (int dp = 0; dp < s.dp; ++dp)
        for (int cp = 0; cp < s.cp; ++cp) {
          GridCoord c = lead;
          c.cp = cp, c.dp = dp;
          g.push_back(rank_of(s, c));
        }
      groups.push_back(std::move(g));
    }
    return groups;
  }
  auto index_of = [axis](GridCoord& c) -> int& {
    switch (axis) {
      case Axis::tp: return c.tp;
      case Axis::cp: return c.cp;
      case Axis::dp: return c.dp;
      default: return c.pp;
    }
  };
  const int extent = axis == Axis::tp   ? s.tp
                     : axis == Axis::cp ? s.cp
                     : axis == Axis::dp ? s.dp
                                        : s.pp;
  for (int r = 0; r < s.world_size(); ++r) {
    GridCoord c = coord_of(s, r);
    int& index = index_of(c);
    if (index != 0) continue;  // r leads its group
    std::vector<int> g;
    for (int i = 0; i < extent; ++i) {
      index = i;
      g.push_back(rank_of(s, c));
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

std::vector<std::vector<int>> embedding_group_ranks(const GridShape& s, Placement placement,
                                                    int vpp) {
  const StageMap map{placement, s.pp, vpp};
  std::vector<std::vector<int>> groups;
  for (const auto& pipe : group_ranks(s, Axis::pp)) {
    std::vector<int> g{pipe[std::size_t(map.embedding_rank())]};
    if (map.head_rank() != map.embedding_rank()) g.push_back(pipe[std::size_t(map.head_rank())]);
    groups.push_back(std::move(g));
  }
  return groups;
}

namespace {
void write_groups(std::ostringstream& os, const std::vector<std::vector<int>>& groups) {
  os << '[';
  for (std::size_t i = 0; i < groups.size(); ++i) {
    os << (i ? ", [" : "[");
    for (std::size_t j = 0; j < groups[i].size(); ++j) os << (j ? ", " : "") << groups[i][j];
    os << ']';
  }
  os << ']';
}
}  // namespace

std::string groups_json(const GridShape& s) {
  std::ostringstream os;
  os << "{\"tp\": ";
  write_groups(os, group_ranks(s, Axis::tp));
  os << ", \"cp\": ";
  write_groups(os, group_ranks(s, Axis::cp));
  os << ", \"dp\": ";
  write_groups(os, group_ranks(s, Axis::dp));
  os << ", \"pp\": ";
  write_groups(os, group_ranks(s, Axis::pp));
  os << ", \"dp_cp\": ";
  write_groups(os, group_ranks(s, Axis::dp_cp));
  os << ", \"embedding\": ";
  write_groups(os, embedding_group_ranks(s));
  os << '}';
  return os.str();
}

}  // namespace trident::parallel
