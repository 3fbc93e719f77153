// trident/parallel/cuda_aware.hpp — whether the MPI library takes device pointers.
// Open MPI (and MPICH-derived MPIs that mimic it) answer through MPIX_Query_cuda_support()
// from <mpi-ext.h>; an MPI built without CUDA support, or one that has no such query, is
// taken as not CUDA-aware. Asked once (the answer is cached). With device buffers
// (runtime.device = "cuda") a CUDA-aware MPI is handed them as they are; any other MPI
// gets host copies (ops/cuda's cuda_download/cuda_upload stage them).
// defines: trident::parallel::mpi_cuda_aware
#pragma once

namespace trident::parallel {

bool mpi_cuda_aware();

}  // namespace trident::parallel
