// ops/cuda/cuda_ops.cpp — builds the CUDA backend (stream, cuBLAS handle, arenas), its
// copies, and every op that is not a matrix product (each one launcher of kernels.hpp).
// defines: make_cuda_ops, cuda_upload, cuda_download, cuda_synchronize, CudaOps (all but the
//          members in matmul.cpp)
#include "cuda_ops.hpp"

#include <algorithm>
#include <cstdlib>

#include "check.hpp"
#include "kernels.hpp"
#include "lt_tune.hpp"
#include "op_timer.hpp"
#include "trident/core/error.hpp"
#include "trident/ops/adamw.hpp"

namespace trident::ops {
namespace cuda {

namespace {
constexpr std::size_t kMinScratch = std::size_t(1) << 20;
}  // namespace

CudaOps::CudaOps(Precision precision, std::size_t arena_bytes, int ranks_per_device)
    : precision_(precision) {
  try {
    setup(arena_bytes, ranks_per_device);
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void CudaOps::setup(std::size_t arena_bytes, int ranks_per_device) {
  TRIDENT_CUDA_CHECK(cudaGetDevice(&device_));
  cudaDeviceProp prop{};
  TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  // A blocking stream (the default flags): it orders itself with the legacy default stream,
  // so a plain cudaMemcpy elsewhere in the program cannot overtake the ops queued here.
  TRIDENT_CUDA_CHECK(cudaStreamCreate(&stream_));
  TRIDENT_CUBLAS_CHECK(cublasCreate(&cublas_));
  TRIDENT_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));  // before the workspace: it resets it
  TRIDENT_CUBLAS_CHECK(cublasLtCreate(&lt_));

  // The one cudaMalloc: after the stream and cuBLAS exist, so that "free memory" counts them.
  memory_ = std::make_unique<CudaMemory>(arena_bytes, ranks_per_device, stream_);
  cublas_workspace_ = memory_->allocate(kCublasWorkspaceBytes);
  sum_partial_ = static_cast<double*>(
      memory_->allocate(sizeof(double) * std::size_t(sum_squares_blocks())));
  sum_result_ = static_cast<double*>(memory_->allocate(sizeof(double)));
  loss_total_ = static_cast<double*>(memory_->allocate(sizeof(double)));
  TRIDENT_CUDA_CHECK(cudaMemsetAsync(loss_total_, 0, sizeof(double), stream_));
  TRIDENT_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
  // Host-pointer scalars (alpha, beta); fp32 math unless a call names a faster compute type.
  TRIDENT_CUBLAS_CHECK(cublasSetPointerMode(cublas_, CUBLAS_POINTER_MODE_HOST));
  TRIDENT_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  TRIDENT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_result_), sizeof(double)));
  timer_ = OpTimer::from_environment(stream_);  // TRIDENT_OP_TIMING (op_timer.hpp)
  const char* baseline = std::getenv("TRIDENT_CUDA_BASELINE");
  baseline_ = baseline && std::string(baseline) == "1";
  const char* attention = std::getenv("TRIDENT_CUDA_ATTENTION");
  attention_kernel_ = attention ? attention : "";
  TRIDENT_CHECK(attention_kernel_.empty() || attention_kernel_ == "tc" ||
                    attention_kernel_ == "scalar",
                "TRIDENT_CUDA_ATTENTION: expected tc or scalar, got '", attention_kernel_, "'");
  weight_cache_ = !baseline_ && on_unless_zero("TRIDENT_CUDA_WEIGHT_CACHE");
  fused_head_ = on_unless_zero("TRIDENT_CUDA_FUSED_HEAD");
  if (precision_ == Precision::bf16 && !baseline_)
    cudnn_ = std::make_unique<CudnnAttention>(stream_);
  if (!baseline_) lt_tune_ = LtTuner::from_environment(device_name_);  // TRIDENT_CUDA_LT_TUNE
}

bool CudaOps::on_unless_zero(const char* variable) {
  const char* v = std::getenv(variable);
  return !(v && std::string(v) == "0");
}

void CudaOps::set_weights(const float* params, std::int64_t n) {
  if (weights16_) memory_->release(weights16_);
  weights16_ = nullptr;
  weights_ = params;
  weights_end_ = reinterpret_cast<const char*>(params + std::max<std::int64_t>(n, 0));
  weights16_fresh_ = false;
  memory_->watch(nullptr, 0);
  if (!params || n <= 0 || precision_ != Precision::bf16 || !weight_cache_) return;
  weights16_ = static_cast<std::uint16_t*>(memory_->allocate(std::size_t(n) * 2));
  memory_->watch(params, std::size_t(n) * sizeof(float));  // copies from the host into it
}

