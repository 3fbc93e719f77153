// ops/cuda/fused_block.cpp — the coarse GPT-2 block (Ops::gpt2_block_forward / backward) on
// bf16 activations: under bf16 products, not the baseline, TRIDENT_CUDA_FUSED_BLOCK not 0, and
// with a stash the model carved for it (Gpt2BlockStash::bf16). Otherwise Ops' composition.
// defines: CudaOps::gpt2_block_stash_bf16, gpt2_block_forward, gpt2_block_backward,
//          gpt2_block_backward_weights, gpt2_block_recompute, say_lt_refusal, bias_lt_bf16_bias, block_linear,
//          block_weight16, gemm_rm16_to16, llama_block_forward, llama_block_backward,
//          llama_block_backward_weights, llama_block_recompute
//
// Inside the block, every activation a product or attention reads is bf16, written so by its
// producer: the LayerNorms write bf16 (fused_block.cu), c_attn and c_fc write bf16 through
// cuBLASLt (bias in the epilogue), attention reads and writes bf16, GELU reads and writes bf16
// (in c_fc's cuBLASLt epilogue, GELU_AUX_BIAS, writing fch as its aux; else own kernel).
// The residual stream stays fp32: the c_projs add it in the product (cuBLASLt, C = residual,
// beta = 1, fp32 D), so res2 and out are written once. The stash (ln1, qkv, atty, ln2, fch,
// fch_gelu: bf16; res2, the statistics, lse: fp32) is what the forward wrote; the backward's
// products read it as it is. The backward converts each residual gradient once (with the
// c_proj bias gradient in the same read), writes the gradients at the products' outputs as
// bf16 (the GELU backward and the c_fc bias gradient in the MLP c_proj's product, cuBLASLt's
// DGELU_BGRAD, else a GELU backward kernel with the column sums; c_attn's bias gradient summed
// from bf16), and the LayerNorm input gradients in fp32 (the residual stream's).
// TRIDENT_CUDA_GELU_EPILOGUE=0: the GELU kernels (docs/gpu.md, step 5).
// Bytes per layer, GPT-2 small (N = 8192, C = 768): docs/gpu.md, "The fused GPT-2 block".
//
// Context parallelism (the shape's attention, Ops::BlockAttention: the model's ring or
// Ulysses): block_attention_forward / backward, which every attention call of both blocks goes
// through, widen this rank's bf16 [q k v] (rotated, for Llama; RoPE per run of the shape's
// slice), atty and datty to fp32 copies in hook_block_, call the hook, and narrow its fp32 out
// (dq dk dv) to the bf16 atty (dqkv) the products read.
//
// Llama's block the same way (same knob, same stash rule): the RMSNorms write bf16, [q k v] and
// [gate up] write bf16 (no bias: no epilogue; weights [out, in]: A transposed), RoPE rotates the
// bf16 q and k in place (fused_block.cu; its backward the bf16 dq and dk), attention_forward_bf16
// takes the grouped-query shape, SwiGLU reads and writes bf16, o and down add the residual as
// C. The backward converts each residual gradient once (no bias gradients) and runs the RMSNorm
// backward on the fp32 residual stream. Both blocks take TP and SP the same way (BlockTp);
// Llama's with its kv heads split over TP or replicated (n_kv_head < tp: every rank computes
// them all, its query heads read one, the others' gradients are zero here).
//
// The split backward (zero-bubble B and W; Ops::BlockWStash): B computes everything but c_fc's
// and c_attn's ([gate up]'s, [q k v]'s) weight gradients and copies their bf16 output
// gradients, which it computed in the scratch as the whole backward does, to the W stash
// (the layer's own dead bf16 fch and qkv, or the model's separate bf16 stash under full
// recompute; a copy, not the producer's output: cuBLASLt's DGELU epilogue reads fch as aux and
// attention's backward reads qkv while they are written). The bias gradients stay in B (the
// DGELU_BGRAD epilogue, the column sums). W runs the two weight-gradient products the whole
// backward would have run, on the same bf16 operands: the split's gradients are the whole
// backward's.
//
// Selective recompute (Gpt2BlockStash::recomputed): atty, lse and fch_gelu are one bf16 copy
// (lse fp32) shared by the layers; gpt2_block_recompute writes them again from the layer's
// bf16 qkv and fch before its backward, with the forward's own calls: attention_forward_bf16
// (the same plan on the same operands) and the GELU kernel on the bf16 fch. cuBLASLt's GELU
// epilogue takes GELU of the fp32 accumulator, not of the rounded fch, so a recomputed stash's
// forward runs c_fc with the bias epilogue and the GELU kernel: the recompute is bit-equal.
// Llama's (llama_block_recompute) the same way: attention_forward_bf16 on the layer's rotated
// bf16 qkv (the forward's shape and pointers: this rank's heads, kv columns and kv_head0 at any
// TP; no collectives) and the SwiGLU kernel on its bf16 [gate up]. SwiGLU has no epilogue form
// (the forward runs the same kernel), so a recomputed stash's forward is the usual one.
#include <algorithm>
#include <cstdio>
#include <string>

#include "check.hpp"
#include "cuda_ops.hpp"
#include "kernels.hpp"
#include "plans.hpp"
#include "trident/core/error.hpp"

namespace trident::ops::cuda {

namespace {

cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

std::uint16_t* bf(float* p) { return reinterpret_cast<std::uint16_t*>(p); }

// The split backward's B: n bf16 output gradients into the W stash (stream-ordered after their
// producer and after the last read of what the stash may be, the layer's fch or qkv).
void keep_bf16(cudaStream_t stream, OpTimer* timer, float* dst, const std::uint16_t* src,
               std::int64_t n) {
  OpScope timed(timer, "block_backward copy_bf16");
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, std::size_t(n) * 2, cudaMemcpyDeviceToDevice,
                                     stream));
}

