// Non-blocking calls that own their host staging (see trident/parallel/request.hpp).
#include "trident/parallel/request.hpp"

#include <algorithm>
#include <utility>

#include "trident/parallel/wait.hpp"

namespace trident::parallel {

void DeferredStarts::advance(const Call* until, bool wait) {
  while (!queue_.empty()) {
    Call& c = *queue_.front();
    if (!memory_->copy_done(c.copy)) {
      if (!wait) return;
      memory_->wait_copy(c.copy);
    }
    c.start(&c.mpi);
    c.started = true;
    const bool last = &c == until;
    queue_.pop_front();
    if (last) return;
  }
}

void DeferredStarts::drop(const Call* call) {
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const std::shared_ptr<Call>& c) { return c.get() == call; }),
               queue_.end());
}

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    abandon();
    mpi_ = std::exchange(o.mpi_, MPI_REQUEST_NULL);
    memory_ = std::exchange(o.memory_, nullptr);
    in_ = std::move(o.in_);
    out_ = std::move(o.out_);
    deferred_ = std::move(o.deferred_);
    starts_ = std::move(o.starts_);
  }
  return *this;
}

bool Request::started() {
  if (!deferred_) return true;
  if (!deferred_->started) starts_->advance(deferred_.get(), false);
  if (!deferred_->started) return false;
  mpi_ = std::exchange(deferred_->mpi, MPI_REQUEST_NULL);
  deferred_.reset();
  starts_.reset();
  return true;
}

void Request::complete() {
  if (out_.host.get()) memory_->to_device(out_.device, out_.host.get(), out_.bytes);
  in_ = Staged();
  out_ = Staged();
}

bool Request::test() {
  if (!started()) return false;
  if (mpi_ != MPI_REQUEST_NULL && !parallel::test(mpi_)) return false;
  complete();
  return true;
}

void Request::wait(const std::function<std::string()>& describe) {
  if (deferred_ && !deferred_->started) starts_->advance(deferred_.get(), true);
  started();
  parallel::wait(mpi_, describe);
  complete();
}

void Request::abandon() noexcept {
  bool busy = mpi_ != MPI_REQUEST_NULL;
  if (deferred_) {  // its copy may still land, or MPI's call is running
    busy = true;
    if (!deferred_->started) starts_->drop(deferred_.get());
    deferred_.reset();
    starts_.reset();
  }
  // Still MPI's (a collective cannot be cancelled) or the staging stream's: never reused.
  if (busy) {
    in_.host.abandon();
    out_.host.abandon();
  }
  mpi_ = MPI_REQUEST_NULL;
}

bool test_all(std::vector<Request>& requests) {
  bool all = true;
  for (Request& r : requests) all = r.test() && all;
  return all;
}

void wait_all(std::vector<Request>& requests, const std::function<std::string()>& describe) {
  for (Request& r : requests) r.wait(describe);
}

}  // namespace trident::parallel
