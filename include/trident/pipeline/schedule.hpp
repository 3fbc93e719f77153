// trident/pipeline/schedule.hpp — pipeline schedules as plain data (DESIGN.md, decision 4).
// A generator returns, for each pipeline rank, the ordered Actions it performs in one
// optimizer step; the executor runs them, the same code for every schedule. No MPI and no
// model here, so schedules are testable anywhere.
// defines: trident::pipeline::ActionType, Action, Schedule, make_schedule, schedule_names,
//          peak_activations
#pragma once

#include <string>
#include <vector>

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
};

// The schedule names FORMAT.md accepts.
const std::vector<std::string>& schedule_names();

// Builds `name` for pp ranks, vpp chunks per rank and m microbatches; an Error names the
// schedule and the constraint that fails.
Schedule make_schedule(const std::string& name, int pp, int vpp, int microbatches);

// Most microbatches whose forward activations one stage holds at the same time.
int peak_activations(const std::vector<Action>& actions);

}  // namespace trident::pipeline