// The bf16 blocks' tensor (and sequence) parallelism, GPT-2's and Llama's alike: the shape's
// collectives between the products (tp null: TP 1, each step the identity). Forward: a norm
// writes this rank's bf16 rows (norm_rows), under SP every rank's all-gathered as bytes (bf16
// pairs moved as floats: a gather does no arithmetic). A row-parallel product writes an fp32
// partial (partial_of): without SP it holds the residual (cuBLASLt's C) and the bias on TP
// rank 0 only (beta 0 elsewhere), so that the sum over TP (leave: an allreduce) adds them
// once; under SP the partial (full rows, the bias on rank 0) is reduce-scattered into the
// local rows, then the residual added. Backward: the residual gradient of every row (whole:
// dres itself without SP, else all-gathered); the norms' input gradients are fp32 partials of
// every row, summed (an allreduce, or under SP a reduce-scatter into the local rows).
struct BlockTp {
  Ops::BlockCollectives* tp;
  bool rank0, sp;
  std::int64_t local_n;  // the residual stream's floats here (local rows x C)

  float* partial_of(float* y) const { return tp ? tp->partial_of(y) : y; }
  const float* residual_in_product(const float* r) const { return rank0 && !sp ? r : nullptr; }
  const float* bias_in_product(const float* b) const { return rank0 ? b : nullptr; }
  void leave(Ops& ops, float* partial, float* y, const float* residual) const {
    if (!tp) return;
    tp->leave_forward(partial, y, local_n);
    if (sp) ops.add(y, y, residual, local_n);
  }
  std::uint16_t* norm_rows(float* full) const {
    return bf(tp ? tp->local_part(full, local_n / 2) : full);
  }
  void gather(float* full) const { if (sp) tp->enter_forward(full, local_n / 2); }
  const float* summed(float* partial) const {
    return tp ? tp->enter_backward(partial, local_n) : partial;
  }
  const float* whole(const float* d) const { return tp ? tp->leave_backward(d, local_n) : d; }
};

// op: the caller's name; n rows of which nr here; c channels.
BlockTp block_tp(const char* op, Ops::BlockCollectives* tp, int tp_rank, int n, int nr, int c) {
  const bool sp = nr != n;
  const std::int64_t local_n = std::int64_t(nr) * c;
  TRIDENT_CHECK(!sp || (tp && local_n % 2 == 0), op, ": the bf16 block under sequence "
                "parallelism needs its collectives and an even rows x channels");
  return {tp, tp_rank == 0, sp, local_n};
}

// Where attention finds q, k and v in a block's [q k v] rows: the shape (row stride ld_q), k
// at column k0, v at v0. GPT-2: q | k | v of Ca columns each. Llama: this rank's k (and v)
// columns after its Ca query columns, its heads reading from kv head kv_head0 on (kv heads
// split over TP, or all of them here: replicated, n_kv_head < tp).
struct QkvView {
  Ops::AttentionShape att;
  std::int64_t k0, v0;
};
QkvView qkv_view(const Ops::Gpt2BlockShape& s) {
  const int Ca = s.attn_c();
  return {attention_shape_qkv(s.b, s.t, Ca, s.nh), Ca, 2 * std::int64_t(Ca)};
}
QkvView qkv_view(const Ops::LlamaBlockShape& s) {
  const Ops::AttentionShape att = attention_shape_llama(s);
  const std::int64_t Ca = att.ld_o, kv = (att.ld_q - Ca) / 2;
  const std::int64_t k0 = Ca + std::int64_t(s.kv_head0) * att.hs;
  return {att, k0, k0 + kv};
}

}  // namespace

BumpBlock& CudaOps::hook_scratch(const AttentionShape& att) {
  const std::size_t rows = std::size_t(att.b) * std::size_t(att.t);
  const std::size_t bytes = 2 * aligned_bytes(rows * std::size_t(att.ld_q) * sizeof(float)) +
                            2 * aligned_bytes(rows * std::size_t(att.ld_o) * sizeof(float));
  if (bytes > hook_block_.capacity()) {
    // Ops queued earlier may still read the old block: wait for them before releasing it.
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (hook_block_.base()) memory_->release(hook_block_.base());
    hook_block_ = BumpBlock();
    void* p = nullptr;
    try {
      p = memory_->allocate(bytes);
    } catch (const Error& e) {
      fail("cuda: the fp32 copies of the bf16 block's attention under context parallelism "
           "need ", bytes, " bytes: ", e.what(),
           " (runtime's device arena must hold them besides the model's buffers)");
    }
    hook_block_ = BumpBlock(p, bytes);
  }
  hook_block_.reset();
  return hook_block_;
}

void CudaOps::block_attention_forward(BlockAttention* hook, const AttentionShape& att,
                                      std::int64_t k0, std::int64_t v0, std::uint16_t* atty,
                                      float* lse, const std::uint16_t* qkv) {
  if (!hook) return attention_forward_bf16(atty, lse, qkv, qkv + k0, qkv + v0, att);
  if (cp_bf16_ && hook->takes_bf16())  // the ring or Ulysses on the bf16 rows themselves
    return hook->forward_bf16(atty, lse, qkv, qkv + k0, qkv + v0, att);
  const std::int64_t n = std::int64_t(att.b) * att.t;
  BumpBlock& block = hook_scratch(att);
  float* qkv32 = block.alloc_n<float>(std::size_t(n * att.ld_q));
  block.alloc_n<float>(std::size_t(n * att.ld_q));  // the backward's dqkv
  float* out32 = block.alloc_n<float>(std::size_t(n * att.ld_o));
  {
    OpScope timed(timer_.get(), "block_forward attention_hook from_bf16");
    launch_from_bf16(stream_, qkv32, qkv, n * att.ld_q);
  }
  hook->forward(out32, lse, qkv32, qkv32 + k0, qkv32 + v0, att, cp_wire_bf16_);
  OpScope timed(timer_.get(), "block_forward attention_hook to_bf16");
  launch_to_bf16(stream_, atty, out32, n, att.ld_o, att.ld_o);
}

