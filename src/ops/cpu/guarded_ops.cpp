// ops/cpu/guarded_ops.cpp — the backend behind runtime.device = "cpu-guarded": the CPU kernels
// on "device memory" that host code cannot touch, so that a machine without a GPU runs every
// host <-> device crossing the CUDA backend needs and catches each one that is missing.
//   * The device memory is one mmap'ed arena, PROT_NONE except while an op (or a to_host /
//     to_device copy) runs: host code that reads or writes a device buffer directly (an
//     unstaged MPI call, a loop over the loss, a checkpoint written from the parameters)
//     dies with SIGSEGV at that line.
//   * Every pointer an op is given must be in the arena (or null): a host pointer handed to a
//     device kernel (tokens not uploaded, a host scratch buffer) is an Error naming the op.
// Results are bit-identical to "cpu" (the same kernels), which is what the tests compare.
// MPI is told the memory is not CUDA-aware, so everything goes through host staging.
// defines: trident::ops::make_guarded_ops
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>

#include "cpu_ops.hpp"
#include "trident/core/arena.hpp"
#include "trident/core/device_memory.hpp"
#include "trident/core/error.hpp"

namespace trident::ops {

namespace {

class GuardedMemory final : public DeviceMemory {
 public:
  explicit GuardedMemory(std::size_t bytes) : arena_(bytes) {
    // Reserved, not committed: pages exist once an op writes them.
    void* p = mmap(nullptr, arena_.capacity(), PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TRIDENT_CHECK(p != MAP_FAILED, "cpu-guarded: cannot reserve ", arena_.capacity(),
                  " bytes of address space: ", std::strerror(errno));
    base_ = static_cast<char*>(p);
  }
  ~GuardedMemory() override { munmap(base_, arena_.capacity()); }
  GuardedMemory(const GuardedMemory&) = delete;
  GuardedMemory& operator=(const GuardedMemory&) = delete;

  const char* where() const override { return "cpu-guarded"; }
  void* allocate(std::size_t bytes) override {
    return base_ + arena_.allocate(bytes, "cpu-guarded device arena");
  }
  void release(void* p) noexcept override {
    if (p) arena_.release(std::size_t(static_cast<char*>(p) - base_));
  }
  bool holds(const void* p) const override {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + arena_.capacity();
  }
  std::size_t capacity() const override { return arena_.capacity(); }
  std::size_t used() const override { return arena_.used(); }
  std::size_t peak() const override { return arena_.peak(); }

  void to_device(void* dst, const void* src, std::size_t bytes) override {
    TRIDENT_CHECK(bytes == 0 || (holds(dst) && !holds(src)),
                  "cpu-guarded: to_device needs a device destination and a host source");
    Open open(*this);
    std::memcpy(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    TRIDENT_CHECK(bytes == 0 || (holds(src) && !holds(dst)),
                  "cpu-guarded: to_host needs a device source and a host destination");
    Open open(*this);
    std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}
  // The copy is made at once, but each ticket reads "not yet" on its first query, so that
  // callers' waiting paths run too (a GPU's staging stream lands copies later).
  std::uint64_t to_host_async(void* dst, const void* src, std::size_t bytes) override {
    to_host(dst, src, bytes);
    return ++tickets_;
  }
  bool copy_done(std::uint64_t ticket) override { return !asked_once_.insert(ticket).second; }
  void wait_copy(std::uint64_t ticket) override { asked_once_.insert(ticket); }
  void* allocate_host(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release_host(void* p) noexcept override { std::free(p); }

  // The arena is readable and writable while an Open lives (nested: the outermost counts).
  class Open {
   public:
    explicit Open(GuardedMemory& m) : m_(m) {
      if (m_.depth_++ == 0) m_.protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      if (--m_.depth_ == 0) m_.protect(PROT_NONE);
    }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    GuardedMemory& m_;
  };

 private:
  void protect(int prot) {
    if (arena_.used() == 0) return;
    // Only the part handed out so far: less page-table work per op.
    const std::size_t page = 4096, span = (arena_.peak() + page - 1) / page * page;
    if (mprotect(base_, span, prot) != 0) std::abort();  // cannot happen on our own mapping
  }

  ArenaAllocator arena_;
  char* base_ = nullptr;
  int depth_ = 0;
  std::uint64_t tickets_ = 0;
  std::set<std::uint64_t> asked_once_;
};

class GuardedOps final : public Ops {
 public:
  GuardedOps(int threads, std::size_t arena_bytes)
      : inner_(make_cpu_ops(threads)), mem_(arena_bytes) {}

  Device device() const override { return Device::cuda; }
  std::string name() const override { return "cpu-guarded (" + inner_->name() + ")"; }
  DeviceMemory* memory() override { return &mem_; }

  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    on("gemm", {a, b, c}), inner_->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void linear_forward(float* y, const float* x, const float* w, const float* b, int n, int in,
                      int out) override {
    on("linear_forward", {y, x, w, b}), inner_->linear_forward(y, x, w, b, n, in, out);
  }
  void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                       const float* w, int n, int in, int out) override {
    on("linear_backward", {dx, dw, db, dy, x, w}),
        inner_->linear_backward(dx, dw, db, dy, x, w, n, in, out);
  }
  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int n, int c) override {
    on("layernorm_forward", {y, mean, rstd, x, w, b}),
        inner_->layernorm_forward(y, mean, rstd, x, w, b, n, c);
  }
  void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const float* mean, const float* rstd, int n,
                          int c) override {
    on("layernorm_backward", {dx, dw, db, dy, x, w, mean, rstd}),
        inner_->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, n, c);
  }
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int n, int c,
                       float eps) override {
    on("rmsnorm_forward", {y, rstd, x, w}), inner_->rmsnorm_forward(y, rstd, x, w, n, c, eps);
  }
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int n, int c) override {
    on("rmsnorm_backward", {dx, dw, dy, x, w, rstd}),
        inner_->rmsnorm_backward(dx, dw, dy, x, w, rstd, n, c);
  }
  void rope_forward(float* x, int b, int t, int ld, int heads, int hs, int pos0,
                    float theta) override {
    on("rope_forward", {x}), inner_->rope_forward(x, b, t, ld, heads, hs, pos0, theta);
  }
  void rope_backward(float* dx, int b, int t, int ld, int heads, int hs, int pos0,
                     float theta) override {
    on("rope_backward", {dx}), inner_->rope_backward(dx, b, t, ld, heads, hs, pos0, theta);
  }
  void swiglu_forward(float* y, const float* gu, int n, int f) override {
    on("swiglu_forward", {y, gu}), inner_->swiglu_forward(y, gu, n, f);
  }
  void swiglu_backward(float* dgu, const float* gu, const float* dy, int n, int f) override {
    on("swiglu_backward", {dgu, gu, dy}), inner_->swiglu_backward(dgu, gu, dy, n, f);
  }
  void gelu_forward(float* y, const float* x, std::int64_t n) override {
    on("gelu_forward", {y, x}), inner_->gelu_forward(y, x, n);
  }
  void gelu_backward(float* dx, const float* x, const float* dy, std::int64_t n) override {
    on("gelu_backward", {dx, x, dy}), inner_->gelu_backward(dx, x, dy, n);
  }
  void add(float* y, const float* a, const float* b, std::int64_t n) override {
    on("add", {y, a, b}), inner_->add(y, a, b, n);
  }
  void scale(float* x, float alpha, std::int64_t n) override {
    on("scale", {x}), inner_->scale(x, alpha, n);
  }
  double sum_squares(const float* x, std::int64_t n) override {
    GuardedMemory::Open open = on("sum_squares", {x});
    return inner_->sum_squares(x, n);
  }
  void fill(float* x, float value, std::int64_t n) override {
    on("fill", {x}), inner_->fill(x, value, n);
  }
  void copy(float* dst, const float* src, std::int64_t n) override {
    on("copy", {dst, src}), inner_->copy(dst, src, n);
  }
  void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                 std::int64_t rows, std::int64_t width) override {
    on("copy_rows", {dst, src}), inner_->copy_rows(dst, ld_dst, src, ld_src, rows, width);
  }
  void to_bf16(std::uint16_t* dst, const float* src, std::int64_t n) override {
    on("to_bf16", {dst, src}), inner_->to_bf16(dst, src, n);
  }
  void from_bf16(float* dst, const std::uint16_t* src, std::int64_t n) override {
    on("from_bf16", {dst, src}), inner_->from_bf16(dst, src, n);
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionShape& s) override {
    on("attention_forward", {out, lse, q, k, v}), inner_->attention_forward(out, lse, q, k, v, s);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const AttentionShape& s) override {
    on("attention_backward", {dq, dk, dv, dout, out, lse, q, k, v}),
        inner_->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s);
  }
  void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                       const AttentionShape& s) override {
    on("attention_merge", {out, lse, out_part, lse_part}),
        inner_->attention_merge(out, lse, out_part, lse_part, s);
  }
  void attention_naive_forward(float* out, float* att, const float* qkv, int b, int t, int c,
                         int nh) override {
    on("attention_naive_forward", {out, att, qkv}), inner_->attention_naive_forward(out, att, qkv, b, t, c, nh);
  }
  void attention_naive_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int b, int t, int c, int nh) override {
    on("attention_naive_backward", {dqkv, datt, dout, qkv, att}),
        inner_->attention_naive_backward(dqkv, datt, dout, qkv, att, b, t, c, nh);
  }
  void attention_decode(float* out, float* scratch, const float* q, const float* k,
                        const float* v, int b, int s, int nh, int nkv, int hs, std::int64_t ld_q,
                        std::int64_t ld_kv, std::int64_t kv_batch, std::int64_t ld_o) override {
    on("attention_decode", {out, scratch, q, k, v}),
        inner_->attention_decode(out, scratch, q, k, v, b, s, nh, nkv, hs, ld_q, ld_kv, kv_batch,
                                 ld_o);
  }
  void embedding_forward(float* x, const std::int32_t* tokens, const float* wte, int n, int c,
                         int vocab_start, int v) override {
    on("embedding_forward", {x, tokens, wte}),
        inner_->embedding_forward(x, tokens, wte, n, c, vocab_start, v);
  }
  void embedding_backward(float* dwte, const float* dx, const std::int32_t* tokens, int n,
                          int c, int vocab_start, int v) override {
    on("embedding_backward", {dwte, dx, tokens}),
        inner_->embedding_backward(dwte, dx, tokens, n, c, vocab_start, v);
  }
  void position_forward(float* x, const float* wpe, int b, int t, int c) override {
    on("position_forward", {x, wpe}), inner_->position_forward(x, wpe, b, t, c);
  }
  void position_backward(float* dwpe, const float* dx, int b, int t, int c) override {
    on("position_backward", {dwpe, dx}), inner_->position_backward(dwpe, dx, b, t, c);
  }
  void xent_row_max(float* row_max, const float* logits, int n, int ld, int v_valid) override {
    on("xent_row_max", {row_max, logits}), inner_->xent_row_max(row_max, logits, n, ld, v_valid);
  }
  void xent_sumexp(float* sumexp, float* target_logit, const float* logits,
                   const float* row_max, const std::int32_t* targets, int n, int ld, int v_valid,
                   int vocab_start) override {
    on("xent_sumexp", {sumexp, target_logit, logits, row_max, targets}),
        inner_->xent_sumexp(sumexp, target_logit, logits, row_max, targets, n, ld, v_valid,
                            vocab_start);
  }
  void xent_rescale_sumexp(float* sumexp, const float* shard_max, const float* row_max,
                           int n) override {
    on("xent_rescale_sumexp", {sumexp, shard_max, row_max}),
        inner_->xent_rescale_sumexp(sumexp, shard_max, row_max, n);
  }
  void xent_loss(float* loss, const float* row_max, const float* sumexp,
                 const float* target_logit, int n) override {
    on("xent_loss", {loss, row_max, sumexp, target_logit}),
        inner_->xent_loss(loss, row_max, sumexp, target_logit, n);
  }
  void xent_backward(float* logits, const float* row_max, const float* sumexp,
                     const std::int32_t* targets, int n, int ld, int v_valid, int vocab_start,
                     float scale) override {
    on("xent_backward", {logits, row_max, sumexp, targets}),
        inner_->xent_backward(logits, row_max, sumexp, targets, n, ld, v_valid, vocab_start,
                              scale);
  }
  void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float bc1, float bc2) override {
    on("adamw", {p, g, m, v}),
        inner_->adamw(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
  }

 private:
  // Checks that every pointer is device memory, then opens the arena for the op's length
  // (the returned Open lives to the end of the full expression that calls the kernel).
  GuardedMemory::Open on(const char* op, std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
      TRIDENT_CHECK(p == nullptr || mem_.holds(p), "cpu-guarded: ", op,
                    " was given host memory (", p, ") where device memory belongs");
    return GuardedMemory::Open(mem_);
  }

  std::unique_ptr<Ops> inner_;
  GuardedMemory mem_;
};

}  // namespace

std::unique_ptr<Ops> make_guarded_ops(int threads, std::size_t arena_bytes) {
  return std::make_unique<GuardedOps>(threads, arena_bytes);
}

}  // namespace trident::ops
