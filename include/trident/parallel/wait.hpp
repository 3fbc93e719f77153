// trident/parallel/wait.hpp — waiting for MPI requests under an optional watchdog.
// With a limit (runtime.watchdog_s > 0) a wait polls MPI_Test; once it has waited longer
// than the limit it prints one line to stderr,
//   trident: error: watchdog: <description> for more than <limit> s; aborting the job
// and calls MPI_Abort: a pipeline that stops moving ends the job with a diagnosis instead
// of hanging until the batch system kills it. Comm's allreduces wait here too (as
// MPI_Iallreduce) when the limit is set. The description is the caller's (this
// module knows nothing of what is being sent); it is built only when the limit is hit.
// defines: trident::parallel::set_watchdog_seconds, watchdog_seconds, wait, wait_all, test
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace trident::parallel {

// The limit for every wait of this process; 0 (the default) waits without a limit.
void set_watchdog_seconds(double seconds);
double watchdog_seconds();

// Waits for `request` (MPI_REQUEST_NULL returns at once).
void wait(MPI_Request& request, const std::function<std::string()>& describe);
// Whether `request` has finished, without waiting (MPI_Test: a finished request becomes
// MPI_REQUEST_NULL, whose later wait returns at once). Also drives MPI's progress.
bool test(MPI_Request& request);
// Waits for all of `requests` and clears the list.
void wait_all(std::vector<MPI_Request>& requests, const std::function<std::string()>& describe);

}  // namespace trident::parallel
