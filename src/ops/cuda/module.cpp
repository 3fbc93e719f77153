// ops/cuda/module.cpp — the entry point of libtrident_cuda.so, the CUDA backend that trident
// loads (dlopen, ops.cpp) only when a run asks for runtime.device = "cuda". Why a module: the
// CUDA runtime and cuBLAS, once linked, load with every process, and cuBLASLt's start-up costs
// about 0.5 s of CPU per process (measured: `trident --version` 2.3 s against 0.9 s on a
// loaded 2-core machine) — on every rank of every CPU job and every test.
#include "module.hpp"

extern "C" __attribute__((visibility("default"))) const trident::ops::CudaModule*
trident_cuda_module() {
  static const trident::ops::CudaModule table = trident::ops::cuda_module_table();
  return &table;
}
