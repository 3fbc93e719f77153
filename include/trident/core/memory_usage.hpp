// trident/core/memory_usage.hpp — this process's resident memory, as the kernel counts it
// (/proc/self/status; getrusage's ru_maxrss where that file is missing).
// defines: trident::resident_bytes, peak_resident_bytes, reset_peak_resident,
//          available_memory_bytes, format_bytes
#pragma once

#include <cstdint>
#include <string>

namespace trident {

std::int64_t resident_bytes();       // VmRSS now
std::int64_t peak_resident_bytes();  // VmHWM: the high-water mark since the process started
// Lowers the high-water mark to VmRSS now (/proc/self/clear_refs, Linux >= 4.0), so that
// peak_resident_bytes() measures from here; false where the kernel refuses.
bool reset_peak_resident();
// What this node's processes may still allocate: MemAvailable (/proc/meminfo), lowered to
// the cgroup's limit less its usage (v2 memory.max, v1 memory.limit_in_bytes) where there
// is one, as under Slurm's --mem; -1 where none of them can be read.
std::int64_t available_memory_bytes();

// "812.0 MiB": a unit per size (KiB, MiB, GiB), so that a tiny model's report does not
// read "0.0 MiB".
std::string format_bytes(std::int64_t bytes);

}  // namespace trident
