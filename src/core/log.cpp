// Rank-aware logging (see trident/core/log.hpp).
#include "trident/core/log.hpp"

namespace trident::log {
namespace {
int g_rank = 0;
}

void set_rank(int r) { g_rank = r; }
int rank() { return g_rank; }

void info_line(const std::string& line) {
  if (g_rank != 0) return;
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void warn_line(const std::string& line) {
  if (g_rank == 0)
    std::fprintf(stderr, "trident: warning: %s\n", line.c_str());
  else
    std::fprintf(stderr, "trident: warning: [rank %d] %s\n", g_rank, line.c_str());
  std::fflush(stderr);
}

}  // namespace trident::log
