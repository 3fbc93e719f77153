// ops/cpu/cpu_ops.cpp — builds the CPU backend and owns its thread settings.
// defines: trident::ops::make_cpu_ops, CpuOps::CpuOps, CpuOps::name, CpuOps::team, BlasThreads

#include "cpu_ops.hpp"

#include <cblas.h>
#include <omp.h>

#include "trident/core/error.hpp"

namespace trident::ops {
namespace cpu {

BlasThreads::BlasThreads(int n) : saved_(openblas_get_num_threads()) {
  if (n != saved_) openblas_set_num_threads(n);
}

BlasThreads::~BlasThreads() {
  if (openblas_get_num_threads() != saved_) openblas_set_num_threads(saved_);
}

CpuOps::CpuOps(int threads) : threads_(threads) {
  TRIDENT_CHECK(threads >= 1, "cpu ops: threads must be >= 1, got ", threads);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

std::string CpuOps::name() const { return str("cpu (OpenBLAS + OpenMP, ", threads_, " threads)"); }

int CpuOps::team(std::int64_t work) const {
  constexpr std::int64_t kMinWorkPerThread = 16384;
  std::int64_t t = work / kMinWorkPerThread;
  if (t < 1) t = 1;
  return t < threads_ ? static_cast<int>(t) : threads_;
}

}  // namespace cpu

std::unique_ptr<Ops> make_cpu_ops(int threads) { return std::make_unique<cpu::CpuOps>(threads); }

}  // namespace trident::ops