const void* CudaOps::cached_bf16(const float* p, std::int64_t rows, std::int64_t cols,
                                 std::int64_t ld) {
  if (!weights16_ || rows <= 0 || cols <= 0) return nullptr;
  const float* last = p + (rows - 1) * ld + cols;  // one past the last element read
  if (p < weights_ || reinterpret_cast<const char*>(last) > weights_end_) return nullptr;
  if (memory_->take_watched_write()) weights16_fresh_ = false;
  if (!weights16_fresh_) {  // the whole range in one pass, once per change of the weights
    const std::int64_t n = std::int64_t(weights_end_ - reinterpret_cast<const char*>(weights_)) /
                           std::int64_t(sizeof(float));
    launch_to_bf16(stream_, weights16_, weights_, 1, n, n);
    weights16_fresh_ = true;
  }
  return weights16_ + (p - weights_);
}

CudaOps::~CudaOps() { release(); }

void CudaOps::release() noexcept {
  // No throwing here: a fault would have been reported by an earlier synchronizing call.
  // The arena goes last but one: cuBLAS may use its workspace until destroyed.
  if (stream_) cudaStreamSynchronize(stream_);
  for (Graph& g : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  timer_.reset();  // writes its table; its events are on the stream
  cudnn_.reset();  // its handle and plans, before the arena its buffers came from
  if (cublas_) cublasDestroy(cublas_);
  lt_tune_.reset();  // its summary line
  for (auto& [key, plan] : lt_plans_) {
    (void)key;
    if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
    for (cublasLtMatrixLayout_t l : {plan.a, plan.b, plan.d})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
  lt_plans_.clear();
  if (lt_) cublasLtDestroy(lt_);
  lt_ = nullptr;
  if (host_result_) cudaFreeHost(host_result_);
  if (host_sums_) cudaFreeHost(host_sums_);
  host_sums_ = nullptr;
  host_sums_capacity_ = 0;
  sum_spans_table_ = DeviceTable();  // in the arena
  adamw_table_ = DeviceTable();
  weights16_ = nullptr;  // in the arena
  cublas_ = nullptr;
  host_result_ = nullptr;
  scratch_ = BumpBlock();
  hook_block_ = BumpBlock();
  cublas_workspace_ = nullptr;
  sum_partial_ = sum_result_ = loss_total_ = nullptr;
  memory_.reset();  // cudaFree of the whole arena (Buffers made from it must be gone by now)
  if (stream_) cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

std::string CudaOps::name() const {
  return str("cuda (cuBLAS + CUDA kernels, device ", device_, " ", device_name_, ", ",
             precision_name(precision_), " matrix products",
             baseline_ ? ", TRIDENT_CUDA_BASELINE: the paths before issue 27" : "", ")");
}

BumpBlock& CudaOps::scratch(std::size_t bytes) {
  if (bytes > scratch_.capacity()) {
    // Ops queued earlier may still read the old scratch: wait for them before releasing it.
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    // 1.25x the need, not doubling: the ops repeat every step, so it settles after the first,
    // at a size model::predict_memory can know.
    const std::size_t grown = aligned_bytes(std::max(bytes + bytes / 4, kMinScratch));
    memory_->release(scratch_.base());  // first: the old and new together may not fit
    scratch_ = BumpBlock();
    std::size_t size = grown;
    void* p = nullptr;
    try {
      p = memory_->allocate(size);
    } catch (const Error&) {
      // No room for the headroom: exactly what this call needs, or an Error naming the sizes.
      size = aligned_bytes(bytes);
      try {
        p = memory_->allocate(size);
      } catch (const Error& e) {
        fail("cuda: the scratch of one op needs ", bytes, " bytes: ", e.what(),
             " (runtime's device arena must hold it besides the model's buffers)");
      }
    }
    scratch_ = BumpBlock(p, size);
  }
  scratch_.reset();
  return scratch_;
}

// The copies are CudaMemory's (the same stream).
void CudaOps::upload(void* device_dst, const void* host_src, std::size_t bytes) {
  memory_->to_device(device_dst, host_src, bytes);
}

void CudaOps::download(void* host_dst, const void* device_src, std::size_t bytes) {
  memory_->to_host(host_dst, device_src, bytes);
}

void CudaOps::synchronize() { memory_->synchronize(); }

// ---- normalization and pointwise ----------------------------------------------------------

void CudaOps::layernorm_forward(float* y, float* mean, float* rstd, const float* x,
                                const float* w, const float* b, int n, int c) {
  OpScope timed(timer_.get(), "layernorm_forward");
  launch_layernorm_forward(stream_, y, mean, rstd, x, w, b, n, c);
}

void CudaOps::layernorm_backward(float* dx, float* dw, float* db, const float* dy,
                                 const float* x, const float* w, const float* mean,
                                 const float* rstd, int n, int c) {
  OpScope timed(timer_.get(), "layernorm_backward");
  if (n <= 0 || c <= 0) return;
  const std::size_t floats = std::size_t(layernorm_partial_floats(n, c));
  float* partial = scratch(aligned_bytes(floats * sizeof(float))).alloc_n<float>(floats);
  launch_layernorm_backward(stream_, dx, dw, db, dy, x, w, mean, rstd, n, c, partial);
}

void CudaOps::rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int n,
                              int c, float eps) {
  OpScope timed(timer_.get(), "rmsnorm_forward");
  launch_rmsnorm_forward(stream_, y, rstd, x, w, n, c, eps);
}

void CudaOps::rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x,
                               const float* w, const float* rstd, int n, int c) {
  OpScope timed(timer_.get(), "rmsnorm_backward");
  if (n <= 0 || c <= 0) return;
  const std::size_t floats = std::size_t(rmsnorm_partial_floats(n, c));
  float* partial = scratch(aligned_bytes(floats * sizeof(float))).alloc_n<float>(floats);
  launch_rmsnorm_backward(stream_, dx, dw, dy, x, w, rstd, n, c, partial);
}

void CudaOps::rope_forward(float* x, int b, int t, int ld, int heads, int hs, int pos0,
                           float theta) {
  OpScope timed(timer_.get(), "rope_forward");
  TRIDENT_CHECK(hs % 2 == 0, "rope: head size must be even, got ", hs);
  launch_rope(stream_, x, b, t, ld, heads, hs, pos0, theta, 1.0f);
}

void CudaOps::rope_backward(float* dx, int b, int t, int ld, int heads, int hs, int pos0,
                            float theta) {
  OpScope timed(timer_.get(), "rope_backward");
  TRIDENT_CHECK(hs % 2 == 0, "rope: head size must be even, got ", hs);
  launch_rope(stream_, dx, b, t, ld, heads, hs, pos0, theta, -1.0f);
}

void CudaOps::swiglu_forward(float* y, const float* gu, int n, int f) {
  OpScope timed(timer_.get(), "swiglu_forward");
  launch_swiglu_forward(stream_, y, gu, n, f);
}

void CudaOps::swiglu_backward(float* dgu, const float* gu, const float* dy, int n, int f) {
  OpScope timed(timer_.get(), "swiglu_backward");
  launch_swiglu_backward(stream_, dgu, gu, dy, n, f);
}

void CudaOps::attention_decode(float* out, float* scratch, const float* q, const float* k,
                               const float* v, int b, int s, int nh, int nkv, int hs,
                               std::int64_t ld_q, std::int64_t ld_kv, std::int64_t kv_batch,
                               std::int64_t ld_o) {
  OpScope timed(timer_.get(), "attention_decode");
  TRIDENT_CHECK(nkv >= 1 && nh % nkv == 0, "attention_decode: ", nh, " query heads over ", nkv,
                " kv heads");
  launch_attention_decode(stream_, out, scratch, q, k, v, b, s, nh, nkv, hs, ld_q, ld_kv,
                          kv_batch, ld_o);
}

void CudaOps::gelu_forward(float* y, const float* x, std::int64_t n) {
  OpScope timed(timer_.get(), "gelu_forward");
  launch_gelu_forward(stream_, y, x, n);
}

void CudaOps::gelu_backward(float* dx, const float* x, const float* dy, std::int64_t n) {
  OpScope timed(timer_.get(), "gelu_backward");
  launch_gelu_backward(stream_, dx, x, dy, n);
}

void CudaOps::add(float* y, const float* a, const float* b, std::int64_t n) {
  OpScope timed(timer_.get(), "add");
  note_write(y, n * std::int64_t(sizeof(float)));
  launch_add(stream_, y, a, b, n);
}

void CudaOps::scale(float* x, float alpha, std::int64_t n) {
  OpScope timed(timer_.get(), "scale");
  note_write(x, n * std::int64_t(sizeof(float)));
  launch_scale(stream_, x, alpha, n);
}

void CudaOps::fill(float* x, float value, std::int64_t n) {
  note_write(x, n * std::int64_t(sizeof(float)));
  launch_fill(stream_, x, value, n);
}

void CudaOps::copy(float* dst, const float* src, std::int64_t n) {
  OpScope timed(timer_.get(), "scale");
  if (n <= 0 || dst == src) return;
  note_write(dst, n * std::int64_t(sizeof(float)));
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, std::size_t(n) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream_));
}

