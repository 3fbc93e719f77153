// ops/cuda/module.hpp — the CUDA backend's entry points as one table: what the loadable module
// libtrident_cuda.so hands to ops.cpp (dlsym of kCudaModuleSymbol, see module.cpp), and what a
// build that links the backend in (the CPU stand-in, test/unit/ops/cuda/emulate) uses directly.
// defines: trident::ops::CudaModule, kCudaModuleSymbol, kCudaModuleVersion, cuda_module_table
#pragma once

#include <cstddef>
#include <memory>

#include "trident/core/log.hpp"
#include "trident/ops/cuda.hpp"

namespace trident::ops {

constexpr const char* kCudaModuleSymbol = "trident_cuda_module";
constexpr int kCudaModuleVersion = 1;  // raised when the table changes

struct CudaModule {
  int version = kCudaModuleVersion;
  int (*device_count)() = nullptr;
  int (*select_device)(int local_rank, int local_size) = nullptr;
  std::unique_ptr<Ops> (*make_ops)(Precision, std::size_t arena_bytes,
                                   int ranks_per_device) = nullptr;
  // The module has its own copy of core's log state: the caller's rank, so that only rank 0
  // warns.
  void (*set_log_rank)(int rank) = nullptr;
};

inline CudaModule cuda_module_table() {
  CudaModule m;
  m.device_count = &cuda_device_count;
  m.select_device = &cuda_select_device;
  m.make_ops = &make_cuda_ops;
  m.set_log_rank = &log::set_rank;
  return m;
}

}  // namespace trident::ops