void CudaOps::block_attention_backward(BlockAttention* hook, const AttentionShape& att,
                                       std::int64_t k0, std::int64_t v0, std::uint16_t* dqkv,
                                       const std::uint16_t* datty, const std::uint16_t* atty,
                                       const float* lse, const std::uint16_t* qkv) {
  const std::int64_t n = std::int64_t(att.b) * att.t;
  // Columns no head of this rank reads (replicated kv heads, n_kv_head < tp): their gradients
  // are zero here (the k/v weights' gradients partial, summed over TP by the model).
  const bool unread = att.ld_q != std::int64_t(att.nh + 2 * att.nkv) * att.hs;
  if (!hook || (cp_bf16_ && hook->takes_bf16())) {
    if (unread) {
      OpScope timed(timer_.get(), "block_backward zero_bf16");
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, std::size_t(n * att.ld_q) * 2, stream_));
    }
    if (hook)
      return hook->backward_bf16(dqkv, dqkv + k0, dqkv + v0, datty, atty, lse, qkv, qkv + k0,
                                 qkv + v0, att);
    return attention_backward_bf16(dqkv, dqkv + k0, dqkv + v0, datty, atty, lse, qkv, qkv + k0,
                                   qkv + v0, att);
  }
  BumpBlock& block = hook_scratch(att);
  float* qkv32 = block.alloc_n<float>(std::size_t(n * att.ld_q));
  float* dqkv32 = block.alloc_n<float>(std::size_t(n * att.ld_q));
  float* atty32 = block.alloc_n<float>(std::size_t(n * att.ld_o));
  float* datty32 = block.alloc_n<float>(std::size_t(n * att.ld_o));
  {
    OpScope timed(timer_.get(), "block_backward attention_hook from_bf16");
    launch_from_bf16(stream_, qkv32, qkv, n * att.ld_q);
    launch_from_bf16(stream_, atty32, atty, n * att.ld_o);
    launch_from_bf16(stream_, datty32, datty, n * att.ld_o);
    if (unread) launch_fill(stream_, dqkv32, 0.0f, n * att.ld_q);
  }
  hook->backward(dqkv32, dqkv32 + k0, dqkv32 + v0, datty32, atty32, lse, qkv32, qkv32 + k0,
                 qkv32 + v0, att, cp_wire_bf16_);
  OpScope timed(timer_.get(), "block_backward attention_hook to_bf16");
  launch_to_bf16(stream_, dqkv, dqkv32, n, att.ld_q, att.ld_q);
}

void CudaOps::say_lt_refusal(LtRefusal what, int n, int in, int out) {
  if (lt_refusal_told_[int(what)]) return;
  lt_refusal_told_[int(what)] = true;
  if (what == LtRefusal::fp32_bias)
    std::fprintf(stderr, "cuBLASLt: an fp32 bias with bf16 D refused (n %d in %d out %d): the "
                 "bias in bf16\n", n, in, out);
  else if (what == LtRefusal::fp32_bias_grad)
    std::fprintf(stderr, "cuBLASLt DGELU_BGRAD: an fp32 bias gradient refused (n %d in %d out "
                 "%d): the bias gradient in bf16\n", n, in, out);
  else
    std::fprintf(stderr, "cuBLASLt GELU epilogue unavailable (%s, n %d in %d out %d: refused): "
                 "using trident's GELU kernel\n",
                 what == LtRefusal::gelu_backward ? "DGELU_BGRAD" : "GELU_AUX_BIAS", n,
                 in, out);
}

bool CudaOps::gpt2_block_stash_bf16() const {
  return precision_ == Precision::bf16 && !baseline_ && fused_block_;
}

bool CudaOps::bias_lt_bf16_bias(void* d, const void* x16, const void* w16, bool w_t,
                                const float* bias, int n, int in, int out, LtGelu gelu,
                                const void* aux) {
  const void* bias16 = bias ? cached_bf16(bias, 1, out, out) : nullptr;
  if (!bias16 || !bias_lt(d, true, nullptr, x16, w16, w_t, bias16, n, in, out, gelu, aux, nullptr,
                          true))
    return false;
  say_lt_refusal(LtRefusal::fp32_bias, n, in, out);
  return true;
}

const void* CudaOps::block_weight16(const float* w, int rows, int cols) {
  if (const void* w16 = cached_bf16(w, rows, cols, cols)) return w16;
  // No weight cache (TRIDENT_CUDA_WEIGHT_CACHE=0): converted here, read by the next product
  // only (the stream orders it before the scratch's next use).
  const std::size_t bytes = std::size_t(rows) * std::size_t(cols) * 2;
  void* w16 = scratch(aligned_bytes(bytes)).alloc(bytes);
  launch_to_bf16(stream_, w16, w, rows, cols, cols);
  return w16;
}