void CudaOps::copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                        std::int64_t rows, std::int64_t width) {
  OpScope timed(timer_.get(), "scale");
  if (rows <= 0 || width <= 0) return;
  note_write(dst, ((rows - 1) * ld_dst + width) * std::int64_t(sizeof(float)));
  const std::size_t f = sizeof(float);
  TRIDENT_CUDA_CHECK(cudaMemcpy2DAsync(dst, std::size_t(ld_dst) * f, src, std::size_t(ld_src) * f,
                                       std::size_t(width) * f, std::size_t(rows),
                                       cudaMemcpyDeviceToDevice, stream_));
}

void CudaOps::to_bf16(std::uint16_t* dst, const float* src, std::int64_t n) {
  OpScope timed(timer_.get(), "to_bf16");
  launch_to_bf16(stream_, dst, src, 1, n, n);
}

void CudaOps::from_bf16(float* dst, const std::uint16_t* src, std::int64_t n) {
  OpScope timed(timer_.get(), "from_bf16");
  note_write(dst, n * std::int64_t(sizeof(float)));
  launch_from_bf16(stream_, dst, src, n);
}

double CudaOps::sum_squares(const float* x, std::int64_t n) {
  OpScope timed(timer_.get(), "sum_squares");
  launch_sum_squares(stream_, sum_result_, sum_partial_, x, n);
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host_result_, sum_result_, sizeof(double),
                                     cudaMemcpyDeviceToHost, stream_));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *host_result_;
}

