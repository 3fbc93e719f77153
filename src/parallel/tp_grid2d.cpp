// The q x q grid of 2D tensor parallelism (see trident/parallel/tp_grid2d.hpp).
#include "trident/parallel/tp_grid2d.hpp"

#include "trident/core/error.hpp"

namespace trident::parallel {

int tp2d_side(int tp) {
  if (tp < 1) return 0;
  int q = 1;
  while ((q + 1) * (q + 1) <= tp) ++q;
  return q * q == tp ? q : 0;
}

Tp2dCoord tp2d_coord(int tp_rank, int q) {
  TRIDENT_CHECK(q >= 1 && tp_rank >= 0 && tp_rank < q * q, "TP rank ", tp_rank,
                " outside a ", q, " x ", q, " grid");
  return Tp2dCoord{tp_rank / q, tp_rank % q};
}

int tp2d_rank(const Tp2dCoord& c, int q) { return c.row * q + c.col; }

Tp2dGrid make_tp2d_grid(const Comm& tp) {
  const int q = tp2d_side(tp.size());
  TRIDENT_CHECK(q > 0, "2D tensor parallelism needs a square TP group, got ", tp.size(),
                " ranks");
  Tp2dGrid g;
  g.q = q;
  g.coord = tp2d_coord(tp.rank(), q);
  // color = the fixed index, key = the position along the line.
  g.row = tp.split(g.coord.row, g.coord.col, "tp_row");
  g.col = tp.split(g.coord.col, g.coord.row, "tp_col");
  return g;
}

}  // namespace trident::parallel
