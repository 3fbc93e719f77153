// ops/cuda/graphs.cpp — CudaOps' graphs (runtime.cuda_graphs; ops.hpp): stream capture of the
// backend's stream in thread-local mode, instantiated once, launched on the same stream.
// A graph bakes in every pointer and host scalar its ops were given, so the capture is kept
// only where nothing was allocated from the arena during it (an allocation there could be
// released before a launch), and a launch first checks that every arena block live at the
// capture is still the same allocation (else the caller runs its work eagerly).
// defines: the graph members of CudaOps
#include <string>

#include "check.hpp"
#include "cuda_ops.hpp"
#include "kernels.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

std::string CudaOps::graphs_unsupported() const {
  if (timer_)
    return "TRIDENT_OP_TIMING is set (its per-op events would be recorded once and never "
           "timed per launch)";
  return "";
}

void CudaOps::before_graph() {
  // The weight cache's conversion, which the first product after a change would make: a
  // graph replays only what it recorded, never the host's decision to convert.
  if (!weights16_) return;
  if (memory_->take_watched_write()) weights16_fresh_ = false;
  if (weights16_fresh_) return;
  const std::int64_t n = std::int64_t(weights_end_ - reinterpret_cast<const char*>(weights_)) /
                         std::int64_t(sizeof(float));
  launch_to_bf16(stream_, weights16_, weights_, 1, n, n);
  weights16_fresh_ = true;
}

bool CudaOps::begin_capture(std::string* why) {
  const std::string no = graphs_unsupported();
  if (!no.empty()) {
    *why = no;
    return false;
  }
  allocations_at_capture_ = memory_->arena().allocations();
  const cudaError_t status = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    cudaGetLastError();
    *why = str("cudaStreamBeginCapture: ", cudaGetErrorString(status));
    return false;
  }
  return true;
}

int CudaOps::end_capture(std::string* why) {
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaStreamEndCapture(stream_, &graph);
  if (status != cudaSuccess || !graph) {
    cudaGetLastError();  // the capture's error: not sticky, the stream is usable again
    if (graph) cudaGraphDestroy(graph);
    *why = str("cudaStreamEndCapture: ", cudaGetErrorString(status));
    return -1;
  }
  if (memory_->arena().allocations() != allocations_at_capture_) {
    cudaGraphDestroy(graph);
    *why = "device memory was allocated inside the captured work";
    return -1;
  }
  cudaGraphExec_t exec = nullptr;
  status = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess) {
    cudaGetLastError();
    *why = str("cudaGraphInstantiateWithFlags: ", cudaGetErrorString(status));
    return -1;
  }
  graphs_.push_back({exec, memory_->arena().taken_blocks(), memory_->arena().releases()});
  return int(graphs_.size()) - 1;
}

bool CudaOps::launch_graph(int handle, std::string* why) {
  TRIDENT_CHECK(handle >= 0 && std::size_t(handle) < graphs_.size() && graphs_[std::size_t(handle)].exec,
                "cuda: launch of graph ", handle, ", which does not exist");
  Graph& g = graphs_[std::size_t(handle)];
  if (memory_->arena().releases() != g.releases) {  // else every block is as it was
    if (!memory_->arena().still_taken(g.blocks)) {
      *why = "device memory live at its capture was released since";
      return false;
    }
    g.releases = memory_->arena().releases();  // checked: no need again until the next release
  }
  TRIDENT_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  return true;
}

void CudaOps::release_graph(int handle) {
  if (handle < 0 || std::size_t(handle) >= graphs_.size()) return;
  Graph& g = graphs_[std::size_t(handle)];
  if (g.exec) cudaGraphExecDestroy(g.exec);
  g = Graph();
}

}  // namespace trident::ops::cuda