void CudaOps::add_loss(const float* loss, int n) {
  OpScope timed(timer_.get(), "add_loss");
  launch_loss_add(stream_, loss_total_, loss, n);
}

double CudaOps::take_loss() {
  OpScope timed(timer_.get(), "take_loss");
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host_result_, loss_total_, sizeof(double),
                                     cudaMemcpyDeviceToHost, stream_));
  TRIDENT_CUDA_CHECK(cudaMemsetAsync(loss_total_, 0, sizeof(double), stream_));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *host_result_;
}

// ---- embeddings ---------------------------------------------------------------------------

void CudaOps::embedding_forward(float* x, const std::int32_t* tokens, const float* wte, int n,
                                int c, int vocab_start, int v) {
  OpScope timed(timer_.get(), "embedding_forward");
  launch_embedding_forward(stream_, x, tokens, wte, n, c, vocab_start, v);
}

void CudaOps::embedding_backward(float* dwte, const float* dx, const std::int32_t* tokens, int n,
                                 int c, int vocab_start, int v) {
  OpScope timed(timer_.get(), "embedding_backward");
  // Grouped by row in scratch (deterministic); the baseline keeps the atomicAdd scatter.
  int* sort = nullptr;
  if (!baseline_ && n > 0 && v > 0) {
    const std::size_t bytes = std::size_t(embedding_backward_scratch_ints(n, v)) * sizeof(int);
    sort = static_cast<int*>(scratch(aligned_bytes(bytes)).alloc(bytes));
  }
  launch_embedding_backward(stream_, dwte, dx, tokens, n, c, vocab_start, v, sort);
}

void CudaOps::position_forward(float* x, const float* wpe, int b, int t, int c) {
  OpScope timed(timer_.get(), "position_forward");
  launch_position_forward(stream_, x, wpe, b, t, c);
}

void CudaOps::position_backward(float* dwpe, const float* dx, int b, int t, int c) {
  OpScope timed(timer_.get(), "position_backward");
  launch_position_backward(stream_, dwpe, dx, b, t, c);
}

// ---- softmax cross-entropy ----------------------------------------------------------------

void CudaOps::xent_row_max(float* row_max, const float* logits, int n, int ld, int v_valid) {
  OpScope timed(timer_.get(), "xent_row_max");
  launch_xent_row_max(stream_, row_max, logits, n, ld, v_valid);
}

