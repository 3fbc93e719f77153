#include "trident/core/memory_usage.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

namespace trident {

namespace {
// The "<key>:   123 kB" line of /proc/self/status in bytes, or -1.
std::int64_t status_kb(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  std::int64_t kb = -1;
  const std::size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      long long v = 0;
      if (std::sscanf(line + n + 1, "%lld", &v) == 1) kb = v;
      break;
    }
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}
// The first integer of a file ("max" and unreadable files: -1).
std::int64_t file_integer(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}
}  // namespace

std::int64_t available_memory_bytes() {
  std::int64_t avail = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = 0;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
        avail = std::int64_t(kb) * 1024;
        break;
      }
    std::fclose(f);
  }
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_file, usage_file] : cgroups) {
    const std::int64_t limit = file_integer(limit_file), usage = file_integer(usage_file);
    // v1 reports "no limit" as a huge number: anything past 2^60 is none.
    if (limit <= 0 || usage < 0 || limit > (std::int64_t(1) << 60)) continue;
    const std::int64_t left = std::max<std::int64_t>(0, limit - usage);
    avail = avail < 0 ? left : std::min(avail, left);
  }
  return avail;
}

std::int64_t resident_bytes() {
  const std::int64_t b = status_kb("VmRSS");
  return b < 0 ? 0 : b;
}

std::int64_t peak_resident_bytes() {
  const std::int64_t b = status_kb("VmHWM");
  if (b >= 0) return b;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return std::int64_t(u.ru_maxrss) * 1024;  // kilobytes on Linux
}

bool reset_peak_resident() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

std::string format_bytes(std::int64_t bytes) {
  const double b = double(bytes);
  char s[32];
  if (b >= 1024.0 * 1048576.0)
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1024.0 * 1048576.0));
  else if (b >= 1048576.0)
    std::snprintf(s, sizeof s, "%.1f MiB", b / 1048576.0);
  else
    std::snprintf(s, sizeof s, "%.1f KiB", b / 1024.0);
  return s;
}

}  // namespace trident
