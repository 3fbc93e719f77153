// trident/io/grad.hpp — the files of `trident grad` (FORMAT.md): the batch it reads
// (/inputs, /targets: int32 [batch, seq_len]) and the gradient dump it writes (the model's
// tensors under /grad, root attribute loss (float64) and the model attributes; we add
// format = "trident-grad", format_version = 1).
// defines: trident::io::Batch, read_batch, write_batch, write_grad_dump, read_grad_dump
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trident/io/shard_role.hpp"
#include "trident/model/spec.hpp"

namespace trident::io {

// B = batch, T = seq_len
struct Batch {
  int batch = 0;
  int seq_len = 0;
  std::vector<std::int32_t> inputs;   // (B, T) row-major
  std::vector<std::int32_t> targets;  // (B, T)
};

// Reads a batch file (serial; every rank may read it). Checks /inputs and /targets exist,
// are 2-D integer datasets of the same non-empty shape, and, when vocab_size > 0, that
// every id is in [0, vocab_size).
Batch read_batch(const std::string& path, int vocab_size = 0);
void write_batch(const std::string& path, const Batch& batch);

// Writes the gradient dump atomically, collectively over comm (see write_weights).
void write_grad_dump(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                     const std::vector<model::ShardSpec>& specs, const float* grads, double loss,
                     const ShardRole& role = {});
// Reads it back (tests, tools): this rank's shards into `grads`; returns the loss.
double read_grad_dump(const std::string& path, MPI_Comm comm, const model::ModelConfig& cfg,
                      const std::vector<model::ShardSpec>& specs, float* grads,
                      const ShardRole& role = {});

}  // namespace trident::io
