// Whether the MPI library is CUDA-aware (see trident/parallel/cuda_aware.hpp).
#include "trident/parallel/cuda_aware.hpp"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <cstdlib>
#include <cstring>

namespace trident::parallel {

bool mpi_cuda_aware() {
  const char* forced = std::getenv("TRIDENT_MPI_CUDA_AWARE");
  if (forced && std::strcmp(forced, "0") == 0) return false;
  if (forced && std::strcmp(forced, "1") == 0) return true;
  return mpi_cuda_aware_library();
}

bool mpi_cuda_aware_library() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  // Built with CUDA support; the running library (and its transports) may still say no.
  static const bool aware = MPIX_Query_cuda_support() == 1;
  return aware;
#else
  return false;
#endif
}

}  // namespace trident::parallel
