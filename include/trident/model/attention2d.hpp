// trident/model/attention2d.hpp — the attention core on 2D-sharded activations, without
// communication (Colossal-AI's 2D attention: batch split by grid row, heads by grid column).
// defines: trident::model::qkv2d_global_column, attention2d_shape
//
// After the SUMMA product qkv = X W_qkv, rank (r, c) holds rows block r of the tokens and
// columns block c (3C/q columns) of qkv. Two layout rules make those whole heads of whole
// sequences, so the flash attention kernel runs on each rank's block alone:
//   rows:    the B*T token rows are batch-major, so rows block r is sequences
//            [r*B/q, (r+1)*B/q) when q divides the micro-batch B;
//   columns: W_qkv's columns are stored so that column block c is [q | k | v] of heads
//            [c*NH/q, (c+1)*NH/q) (the per-head interleave 1D TP's Split::qkv uses), with
//            NH divisible by q.
// The attention output block [B/q*T, C/q] is then block (r, c) of the serial output (head h
// at columns h*hs), the layout SUMMA's c_proj takes.
#pragma once

#include <cstdint>

#include "trident/ops/ops.hpp"

namespace trident::model {

// The column of the serial qkv [.., 3C] (q, then k, then v; head h at h*hs inside each) that
// column `col` of the 2D order holds (col in [0, 3C)).
std::int64_t qkv2d_global_column(std::int64_t col, int c, int q);

// The local attention's shape on one rank: b/q sequences, n_head/q heads of c/n_head, q, k
// and v inside the rank's [.., 3C/q] qkv block (k at C/q, v at 2C/q), output [.., C/q]. An
// Error unless q divides b and n_head.
ops::Ops::AttentionShape attention2d_shape(int b, int t, int c, int n_head, int q);

}  // namespace trident::model
