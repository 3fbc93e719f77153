// trident/core/trace.hpp — timed events of one rank (what the pipeline executor did and
// where it waited), kept in memory and written as a Chrome trace by io/trace.hpp.
// defines: trident::TraceEvent, trace_now_us
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace trident {

// One complete event ("ph": "X"): a pipeline action's compute, or an MPI wait.
struct TraceEvent {
  std::string name;   // "F3.1" for an action; "wait F3.1" for a wait inside it
  std::string cat;    // "F", "B", "W" (actions) or "wait"
  double ts_us = 0;   // start, microseconds of the steady clock (one time base per machine)
  double dur_us = 0;
  int mb = -1, chunk = -1;
  int peer = -1;      // pp rank waited on (waits), -1 if none
  std::string what;   // waits: what was awaited ("activation", "gradient", "send")
};

// Microseconds of std::chrono::steady_clock (CLOCK_MONOTONIC: shared by the processes of
// one machine, so the ranks' traces line up).
inline double trace_now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace trident