void CudaOps::xent_sumexp(float* sumexp, float* target_logit, const float* logits,
                          const float* row_max, const std::int32_t* targets, int n, int ld,
                          int v_valid, int vocab_start) {
  OpScope timed(timer_.get(), "xent_sumexp");
  launch_xent_sumexp(stream_, sumexp, target_logit, logits, row_max, targets, n, ld, v_valid,
                     vocab_start);
}

void CudaOps::xent_loss(float* loss, const float* row_max, const float* sumexp,
                        const float* target_logit, int n) {
  OpScope timed(timer_.get(), "xent_loss");
  launch_xent_loss(stream_, loss, row_max, sumexp, target_logit, n);
}

void CudaOps::xent_backward(float* logits, const float* row_max, const float* sumexp,
                            const std::int32_t* targets, int n, int ld, int v_valid,
                            int vocab_start, float scale) {
  OpScope timed(timer_.get(), "xent_backward");
  launch_xent_backward(stream_, logits, row_max, sumexp, targets, n, ld, v_valid, vocab_start,
                       scale);
}

void CudaOps::xent_shard_stats(float* row_max, float* sumexp, float* target_logit,
                               const float* logits, const std::int32_t* targets, int n, int ld,
                               int v_valid, int vocab_start) {
  OpScope timed(timer_.get(), "xent_shard_stats");
  if (baseline_) {
    Ops::xent_shard_stats(row_max, sumexp, target_logit, logits, targets, n, ld, v_valid,
                          vocab_start);
    return;
  }
  launch_xent_forward(stream_, nullptr, row_max, sumexp, target_logit, logits, targets, n, ld,
                      v_valid, vocab_start);
}

void CudaOps::xent_rescale_sumexp(float* sumexp, const float* shard_max, const float* row_max,
                                  int n) {
  OpScope timed(timer_.get(), "xent_rescale_sumexp");
  launch_xent_rescale_sumexp(stream_, sumexp, shard_max, row_max, n);
}

void CudaOps::xent_forward(float* loss, float* row_max, float* sumexp, float* target_logit,
                           const float* logits, const std::int32_t* targets, int n, int ld,
                           int v_valid, int vocab_start) {
  OpScope timed(timer_.get(), "xent_forward");
  if (baseline_) {  // the three passes (Ops' default), for before/after timings
    Ops::xent_forward(loss, row_max, sumexp, target_logit, logits, targets, n, ld, v_valid,
                      vocab_start);
    return;
  }
  launch_xent_forward(stream_, loss, row_max, sumexp, target_logit, logits, targets, n, ld,
                      v_valid, vocab_start);
}

// ---- optimizer ----------------------------------------------------------------------------

void CudaOps::adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float bc1,
                    float bc2) {
  OpScope timed(timer_.get(), "adamw");
  note_write(p, n * std::int64_t(sizeof(float)));
  const AdamWScalars s = adamw_scalars(lr, beta1, beta2, weight_decay, bc1, bc2);
  launch_adamw(stream_, p, g, m, v, n, beta1, beta2, s.omb1, s.omb2, eps, s.decay, s.step,
               s.bc2_sqrt);
}

const void* CudaOps::device_table(DeviceTable& t, const void* data, std::size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(data);
  if (t.device && t.host.size() == bytes && std::equal(b, b + bytes, t.host.begin()))
    return t.device;
  if (bytes > t.capacity) {
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued kernel may read the old one
    if (t.device) memory_->release(t.device);
    t.device = nullptr;
    t.capacity = 0;
    t.device = memory_->allocate(bytes);
    t.capacity = bytes;
  }
  memory_->to_device(t.device, data, bytes);  // after the queued work; complete on return
  t.host.assign(b, b + bytes);
  return t.device;
}

