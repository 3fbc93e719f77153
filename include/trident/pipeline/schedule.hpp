// trident/pipeline/schedule.hpp — pipeline schedules as plain data (DESIGN.md, decision 4).
// A generator returns, for each pipeline rank, the ordered Actions it performs in one
// optimizer step; the executor runs them, the same code for every schedule. No MPI and no
// model here, so schedules are testable anywhere.
//
// Chunks and virtual stages: with vpp chunks per rank the model is cut into pp * vpp
// virtual stages, placed on the ranks by the schedule's placement (core/placement.hpp,
// Schedule::stage_map). Every schedule but zb-v uses Megatron's round robin: chunk c on pp
// rank r is virtual stage c * pp + r, so activations go r -> r+1 within a chunk and from
// rank pp-1 to rank 0 between chunks. zb-v places its two chunks in a V: chunk 0 of rank r
// is virtual stage r, chunk 1 is 2 pp - 1 - r (down the ranks, then back up).
//
// The schedules (make_schedule):
//   naive             one microbatch at a time through the whole pipeline: every rank runs
//                     F0 B0 F1 B1 ..., so only one stage works at any moment (bubble (p-1)/p).
//   gpipe             all forwards, then all backwards (Huang et al. 2019).
//   1f1b              PipeDream-Flush: pp-rank-1 warm-up forwards, then one F one B, then
//                     the cool-down backwards.
//   interleaved-1f1b  Megatron's virtual pipeline (Narayanan et al. 2021): 1F1B over the
//                     virtual stages, microbatches taken in groups of pp per chunk; with
//                     vpp > 1 it needs microbatches % pp == 0. vpp = 1 is plain 1f1b.
//   looped-bfs        breadth-first (Lamy-Poirier 2022): chunk 0 forwards of all
//                     microbatches, then chunk 1's, ..., then backwards chunk vpp-1 first.
//   zb-h1             zero bubble H1 (Qi et al. 2023): B computes only the input gradient and
//                     W the weight gradient; 1F1B order, stage r defers its first r W's so
//                     the backwards reach the first stage sooner, and the W's fill the tail.
//   zb-v              zero bubble V (Qi et al. 2024, "Pipeline parallelism with controllable
//                     memory"; PyTorch's ScheduleZBVZeroBubble): vpp = 2 in V placement,
//                     B and W split. Warm-up forwards of chunk 0, then of chunks 1 and 0
//                     alternately, then F-B-W of chunk 1; steady F-B-W of chunk 0 then of
//                     chunk 1; the cool-down B's with the W's filling the tail. Near-zero
//                     bubble at 1F1B's peak activation memory (2 pp chunk activations on
//                     a rank, each half a stage's).
//   pipedream         asynchronous (Narayanan et al. 2019, PipeDream): the 1F1B order, and
//                     each stage updates its weights after every backward (no flush inside
//                     the step); the backward of microbatch k computes with the weight version
//                     its forward used (weight stashing), so stage r holds up to pp - r
//                     versions (WeightUpdate::per_microbatch).
//   pipedream-2bw     asynchronous (Narayanan et al. 2021, PipeDream-2BW): the 1F1B order
//                     within a window of m microbatches, gradients accumulated over the
//                     window and one update per window, but every forward and backward of
//                     window t computes with the weights of window t-1 (double-buffered:
//                     two versions): W(t+1) = W(t) - lr * grad(W(t-1)). Not equivalent to
//                     the serial run (WeightUpdate::delayed).
// defines: trident::pipeline::ActionType, Action, Schedule, ScheduleKind, ScheduleMisfit,
//          schedule_kinds, find_schedule, multi_chunk_schedule_names, join_or,
//          make_schedule, schedule_names,
//          placement_of, splits_weight_grad, peak_activations, head_chunk_of,
//          head_gradient_waits, peak_head_gradients, format_actions, parse_actions,
//          WeightUpdate, weight_update_of, weight_versions
#pragma once

#include <string>
#include <vector>

#include "trident/core/placement.hpp"