void CudaOps::gemm_rm16_to16(bool ta, bool tb, int m, int n, int k, const void* a16, int lda,
                             const void* b16, int ldb, void* c16, int ldc) {
  const ColMajor g = col_major(ta, tb, m, n, k, nullptr, lda, 0, nullptr, ldb, 0);
  // TRIDENT_CUDA_LT_TUNE (null when off and under the baseline): a tuned cuBLASLt plan
  if (lt_tune_ && gemm_lt16(g, 1.0f, b16, a16, 0.0f, c16, true, ldc)) return;
  const float one = 1.0f, zero = 0.0f;
  TRIDENT_CUBLAS_CHECK(cublasGemmEx(cublas_, op_of(g.trans1), op_of(g.trans2), g.m, g.n, g.k,
                                    &one, b16, CUDA_R_16BF, g.ld1, a16, CUDA_R_16BF, g.ld2,
                                    &zero, c16, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
}

void CudaOps::block_linear(void* d, bool d16, const float* residual, const void* x16,
                           const float* w, const float* bias, int n, int in, int out,
                           bool w_t) {
  const int w_rows = w_t ? out : in, w_cols = w_t ? in : out;
  const void* w16 = block_weight16(w, w_rows, w_cols);
  if (bias_lt(d, d16, residual, x16, w16, w_t, bias, n, in, out)) return;
  if (d16 && !residual && bias_lt_bf16_bias(d, x16, w16, w_t, bias, n, in, out)) return;
  // The fallback: y = bias rows + product in fp32 (scratch unless D is fp32), then the residual
  // or the rounding to bf16.
  // (A weight converted into scratch is converted again beside y: scratch() empties it.)
  const std::size_t ybytes = d16 ? std::size_t(n) * std::size_t(out) * sizeof(float) : 0;
  const bool w_scratch = !cached_bf16(w, w_rows, w_cols, w_cols);
  const std::size_t wbytes = w_scratch ? std::size_t(in) * std::size_t(out) * 2 : 0;
  BumpBlock& block = scratch(aligned_bytes(ybytes) + aligned_bytes(wbytes));
  float* y = d16 ? block.alloc_n<float>(std::size_t(n) * out) : static_cast<float*>(d);
  if (w_scratch) {
    void* w16s = block.alloc(wbytes);
    launch_to_bf16(stream_, w16s, w, w_rows, w_cols, w_cols);
    w16 = w16s;
  }
  if (bias) launch_bias_rows(stream_, y, bias, n, out);
  gemm_rm16(false, w_t, n, out, in, 1.0f, x16, in, w16, w_cols, bias ? 1.0f : 0.0f, y, out);
  if (residual) launch_add(stream_, y, y, residual, std::int64_t(n) * out);
  if (d16) launch_to_bf16(stream_, d, y, n, out, out);
}

void CudaOps::gpt2_block_forward(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                 const float* x, float* out, const Gpt2BlockStash& la) {
  if (!la.bf16) return Ops::gpt2_block_forward(s, p, x, out, la);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "gpt2_block_forward: a bf16 stash on ", name(),
                " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  const int n = s.b * s.t, C = s.c, Ca = s.attn_c(), F = s.f, nr = s.rows();
  const BlockTp tp = block_tp("gpt2_block_forward", s.tp, s.tp_rank, n, nr, C);
  if (n <= 0) return;
  // TP (BlockTp): c_attn and c_fc read every row's bf16 LayerNorm output, the c_projs write
  // fp32 partials.
  auto row_parallel = [&](float* y, const float* residual, const void* in16, const float* w,
                          const float* bias, int in) {
    float* partial = tp.partial_of(y);
    block_linear(partial, false, tp.residual_in_product(residual), in16, w,
                 tp.bias_in_product(bias), n, in, C);
    return partial;
  };
  std::uint16_t *ln1 = bf(la.ln1), *qkv = bf(la.qkv), *atty = bf(la.atty);
  std::uint16_t *ln2 = bf(la.ln2), *fch = bf(la.fch), *gelu = bf(la.fch_gelu);
  float* partial = nullptr;
  {
    OpScope timed(timer_.get(), "block_forward layernorm_bf16");
    launch_layernorm_forward_bf16(stream_, tp.norm_rows(la.ln1), la.ln1_mean, la.ln1_rstd, x,
                                  p.ln1_w, p.ln1_b, nr, C);
  }
  tp.gather(la.ln1);
  {
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_bf16 n=", n, " in=", C,
                                                 " out=", 3 * Ca); }, 0);
    block_linear(qkv, true, nullptr, ln1, p.qkv_w, p.qkv_b, n, C, 3 * Ca);
  }
  const QkvView view = qkv_view(s);
  block_attention_forward(s.attention, view.att, view.k0, view.v0, atty, la.lse, qkv);
  {  // res2 = x + atty @ w + b: the residual as the product's C (x is not read after it)
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_residual n=", n, " in=",
                                                 Ca, " out=", C); }, 0);
    partial = row_parallel(la.res2, x, atty, p.attproj_w, p.attproj_b, Ca);
  }
  tp.leave(*this, partial, la.res2, x);  // the collectives outside the op's timer
  {
    OpScope timed(timer_.get(), "block_forward layernorm_bf16");
    launch_layernorm_forward_bf16(stream_, tp.norm_rows(la.ln2), la.ln2_mean, la.ln2_rstd,
                                  la.res2, p.ln2_w, p.ln2_b, nr, C);
  }
  tp.gather(la.ln2);
  // c_fc and GELU: one product with GELU in cuBLASLt's epilogue (fch its pre-GELU aux), else
  // the product with the bias epilogue and the GELU kernel.
  bool gelu_fused = false;
  if (gelu_epilogue_ && !la.recomputed) {
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_gelu_bf16 n=", n,
                                                 " in=", C, " out=", F); }, 0);
    const void* fc_w16 = block_weight16(p.fc_w, C, F);
    gelu_fused = bias_lt(gelu, true, nullptr, ln2, fc_w16, false, p.fc_b, n, C, F,
                         LtGelu::forward, fch) ||
                 bias_lt_bf16_bias(gelu, ln2, fc_w16, false, p.fc_b, n, C, F, LtGelu::forward,
                                   fch);
    if (!gelu_fused) say_lt_refusal(LtRefusal::gelu_forward, n, C, F);
  }
  if (!gelu_fused) {
    {
      OpScope timed(timer_.get(), [&] { return str("block_forward linear_bf16 n=", n, " in=", C,
                                                   " out=", F); }, 0);
      block_linear(fch, true, nullptr, ln2, p.fc_w, p.fc_b, n, C, F);
    }
    OpScope timed(timer_.get(), "block_forward gelu_bf16");
    launch_gelu_forward_bf16(stream_, gelu, fch, std::int64_t(n) * F);
  }
  {
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_residual n=", n, " in=", F,
                                                 " out=", C); }, 0);
    partial = row_parallel(out, la.res2, gelu, p.fcproj_w, p.fcproj_b, F);
  }
  tp.leave(*this, partial, out, la.res2);
}

