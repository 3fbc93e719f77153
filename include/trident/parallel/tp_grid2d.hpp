// trident/parallel/tp_grid2d.hpp — 2D tensor parallelism's q x q grid inside one TP group
// (Colossal-AI's 2D / SUMMA, parallel.tp_mode = "2d"): its arithmetic and its row and column
// communicators.
// defines: trident::parallel::tp2d_side, Tp2dCoord, tp2d_coord, tp2d_rank, Tp2dGrid,
//          make_tp2d_grid
//
// The tp = q*q ranks of a TP group are laid out row-major: tp_rank = row * q + col, so a row
// is q adjacent TP ranks. Rank (row, col) holds block (row, col) of every 2D-sharded matrix.
// Worked example, tp = 4 (q = 2), TP group [8, 9, 10, 11]:
//     (0,0)=8  (0,1)=9          row communicators    [8, 9]  [10, 11]   (rank in it = col)
//     (1,0)=10 (1,1)=11         column communicators [8, 10] [9, 11]    (rank in it = row)
#pragma once

#include "trident/parallel/comm.hpp"

namespace trident::parallel {

// q when tp == q*q for an integer q >= 1, else 0.
int tp2d_side(int tp);

struct Tp2dCoord {
  int row = 0;
  int col = 0;
};
Tp2dCoord tp2d_coord(int tp_rank, int q);
int tp2d_rank(const Tp2dCoord& c, int q);

// One rank's place in the q x q grid and the two communicators SUMMA broadcasts and reduces
// along: `row` joins the q ranks of this rank's grid row (row.rank() == coord.col), `col` the
// q ranks of its grid column (col.rank() == coord.row). Each counts its own bytes
// (comm/tp_row, comm/tp_col).
struct Tp2dGrid {
  int q = 1;
  Tp2dCoord coord;
  Comm row, col;
};

// Splits `tp` (size q*q, else an Error) into the row and column communicators; collective
// over `tp`.
Tp2dGrid make_tp2d_grid(const Comm& tp);

}  // namespace trident::parallel
