// ops/cuda/kernels.hpp — host-callable launchers of the backend's CUDA kernels (private to
// src/ops/cuda; defined by topic in layernorm.cu, rope.cu, decode.cu, softmax.cu, crossentropy.cu,
// embedding.cu, pointwise.cu, flash_attention*.cu and bf16_rows.cu). Each queues its kernel(s)
// on `stream`, checks the launch, and returns at once; n <= 0 launches nothing. Pointers are device memory. Shapes as in ops.hpp.
// defines: the launch_* functions below
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::ops::cuda {

// ---- layernorm.cu (LayerNorm, RMSNorm) ---------------------------------------------------
// One warp per row; fp32 sums, two passes (mean, then the centred variance) as the CPU.
void launch_layernorm_forward(cudaStream_t s, float* y, float* mean, float* rstd, const float* x,
                              const float* w, const float* b, int n, int c);
// dx += (one warp per row). dw, db += column sums, deterministic: per-chunk partials in
// `partial` (layernorm_partial_floats(n, c) floats of scratch), then summed in chunk order.
void launch_layernorm_backward(cudaStream_t s, float* dx, float* dw, float* db, const float* dy,
                               const float* x, const float* w, const float* mean,
                               const float* rstd, int n, int c, float* partial);
std::int64_t layernorm_partial_floats(int n, int c);

// RMSNorm: y = x * rstd * w (one warp per row); the backward's dx += (one warp per row), and
// dw += column sums in a fixed order through `partial` (rmsnorm_partial_floats(n, c) floats).
void launch_rmsnorm_forward(cudaStream_t s, float* y, float* rstd, const float* x, const float* w,
                            int n, int c, float eps);
void launch_rmsnorm_backward(cudaStream_t s, float* dx, float* dw, const float* dy, const float* x,
                             const float* w, const float* rstd, int n, int c, float* partial);
std::int64_t rmsnorm_partial_floats(int n, int c);

// ---- rope.cu ----------------------------------------------------------------------------
// Rotary embedding in place (Ops::rope_forward); sign +1 rotates by +a (forward), -1 by -a
// (backward, the transpose).
void launch_rope(cudaStream_t s, float* x, int b, int t, int ld, int heads, int hs, int pos0,
                 float theta, float sign);

// ---- decode.cu --------------------------------------------------------------------------
// Ops::attention_decode: one query row per sequence against n_keys cached keys and values.
void launch_attention_decode(cudaStream_t s, float* out, float* scratch, const float* q,
                             const float* k, const float* v, int b, int n_keys, int nh, int nkv,
                             int hs, std::int64_t ld_q, std::int64_t ld_kv, std::int64_t kv_batch,
                             std::int64_t ld_o);

// ---- softmax.cu (attention) -------------------------------------------------------------
// att[rows, T] (rows = B*NH*T, row r is query r % T): scaled scores in, causal softmax out
// (0 above the diagonal).
void launch_causal_softmax(cudaStream_t s, float* att, std::int64_t rows, int t);
// In place on datt: ds = scale * att * (datt - sum_j att datt) for j <= i, else 0.
void launch_causal_softmax_backward(cudaStream_t s, float* datt, const float* att,
                                    std::int64_t rows, int t, float scale);

// ---- flash_attention.cu -------------------------------------------------------------------
// Causal (or full) attention without T x T (ops.hpp's attention_forward/backward; shapes
// and strides as Ops::AttentionShape, the batch strides resolved). Head sizes up to
// kFlashMaxHeadSize.
constexpr int kFlashMaxHeadSize = 128;
struct FlashShape {
  int b, t, nh, nkv, hs;
  long long ld_q, ld_k, ld_v, ld_o;
  long long bs_q, bs_k, bs_v, bs_o, bs_lse;  // resolved (never 0)
  bool causal, accumulate;
};
void launch_flash_attention_forward(cudaStream_t s, float* out, float* lse, const float* q,
                                    const float* k, const float* v, const FlashShape& shape);
// dq, dk, dv written (two kernels: dq per query tile, dk and dv per key tile).
void launch_flash_attention_backward(cudaStream_t s, float* dq, float* dk, float* dv,
                                     const float* dout, const float* out, const float* lse,
                                     const float* q, const float* k, const float* v,
                                     const FlashShape& shape);
// ---- flash_attention_tc.cu ----------------------------------------------------------------
// The same contract on tensor cores (WMMA, sm_80+): bf16 operands in the products, fp32
// accumulation, softmax and outputs. Shapes with flash_tc_supported (hs a multiple of 16 up
// to 128) only.
bool flash_tc_supported(const FlashShape& shape);
void launch_flash_attention_tc_forward(cudaStream_t s, float* out, float* lse, const float* q,
                                       const float* k, const float* v, const FlashShape& shape);
void launch_flash_attention_tc_backward(cudaStream_t s, float* dq, float* dk, float* dv,
                                        const float* dout, const float* out, const float* lse,
                                        const float* q, const float* k, const float* v,
                                        const FlashShape& shape);
// The same kernels on bf16 storage (16-bit words, round to nearest even: the bf16-I/O
// entry points of attention_bf16.cpp): q, k, v, dout, out read as bf16, out, dq, dk, dv
// written as bf16 (added to, rounded again, with shape.accumulate); lse fp32.
void launch_flash_attention_tc_forward_bf16(cudaStream_t s, std::uint16_t* out, float* lse,
                                            const std::uint16_t* q, const std::uint16_t* k,
                                            const std::uint16_t* v, const FlashShape& shape);
void launch_flash_attention_tc_backward_bf16(cudaStream_t s, std::uint16_t* dq, std::uint16_t* dk,
                                             std::uint16_t* dv, const std::uint16_t* dout,
                                             const std::uint16_t* out, const float* lse,
                                             const std::uint16_t* q, const std::uint16_t* k,
                                             const std::uint16_t* v, const FlashShape& shape);
// ---- bf16_rows.cu -------------------------------------------------------------------------
// b blocks of t rows of `cols` values, row stride ld and block stride bs on each side: the
// widening (exact) and narrowing (round to nearest even) of attention_bf16.cpp's fallback.
void launch_bf16_rows_to_float(cudaStream_t s, float* dst, std::int64_t ld_dst,
                               std::int64_t bs_dst, const std::uint16_t* src,
                               std::int64_t ld_src, std::int64_t bs_src, int b, int t,
                               std::int64_t cols);
void launch_float_rows_to_bf16(cudaStream_t s, std::uint16_t* dst, std::int64_t ld_dst,
                               std::int64_t bs_dst, const float* src, std::int64_t ld_src,
                               std::int64_t bs_src, int b, int t, std::int64_t cols);
// Ops::attention_merge.
void launch_attention_merge(cudaStream_t s, float* out, float* lse, const float* out_part,
                            const float* lse_part, const FlashShape& shape);

// ---- crossentropy.cu --------------------------------------------------------------------
void launch_xent_row_max(cudaStream_t s, float* row_max, const float* logits, int n, int ld,
                         int v_valid);
void launch_xent_sumexp(cudaStream_t s, float* sumexp, float* target_logit, const float* logits,
                        const float* row_max, const std::int32_t* targets, int n, int ld,
                        int v_valid, int vocab_start);
void launch_xent_loss(cudaStream_t s, float* loss, const float* row_max, const float* sumexp,
                      const float* target_logit, int n);
void launch_xent_backward(cudaStream_t s, float* logits, const float* row_max,
                          const float* sumexp, const std::int32_t* targets, int n, int ld,
                          int v_valid, int vocab_start, float scale);
// One pass of the unsharded forward: what xent_row_max, xent_sumexp and xent_loss write (loss
// null: the first three only, at the shard's max: Ops::xent_shard_stats).
void launch_xent_forward(cudaStream_t s, float* loss, float* row_max, float* sumexp,
                         float* target_logit, const float* logits, const std::int32_t* targets,
                         int n, int ld, int v_valid, int vocab_start);
// sumexp[i] *= exp(shard_max[i] - row_max[i]); 0 where shard_max is -inf.
void launch_xent_rescale_sumexp(cudaStream_t s, float* sumexp, const float* shard_max,
                                const float* row_max, int n);

// ---- embedding.cu -----------------------------------------------------------------------
void launch_embedding_forward(cudaStream_t s, float* x, const std::int32_t* tokens,
                              const float* wte, int n, int c, int vocab_start, int v);
// dwte[tokens[i] - vocab_start] += dx[i] for the tokens in range. With scratch (at least
// embedding_backward_scratch_ints(n, v) ints of device memory) grouped by row and added in
// token order: the CPU's bits, run to run. Without (TRIDENT_CUDA_BASELINE): an atomicAdd
// scatter, whose order of additions into a repeated token's row is not fixed.
void launch_embedding_backward(cudaStream_t s, float* dwte, const float* dx,
                               const std::int32_t* tokens, int n, int c, int vocab_start, int v,
                               int* scratch);
std::int64_t embedding_backward_scratch_ints(int n, int v);
void launch_position_forward(cudaStream_t s, float* x, const float* wpe, int b, int t, int c);
// One thread per (t, c), batch walked in order: the CPU's order of additions exactly.
void launch_position_backward(cudaStream_t s, float* dwpe, const float* dx, int b, int t, int c);

// ---- pointwise.cu -----------------------------------------------------------------------
void launch_gelu_forward(cudaStream_t s, float* y, const float* x, std::int64_t n);
void launch_gelu_backward(cudaStream_t s, float* dx, const float* x, const float* dy,
                          std::int64_t n);
// SwiGLU (Ops::swiglu_forward / swiglu_backward): gu[N, 2F] gate then up, y[N, F].
void launch_swiglu_forward(cudaStream_t s, float* y, const float* gu, int n, int f);
void launch_swiglu_backward(cudaStream_t s, float* dgu, const float* gu, const float* dy, int n,
                            int f);
void launch_add(cudaStream_t s, float* y, const float* a, const float* b, std::int64_t n);
void launch_scale(cudaStream_t s, float* x, float alpha, std::int64_t n);
void launch_fill(cudaStream_t s, float* x, float value, std::int64_t n);
// y[n, out] = each row a copy of bias[out]
void launch_bias_rows(cudaStream_t s, float* y, const float* bias, int n, int out);
// dst[rows, cols] (packed) = bf16(src[rows, cols] with row stride ld), round to nearest even
void launch_to_bf16(cudaStream_t s, void* dst, const float* src, std::int64_t rows,
                    std::int64_t cols, std::int64_t ld);
// linear_backward's dy under bf16 in one read: dst[n, cols] (packed) = bf16(src[n, cols]) and
// db[cols] += the column sums of src (fp32, row blocks of kColsumRows summed in row order,
// then the blocks in order: deterministic). partial holds colsum_partial_floats(n, cols).
constexpr int kColsumRows = 64;
inline int colsum_row_blocks(int n) { return (n + kColsumRows - 1) / kColsumRows; }
inline std::int64_t colsum_partial_floats(int n, int cols) {
  return std::int64_t(colsum_row_blocks(n)) * cols;
}
void launch_to_bf16_colsum(cudaStream_t s, void* dst, float* db, float* partial,
                           const float* src, int n, int cols);
// db[cols] += the colsum_row_blocks(n) partial sums in partial, in block order (the second half
// of launch_to_bf16_colsum; fused_block.cu's column sums end with it too)
void launch_colsum_add(cudaStream_t s, float* db, const float* partial, int n, int cols);
// dst[n] = float(src[n] bf16), exact
void launch_from_bf16(cudaStream_t s, float* dst, const void* src, std::int64_t n);
// dst[rows, cols] (row stride ld) = float(src[rows, cols] bf16, packed), or += with accumulate
void launch_from_bf16_rows(cudaStream_t s, float* dst, std::int64_t ld, const void* src,
                           std::int64_t rows, std::int64_t cols, bool accumulate);
// *result = sum x^2 in double, deterministic (fixed grid, fixed reduction order); `partial`
// holds sum_squares_blocks() doubles of scratch.
void launch_sum_squares(cudaStream_t s, double* result, double* partial, const float* x,
                        std::int64_t n);
int sum_squares_blocks();
// *total += sum of loss[n] in double (one block, deterministic): Ops::add_loss on the device.
void launch_loss_add(cudaStream_t s, double* total, const float* loss, int n);
// AdamW with the scalars formed on the host (trident/ops/adamw.hpp), the CPU's float ops in
// the CPU's order without FMA contraction.
void launch_adamw(cudaStream_t s, float* p, const float* g, float* m, float* v, std::int64_t n,
                  float beta1, float beta2, float omb1, float omb2, float eps, float decay,
                  float step, float bc2_sqrt);

// ---- the optimizer step over many tensors (Ops::sum_squares_spans, Ops::adamw_segments) --
// One span of launch_sum_squares_spans: x[n], reduced exactly as launch_sum_squares reduces it
// (sum_squares_span_blocks(n) blocks and partials, from partial `first` on).
struct SumSquaresSpan {
  const float* x;
  std::int64_t n;
  std::int64_t first;
  std::int64_t blocks;
};
std::int64_t sum_squares_span_blocks(std::int64_t n);
// sums[i] = what launch_sum_squares leaves in *result for spans[i] (bit for bit), for all
// `count` spans in two launches. spans: device memory, in order of `first`, back to back;
// partial holds total_blocks doubles (the spans' blocks summed).
void launch_sum_squares_spans(cudaStream_t s, double* sums, double* partial,
                              const SumSquaresSpan* spans, int count, std::int64_t total_blocks);
// One segment of launch_adamw_segments: launch_adamw on p, g, m, v [n] (with the segment's
// decay), its chunks of kAdamWChunk elements the blocks [first, first + adamw_chunks(n)); p16
// (may be null) receives bf16_bits of every updated p (the weight cache's copy).
struct AdamWSegmentEntry {
  float* p;
  const float* g;
  float* m;
  float* v;
  std::uint16_t* p16;
  std::int64_t n;
  std::int64_t first;
  std::int64_t decay;  // 1: decay_on, 0: decay_off (64 bits: no padding in the compared bytes)
};
constexpr std::int64_t kAdamWChunk = 4096;  // elements per block
inline std::int64_t adamw_chunks(std::int64_t n) { return (n + kAdamWChunk - 1) / kAdamWChunk; }
// Every segment's update in one launch: g * grad_scale in float first when grad_scale != 1
// (launch_scale's product), then launch_adamw's float ops; bit for bit the per-segment
// launches. segments: device memory, in order of `first`, back to back from 0.
void launch_adamw_segments(cudaStream_t s, const AdamWSegmentEntry* segments, int count,
                           std::int64_t total_chunks, float grad_scale, float beta1, float beta2,
                           float omb1, float omb2, float eps, float decay_on, float decay_off,
                           float step, float bc2_sqrt);

// ---- classifier.cu (the LM head under bf16: fused_head.cpp) ------------------------------
// One block per row of bf16 logits16[N, ld]: loss[i] from one read of the row (online max and
// sum of exponentials, target logit); with backward, the row overwritten by the bf16 dlogits
// scale * (softmax - onehot) (padding columns [v_valid, ld) 0).
void launch_fused_classifier(cudaStream_t s, void* logits16, float* loss,
                             const std::int32_t* targets, int n, int ld, int v_valid, float scale,
                             bool backward);
// A vocabulary shard (TP: this rank's columns from vocab_start): the classifier in two passes
// around the collectives. The first: per row of logits16 its max (shard_max), the sum of
// exponentials at that max (sumexp) and the target logit if this shard holds the target
// (else 0), as Ops::xent_shard_stats on fp32 logits. The second, once row_max and sumexp are
// the whole vocabulary's: the row overwritten by the bf16 dlogits as launch_fused_classifier's.
void launch_classifier_shard_stats(cudaStream_t s, const void* logits16, float* shard_max,
                                   float* sumexp, float* target_logit,
                                   const std::int32_t* targets, int n, int ld, int v_valid,
                                   int vocab_start);
void launch_classifier_backward(cudaStream_t s, void* logits16, const float* row_max,
                                const float* sumexp, const std::int32_t* targets, int n, int ld,
                                int v_valid, int vocab_start, float scale);

// ---- fused_block.cu (CudaOps::gpt2_block_*: bf16 activations, packed, 2 bytes each) -------
// LayerNorm of fp32 x[n, c] (the layernorm_forward kernel's arithmetic) written as bf16 y,
// with the fp32 mean[n] and rstd[n].
void launch_layernorm_forward_bf16(cudaStream_t s, void* y, float* mean, float* rstd,
                                   const float* x, const float* w, const float* b, int n, int c);
// y = gelu(x) on bf16 x (the gelu_forward kernel's arithmetic in fp32), written as bf16.
void launch_gelu_forward_bf16(cudaStream_t s, void* y, const void* x, std::int64_t n);
// dx[n, cols] = bf16(dy * gelu'(x)) on bf16 x and dy, and db[cols] += the column sums of the
// fp32 values (colsum_partial_floats(n, cols) floats of `partial`; the order of
// launch_to_bf16_colsum: deterministic).
void launch_gelu_backward_bf16_colsum(cudaStream_t s, void* dx, float* db, float* partial,
                                      const void* x, const void* dy, int n, int cols);
// db[cols] += the column sums of bf16 src[n, cols] (as launch_to_bf16_colsum's sums).
void launch_colsum_bf16(cudaStream_t s, float* db, float* partial, const void* src, int n,
                        int cols);
// The fused Llama block's (CudaOps::llama_block_*): RMSNorm of fp32 x[n, c] (rmsnorm_forward's
// arithmetic) written as bf16 y, rstd fp32; RoPE in place on bf16 (launch_rope's contract);
// SwiGLU forward and backward on bf16 gu[n, 2f], y / dy [n, f] (pointwise.cu's arithmetic).
void launch_rmsnorm_forward_bf16(cudaStream_t s, void* y, float* rstd, const float* x,
                                 const float* w, int n, int c, float eps);
void launch_rope_bf16(cudaStream_t s, void* x, int b, int t, int ld, int heads, int hs, int pos0,
                      float theta, float sign);
void launch_swiglu_forward_bf16(cudaStream_t s, void* y, const void* gu, int n, int f);
void launch_swiglu_backward_bf16(cudaStream_t s, void* dgu, const void* gu, const void* dy, int n,
                                 int f);

// Whether the launchers may take their 16-byte (common.cuh's Packed128) paths: false under
// TRIDENT_CUDA_BASELINE=1 (read once, CudaOps' rule), which keeps the scalar kernels (the
// paths before issue 27). pointwise.cu.
bool packed_access();

}  // namespace trident::ops::cuda
