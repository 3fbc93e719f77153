// Non-blocking calls that own their host staging (see trident/parallel/request.hpp).
#include "trident/parallel/request.hpp"

#include <utility>

#include "trident/parallel/wait.hpp"

namespace trident::parallel {

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    mpi_ = std::exchange(o.mpi_, MPI_REQUEST_NULL);
    memory_ = std::exchange(o.memory_, nullptr);
    in_ = std::move(o.in_);
    out_ = std::move(o.out_);
  }
  return *this;
}

void Request::complete() {
  if (out_.host.get()) memory_->to_device(out_.device, out_.host.get(), out_.bytes);
  in_ = Staged();
  out_ = Staged();
}

bool Request::test() {
  if (mpi_ != MPI_REQUEST_NULL && !parallel::test(mpi_)) return false;
  complete();
  return true;
}

void Request::wait(const std::function<std::string()>& describe) {
  parallel::wait(mpi_, describe);
  complete();
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