namespace trident::pipeline {

enum class ActionType {
  F,  // forward of one microbatch through one chunk
  B,  // backward (input and weight gradients, unless the schedule splits off W)
  W,  // weight gradient only (zero-bubble schedules)
};

struct Action {
  ActionType type;
  int mb;         // microbatch index
  int chunk = 0;  // model chunk on this rank (virtual pipeline stage), 0 when vpp = 1
  std::string str() const;  // "F3", or "F3.1" for chunk 1
  bool operator==(const Action& o) const {
    return type == o.type && mb == o.mb && chunk == o.chunk;
  }
};

struct Schedule {
  std::string name;
  int pp = 1, vpp = 1, microbatches = 1;
  std::vector<std::vector<Action>> stages;  // [pp rank] -> ordered actions
  Placement placement = Placement::round_robin;  // which rank and chunk hold each virtual stage
  StageMap stage_map() const { return {placement, pp, vpp}; }
};

// Why a schedule cannot run a layout (ScheduleKind::misfit).
enum class ScheduleMisfit {
  none,
  chunks,        // vpp > 1, and the schedule places one chunk per rank
  microbatches,  // vpp > 1 takes the microbatches in groups of pp: m % pp != 0
  chunk_count,   // the schedule needs exactly ScheduleKind::fixed_vpp chunks per rank
};

// When the weights change, relative to the gradients computed with them.
enum class WeightUpdate {
  flush,    // synchronous: one update per step after every backward (= the serial run)
  per_microbatch,  // PipeDream: an update after every backward, with weight stashing
  delayed,  // PipeDream-2BW: one update per step with the gradient of the previous
            // version, W(t+1) = W(t) - lr * grad(W(t-1)); two weight versions per stage
};

// The registry of schedules: each with its generator and the layouts it accepts. The deck
// (train/config) and make_schedule both ask it, so each rule lives here only.
struct ScheduleKind {
  const char* name;   // as the deck names it (parallel.schedule)
  bool multi_chunk;   // accepts vpp > 1 chunks per rank
  bool whole_groups;  // with vpp > 1, microbatches in whole groups of pp
  std::vector<Action> (*stage)(int pp, int vpp, int rank, int microbatches);
  WeightUpdate update = WeightUpdate::flush;
  Placement placement = Placement::round_robin;
  int fixed_vpp = 0;  // > 0: the only vpp the schedule accepts (zb-v: 2)
  bool asynchronous() const { return update != WeightUpdate::flush; }
  // m = 0: the microbatches are not known yet (the deck alone); their rule is not checked.
  ScheduleMisfit misfit(int pp, int vpp, int microbatches) const;
};
const std::vector<ScheduleKind>& schedule_kinds();  // FORMAT.md's order
const ScheduleKind* find_schedule(const std::string& name);  // null: unknown
// The schedule names FORMAT.md accepts, and those that accept vpp > 1.
const std::vector<std::string>& schedule_names();
std::vector<std::string> multi_chunk_schedule_names();
// "a, b or c", each word between `quote`s.
std::string join_or(const std::vector<std::string>& words, const char* quote = "");

// Builds `name` for pp ranks, vpp chunks per rank and m microbatches; an Error names the
// schedule and the constraint that fails (ScheduleKind::misfit).
Schedule make_schedule(const std::string& name, int pp, int vpp, int microbatches);
// The same for a registry entry (a deck's parallel.schedule, found when the deck was read).
Schedule make_schedule(const ScheduleKind& kind, int pp, int vpp, int microbatches);

// The placement of schedule `name` (round robin for a name the registry lacks): what the
// model's layer split and the tied-embedding group ask before any Schedule is built.
Placement placement_of(const std::string& name);

// True when the schedule has W actions, i.e. its B computes only the input gradient.
bool splits_weight_grad(const Schedule& s);

// Most (microbatch, chunk) activations one stage holds at the same time. An activation is
// live from its F until the action that last needs it: B, or W when the list has W actions
// (the weight gradient needs the layer inputs, so they stay until W). For vpp > 1 the unit
// is one chunk's activations, 1/vpp of a whole stage's.
int peak_activations(const std::vector<Action>& actions);

// The head chunk's output gradient: its F computes it (the head's backward runs there) and its
// B reads it. Where that B is the next compute action after the F (1F1B's last rank, zb-v's
// first: only messages run between), it waits in the model's shared scratch; else it needs a
// row of its own (boundary_numel floats) from its F until its B (Executor). One rule for the
// executor and the memory prediction (stage_memory.hpp).
// The chunk of pipeline rank `rank` that holds the head (virtual stage pp * vpp - 1), or -1.
int head_chunk_of(const Schedule& s, int rank);
// Whether actions[i], an F of chunk head_chunk, keeps its gradient in a row of its own.
bool head_gradient_waits(const std::vector<Action>& actions, std::size_t i, int head_chunk);
// Most such rows one rank's list holds at once (0 without a head chunk: head_chunk < 0).
int peak_head_gradients(const std::vector<Action>& actions, int head_chunk);

// The update rule of schedule `name` (flush for a name the registry lacks).
WeightUpdate weight_update_of(const std::string& name);

// Weight versions one stage holds at its peak, the live one included: 1 under a flush, 2
// under PipeDream-2BW (the version the window computes with and the one it updates); under
// PipeDream, walking the list: the versions of the microbatches between their F and B, and
// the live one (each B is followed by an update that makes a new live version).
int weight_versions(const std::vector<Action>& actions, WeightUpdate update);

// "F0 F1 B0 B1" and back; parse_actions throws Error on a malformed token.
std::string format_actions(const std::vector<Action>& actions);
std::vector<Action> parse_actions(const std::string& text);

}  // namespace trident::pipeline
