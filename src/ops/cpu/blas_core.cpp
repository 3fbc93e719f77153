// OpenBLAS core-type choice and advice (see trident/ops/blas_core.hpp).
#include "trident/ops/blas_core.hpp"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace trident::ops {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

std::string core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

// The best core type this CPU can safely run, by its instruction sets and vendor.
const char* best_core_for_cpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool amd = __builtin_cpu_is("amd");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512 && !amd) return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  if (avx2) return "Haswell";
#endif
  return nullptr;
}

bool user_chose_core() {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  return set && *set && !std::getenv(kBlasCoreAutoEnv);
}

}  // namespace

std::string blas_core_override() {
  const std::string core = lower(core_name());
  const bool generic = core == "prescott" || core == "core2" || core == "nehalem" ||
                       core == "katmai" || core == "generic";
  if (!generic) return "";
  const char* best = best_core_for_cpu();
  return best ? best : "";
}

std::string blas_core_advice() {
  if (user_chose_core()) return "";
  const char* best = best_core_for_cpu();
  if (!best) return "";
  const std::string core = lower(core_name());
  const bool avx512_core = core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  const bool avx2_core = avx512_core || core == "haswell" || core == "zen";
  const std::string want = best;
  const bool weaker = (want == "Haswell") ? !avx2_core : !avx512_core;
  if (!weaker) return "";
  return "OpenBLAS chose its '" + core_name() + "' kernels, but this CPU can run its '" + want +
         "' kernels; matrix products will be several times slower. Set OPENBLAS_CORETYPE=" +
         want + " in the environment (it is read when the library loads)";
}

std::string blas_core_report() {
  // No parentheses: the report sits inside the backend's own "cpu (...)".
  std::string how = "chosen by OpenBLAS";
  if (std::getenv(kBlasCoreAutoEnv))
    how = "set by trident, as OpenBLAS fell back to a generic core";
  else if (user_chose_core())
    how = "set by OPENBLAS_CORETYPE in the environment";
  return "OpenBLAS " + core_name() + " kernels " + how;
}

}  // namespace trident::ops
