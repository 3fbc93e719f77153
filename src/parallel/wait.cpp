// Waits under the watchdog (see trident/parallel/wait.hpp).
#include "trident/parallel/wait.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

namespace trident::parallel {

namespace {
double g_limit_s = 0;

// Polls until `done` says so or the limit passes; then prints and aborts. The first
// millisecond spins (a message in flight usually lands within it), then it sleeps 50 us
// between tests so that a rank waiting on a stalled peer leaves the cores to others.
template <typename Done>
void poll(Done done, const std::function<std::string()>& describe) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (long i = 0;; ++i) {
    if (done()) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > g_limit_s) {
      const std::string what = describe ? describe() : std::string("an MPI request");
      std::fprintf(stderr, "trident: error: watchdog: %s for more than %g s; aborting the job\n",
                   what.c_str(), g_limit_s);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (waited > 1e-3) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}
}  // namespace

void set_watchdog_seconds(double seconds) { g_limit_s = seconds > 0 ? seconds : 0; }
double watchdog_seconds() { return g_limit_s; }

void wait(MPI_Request& request, const std::function<std::string()>& describe) {
  if (request == MPI_REQUEST_NULL) return;
  if (g_limit_s <= 0) {
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    return;
  }
  poll(
      [&] {
        int flag = 0;
        MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        return flag != 0;
      },
      describe);
}

void wait_all(std::vector<MPI_Request>& requests, const std::function<std::string()>& describe) {
  if (requests.empty()) return;
  if (g_limit_s <= 0) {
    MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  } else {
    poll(
        [&] {
          int flag = 0;
          MPI_Testall(int(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
          return flag != 0;
        },
        describe);
  }
  requests.clear();
}

bool test(MPI_Request& request) {
  int done = 0;
  MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  return done != 0;
}

}  // namespace trident::parallel
