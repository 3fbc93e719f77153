// trident/core/fault.hpp — fault injection for the tests (issue 9): the environment
// variable TRIDENT_FAULT makes one world rank fail at one optimizer step, so that tests
// can check that a job ends, that nothing written is lost and that a resume continues the
// curve. Unset (the normal case) it costs one getenv at start-up.
//
//   TRIDENT_FAULT=<kind>:<rank>:<step>[,<kind>:<rank>:<step>...]
//     exit        the rank calls _exit(3) at the start of the step (a crashed process)
//     abort       the rank calls abort() at the start of the step (SIGABRT, a core dump)
//     stall       the rank sleeps for an hour at the start of the step (a hung node)
//     nan         the rank's gradients become NaN after the step's backward
//     kill-in-checkpoint
//                 the rank sends itself SIGKILL in the middle of writing the checkpoint of
//                 the step (after the .tmp file holds the model, before the moments)
//     slow        the rank sleeps <step> milliseconds at the start of EVERY step (the third
//                 field is a duration here): a slow node, and a run whose length does not
//                 depend on the machine's load (tests that race a scheduler's timer)
//     no-room-check
//                 the rank skips the free-space checks before its writes at that step (the
//                 sample index at step 0, metrics rows, checkpoints), so that a full disk
//                 meets the write itself (the error paths behind those checks)
//     pause-in-checkpoint
//                 the rank prints `TRIDENT_FAULT: pausing in the checkpoint of step S` and
//                 sleeps 3 s in the middle of writing that step's checkpoint (where
//                 kill-in-checkpoint strikes), so that a test can signal it mid-write
//     disk-full-in-metrics
//                 the metrics row of the step meets a full disk after its room check: the
//                 reservation of the bytes its flush will write fails with ENOSPC, as when
//                 another process fills the file system in between (io/metrics.cpp)
//
// defines: trident::fault::Kind, Fault, parse, validate, armed, at_step_start, at_checkpoint_write,
//          set_step, current_step
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident::fault {

enum class Kind {
  exit,
  abort,
  stall,
  nan,
  kill_in_checkpoint,
  slow,
  no_room_check,
  pause_in_checkpoint,
  disk_full_in_metrics,
};

struct Fault {
  Kind kind;
  int rank;           // world rank
  std::int64_t step;  // optimizer step
};

// The faults a TRIDENT_FAULT value names (empty: none). A trident::Error quoting the value
// when it is malformed: every item must be <kind>:<rank>:<step>, rank and step non-negative
// decimal integers.
std::vector<Fault> parse(const std::string& text);

// Parses TRIDENT_FAULT (at start-up, so that a malformed one is an agreed error): a
// trident::Error naming the variable when it is malformed.
void validate();

// The optimizer step now running (set by the step loop; 0 outside it).
void set_step(std::int64_t step);
std::int64_t current_step();

// Whether TRIDENT_FAULT asks for `kind` on this rank (log::rank()) at the current step.
// A malformed TRIDENT_FAULT is a trident::Error naming the variable.
bool armed(Kind kind);

// The step loop calls this first in every step: exit, abort or stall when armed; slow.
void at_step_start();

// Raises SIGKILL on this process when kill-in-checkpoint is armed, pauses 3 s when
// pause-in-checkpoint is (io calls it mid-write).
void at_checkpoint_write();

}  // namespace trident::fault
