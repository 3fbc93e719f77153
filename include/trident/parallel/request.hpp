// trident/parallel/request.hpp — a non-blocking call in flight (Comm's isend, irecv and the
// bucket collectives). When its buffer is device memory and MPI is not CUDA-aware, the
// request owns the host copy MPI works on (a block leased from the rank's DeviceStaging):
// filled from the device when the call starts (what MPI reads), moved back into the device
// buffer when the call completes (what MPI writes), in test() or wait(). So callers hand
// their buffers to the Comm as they are and never stage for themselves.
// defines: trident::parallel::Request, test_all, wait_all (over Requests)
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "trident/parallel/staging.hpp"

namespace trident::parallel {

class Request {
 public:
  Request() = default;  // complete
  Request(Request&& o) noexcept { *this = std::move(o); }
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Whether the call has finished, without waiting (then its data is in place). Also drives
  // MPI's progress, which moves messages only inside MPI calls.
  bool test();
  // Waits for the call under the watchdog (parallel/wait.hpp; `describe` names it when it
  // hangs) and puts its data in place.
  void wait(const std::function<std::string()>& describe);

 private:
  friend class Comm;
  struct Staged {  // one side of the call that goes through host memory
    HostLease host;
    void* device = nullptr;
    std::size_t bytes = 0;
  };
  void complete();  // MPI is done: the received side to the device, the leases back
  MPI_Request mpi_ = MPI_REQUEST_NULL;
  DeviceMemory* memory_ = nullptr;
  Staged in_;   // read by MPI (send, a reduction's input)
  Staged out_;  // written by MPI (receive, a reduction's result): copied back on completion
};

// Whether all of `requests` have finished (each tested, in order), without waiting.
bool test_all(std::vector<Request>& requests);
// Waits for each of `requests` in order; they stay in the list, complete.
void wait_all(std::vector<Request>& requests, const std::function<std::string()>& describe);

}  // namespace trident::parallel
