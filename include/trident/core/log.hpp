// trident/core/log.hpp — progress and diagnostics. Rank 0 speaks for the job; the others
// stay quiet unless something is wrong (warnings from any rank carry the rank).
// defines: trident::log::set_rank, info, warn, rank
#pragma once

#include <cstdio>
#include <string>

#include "trident/core/error.hpp"

namespace trident::log {

void set_rank(int rank);  // called once, after MPI_Init
int rank();

void info_line(const std::string& line);  // stdout, rank 0 only, flushed
void warn_line(const std::string& line);  // stderr, any rank: "trident: warning: ..."

template <typename... Args>
void info(Args&&... args) { info_line(str(std::forward<Args>(args)...)); }
template <typename... Args>
void warn(Args&&... args) { warn_line(str(std::forward<Args>(args)...)); }

}  // namespace trident::log
