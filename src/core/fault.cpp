// Fault injection for the tests (see trident/core/fault.hpp).
#include "trident/core/fault.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"

namespace trident::fault {

namespace {

struct Fault {
  Kind kind;
  int rank;
  std::int64_t step;
};

std::int64_t g_step = 0;

Kind parse_kind(const std::string& s, const std::string& whole) {
  if (s == "exit") return Kind::exit;
  if (s == "abort") return Kind::abort;
  if (s == "stall") return Kind::stall;
  if (s == "nan") return Kind::nan;
  if (s == "kill-in-checkpoint") return Kind::kill_in_checkpoint;
  fail("TRIDENT_FAULT = '", whole, "': unknown kind '", s,
       "' (expected exit, abort, stall, nan or kill-in-checkpoint)");
}

std::vector<Fault> parse(const char* env) {
  std::vector<Fault> out;
  if (!env || !*env) return out;
  const std::string whole(env);
  std::stringstream items(whole);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto a = item.find(':'), b = item.rfind(':');
    TRIDENT_CHECK(a != std::string::npos && b != a, "TRIDENT_FAULT = '", whole,
                  "': expected <kind>:<rank>:<step>[,...]");
    Fault f{parse_kind(item.substr(0, a), whole), 0, 0};
    try {
      f.rank = std::stoi(item.substr(a + 1, b - a - 1));
      f.step = std::stoll(item.substr(b + 1));
    } catch (const std::exception&) {
      fail("TRIDENT_FAULT = '", whole, "': rank and step must be integers");
    }
    out.push_back(f);
  }
  return out;
}

const std::vector<Fault>& faults() {
  static const std::vector<Fault> all = parse(std::getenv("TRIDENT_FAULT"));
  return all;
}

}  // namespace

void validate() { faults(); }

void set_step(std::int64_t step) { g_step = step; }
std::int64_t current_step() { return g_step; }

bool armed(Kind kind) {
  for (const Fault& f : faults())
    if (f.kind == kind && f.rank == log::rank() && f.step == g_step) return true;
  return false;
}

void at_step_start() {
  if (armed(Kind::exit)) {
    log::warn("TRIDENT_FAULT: exiting at step ", g_step);
    std::_Exit(3);
  }
  if (armed(Kind::abort)) {
    log::warn("TRIDENT_FAULT: aborting at step ", g_step);
    std::abort();
  }
  if (armed(Kind::stall)) {
    log::warn("TRIDENT_FAULT: stalling at step ", g_step);
    for (int i = 0; i < 3600; ++i) sleep(1);
  }
}

void at_checkpoint_write() {
  if (!armed(Kind::kill_in_checkpoint)) return;
  log::warn("TRIDENT_FAULT: SIGKILL in the middle of the checkpoint of step ", g_step);
  std::raise(SIGKILL);
}

}  // namespace trident::fault