void CudaOps::gpt2_block_backward(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                  const Gpt2BlockParams& g, const float* x, float* dres,
                                  const Gpt2BlockStash& la, const Gpt2BlockScratch& scratch_in,
                                  const BlockWStash* w) {
  if (!la.bf16) return Ops::gpt2_block_backward(s, p, g, x, dres, la, scratch_in, w);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "gpt2_block_backward: a bf16 stash on ", name(),
                " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  const int n = s.b * s.t, C = s.c, Ca = s.attn_c(), F = s.f, nr = s.rows();
  const BlockTp tp = block_tp("gpt2_block_backward", s.tp, s.tp_rank, n, nr, C);
  if (n <= 0) return;
  // TP (BlockTp): the residual gradient of every row (whole, outside the op's timer); the
  // LayerNorms' input gradients summed.
  const std::uint16_t *ln1 = bf(la.ln1), *qkv = bf(la.qkv), *atty = bf(la.atty);
  const std::uint16_t *ln2 = bf(la.ln2), *fch = bf(la.fch), *gelu = bf(la.fch_gelu);
  // The model's scratch, as bf16 where a product reads it: dres16 [N,C] in dbuf until the
  // products that read it are queued (then dbuf takes the fp32 LayerNorm gradient), the
  // gradients at c_fc's and c_attn's outputs in dfch and dqkv, at GELU's and attention's
  // outputs in dact.
  std::uint16_t* dres16 = bf(scratch_in.dbuf);
  float* dln = scratch_in.dbuf;
  std::uint16_t* dact16 = bf(scratch_in.dact);
  std::uint16_t* dfch16 = bf(scratch_in.dfch);
  std::uint16_t* dqkv16 = bf(scratch_in.dqkv);
  auto partial = [&](int cols) {  // column partials of one call (the scratch's next use)
    const std::size_t floats = std::size_t(colsum_partial_floats(n, cols));
    return scratch(aligned_bytes(floats * sizeof(float))).alloc_n<float>(floats);
  };
  // c_proj of the MLP: dres16 (+ its bias gradient), d gelu16, its weight gradient
  {
    const float* dall = tp.whole(dres);  // every row's (outside the op's timer)
    OpScope timed(timer_.get(), "block_backward to_bf16_colsum");
    launch_to_bf16_colsum(stream_, dres16, g.fcproj_b, partial(C), dall, n, C);
  }
  // d gelu and GELU's backward: one product with cuBLASLt's DGELU_BGRAD epilogue (reading fch,
  // writing dfch16 and c_fc's bias gradient, which it overwrites: into scratch, then added;
  // fp32, else bf16 where cuBLASLt refuses an fp32 one, widened), else the product into dact16
  // and the GELU backward kernel with the bias gradient.
  bool dgelu_fused = false;
  if (gelu_epilogue_) {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_dgelu_bf16 n=", n,
                                                 " in=", F, " out=", C); }, 0);
    // fcproj_w [F, C] is [out, in] of this product (w_t); a weight converted into scratch
    // goes in the same block as the bias gradient (scratch() empties the block).
    const bool w_scratch = !cached_bf16(p.fcproj_w, F, C, C);
    const std::size_t wbytes = w_scratch ? std::size_t(F) * std::size_t(C) * 2 : 0;
    BumpBlock& block = scratch(aligned_bytes(std::size_t(F) * sizeof(float)) +
                               aligned_bytes(std::size_t(F) * 2) + aligned_bytes(wbytes));
    float* dfc_b = block.alloc_n<float>(std::size_t(F));
    void* dfc_b16 = block.alloc(std::size_t(F) * 2);
    const void* w16 = cached_bf16(p.fcproj_w, F, C, C);
    if (w_scratch) {
      void* w16s = block.alloc(wbytes);
      launch_to_bf16(stream_, w16s, p.fcproj_w, F, C, C);
      w16 = w16s;
    }
    dgelu_fused = bias_lt(dfch16, true, nullptr, dres16, w16, true, nullptr, n, C, F,
                          LtGelu::backward, fch, dfc_b);
    if (!dgelu_fused &&
        bias_lt(dfch16, true, nullptr, dres16, w16, true, nullptr, n, C, F,
                LtGelu::backward_bgrad16, fch, dfc_b16)) {
      say_lt_refusal(LtRefusal::fp32_bias_grad, n, C, F);
      launch_from_bf16(stream_, dfc_b, dfc_b16, F);
      dgelu_fused = true;
    }
    if (dgelu_fused) {
      launch_add(stream_, g.fc_b, g.fc_b, dfc_b, F);
      gemm_rm16(true, false, F, C, n, 1.0f, gelu, F, dres16, C, 1.0f, g.fcproj_w, C);
    } else {
      say_lt_refusal(LtRefusal::gelu_backward, n, C, F);
    }
  }
  if (!dgelu_fused) {
    {
      OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", F,
                                                   " out=", C); }, 0);
      gemm_rm16_to16(false, true, n, F, C, dres16, C, block_weight16(p.fcproj_w, F, C), C,
                     dact16, F);
      gemm_rm16(true, false, F, C, n, 1.0f, gelu, F, dres16, C, 1.0f, g.fcproj_w, C);
    }
    OpScope timed(timer_.get(), "block_backward gelu_bf16_colsum");
    launch_gelu_backward_bf16_colsum(stream_, dfch16, g.fc_b, partial(F), fch, dact16, n, F);
  }
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", C,
                                                 " out=", F); }, 0);
    gemm_rm16(false, true, n, C, F, 1.0f, dfch16, F, block_weight16(p.fc_w, C, F), F, 0.0f, dln,
              C);
    if (!w) gemm_rm16(true, false, C, F, n, 1.0f, ln2, C, dfch16, F, 1.0f, g.fc_w, F);
  }
  // fch is read for the last time above: w->dfch may be it.
  if (w) keep_bf16(stream_, timer_.get(), w->dfch, dfch16, std::int64_t(n) * F);
  layernorm_backward(dres, g.ln2_w, g.ln2_b, tp.summed(dln), la.res2, p.ln2_w, la.ln2_mean,
                     la.ln2_rstd, nr, C);
  // Attention's c_proj, attention, c_attn
  {
    const float* dall = tp.whole(dres);  // every row's (outside the op's timer)
    OpScope timed(timer_.get(), "block_backward to_bf16_colsum");
    launch_to_bf16_colsum(stream_, dres16, g.attproj_b, partial(C), dall, n, C);
  }
  std::uint16_t* datty16 = dact16;
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", Ca,
                                                 " out=", C); }, 0);
    gemm_rm16_to16(false, true, n, Ca, C, dres16, C, block_weight16(p.attproj_w, Ca, C), C,
                   datty16, Ca);
    gemm_rm16(true, false, Ca, C, n, 1.0f, atty, Ca, dres16, C, 1.0f, g.attproj_w, C);
  }
  const QkvView view = qkv_view(s);
  block_attention_backward(s.attention, view.att, view.k0, view.v0, dqkv16, datty16, atty,
                           la.lse, qkv);
  const int C3 = 3 * Ca;
  {
    OpScope timed(timer_.get(), "block_backward colsum_bf16");
    launch_colsum_bf16(stream_, g.qkv_b, partial(C3), dqkv16, n, C3);
  }
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", C,
                                                 " out=", C3); }, 0);
    gemm_rm16(false, true, n, C, C3, 1.0f, dqkv16, C3, block_weight16(p.qkv_w, C, C3), C3, 0.0f,
              dln, C);
    if (!w) gemm_rm16(true, false, C, C3, n, 1.0f, ln1, C, dqkv16, C3, 1.0f, g.qkv_w, C3);
  }
  // qkv is read for the last time by attention's backward: w->dqkv may be it.
  if (w) keep_bf16(stream_, timer_.get(), w->dqkv, dqkv16, std::int64_t(n) * C3);
  layernorm_backward(dres, g.ln1_w, g.ln1_b, tp.summed(dln), x, p.ln1_w, la.ln1_mean,
                     la.ln1_rstd, nr, C);
}

