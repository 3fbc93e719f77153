// Backend selection (see trident/ops/ops.hpp).
#include "trident/ops/ops.hpp"

#include <algorithm>

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

std::unique_ptr<Ops> make_ops(const std::string& device, int threads, Precision precision) {
  BackendOptions options;
  options.device = device;
  options.threads = threads;
  options.precision = precision;
  return make_ops(options);
}

std::unique_ptr<Ops> make_ops(const BackendOptions& o) {
  if (o.device == "cpu" || o.device == "cpu-guarded") {
    TRIDENT_CHECK(o.precision == Precision::fp32, "runtime.device = \"", o.device,
                  "\" computes in fp32 only, not ", precision_name(o.precision),
                  " (tf32 and bf16 are for \"cuda\")");
    if (o.device == "cpu") return make_cpu_ops(o.threads);
    return make_guarded_ops(o.threads, o.arena_bytes ? o.arena_bytes : std::size_t(2) << 30);
  }
  if (o.device == "cuda") {
#ifdef TRIDENT_HAVE_CUDA
    TRIDENT_CHECK(cuda_device_count() > 0,
                  "runtime.device = \"cuda\" but no CUDA GPU is visible to this rank");
    const int device = cuda_select_device(o.local_rank, o.local_size);
    // The node's ranks r with r % GPUs == device share it (and split its free memory).
    const int gpus = cuda_device_count(), local = std::max(1, o.local_size);
    const int sharing = local / gpus + (device < local % gpus ? 1 : 0);
    return make_cuda_ops(o.precision, o.arena_bytes, std::max(1, sharing));
#else
    fail("runtime.device = \"cuda\" but this trident was built without CUDA "
         "(reconfigure with -DTRIDENT_CUDA=ON where nvcc is installed)");
#endif
  }
  fail("runtime.device = \"", o.device, "\": expected \"cpu\", \"cuda\" or \"cpu-guarded\"");
}

}  // namespace trident::ops
