// trident/io/trace.hpp — one rank's trace as a Chrome trace JSON file (the "JSON Object
// Format" that chrome://tracing and https://ui.perfetto.dev open): every event a complete
// event ("ph": "X") on thread 0 of process <pid>, its mb/chunk (and for waits the peer and
// what was awaited) in "args"; a process_name metadata event; and "otherData" with
// whatever the caller adds (the schedule, the run-time peak stash, ...).
// defines: trident::io::write_chrome_trace
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trident/core/trace.hpp"

namespace trident::io {

// Writes `path` (creating its folder), atomically (a temporary name, then rename). `other`
// holds (key, JSON value text) pairs. Throws Error naming the path when it cannot.
void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events, int pid,
                        const std::string& process_name,
                        const std::vector<std::pair<std::string, std::string>>& other);

}  // namespace trident::io
