// The communicators of make_parallel_state against the grid's arithmetic: on every rank,
// each communicator's members (gathered over it, in its rank order) are the group of
// group_ranks (grid.hpp) that holds this rank, for shapes with and without context
// parallelism; with cp = 1, dp_cp holds the ranks of dp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "trident/parallel/comm.hpp"
#include "trident/parallel/grid.hpp"

namespace par = trident::parallel;

namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The world ranks of comm's members, in comm's rank order (empty outside the group).
std::vector<int> members(par::Comm& comm, int world_rank) {
  if (comm.size() == 0) return {};
  const std::int64_t mine = world_rank;
  std::vector<std::int64_t> all(std::size_t(comm.size()));
  comm.all_gather(&mine, all.data(), 1);
  return {all.begin(), all.end()};
}

// The group of `groups` holding `rank`.
std::vector<int> group_of(const std::vector<std::vector<int>>& groups, int rank) {
  for (const auto& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  return {};
}

void check_shape(const par::GridShape& s) {
  ASSERT_EQ(s.world_size(), world_size());
  par::ParallelState ps = par::make_parallel_state(s);
  const int r = ps.world_rank;
  EXPECT_EQ(par::rank_of(s, ps.coord), r);
  struct Case {
    par::Comm* comm;
    par::Axis axis;
    const char* name;
  };
  for (const Case& c : {Case{&ps.tp, par::Axis::tp, "tp"}, Case{&ps.cp, par::Axis::cp, "cp"},
                        Case{&ps.dp, par::Axis::dp, "dp"}, Case{&ps.pp, par::Axis::pp, "pp"},
                        Case{&ps.dp_cp, par::Axis::dp_cp, "dp_cp"}}) {
    EXPECT_EQ(c.comm->name(), c.name);
    EXPECT_EQ(members(*c.comm, r), group_of(par::group_ranks(s, c.axis), r))
        << c.name << " on rank " << r << " of tp " << s.tp << " cp " << s.cp << " dp " << s.dp
        << " pp " << s.pp;
  }
  EXPECT_EQ(ps.coord.cp, ps.cp.rank());
  EXPECT_EQ(ps.coord.cp + s.cp * ps.coord.dp, ps.dp_cp.rank());
  EXPECT_EQ(members(ps.embedding, r), group_of(par::embedding_group_ranks(s), r));
}

par::GridShape shape(int tp, int cp, int dp, int pp) {
  par::GridShape s;
  s.tp = tp, s.cp = cp, s.dp = dp, s.pp = pp;
  return s;
}

}  // namespace

TEST(GridComm, CpTwoDpTwo) { check_shape(shape(1, 2, 2, 1)); }
TEST(GridComm, TpTwoCpTwo) { check_shape(shape(2, 2, 1, 1)); }
TEST(GridComm, CpTwoPpTwo) { check_shape(shape(1, 2, 1, 2)); }  // an embedding group per CP rank
TEST(GridComm, CpFour) { check_shape(shape(1, 4, 1, 1)); }
TEST(GridComm, CpOneDpCpIsDp) {
  check_shape(shape(2, 1, 2, 1));
  par::ParallelState ps = par::make_parallel_state(shape(2, 1, 2, 1));
  EXPECT_EQ(members(ps.dp_cp, ps.world_rank), members(ps.dp, ps.world_rank));
  EXPECT_EQ(ps.dp_cp.rank(), ps.dp.rank());
}
