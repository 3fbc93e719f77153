// trident/pipeline/simulator.hpp — runs a Schedule on paper: every stage executes its
// actions strictly in order, each as soon as its data dependencies are met. With v the
// virtual stage of (rank, chunk) (virtual_stage in schedule.hpp):
//   F(mb, v) after F(mb, v-1);  B(mb, v) after F(mb, v) and B(mb, v+1);  W(mb, v) after
//   B(mb, v).
// It runs the schedule's lowered lists (lower.hpp), as the executor does: a compute action
// waits for its receive, whose message leaves when its sender's send op runs (buffered
// sends, blocking receives). It validates the schedule and measures it. Validation, in this
// order:
//   - shape: one list per pp rank, actions in range;
//   - each F, B (and W, when the schedule has any) exactly once per (mb, chunk) per rank;
//   - on each rank, F before B before W of the same (mb, chunk);
//   - no deadlock when sends are non-blocking (buffered) and receives block;
//   - MPI matching order: on each link (rank -> rank', activations or gradients) the
//     messages are sent in the order the receiver consumes them, so an executor can post
//     its receives in list order with one tag per link and direction.
// Each failure is an Error naming the stage (pp rank) and the action.
// defines: trident::pipeline::Costs, Simulation, simulate, format_timeline
#pragma once

#include <string>
#include <vector>

#include "trident/pipeline/schedule.hpp"

namespace trident::pipeline {

// Time slots per action on one chunk. For vpp > 1 a chunk holds 1/vpp of a rank's layers,
// so these are per-chunk times: Megatron's interleaved bubble (p-1)/(v*m+p-1) is in these
// units (a whole stage's forward then costs vpp * f).
struct Costs {
  int f = 1;
  int b = 2;  // a B that computes input and weight gradients together
  int b_split = 1, w = 1;  // when the schedule splits B and W
  int comm = 0;  // added to a dependency on an action of another rank (p2p latency)
  // Per virtual stage (pp * vpp entries, or empty: all 1): each compute action of that
  // stage costs its slots above times this weight, rounded, at least 1 slot. Uneven stages
  // (parallel.pipeline_layers, or the LM head on the last one) make the bubble uneven too.
  std::vector<double> stage_weight;
  // Per virtual stage (pp * vpp entries, or empty): that stage's own slots per action, in
  // place of f, b, b_split, w and stage_weight. The planner's per-stage chunk costs: the
  // LM head runs its backward inside its forward, so a stage's F and B do not scale alike.
  struct Slots {
    int f = 1, b = 2, b_split = 1, w = 1;
  };
  std::vector<Slots> stage_slots;
};

struct Simulation {
  int makespan = 0;
  double bubble_fraction = 0;  // idle time / (stages * makespan)
  std::vector<int> peak_activations;                // per stage, as peak_activations()
  std::vector<std::vector<int>> start;              // [stage][action index] -> start slot
  std::vector<double> idle_fraction;                // per stage: idle time / makespan
  // Asynchronous schedules (WeightUpdate other than flush): not equivalent to the serial
  // run. weight_versions: per stage, the weight copies it holds at its peak (the live one
  // included; weight_versions() in schedule.hpp), 1 under a flush.
  bool asynchronous = false;
  std::vector<int> weight_versions;
};

// Throws Error naming the stage and the action when the schedule is invalid or deadlocks.
Simulation simulate(const Schedule& s, const Costs& costs = {});

// One row per stage, one column per time slot, cells "F3"/"B3"/"W3" ("F3.1" for chunk 1),
// blank when idle; a header row numbers the slots.
std::string format_timeline(const Schedule& s, const Simulation& sim, const Costs& costs = {});

}  // namespace trident::pipeline
