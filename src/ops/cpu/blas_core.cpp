// OpenBLAS core-type check (see trident/ops/blas_core.hpp).
#include "trident/ops/blas_core.hpp"

#include <cblas.h>

#include <algorithm>
#include <cctype>

namespace trident::ops {

std::string blas_core_override() {
#if defined(__x86_64__)
  std::string core = openblas_get_corename();
  std::transform(core.begin(), core.end(), core.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  const bool generic = core == "prescott" || core == "core2" || core == "nehalem" ||
                       core == "katmai" || core == "generic";
  if (!generic) return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2")) return "Haswell";
#endif
  return "";
}

}  // namespace trident::ops
