// trident/pipeline/simulator.hpp — runs a Schedule on paper: every stage executes its
// actions in order, each as soon as its data dependencies are met (F of a microbatch
// after the previous stage's F; B after the next stage's B and its own F; W after its B).
// It validates the schedule (each action exactly once, no deadlock) and measures it.
// defines: trident::pipeline::Costs, Simulation, simulate, format_timeline
#pragma once

#include <string>
#include <vector>

#include "trident/pipeline/schedule.hpp"

namespace trident::pipeline {

struct Costs {
  int f = 1;
  int b = 2;  // a B that computes input and weight gradients together
  int b_split = 1, w = 1;  // when the schedule splits B and W
};

struct Simulation {
  int makespan = 0;
  double bubble_fraction = 0;  // idle time / (stages * makespan)
  std::vector<int> peak_activations;                // per stage
  std::vector<std::vector<int>> start;              // [stage][action index] -> start slot
};

// Throws Error with the rank x action grid when the schedule is invalid or deadlocks.
Simulation simulate(const Schedule& s, const Costs& costs = {});

// One row per stage, one column per time slot, cells "F3"/"B3"/"W3" (blank when idle).
std::string format_timeline(const Schedule& s, const Simulation& sim, const Costs& costs = {});

}  // namespace trident::pipeline
