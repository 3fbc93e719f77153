// ops/cpu/cpu_ops.cpp — builds the CPU backend and owns its thread settings.
// defines: trident::ops::make_cpu_ops, CpuOps::CpuOps, CpuOps::name, CpuOps::team, BlasThreads
//
// make_cpu_ops(threads) sets OpenMP's and OpenBLAS's thread counts; the kernels then call
// sgemm single-threaded from inside their OpenMP loops (see cpu_ops.hpp).

#include "cpu_ops.hpp"

#include <cblas.h>
#include <omp.h>

#include <string>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"
#include "trident/ops/blas_core.hpp"

namespace trident::ops {
namespace cpu {

namespace {

// OpenBLAS (DYNAMIC_ARCH builds such as Debian's) picks its kernels from the CPU model at
// load time, and a model newer than the library falls back to generic SSE3 "Prescott"
// kernels: 7x slower SGEMM on an AVX-512 Xeon (0.3.21 on Emerald Rapids, model 207).
// The choice is made before main, so the fix is OPENBLAS_CORETYPE in the environment.
// The advice is rank 0's, once per process, and never given to a user who set the core
// type (see blas_core.hpp for the policy).
void check_blas_core() {
  static bool checked = false;
  if (checked) return;
  checked = true;
  if (log::rank() != 0) return;
  const std::string advice = blas_core_advice();
  if (!advice.empty()) log::warn(advice);
}

}  // namespace

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
  check_blas_core();
}

std::string CpuOps::name() const { return str("cpu (", blas_core_report(), ", OpenMP, ", threads_, " threads)"); }

int CpuOps::team(std::int64_t work) const {
  constexpr std::int64_t kMinWorkPerThread = 16384;
  std::int64_t t = work / kMinWorkPerThread;
  if (t < 1) t = 1;
  return t < threads_ ? static_cast<int>(t) : threads_;
}

}  // namespace cpu

std::unique_ptr<Ops> make_cpu_ops(int threads) { return std::make_unique<cpu::CpuOps>(threads); }

}  // namespace trident::ops
