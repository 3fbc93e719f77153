// Backend selection (see trident/ops/ops.hpp).
#include "trident/ops/ops.hpp"

#include <algorithm>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"
#if defined(TRIDENT_CUDA_MODULE)
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>
#endif
#if defined(TRIDENT_CUDA_MODULE) || defined(TRIDENT_HAVE_CUDA)
#include "cuda/module.hpp"
#endif

namespace trident::ops {

void Ops::copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                    std::int64_t rows, std::int64_t width) {
  for (std::int64_t r = 0; r < rows; r++) copy(dst + r * ld_dst, src + r * ld_src, width);
}

void Ops::sum_squares_spans(const std::vector<Span>& spans, double* sums) {
  for (std::size_t i = 0; i < spans.size(); i++) sums[i] = sum_squares(spans[i].x, spans[i].n);
}

void Ops::adamw_segments(const std::vector<AdamWSegment>& segments, float grad_scale, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float bc1,
                         float bc2) {
  if (grad_scale != 1.0f)
    for (const AdamWSegment& s : segments) scale(s.g, grad_scale, s.n);
  for (const AdamWSegment& s : segments)
    adamw(s.p, s.g, s.m, s.v, s.n, lr, beta1, beta2, eps, s.decay ? weight_decay : 0.0f, bc1,
          bc2);
}

#if defined(TRIDENT_CUDA_MODULE)
namespace {
// The directory of this executable (/proc/self/exe), with a trailing '/', or "".
std::string executable_dir() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  const std::string p(path, std::size_t(n));
  return p.substr(0, p.rfind('/') + 1);
}

// The CUDA backend, loaded on first use (ops/cuda/module.cpp says why): beside the executable
// (the build folder, or wherever trident was copied with it), else where the build put it
// (test and benchmark programs in other folders). Never unloaded.
const CudaModule& cuda_backend() {
  static const CudaModule* loaded = [] {
    std::string tried;
    std::vector<std::string> paths{executable_dir() + TRIDENT_CUDA_MODULE};
    if (paths[0] != TRIDENT_CUDA_MODULE_PATH) paths.emplace_back(TRIDENT_CUDA_MODULE_PATH);
    for (const std::string& path : paths) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char* why = dlerror();
        tried += str(tried.empty() ? "" : "; ", why ? why : path);
        continue;
      }
      auto entry = reinterpret_cast<const CudaModule* (*)()>(dlsym(h, kCudaModuleSymbol));
      TRIDENT_CHECK(entry && entry()->version == kCudaModuleVersion, path,
                    " is not this trident's CUDA backend (rebuild trident)");
      return entry();
    }
    fail("runtime.device = \"cuda\": cannot load the CUDA backend ", TRIDENT_CUDA_MODULE, ": ",
         tried);
  }();
  loaded->set_log_rank(log::rank());
  return *loaded;
}
}  // namespace
#elif defined(TRIDENT_HAVE_CUDA)
namespace {
// Linked in (the CPU stand-in's build, test/unit/ops/cuda/emulate).
const CudaModule& cuda_backend() {
  static const CudaModule linked = cuda_module_table();
  return linked;
}
}  // namespace
#endif

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
#if defined(TRIDENT_CUDA_MODULE) || defined(TRIDENT_HAVE_CUDA)
    const CudaModule& cuda = cuda_backend();
    const int gpus = cuda.device_count();
    TRIDENT_CHECK(gpus > 0, "runtime.device = \"cuda\" but no CUDA GPU is visible to this rank");
    const int device = cuda.select_device(o.local_rank, o.local_size);
    // The node's ranks r with r % GPUs == device share it (and split its free memory).
    const int local = std::max(1, o.local_size);
    const int sharing = local / gpus + (device < local % gpus ? 1 : 0);
    return cuda.make_ops(o.precision, o.arena_bytes, std::max(1, sharing));
#else
    fail("runtime.device = \"cuda\" but this trident was built without CUDA "
         "(reconfigure with -DTRIDENT_CUDA=ON where nvcc is installed)");
#endif
  }
  fail("runtime.device = \"", o.device, "\": expected \"cpu\", \"cuda\" or \"cpu-guarded\"");
}

}  // namespace trident::ops
