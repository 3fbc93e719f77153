// trident/model/embedding2d.hpp — GPT's token and position embeddings and the tied LM head on
// the q x q grid of 2D tensor parallelism (parallel.tp_mode = "2d"), forward and backward.
// defines: trident::model::Embedding2dShape, Embedding2dBytes, embedding2d_head_bytes,
//          Embedding2d
//
// Legend: B sequences of T tokens, m = B*T token rows (batch-major), C = d_model, V the
// vocabulary padded up to Vp, a multiple of q (vb = Vp/q, CrossEntropy2d's blocks);
// mb = m/q, cb = C/q. q divides B, so rows block r is whole sequences (positions 0..T-1).
//
// Layout (docs/tp2d.md, "What remains" 1): wte [Vp, C] and wpe [T, C] are split by grid
// COLUMN only: every rank of grid column c holds columns [c*cb, (c+1)*cb) of all their rows,
// wte_c [Vp, cb] and wpe_c [T, cb] (rows >= V of wte are padding, kept 0). So
//   lookup   x_rc = wte_c[tokens of rows block r] + wpe_c[t]       local, no communication;
//   head     logits_rj = sum_c x_rc (wte_c rows block j)^T           rank (r, c) stacks its q
//            partials [q, mb, vb] and one reduce-scatter along row r leaves logits block
//            (r, j) on (r, j): the layout CrossEntropy2d reads;
//   head bwd all-gather dlogits along row r into [q, mb, vb]; dx_rc = sum_j dlogits_rj
//            wte_c[j]; dwte_c[j] += dlogits_rj^T x_rc (partial over the rank's rows);
//   lookup bwd dwte_c[tok] += dx rows, dwpe_c[t] += dx rows (partial over the rank's rows).
// The wte/wpe gradients of the q ranks of a grid column are summed along it by
// reduce_param_grads, once per step (as LayerNorm2d's and SummaLinear's bias gradients).
// Memory per rank: wte Vp*C/q (1/q of serial, not 1/q^2); the head's stack mb*Vp floats.
#pragma once

#include <cstdint>

#include "trident/core/buffer.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace trident::model {

struct Embedding2dShape {
  int batch = 0;    // B sequences (divisible by q)
  int seq = 0;      // T
  int vocab = 0;    // V (unpadded)
  int d_model = 0;  // C (divisible by q)
};

// What the row communicator counts per call (Comm's measure: reduce-scatter and all-gather
// (q-1) * shard bytes; the shard is a logits block, 4*mb*vb bytes): head forward and head
// backward each (q-1)*4*mb*vb. The lookup sends nothing; reduce_param_grads is an allreduce
// of (Vp + T)*cb floats along the column. 0 when q == 1.
struct Embedding2dBytes {
  double head_forward_row = 0;
  double head_backward_row = 0;
};
Embedding2dBytes embedding2d_head_bytes(int q, const Embedding2dShape& shape);

class Embedding2d {
 public:
  // An Error unless q divides batch and d_model.
  Embedding2d(ops::Ops& ops, parallel::Tp2dGrid& grid, const Embedding2dShape& shape);

  int padded_vocab() const { return vp_; }
  int vocab_per_block() const { return vb_; }
  int rows_per_block() const { return mb_; }
  int cols_per_block() const { return cb_; }

  // x[mb, cb] = wte_c[tokens] + wpe_c[t] (overwritten) for this rank's rows block; tokens[mb]
  // are those rows' global ids (the batch's sequences [r*B/q, (r+1)*B/q)). Local.
  void forward(float* x, const std::int32_t* tokens, const float* wte, const float* wpe);
  // dwte[Vp, cb] and dwpe[T, cb] += this rank's rows of dx[mb, cb] (partial). Local.
  void backward(float* dwte, float* dwpe, const float* dx, const std::int32_t* tokens);
  // dwte and dwpe summed over the grid column (one allreduce on `col`).
  void reduce_param_grads(float* dwte, float* dwpe);

  // logits[mb, vb] = block (r, c) of X wte^T from x[mb, cb] (this rank's residual block).
  // Collective over the grid row.
  void head_forward(float* logits, const float* x, const float* wte);
  // dx[mb, cb] = block of dlogits wte (overwritten), dwte[Vp, cb] += this rank's part of
  // dlogits^T X, from dlogits[mb, vb] (this rank's block). Collective over the grid row.
  void head_backward(float* dx, float* dwte, const float* dlogits, const float* x,
                     const float* wte);

 private:
  ops::Ops& ops_;
  parallel::Tp2dGrid& grid_;
  Embedding2dShape shape_;
  int mb_ = 0, cb_ = 0, vp_ = 0, vb_ = 0;
  FloatBuffer stack_;  // [q, mb, vb] the head's partial logits / the gathered dlogits
};

}  // namespace trident::model
