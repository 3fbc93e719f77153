// trident/ops/blas_core.hpp — OpenBLAS picks its kernels from the CPU's identity at load
// time, and on CPUs it does not know (new models, some VMs) it falls back to its SSE3
// "Prescott" kernels, 4x slower than AVX-512. This says which core type to ask for instead,
// and whether (and what) to advise about the core OpenBLAS chose.
// defines: trident::ops::blas_core_override, blas_core_advice, blas_core_report,
//          kBlasCoreAutoEnv
//
// Policy: a user who set OPENBLAS_CORETYPE chose their kernels and is never second-guessed
// (sites set it on purpose, e.g. Haswell on AMD EPYC, where older OpenBLAS builds
// misbehave with the AVX-512 kernels). On AMD CPUs trident never asks for the AVX-512 core
// types (SkylakeX, Cooperlake): OpenBLAS's own Zen targets run the Haswell (AVX2) kernels,
// and its AVX-512 paths on Zen 4/5 came after Debian 12's 0.3.21 and still gain Zen-only
// fixes; Haswell is what it documents as safe there.
#pragma once

#include <string>

namespace trident::ops {

// Set (to the core trident asked for) when main re-executed itself with OPENBLAS_CORETYPE,
// so that the child knows the setting was trident's and not the user's.
inline constexpr const char* kBlasCoreAutoEnv = "TRIDENT_BLAS_CORETYPE_AUTO";

// The OPENBLAS_CORETYPE to use when OpenBLAS chose a generic core on a CPU with AVX-512
// or AVX2 ("Cooperlake", "SkylakeX", "Haswell"; never the AVX-512 ones on AMD); "" when
// its choice is fine.
std::string blas_core_override();

// One sentence of advice when OpenBLAS runs weaker kernels than this CPU could use and
// nobody chose them (OPENBLAS_CORETYPE unset, or set by trident itself); "" otherwise.
// The caller says it once, from rank 0.
std::string blas_core_advice();

// For the start-up report: "OpenBLAS Haswell kernels (OPENBLAS_CORETYPE set by the user)".
std::string blas_core_report();

}  // namespace trident::ops
