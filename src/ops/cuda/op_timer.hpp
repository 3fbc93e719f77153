// ops/cuda/op_timer.hpp — per-op timing of the CUDA backend (the ground truth of issue 27):
// with TRIDENT_OP_TIMING=FILE in the environment, every op entry point of CudaOps records a
// CUDA event before and after its work on the backend's stream, and the backend writes, when
// it is destroyed, a JSON table of the GPU time per op (and per matrix-product shape) to FILE
// (ranks other than 0 to FILE.rankN). Off (the default), an op pays one null-pointer test.
// On, the host waits for the stream every 8192 ops to read the events back (a small
// perturbation, only then). Under the CPU stand-in (test/unit/ops/cuda/emulate) the events
// are host clock readings.
// defines: trident::ops::cuda::OpTimer, OpScope
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trident::ops::cuda {

class OpTimer {
 public:
  // A timer writing to `path` at destruction (or by write()).
  OpTimer(std::string path, cudaStream_t stream);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;
  // The timer TRIDENT_OP_TIMING asks for (null when unset or empty).
  static std::unique_ptr<OpTimer> from_environment(cudaStream_t stream);

  // An event pair around one call of op `name`; end() closes the latest begin().
  void begin(const std::string& name);
  void end();
  // Every recorded pair into the totals (waits for the stream).
  void harvest();
  // The JSON table: {"ops": [{"op", "calls", "total_ms", "share"}...] sorted by total_ms,
  // "total_ms", "events": "cuda" | "host"}.
  std::string json();
  void write();
  const std::string& path() const { return path_; }

 private:
  struct Pending {
    std::string name;
    cudaEvent_t start, stop;
  };
  struct Total {
    std::int64_t calls = 0;
    double ms = 0.0;
  };
  cudaEvent_t event();  // from the pool, or a new one
  std::string path_;
  cudaStream_t stream_;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, Total> totals_;
  int depth_ = 0;  // nested scopes (an op calling another op): the outermost holds the time
};

// RAII: begin() in the constructor, end() in the destructor; nothing when timer is null.
class OpScope {
 public:
  OpScope(OpTimer* timer, const char* name) : timer_(timer) {
    if (timer_) timer_->begin(name);
  }
  // A name built only when timing is on (shapes of matrix products).
  template <class Name>
  OpScope(OpTimer* timer, Name&& make_name, int) : timer_(timer) {
    if (timer_) timer_->begin(make_name());
  }
  ~OpScope() {
    if (timer_) timer_->end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpTimer* timer_;
};

}  // namespace trident::ops::cuda
