// 2D tensor parallelism's grid arithmetic (parallel/tp_grid2d.hpp); the communicators
// themselves are checked under mpirun (test/mpi/summa_test.cpp).
#include <gtest/gtest.h>

#include "trident/core/error.hpp"
#include "trident/parallel/tp_grid2d.hpp"

using namespace trident::parallel;

TEST(TpGrid2d, SideOfPerfectSquaresOnly) {
  EXPECT_EQ(tp2d_side(1), 1);
  EXPECT_EQ(tp2d_side(4), 2);
  EXPECT_EQ(tp2d_side(9), 3);
  EXPECT_EQ(tp2d_side(16), 4);
  for (int tp : {0, -4, 2, 3, 5, 8, 12, 15}) EXPECT_EQ(tp2d_side(tp), 0) << tp;
}

TEST(TpGrid2d, RowMajorCoordinates) {
  // tp = 4: (0,0) (0,1) / (1,0) (1,1), as in the header's worked example.
  EXPECT_EQ(tp2d_coord(1, 2).row, 0);
  EXPECT_EQ(tp2d_coord(1, 2).col, 1);
  EXPECT_EQ(tp2d_coord(2, 2).row, 1);
  EXPECT_EQ(tp2d_coord(2, 2).col, 0);
  for (int q : {1, 2, 3})
    for (int r = 0; r < q * q; ++r) EXPECT_EQ(tp2d_rank(tp2d_coord(r, q), q), r);
  EXPECT_THROW(tp2d_coord(4, 2), trident::Error);
}
