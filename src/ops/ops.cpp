// Backend selection (see trident/ops/ops.hpp).
#include "trident/ops/ops.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

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

namespace {
// Host fp32 copies of strided bf16 tensors (the default bf16 attention entry points): the
// whole extent of b sequences of t rows of `width` elements (row stride ld, sequence stride
// bs) widened, and the rows narrowed back, the columns between them untouched.
std::int64_t extent(int b, int t, std::int64_t ld, std::int64_t bs, std::int64_t width) {
  return b > 0 && t > 0 ? std::int64_t(b - 1) * bs + std::int64_t(t - 1) * ld + width : 0;
}
std::vector<float> widened(Ops& ops, const std::uint16_t* x, std::int64_t n) {
  std::vector<float> w(std::size_t(std::max<std::int64_t>(n, 1)));
  ops.from_bf16(w.data(), x, n);
  return w;
}
void narrow_rows(Ops& ops, std::uint16_t* dst, const float* src, int b, int t, std::int64_t ld,
                 std::int64_t bs, std::int64_t width) {
  for (int bb = 0; bb < b; bb++)
    for (int r = 0; r < t; r++) {
      const std::int64_t off = std::int64_t(bb) * bs + std::int64_t(r) * ld;
      ops.to_bf16(dst + off, src + off, width);
    }
}
}  // namespace

void Ops::attention_forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                 const std::uint16_t* k, const std::uint16_t* v,
                                 const AttentionShape& s) {
  TRIDENT_CHECK(!s.accumulate, "attention_forward_bf16: the shape must not accumulate");
  const std::int64_t wq = std::int64_t(s.nh) * s.hs, wk = std::int64_t(s.nkv) * s.hs;
  const std::vector<float> q32 = widened(*this, q, extent(s.b, s.t, s.ld_q, s.batch_q(), wq));
  const std::vector<float> k32 = widened(*this, k, extent(s.b, s.t, s.ld_k, s.batch_k(), wk));
  const std::vector<float> v32 = widened(*this, v, extent(s.b, s.t, s.ld_v, s.batch_v(), wk));
  std::vector<float> o32(std::size_t(std::max<std::int64_t>(
      extent(s.b, s.t, s.ld_o, s.batch_o(), wq), 1)));
  attention_forward(o32.data(), lse, q32.data(), k32.data(), v32.data(), s);
  narrow_rows(*this, out, o32.data(), s.b, s.t, s.ld_o, s.batch_o(), wq);
}

void Ops::attention_backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                  const std::uint16_t* dout, const std::uint16_t* out,
                                  const float* lse, const std::uint16_t* q,
                                  const std::uint16_t* k, const std::uint16_t* v,
                                  const AttentionShape& s) {
  TRIDENT_CHECK(!s.accumulate, "attention_backward_bf16: gradients are written, not "
                "accumulated (the shape must not accumulate)");
  const std::int64_t wq = std::int64_t(s.nh) * s.hs, wk = std::int64_t(s.nkv) * s.hs;
  const std::int64_t nq = extent(s.b, s.t, s.ld_q, s.batch_q(), wq);
  const std::int64_t nk = extent(s.b, s.t, s.ld_k, s.batch_k(), wk);
  const std::int64_t nv = extent(s.b, s.t, s.ld_v, s.batch_v(), wk);
  const std::int64_t no = extent(s.b, s.t, s.ld_o, s.batch_o(), wq);
  const std::vector<float> q32 = widened(*this, q, nq), k32 = widened(*this, k, nk);
  const std::vector<float> v32 = widened(*this, v, nv), o32 = widened(*this, out, no);
  const std::vector<float> do32 = widened(*this, dout, no);
  std::vector<float> dq32(q32.size()), dk32(k32.size()), dv32(v32.size());
  attention_backward(dq32.data(), dk32.data(), dv32.data(), do32.data(), o32.data(), lse,
                     q32.data(), k32.data(), v32.data(), s);
  narrow_rows(*this, dq, dq32.data(), s.b, s.t, s.ld_q, s.batch_q(), wq);
  narrow_rows(*this, dk, dk32.data(), s.b, s.t, s.ld_k, s.batch_k(), wk);
  narrow_rows(*this, dv, dv32.data(), s.b, s.t, s.ld_v, s.batch_v(), wk);
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
