// trident/ops/blas_core.hpp — OpenBLAS picks its kernels from the CPU's identity at load
// time, and on CPUs it does not know (new models, some VMs) it falls back to its SSE3
// "Prescott" kernels, 4x slower than AVX-512. This says which core type to ask for instead.
// defines: trident::ops::blas_core_override
#pragma once

#include <string>

namespace trident::ops {

// The OPENBLAS_CORETYPE to use when OpenBLAS chose a generic core on a CPU with AVX-512
// or AVX2 ("Cooperlake", "SkylakeX", "Haswell"); "" when its choice is fine.
std::string blas_core_override();

}  // namespace trident::ops
