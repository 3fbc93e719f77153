// trident/parallel/request.hpp — a non-blocking call in flight (Comm's isend, irecv and the
// bucket collectives). When its buffer is device memory and MPI is not CUDA-aware, the
// request owns the host copy MPI works on (a block leased from the rank's DeviceStaging),
// moved back into the device buffer when the call completes (what MPI writes), in test() or
// wait(). So callers hand their buffers to the Comm as they are and never stage for
// themselves.
//
// What MPI reads comes down when the call starts: at once for a send; for a collective on
// the backend's staging stream (DeviceMemory::to_host_async), so that a DP gradient bucket
// comes down while the backward goes on. Such a collective is "deferred": MPI's call starts
// once its copy has landed. MPI needs every rank to start a communicator's collectives in
// one order while copies land at different times on different ranks, so a communicator's
// deferred calls wait in a queue (DeferredStarts) and start in the order they were made,
// and any other collective on it first starts all of them.
// defines: trident::parallel::Request, DeferredStarts, test_all, wait_all (over Requests)
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/parallel/staging.hpp"

namespace trident::parallel {

// One communicator's collectives waiting for their staged input, in start order.
class DeferredStarts {
 public:
  struct Call {
    std::uint64_t copy = 0;                  // DeviceMemory::to_host_async's ticket
    std::function<void(MPI_Request*)> start;  // MPI's call on the host copies
    MPI_Request mpi = MPI_REQUEST_NULL;
    bool started = false;
  };
  explicit DeferredStarts(DeviceMemory* memory) : memory_(memory) {}
  void push(std::shared_ptr<Call> call) { queue_.push_back(std::move(call)); }
  // Starts the queued calls in order, up to and including `until` (null: all of them):
  // those whose copies have landed, or all of them, waiting for each copy, when `wait`.
  void advance(const Call* until, bool wait);
  // A call that will never start (its Request was dropped): out of the queue.
  void drop(const Call* call);
  bool empty() const { return queue_.empty(); }

 private:
  DeviceMemory* memory_;
  std::deque<std::shared_ptr<Call>> queue_;
};

class Request {
 public:
  Request() = default;  // complete
  // A request dropped in flight (an error unwinding a step) is left to MPI, and its host
  // copies are never handed to another call: MPI or the staging stream may still write them.
  ~Request() { abandon(); }
  Request(Request&& o) noexcept { *this = std::move(o); }
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Whether the call has finished, without waiting (then its data is in place). Also drives
  // MPI's progress, which moves messages only inside MPI calls, and starts a deferred call
  // whose input has landed.
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
  bool started();     // a deferred call: starts it if its input has landed
  void complete();    // MPI is done: the received side to the device, the leases back
  void abandon() noexcept;
  MPI_Request mpi_ = MPI_REQUEST_NULL;
  DeviceMemory* memory_ = nullptr;
  Staged in_;   // read by MPI (send, a reduction's input)
  Staged out_;  // written by MPI (receive, a reduction's result): copied back on completion
  std::shared_ptr<DeferredStarts::Call> deferred_;  // not yet started: in starts_'s queue
  std::shared_ptr<DeferredStarts> starts_;
};

// Whether all of `requests` have finished (each tested, in order), without waiting.
bool test_all(std::vector<Request>& requests);
// Waits for each of `requests` in order; they stay in the list, complete.
void wait_all(std::vector<Request>& requests, const std::function<std::string()>& describe);

}  // namespace trident::parallel
