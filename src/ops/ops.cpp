// Backend selection (see trident/ops/ops.hpp).
#include "trident/ops/ops.hpp"

#include "trident/core/error.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/ops/cuda.hpp"
#endif

namespace trident::ops {

std::unique_ptr<Ops> make_ops(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_ops(threads);
  if (device == "cuda") {
#ifdef TRIDENT_HAVE_CUDA
    int n = cuda_device_count();
    TRIDENT_CHECK(n > 0, "runtime.device = \"cuda\" but no CUDA GPU is visible to this rank");
    fail("runtime.device = \"cuda\": the CUDA backend is not implemented yet; use \"cpu\"");
#else
    fail("runtime.device = \"cuda\" but this trident was built without CUDA "
         "(reconfigure with -DTRIDENT_CUDA=ON where nvcc is installed)");
#endif
  }
  fail("runtime.device = \"", device, "\": expected \"cpu\" or \"cuda\"");
}

}  // namespace trident::ops