void CudaOps::gpt2_block_backward_weights(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                          const Gpt2BlockParams& g, const Gpt2BlockStash& la,
                                          const BlockWStash& w) {
  if (!la.bf16) return Ops::gpt2_block_backward_weights(s, p, g, la, w);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "gpt2_block_backward_weights: a bf16 stash on ", name(),
                " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  const int n = s.b * s.t, C = s.c, C3 = 3 * s.attn_c(), F = s.f;
  if (n <= 0) return;
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_weights_bf16 n=", n,
                                                 " in=", C, " out=", F); }, 0);
    gemm_rm16(true, false, C, F, n, 1.0f, bf(la.ln2), C, bf(w.dfch), F, 1.0f, g.fc_w, F);
  }
  OpScope timed(timer_.get(), [&] { return str("block_backward linear_weights_bf16 n=", n,
                                               " in=", C, " out=", C3); }, 0);
  gemm_rm16(true, false, C, C3, n, 1.0f, bf(la.ln1), C, bf(w.dqkv), C3, 1.0f, g.qkv_w, C3);
}

void CudaOps::gpt2_block_recompute(const Gpt2BlockShape& s, const Gpt2BlockStash& la) {
  if (!la.bf16) return Ops::gpt2_block_recompute(s, la);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "gpt2_block_recompute: a bf16 stash on ", name(),
                " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  TRIDENT_CHECK(la.recomputed, "internal: gpt2_block_recompute on a stash its forward did not "
                "mark recomputed (its GELU may be cuBLASLt's epilogue's)");
  const int n = s.b * s.t;
  if (n <= 0) return;
  const QkvView view = qkv_view(s);
  block_attention_forward(s.attention, view.att, view.k0, view.v0, bf(la.atty), la.lse,
                          bf(la.qkv));
  OpScope timed(timer_.get(), "block_recompute gelu_bf16");
  launch_gelu_forward_bf16(stream_, bf(la.fch_gelu), bf(la.fch), std::int64_t(n) * s.f);
}

