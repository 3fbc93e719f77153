// Fault injection for the tests (see trident/core/fault.hpp).
#include "trident/core/fault.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"

namespace trident::fault {

namespace {

std::int64_t g_step = 0;

Kind parse_kind(const std::string& s, const std::string& whole) {
  if (s == "exit") return Kind::exit;
  if (s == "abort") return Kind::abort;
  if (s == "stall") return Kind::stall;
  if (s == "nan") return Kind::nan;
  if (s == "kill-in-checkpoint") return Kind::kill_in_checkpoint;
  if (s == "slow") return Kind::slow;
  if (s == "no-room-check") return Kind::no_room_check;
  if (s == "pause-in-checkpoint") return Kind::pause_in_checkpoint;
  if (s == "disk-full-in-metrics") return Kind::disk_full_in_metrics;
  fail("TRIDENT_FAULT = '", whole, "': unknown kind '", s,
       "' (expected exit, abort, stall, nan, kill-in-checkpoint, slow, no-room-check, "
       "pause-in-checkpoint or disk-full-in-metrics)");
}

bool is_count(const std::string& s, std::size_t max_digits) {
  return !s.empty() && s.size() <= max_digits &&
         s.find_first_not_of("0123456789") == std::string::npos;
}

const std::vector<Fault>& faults() {
  static const std::vector<Fault> all = [] {
    const char* env = std::getenv("TRIDENT_FAULT");
    return parse(env ? env : "");
  }();
  return all;
}

}  // namespace

std::vector<Fault> parse(const std::string& whole) {
  std::vector<Fault> out;
  if (whole.empty()) return out;
  std::stringstream items(whole);
  std::string item;
  while (std::getline(items, item, ',')) {
    std::stringstream fields(item);
    std::string kind, rank, step;
    std::getline(fields, kind, ':');
    std::getline(fields, rank, ':');
    std::getline(fields, step);
    TRIDENT_CHECK(std::count(item.begin(), item.end(), ':') == 2 && is_count(rank, 9) &&
                      is_count(step, 18),
                  "TRIDENT_FAULT = '", whole, "': expected <kind>:<rank>:<step>[,...] with ",
                  "non-negative integers rank and step");
    out.push_back(Fault{parse_kind(kind, whole), std::stoi(rank), std::stoll(step)});
  }
  TRIDENT_CHECK(!out.empty() && whole.back() != ',', "TRIDENT_FAULT = '", whole,
                "': expected <kind>:<rank>:<step>[,...]");
  return out;
}

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
  for (const Fault& f : faults())
    if (f.kind == Kind::slow && f.rank == log::rank()) std::this_thread::sleep_for(std::chrono::milliseconds(f.step));
}

void at_checkpoint_write() {
  if (armed(Kind::pause_in_checkpoint)) {
    // One line a test waits for, then time for its signals to land mid-write.
    log::warn("TRIDENT_FAULT: pausing in the checkpoint of step ", g_step);
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  if (!armed(Kind::kill_in_checkpoint)) return;
  log::warn("TRIDENT_FAULT: SIGKILL in the middle of the checkpoint of step ", g_step);
  std::raise(SIGKILL);
}

}  // namespace trident::fault
