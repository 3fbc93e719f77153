// trident/pipeline/stage_memory.hpp — what a schedule makes one pipeline rank hold, for the
// memory prediction (model::MemoryLayout): `trident train`'s start-up report and `trident
// plan` both fill the layout here, so that they agree.
//
// Message buffers: how many boundary-message buffers the executor holds at its peak
// (Executor::take_buffer: one buffer of boundary_numel floats per message in flight).
// Receives: exact, from the lowered list (each is posted kReceiveLead compute actions ahead
// and freed when its consumer starts). Sends: each holds its buffer until its receiver has
// posted the receive and the sender has reaped it after one of its own compute actions; that
// depends on timing, so it is counted on the simulator's timeline (uniform costs): a model,
// which the executor's own count can differ from by a buffer or two.
// defines: trident::pipeline::MessageBuffers, peak_message_buffers, RankScheduleMemory,
//          schedule_memory, set_schedule_memory
#pragma once

#include <vector>

#include "trident/model/memory.hpp"
#include "trident/pipeline/schedule.hpp"

namespace trident::pipeline {

struct MessageBuffers {
  int sends = 0, receives = 0;
  int total() const { return sends + receives; }
};

// Every pipeline rank's peak, from one simulation of the schedule (none at pp 1). Throws
// Error where simulate() does (an invalid schedule).
std::vector<MessageBuffers> peak_message_buffers(const Schedule& s);

// What schedule `s` decides for one pipeline rank's memory: its activation stash
// (peak_activations), the zero-bubble gradient stash (splits_weight_grad), its weight
// versions (weight_versions), its message buffers and the head chunk's output gradients
// that wait in rows of their own (peak_head_gradients).
struct RankScheduleMemory {
  int peak_stash = 1;
  bool split_backward = false;
  int weight_versions = 1;
  int message_buffers = 0;
  int head_gradients = 0;
};
// Every pipeline rank's (index: pipeline rank), from one simulation.
std::vector<RankScheduleMemory> schedule_memory(const Schedule& s);

// Sets `rank`'s figures and the schedule's placement in `layout`.
void set_schedule_memory(model::MemoryLayout& layout, const Schedule& s,
                         const RankScheduleMemory& rank);
// The same for pipeline rank `rank` (one simulation: for one rank only).
void set_schedule_memory(model::MemoryLayout& layout, const Schedule& s, int rank);

}  // namespace trident::pipeline