void CudaOps::llama_block_forward(const LlamaBlockShape& s, const LlamaBlockParams& p,
                                  const float* x, float* out, const LlamaBlockStash& la) {
  if (!la.bf16) return Ops::llama_block_forward(s, p, x, out, la);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "llama_block_forward: a bf16 stash on ", name(),
                " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  const int n = s.b * s.t, C = s.c, Ca = s.ca ? s.ca : C, F = s.f, nr = s.nr ? s.nr : n;
  const BlockTp tp = block_tp("llama_block_forward", s.tp, s.tp_rank, n, nr, C);
  if (n <= 0) return;
  const QkvView view = qkv_view(s);
  const AttentionShape& att = view.att;
  const int C3 = int(att.ld_q), kv = int(view.v0 - view.k0);  // this rank's k (and v) columns
  // TP (BlockTp, as GPT-2's): [q k v] and [gate up] read every row's bf16 RMSNorm output, o
  // and down write fp32 partials (the residual on rank 0 only; no biases).
  auto row_parallel = [&](float* y, const float* residual, const void* in16, const float* w,
                          int in) {
    float* partial = tp.partial_of(y);
    block_linear(partial, false, tp.residual_in_product(residual), in16, w, nullptr, n, in, C,
                 true);
    return partial;
  };
  std::uint16_t *ln1 = bf(la.ln1), *qkv = bf(la.qkv), *atty = bf(la.atty);
  std::uint16_t *ln2 = bf(la.ln2), *fch = bf(la.fch), *act = bf(la.fch_gelu);
  float* partial = nullptr;
  {
    OpScope timed(timer_.get(), "block_forward rmsnorm_bf16");
    launch_rmsnorm_forward_bf16(stream_, tp.norm_rows(la.ln1), la.ln1_rstd, x, p.ln1_w, nr, C,
                                s.eps);
  }
  tp.gather(la.ln1);
  {
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_bf16 n=", n, " in=", C,
                                                 " out=", C3); }, 0);
    block_linear(qkv, true, nullptr, ln1, p.qkv_w, nullptr, n, C, C3, true);
  }
  {  // q and k heads at the positions of the rows (cp 1: one launch over every sequence)
    OpScope timed(timer_.get(), "block_forward rope_bf16");
    s.slice.for_each_run(s.b, s.t, 0, [&](std::int64_t row, int seqs, int rows, int pos0) {
      launch_rope_bf16(stream_, qkv + row * C3, seqs, rows, C3, s.nh + kv / att.hs, att.hs, pos0,
                       s.theta, 1.0f);
    });
  }
  block_attention_forward(s.attention, att, view.k0, view.v0, atty, la.lse, qkv);
  {  // res2 = x + atty @ o^T: the residual as the product's C (x is not read after it)
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_residual n=", n, " in=",
                                                 Ca, " out=", C); }, 0);
    partial = row_parallel(la.res2, x, atty, p.o_w, Ca);
  }
  tp.leave(*this, partial, la.res2, x);  // the collectives outside the op's timer
  {
    OpScope timed(timer_.get(), "block_forward rmsnorm_bf16");
    launch_rmsnorm_forward_bf16(stream_, tp.norm_rows(la.ln2), la.ln2_rstd, la.res2, p.ln2_w,
                                nr, C, s.eps);
  }
  tp.gather(la.ln2);
  {
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_bf16 n=", n, " in=", C,
                                                 " out=", 2 * F); }, 0);
    block_linear(fch, true, nullptr, ln2, p.gateup_w, nullptr, n, C, 2 * F, true);
  }
  {
    OpScope timed(timer_.get(), "block_forward swiglu_bf16");
    launch_swiglu_forward_bf16(stream_, act, fch, n, F);
  }
  {
    OpScope timed(timer_.get(), [&] { return str("block_forward linear_residual n=", n, " in=", F,
                                                 " out=", C); }, 0);
    partial = row_parallel(out, la.res2, act, p.down_w, F);
  }
  tp.leave(*this, partial, out, la.res2);
}

