// trident/ops/cuda.hpp — host-callable entry points of the CUDA backend (ops/cuda).
// Only built when TRIDENT_CUDA is on; the backend is a shell until the CUDA issue lands.
// defines: trident::ops::cuda_device_count
#pragma once

namespace trident::ops {

// Number of CUDA devices visible to this process (0 when none or no driver).
int cuda_device_count();

}  // namespace trident::ops
