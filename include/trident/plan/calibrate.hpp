// trident/plan/calibrate.hpp — measuring a machine file (plan/machine.hpp) on the machine
// itself, every rank working at once as in training (ranks sharing cores share them here
// too): the matrix products of the model's linears at its shapes (every tp and micro-batch
// size given), the attention core, the memory-bound kernels, and allreduce times at a small
// and a large size inside a node and between nodes, fitted to alpha + bytes/beta of a ring.
// Collective over MPI_COMM_WORLD.
// defines: trident::plan::CalibrateOptions, calibrate, linear_shapes
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "trident/model/spec.hpp"
#include "trident/ops/ops.hpp"
#include "trident/plan/machine.hpp"

namespace trident::plan {

struct CalibrateOptions {
  model::ModelConfig model;       // the shapes to measure (vocab_size > 0)
  std::vector<int> tps{1};        // tensor-parallel degrees
  std::vector<int> micro_batches{1};
  // Context-parallel sizes: the products are also measured at micro_batch * seq_len / cp
  // rows (the rows a cp rank's linears take; plan/cost.cpp).
  std::vector<int> cps{1};
  double min_seconds = 0.02;      // each measurement repeats until it has run this long
  // Each figure from its fastest of several rounds (the machine undisturbed) instead of their
  // mean (the machine as a long step sees it on a shared machine, preemptions included).
  bool best = false;
  // Time in this process's CPU seconds, not wall seconds (one rank, CPU backend): on a machine
  // shared with other work, what the rank's own steps cost, whatever else runs.
  bool cpu_time = false;
};

// The (m, n, k) of every product of the model's linears for one tp, micro-batch size and
// cp: forward (n, out, in), input gradient (n, in, out), weight gradient (in, out, n) with
// n = micro_batch * seq_len / cp rows, for q|k|v, the attention and MLP projections and the
// LM head (plan/cost.cpp uses the same shapes).
std::vector<std::array<std::int64_t, 3>> linear_shapes(const model::ModelConfig& cfg, int tp,
                                                       int micro_batch, int cp = 1);

// Measures this machine with `ops` on every rank; returns the same Machine on every rank.
Machine calibrate(const CalibrateOptions& opt, ops::Ops& ops);

}  // namespace trident::plan
