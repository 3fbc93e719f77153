// A graceful stop on SIGUSR1 or SIGTERM (see trident/train/signals.hpp).
#include "trident/train/signals.hpp"

#include <csignal>
#include <cstring>

namespace trident::train {

namespace {

volatile std::sig_atomic_t g_signal = 0;

// Async-signal-safe: stores the signal number and nothing else.
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

struct sigaction g_old_usr1, g_old_term;

void install(int sig, struct sigaction* old) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // MPI, HDF5 and file I/O go on undisturbed
  sigaction(sig, &sa, old);
}

}  // namespace

void StopSignals::catch_early() {
  install(SIGUSR1, nullptr);
  install(SIGTERM, nullptr);
}

StopSignals::StopSignals() {
  install(SIGUSR1, &g_old_usr1);
  install(SIGTERM, &g_old_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopSignals::pending() { return int(g_signal); }

int StopSignals::agree(parallel::Comm& comm) const {
  int any = pending();
  comm.allreduce_max(&any, 1);
  return any;
}

const char* StopSignals::name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal";
}

}  // namespace trident::train
