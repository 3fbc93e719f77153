#include "trident/core/memory_usage.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <cstring>

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
}  // namespace

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

}  // namespace trident
