// trident/train/signals.hpp — a graceful stop on SIGUSR1 or SIGTERM: the handler only sets
// a flag; at each step boundary every rank reduces the flags over the world
// (an allreduce MAX), so all ranks stop after the same step, write a checkpoint of it
// and return normally (exit 0). Slurm's `--signal=B:USR1@<s>`, `scancel --signal=USR1`,
// a preempting scheduler's SIGTERM and Open MPI's mpirun (which forwards SIGUSR1 and
// SIGTERM to its ranks) all arrive this way; see jobscripts/.
// defines: trident::train::StopSignals
#pragma once

#include "trident/parallel/comm.hpp"

namespace trident::train {

class StopSignals {
 public:
  // Called first thing in main, before MPI_Init: a stop that arrives while the job is
  // still starting (MPI, the model, the data) is remembered, not fatal, and the run stops
  // after its first step. Without it a scheduler's early signal kills the rank with the
  // default action (exit 138 under Slurm, nothing checkpointed).
  static void catch_early();

  // Installs the handlers for SIGUSR1 and SIGTERM (keeping a request caught since
  // catch_early); the destructor puts back the handlers that were there before.
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received on this rank since the handlers were installed (0: none).
  // Not collective.
  static int pending();
  // Collective over comm: the largest signal number any rank has received (0: none), the
  // same answer on every rank. One allreduce of one int (counted, under the watchdog).
  int agree(parallel::Comm& comm) const;

  static const char* name(int sig);  // "SIGTERM", "SIGUSR1", else "signal"
};

}  // namespace trident::train
