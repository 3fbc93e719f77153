// Backend selection (see trident/ops/ops.hpp).
#include "trident/ops/ops.hpp"

#include "trident/core/error.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/ops/cuda.hpp"
#endif

namespace trident::ops {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16})
    if (name == precision_name(p)) return p;
  fail("precision \"", name, "\": expected \"fp32\", \"tf32\" or \"bf16\"");
}

std::unique_ptr<Ops> make_ops(const std::string& device, int threads) {
  return make_ops(device, threads, Precision::fp32);
}

std::unique_ptr<Ops> make_ops(const std::string& device, int threads, Precision precision) {
  if (device == "cpu") {
    TRIDENT_CHECK(precision == Precision::fp32, "runtime.device = \"cpu\" computes in fp32 only, "
                  "not ", precision_name(precision), " (tf32 and bf16 are for \"cuda\")");
    return make_cpu_ops(threads);
  }
  if (device == "cuda") {
#ifdef TRIDENT_HAVE_CUDA
    int n = cuda_device_count();
    TRIDENT_CHECK(n > 0, "runtime.device = \"cuda\" but no CUDA GPU is visible to this rank");
    // The backend works on device memory (make_cuda_ops, trident/ops/cuda.hpp), but the model,
    // pipeline and I/O still hand the ops host buffers: refuse clearly until they keep their
    // buffers on the device; then this line becomes `return make_cuda_ops(precision);`.
    fail("runtime.device = \"cuda\" (", precision_name(precision), "): the CUDA kernels are "
         "built, but the model does not keep its buffers on the GPU yet; use \"cpu\"");
#else
    fail("runtime.device = \"cuda\" but this trident was built without CUDA "
         "(reconfigure with -DTRIDENT_CUDA=ON where nvcc is installed)");
#endif
  }
  fail("runtime.device = \"", device, "\": expected \"cpu\" or \"cuda\"");
}

}  // namespace trident::ops