void CudaOps::llama_block_backward(const LlamaBlockShape& s, const LlamaBlockParams& p,
                                   const LlamaBlockParams& g, const float* x, float* dres,
                                   const LlamaBlockStash& la, const Gpt2BlockScratch& scratch_in,
                                   const BlockWStash* w) {
  if (!la.bf16) return Ops::llama_block_backward(s, p, g, x, dres, la, scratch_in, w);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "llama_block_backward: a bf16 stash on ", name(),
                " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  const int n = s.b * s.t, C = s.c, Ca = s.ca ? s.ca : C, F = s.f, nr = s.nr ? s.nr : n;
  const BlockTp tp = block_tp("llama_block_backward", s.tp, s.tp_rank, n, nr, C);
  if (n <= 0) return;
  const QkvView view = qkv_view(s);
  const AttentionShape& att = view.att;
  const int C3 = int(att.ld_q), kv = int(view.v0 - view.k0);
  // TP (BlockTp, as GPT-2's): the residual gradient of every row (whole, outside the op's
  // timer); the RMSNorms' input gradients summed.
  const std::uint16_t *ln1 = bf(la.ln1), *qkv = bf(la.qkv), *atty = bf(la.atty);
  const std::uint16_t *ln2 = bf(la.ln2), *fch = bf(la.fch), *act = bf(la.fch_gelu);
  // The scratch as gpt2_block_backward's: dres16 in dbuf until its products are queued, then
  // dbuf takes the fp32 norm gradient; the bf16 gradients at [gate up]'s and [q k v]'s
  // outputs in dfch and dqkv, at SwiGLU's and attention's outputs in dact.
  std::uint16_t* dres16 = bf(scratch_in.dbuf);
  float* dln = scratch_in.dbuf;
  std::uint16_t* dact16 = bf(scratch_in.dact);
  std::uint16_t* dfch16 = bf(scratch_in.dfch);
  std::uint16_t* dqkv16 = bf(scratch_in.dqkv);
  // MLP: down (weight [C, F]), SwiGLU, [gate up] (weight [2F, C]), RMSNorm
  {
    const float* dall = tp.whole(dres);
    OpScope timed(timer_.get(), "block_backward to_bf16");
    launch_to_bf16(stream_, dres16, dall, n, C, C);
  }
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", F,
                                                 " out=", C); }, 0);
    gemm_rm16_to16(false, false, n, F, C, dres16, C, block_weight16(p.down_w, C, F), F, dact16,
                   F);
    gemm_rm16(true, false, C, F, n, 1.0f, dres16, C, act, F, 1.0f, g.down_w, F);
  }
  {
    OpScope timed(timer_.get(), "block_backward swiglu_bf16");
    launch_swiglu_backward_bf16(stream_, dfch16, fch, dact16, n, F);
  }
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", C,
                                                 " out=", 2 * F); }, 0);
    gemm_rm16(false, false, n, C, 2 * F, 1.0f, dfch16, 2 * F,
              block_weight16(p.gateup_w, 2 * F, C), C, 0.0f, dln, C);
    if (!w) gemm_rm16(true, false, 2 * F, C, n, 1.0f, dfch16, 2 * F, ln2, C, 1.0f, g.gateup_w, C);
  }
  // fch is read for the last time by SwiGLU's backward: w->dfch may be it.
  if (w) keep_bf16(stream_, timer_.get(), w->dfch, dfch16, std::int64_t(n) * 2 * F);
  rmsnorm_backward(dres, g.ln2_w, tp.summed(dln), la.res2, p.ln2_w, la.ln2_rstd, nr, C);
  // Attention: o (weight [C, Ca]), attention, RoPE, [q k v] (weight [C3, C]), RMSNorm
  {
    const float* dall = tp.whole(dres);
    OpScope timed(timer_.get(), "block_backward to_bf16");
    launch_to_bf16(stream_, dres16, dall, n, C, C);
  }
  std::uint16_t* datty16 = dact16;
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", Ca,
                                                 " out=", C); }, 0);
    gemm_rm16_to16(false, false, n, Ca, C, dres16, C, block_weight16(p.o_w, C, Ca), Ca, datty16,
                   Ca);
    gemm_rm16(true, false, C, Ca, n, 1.0f, dres16, C, atty, Ca, 1.0f, g.o_w, Ca);
  }
  // Replicated kv heads (n_kv_head < tp): the gradients of the ones no query head here reads
  // are zero (block_attention_backward; their k/v weight gradients partial here, summed over
  // TP by the model as the composition's).
  block_attention_backward(s.attention, att, view.k0, view.v0, dqkv16, datty16, atty, la.lse,
                           qkv);
  {
    OpScope timed(timer_.get(), "block_backward rope_bf16");
    s.slice.for_each_run(s.b, s.t, 0, [&](std::int64_t row, int seqs, int rows, int pos0) {
      launch_rope_bf16(stream_, dqkv16 + row * C3, seqs, rows, C3, s.nh + kv / att.hs, att.hs,
                       pos0, s.theta, -1.0f);
    });
  }
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_bf16 n=", n, " in=", C,
                                                 " out=", C3); }, 0);
    gemm_rm16(false, false, n, C, C3, 1.0f, dqkv16, C3, block_weight16(p.qkv_w, C3, C), C, 0.0f,
              dln, C);
    if (!w) gemm_rm16(true, false, C3, C, n, 1.0f, dqkv16, C3, ln1, C, 1.0f, g.qkv_w, C);
  }
  // qkv is read for the last time by attention's backward: w->dqkv may be it.
  if (w) keep_bf16(stream_, timer_.get(), w->dqkv, dqkv16, std::int64_t(n) * C3);
  rmsnorm_backward(dres, g.ln1_w, tp.summed(dln), x, p.ln1_w, la.ln1_rstd, nr, C);
}

void CudaOps::llama_block_backward_weights(const LlamaBlockShape& s, const LlamaBlockParams& p,
                                           const LlamaBlockParams& g, const LlamaBlockStash& la,
                                           const BlockWStash& w) {
  if (!la.bf16) return Ops::llama_block_backward_weights(s, p, g, la, w);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "llama_block_backward_weights: a bf16 stash on ",
                name(), " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  const int n = s.b * s.t, C = s.c, F = s.f;
  if (n <= 0) return;
  const int C3 = int(attention_shape_llama(s).ld_q);
  {
    OpScope timed(timer_.get(), [&] { return str("block_backward linear_weights_bf16 n=", n,
                                                 " in=", C, " out=", 2 * F); }, 0);
    gemm_rm16(true, false, 2 * F, C, n, 1.0f, bf(w.dfch), 2 * F, bf(la.ln2), C, 1.0f, g.gateup_w,
              C);
  }
  OpScope timed(timer_.get(), [&] { return str("block_backward linear_weights_bf16 n=", n,
                                               " in=", C, " out=", C3); }, 0);
  gemm_rm16(true, false, C3, C, n, 1.0f, bf(w.dqkv), C3, bf(la.ln1), C, 1.0f, g.qkv_w, C);
}

void CudaOps::llama_block_recompute(const LlamaBlockShape& s, const LlamaBlockStash& la) {
  if (!la.bf16) return Ops::llama_block_recompute(s, la);
  TRIDENT_CHECK(gpt2_block_stash_bf16(), "llama_block_recompute: a bf16 stash on ", name(),
                " without the fused block (TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline)");
  const int n = s.b * s.t;
  if (n <= 0) return;
  // llama_block_forward's attention call: the same shape, plan and operands
  const QkvView view = qkv_view(s);
  block_attention_forward(s.attention, view.att, view.k0, view.v0, bf(la.atty), la.lse,
                          bf(la.qkv));
  OpScope timed(timer_.get(), "block_recompute swiglu_bf16");
  launch_swiglu_forward_bf16(stream_, bf(la.fch_gelu), bf(la.fch), n, s.f);
}

}  // namespace trident::ops::cuda
