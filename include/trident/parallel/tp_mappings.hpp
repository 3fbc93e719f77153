// trident/parallel/tp_mappings.hpp — the four conjugate operators that are the whole
// vocabulary of tensor-parallel communication (Megatron-LM's mappings), each a forward
// and the backward that is its adjoint:
//
//   operator                    forward          backward         where
//   copy   (no SP)              identity         allreduce        into a column-parallel layer
//   reduce (no SP)              allreduce        identity         out of a row-parallel layer
//   gather (SP)                 all-gather       reduce-scatter   into a column-parallel layer
//   reduce-scatter (SP)         reduce-scatter   all-gather       out of a row-parallel layer
//
// TpMappings picks the pair from parallel.sequence_parallel, so a layer is written once:
// `enter` before a column-parallel linear, `leave` after a row-parallel one. Without SP the
// residual stream between layers is replicated on every TP rank ("local" = "full"); with
// SP each rank holds the rows [r*n, (r+1)*n) of the full [tp*n] rows (Korthikanti et al.
// 2022). All counts below are elements of one rank's local rows (n).
// defines: trident::parallel::TpMappings
#pragma once

#include <cstdint>

#include "trident/parallel/comm.hpp"

namespace trident::parallel {

class TpMappings {
 public:
  TpMappings(Comm& tp, bool sequence_parallel);

  bool sequence_parallel() const { return sp_; }
  // Local rows of `rows` full rows (rows / tp under SP, else rows).
  std::int64_t local_rows(std::int64_t rows) const;
  // This rank's local part inside a full buffer (the buffer itself without SP).
  float* local_part(float* full, std::int64_t local_n) const;

  // Into a column-parallel layer. Forward: full (every rank's rows) from each rank's
  // local rows, which are already in place at local_part(full). Backward: the gradient of
  // the local rows from every rank's partial gradient of the full rows; returns where it
  // is (dfull itself without SP — reduced in place — else dlocal).
  void enter_forward(float* full, std::int64_t local_n);
  const float* enter_backward(float* dfull, float* dlocal, std::int64_t local_n);

  // Out of a row-parallel layer. Forward: the local rows of the sum of every rank's
  // partial output (without SP, partial and local are the same buffer, reduced in place).
  // Backward: the gradient of the full rows from each rank's local gradient; returns
  // where it is (dlocal itself without SP, else dfull).
  void leave_forward(float* partial, float* local, std::int64_t local_n);
  const float* leave_backward(const float* dlocal, float* dfull, std::int64_t local_n);

 private:
  Comm& tp_;
  bool sp_;
};

}  // namespace trident::parallel
