// trident/io/shard_role.hpp — which of a rank's shards it is responsible for in a file
// (kept apart from the HDF5 headers so that train/app can name it cheaply).
// defines: trident::io::ShardRole
#pragma once

#include "trident/model/spec.hpp"

namespace trident::io {

// Which of this rank's shards it is responsible for in a file: across the communicator,
// every logical element must have exactly one responsible rank. A responsible rank writes
// the element and hashes it; every rank READS all of its shards, responsible or not.
//   TP copies of a replicated tensor (LayerNorms, wpe, row-parallel biases): one TP rank
//     (tp_rank 0) has write_replicated = true; under 2D TP a tensor split by grid column only
//     is written by its copy 0 (ShardSpec::tp_copy, grid row 0);
//   DP replicas: only DP replica 0 is active;
//   the tied embedding (wte), held by the first and the last pipeline stage: the last stage
//     (when it is not also the first) has write_tied_embedding = false.
// A rank's spec list may name a tensor twice (pp = 1 with vpp > 1 puts wte in the first
// and the last chunk of one rank): the first occurrence is written, all are read.
struct ShardRole {
  bool active = true;
  bool write_replicated = true;
  bool write_tied_embedding = true;

  // The role of a rank in a TP x PP x DP grid (the embedding lives on pipeline stage 0).
  static ShardRole for_rank(int tp_rank, int dp_rank, int pp_rank) {
    return ShardRole{dp_rank == 0, tp_rank == 0, pp_rank == 0};
  }
  bool responsible_for(const model::ShardSpec& spec) const {
    if (!active) return false;
    if (spec.tied_across_stages() && !write_tied_embedding) return false;
    if (spec.tp_copy != 0) return false;  // another TP rank holds the same shard (copy 0)
    return spec.tp_replicated() ? write_replicated : true;
  }
};

}  // namespace trident::io