void CudaOps::sum_squares_spans(const std::vector<Span>& spans, double* sums) {
  if (baseline_) return Ops::sum_squares_spans(spans, sums);  // a launch pair and a sync each
  if (spans.empty()) return;
  OpScope timed(timer_.get(), "sum_squares_spans");
  const std::size_t count = spans.size();
  std::vector<SumSquaresSpan> table(count);
  std::int64_t blocks = 0;
  for (std::size_t i = 0; i < count; i++) {
    table[i] = {spans[i].x, spans[i].n, blocks, sum_squares_span_blocks(spans[i].n)};
    blocks += table[i].blocks;
  }
  const auto* device = static_cast<const SumSquaresSpan*>(
      device_table(sum_spans_table_, table.data(), count * sizeof(SumSquaresSpan)));
  // The partials and sums live for this call only (it waits for them): the op's scratch.
  BumpBlock& block = scratch(aligned_bytes(std::size_t(blocks) * sizeof(double)) +
                             aligned_bytes(count * sizeof(double)));
  double* partial = block.alloc_n<double>(std::size_t(blocks));
  double* device_sums = block.alloc_n<double>(count);
  launch_sum_squares_spans(stream_, device_sums, partial, device, int(count), blocks);
  if (host_sums_capacity_ < count) {
    if (host_sums_) TRIDENT_CUDA_CHECK(cudaFreeHost(host_sums_));
    host_sums_ = nullptr;
    host_sums_capacity_ = 0;
    TRIDENT_CUDA_CHECK(
        cudaMallocHost(reinterpret_cast<void**>(&host_sums_), count * sizeof(double)));
    host_sums_capacity_ = count;
  }
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host_sums_, device_sums, count * sizeof(double),
                                     cudaMemcpyDeviceToHost, stream_));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::copy(host_sums_, host_sums_ + count, sums);
}

void CudaOps::adamw_segments(const std::vector<AdamWSegment>& segments, float grad_scale,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             float bc1, float bc2) {
  if (baseline_)  // scale and adamw launches per segment, the cache stale after
    return Ops::adamw_segments(segments, grad_scale, lr, beta1, beta2, eps, weight_decay, bc1,
                               bc2);
  OpScope timed(timer_.get(), "adamw_segments");
  // adamw's scalars with the segment's weight decay (only `decay` depends on it).
  const AdamWScalars on = adamw_scalars(lr, beta1, beta2, weight_decay, bc1, bc2);
  const AdamWScalars off = adamw_scalars(lr, beta1, beta2, 0.0f, bc1, bc2);
  std::vector<AdamWSegmentEntry> table;
  table.reserve(segments.size());
  std::int64_t chunks = 0;
  for (const AdamWSegment& s : segments) {
    if (s.n <= 0) continue;
    // Inside the weight cache's range, the kernel writes the bf16 copy of what it updates:
    // the cache stays fresh if it was. Elsewhere (or across the range's edge) a plain write.
    std::uint16_t* p16 = nullptr;
    if (weights16_ && s.p >= weights_ && reinterpret_cast<const char*>(s.p + s.n) <= weights_end_)
      p16 = weights16_ + (s.p - weights_);
    else
      note_write(s.p, s.n * std::int64_t(sizeof(float)));
    table.push_back({s.p, s.g, s.m, s.v, p16, s.n, chunks, s.decay ? 1 : 0});
    chunks += adamw_chunks(s.n);
  }
  if (table.empty()) return;
  const auto* device = static_cast<const AdamWSegmentEntry*>(
      device_table(adamw_table_, table.data(), table.size() * sizeof(AdamWSegmentEntry)));
  launch_adamw_segments(stream_, device, int(table.size()), chunks, grad_scale, beta1, beta2,
                        on.omb1, on.omb2, eps, on.decay, off.decay, on.step, on.bc2_sqrt);
}

}  // namespace cuda

// ---- public entry points (trident/ops/cuda.hpp) --------------------------------------------

std::unique_ptr<Ops> make_cuda_ops(Precision precision, std::size_t arena_bytes,
                                   int ranks_per_device) {
  TRIDENT_CHECK(cuda_device_count() > 0, "cuda: no CUDA GPU is visible to this process");
  return std::make_unique<cuda::CudaOps>(precision, arena_bytes, ranks_per_device);
}

std::size_t cuda_default_arena_bytes(int ranks_per_device) {
  TRIDENT_CHECK(cuda_device_count() > 0, "cuda: no CUDA GPU is visible to this process");
  return cuda::default_arena_bytes(ranks_per_device);
}

namespace {
cuda::CudaOps& as_cuda(Ops& ops, const char* what) {
  auto* c = dynamic_cast<cuda::CudaOps*>(&ops);
  TRIDENT_CHECK(c != nullptr, what, ": needs the CUDA backend, got ", ops.name());
  return *c;
}
}  // namespace

void cuda_upload(Ops& ops, void* device_dst, const void* host_src, std::size_t bytes) {
  as_cuda(ops, "cuda_upload").upload(device_dst, host_src, bytes);
}

void cuda_download(Ops& ops, void* host_dst, const void* device_src, std::size_t bytes) {
  as_cuda(ops, "cuda_download").download(host_dst, device_src, bytes);
}

void cuda_synchronize(Ops& ops) { as_cuda(ops, "cuda_synchronize").synchronize(); }

}  // namespace trident::ops
