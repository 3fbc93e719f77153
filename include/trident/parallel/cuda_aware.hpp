// trident/parallel/cuda_aware.hpp — whether the MPI library takes device pointers.
// Open MPI (and MPICH-derived MPIs that mimic it) answer through MPIX_Query_cuda_support()
// from <mpi-ext.h>; an MPI built without CUDA support, or one that has no such query, is
// taken as not CUDA-aware. Asked once (the answer is cached). With device buffers
// (runtime.device = "cuda") a CUDA-aware MPI is handed them as they are; any other MPI
// gets host copies (parallel/staging.hpp). TRIDENT_MPI_CUDA_AWARE=0 in the environment
// answers false whatever the library says: host staging on a CUDA-aware MPI, to compare
// the two paths or to work around a broken transport. TRIDENT_MPI_CUDA_AWARE=1 answers true:
// device buffers go to MPI as they are (an MPI that takes them but has no query; the CPU
// stand-in of the CUDA runtime, whose device memory is host memory, to test that path).
// defines: trident::parallel::mpi_cuda_aware, mpi_cuda_aware_library
#pragma once

namespace trident::parallel {

bool mpi_cuda_aware();          // the library's answer, unless TRIDENT_MPI_CUDA_AWARE=0|1
bool mpi_cuda_aware_library();  // the library's answer alone

}  // namespace trident::parallel
