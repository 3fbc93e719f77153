// trident/pipeline/lower.hpp — a Schedule lowered to what each pipeline rank does, in order:
// its compute actions with the communication written in (PyTorch pipelining's
// _add_send_recv). Every message a compute action produces becomes a send right after it,
// and the sender inserts the matching receive into its peer's list: posted one compute
// action ahead of the action that consumes it (before the action before it), so that the
// transfer overlaps that compute; the consumer waits for it when it starts. The simulator
// (simulator.hpp) and the executor (executor.hpp) both walk these lists; the peers, tags
// and the virtual-stage wrap-around are worked out here only.
//
// With V = pp * vpp virtual stages (virtual_stage in schedule.hpp): F on virtual stage v < V-1
// sends its activations to v + 1, B on v > 0 sends its input gradient to v - 1; the link
// from the last rank wraps to the first between chunks. An activation of microbatch mb
// entering virtual stage v carries tag 2 * (mb * V + v), the gradient leaving v + 1 for v
// carries 2 * (mb * V + v) + 1, so every (microbatch, chunk, direction) has its own tag on
// every link: receives may be posted in any order.
// defines: trident::pipeline::OpKind, Payload, Op, LoweredSchedule, lower, message_tag,
//          format_lowered, kReceiveLead
#pragma once

#include <string>
#include <vector>

#include "trident/pipeline/schedule.hpp"

namespace trident::pipeline {

enum class OpKind {
  compute,  // run `action` (F, B or W); first waits for its receive, if it has one
  send,     // send what `action` (just computed) produced to `peer`
  recv,     // post the receive `action` will consume (it waits for it when it starts)
};

enum class Payload {
  activation,  // F's output, to the next virtual stage
  gradient,    // B's input gradient, to the previous virtual stage
};

struct Op {
  OpKind kind;
  Action action;  // compute: the action; send: the producer; recv: the consumer
  Payload payload = Payload::activation;  // send, recv
  int peer = -1;                          // send, recv: the pp rank at the other end
  int tag = 0;                            // send, recv
  int index = -1;  // compute: the action's index in its rank's Schedule list
  // "F3.1", "send F3.1 act>2", "recv F3.1 act<0" (golden files: format_lowered)
  std::string str() const;
};

struct LoweredSchedule {
  Schedule schedule;                   // what was lowered
  std::vector<std::vector<Op>> ranks;  // [pp rank] -> ops in order
};

// How many compute actions ahead of its consumer a receive is posted (1: before the
// compute action before the consumer). At most kReceiveLead + 1 receives are in flight.
constexpr int kReceiveLead = 1;

int message_tag(const Schedule& s, int mb, int receiver_vstage, Payload payload);

// Every compute action of `s` in its rank's order, with its sends after it and its receive
// posted kReceiveLead compute actions ahead. Does not validate `s` (simulate does).
LoweredSchedule lower(const Schedule& s);

// One line per rank: "stage 1: recv F0 act<0 | F0 | send F0 act>2 | ...".
std::string format_lowered(const LoweredSchedule& l);

}  // namespace trident::pipeline
