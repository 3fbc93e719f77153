// trident/ops/ops.hpp — the kernels one training step needs, behind one backend-neutral
// interface. Model code calls these and nothing else; only ops/cpu (OpenBLAS + OpenMP) and
// ops/cuda (cuBLAS + CUDA kernels) implement them (and "cpu-guarded", the CPU kernels on
// guarded memory, for tests). Pointers are memory of the backend's device: memory() is where
// it comes from (null for the CPU backend: host memory). Everything is row-major fp32.
//
// Dimension legend: B = micro-batch, T = sequence length, C = channels (of this rank's
// shard where TP splits them), NH = heads (on this rank), hs = C / NH, V = vocabulary
// columns on this rank, N = B*T rows.
//
// Gradient rule (as llm.c): parameter gradients are ACCUMULATED (+=) so microbatches add
// up; activation gradients are WRITTEN (=), except where a comment says "+=" (the
// residual stream: layernorm_backward adds into dx).
//
// defines: trident::ops::Ops, Ops::AttentionShape, Ops::OwnAttention, attention_shape_qkv, Precision, precision_name, parse_precision, make_cpu_ops, make_ops
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/device_memory.hpp"
#include "trident/ops/cp_slice.hpp"

namespace trident::ops {

// Arithmetic of the matrix products (every other kernel is fp32 on every backend; inputs,
// outputs and accumulation are fp32 in all three):
//   fp32  plain fp32 products (the only one the CPU backend has);
//   tf32  tensor-core products on inputs rounded to TF32 (10-bit mantissa);
//   bf16  tensor-core products on inputs rounded to bfloat16 (7-bit mantissa); on a device
//         backend the model also keeps its stash as bf16 (Ops::to_bf16, GptChunk).
enum class Precision { fp32, tf32, bf16 };
const char* precision_name(Precision precision);  // "fp32" | "tf32" | "bf16"
// "fp32" | "tf32" | "bf16" -> Precision; an Error naming the word otherwise.
Precision parse_precision(const std::string& name);

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The device memory every pointer given to an op must point into; nullptr when the backend
  // works on host memory (the CPU). Buffers made with it (FloatBuffer(n, ops.memory())) are
  // the backend's memory either way.
  virtual DeviceMemory* memory() { return nullptr; }
  // The arithmetic of the matrix products (fp32 on the CPU backends).
  virtual Precision precision() const { return Precision::fp32; }

  // ---- the model's parameters (a hint for the products; results do not change) -----
  // [params, params + n) holds the weights (nullptr, 0: none). A backend may keep a converted
  // copy of them for its products (CUDA under bf16: one bf16 copy, made at the first product
  // after a change), remade after any write into the range by one of its own ops or copies
  // and after weights_changed(). Default: nothing (the CPU backends).
  virtual void set_weights(const float* params, std::int64_t n) {
    (void)params;
    (void)n;
  }
  // The weights were written other than through this backend (MPI into device memory).
  virtual void weights_changed() {}

  // ---- graphs (runtime.cuda_graphs): a microbatch's work recorded once, replayed ---------
  // "" where this backend records graphs, else why not (the CPU backends: none; CUDA: not
  // with TRIDENT_OP_TIMING, whose events would be recorded once and never timed again).
  virtual std::string graphs_unsupported() const { return "the " + name() + " backend has none"; }
  // Work the backend would otherwise do lazily inside its first op (the weight cache's
  // conversion): done now, eagerly, before a capture and before each launch.
  virtual void before_graph() {}
  // From begin_capture to end_capture the backend's ops are recorded, not run (nothing they
  // write changes). begin_capture: false (with why) where recording cannot start.
  virtual bool begin_capture(std::string* why) {
    *why = graphs_unsupported();
    return false;
  }
  // The graph recorded (a handle >= 0), or -1 with why: the capture failed (an op could not
  // be recorded, or device memory was allocated inside it); none of its ops ran.
  virtual int end_capture(std::string* why) {
    *why = graphs_unsupported();
    return -1;
  }
  // Runs graph `handle` (in stream order with the other ops). false (with why, nothing run)
  // where device memory live at its capture has been released since (its pointers are stale).
  virtual bool launch_graph(int handle, std::string* why) {
    (void)handle;
    *why = graphs_unsupported();
    return false;
  }
  virtual void release_graph(int handle) { (void)handle; }

  // ---- bf16 storage (the model's stash under runtime.precision = "bf16") -------------
  // dst[i] = the 16 bits of bfloat16(src[i]), rounded to nearest even (NaN stays NaN).
  virtual void to_bf16(std::uint16_t* dst, const float* src, std::int64_t n) = 0;
  // dst[i] = the float whose high 16 bits are src[i] (exact).
  virtual void from_bf16(float* dst, const std::uint16_t* src, std::int64_t n) = 0;

  // ---- matrix products ------------------------------------------------------------
  // C[m,n] = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T; row-major, leading dims
  // are row strides of the stored matrices.
  virtual void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) = 0;

  // linear: y[N,out] = x[N,in] @ w[in,out] + b[out]   (b may be null)
  virtual void linear_forward(float* y, const float* x, const float* w, const float* b, int n,
                              int in, int out) = 0;
  // dx[N,in] = dy @ w^T (skipped when dx is null); dw[in,out] += x^T @ dy;
  // db[out] += sum over rows of dy (skipped when db is null)
  virtual void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                               const float* w, int n, int in, int out) = 0;

  // ---- normalization and pointwise ------------------------------------------------
  // y = (x - mean) * rstd * w + b per row; saves mean[N], rstd[N] for the backward. eps 1e-5.
  virtual void layernorm_forward(float* y, float* mean, float* rstd, const float* x,
                                 const float* w, const float* b, int n, int c) = 0;
  // dx[N,C] += ..., dw[C] += ..., db[C] += ...
  virtual void layernorm_backward(float* dx, float* dw, float* db, const float* dy,
                                  const float* x, const float* w, const float* mean,
                                  const float* rstd, int n, int c) = 0;

  // RMSNorm (Llama): y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps); saves
  // rstd[N] for the backward (may be null).
  virtual void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int n,
                               int c, float eps) = 0;
  // dx[N,C] += ... (the residual stream, as layernorm_backward), dw[C] += ...
  virtual void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x,
                                const float* w, const float* rstd, int n, int c) = 0;

  // Rotary position embedding (Llama; Hugging Face's rotate_half layout), IN PLACE on
  // x[B,T,ld]: in each row, `heads` heads of hs (even) columns from column 0, head h at
  // [h*hs, (h+1)*hs) (q and k side by side in a qkv row are one call with heads = their sum).
  // Row (b, t) is position p = pos0 + t; for i < hs/2, a = p * theta^(-2i/hs) (formed in
  // double), x1 = x[i], x2 = x[i + hs/2]:  x[i] = x1 cos a - x2 sin a,
  // x[i + hs/2] = x2 cos a + x1 sin a. Columns past heads*hs are untouched.
  virtual void rope_forward(float* x, int b, int t, int ld, int heads, int hs, int pos0,
                            float theta) = 0;
  // IN PLACE on the gradient dx[B,T,ld]: the transposed rotation (angle -a), which maps the
  // gradient w.r.t. the rotated values to the gradient w.r.t. the inputs of rope_forward.
  virtual void rope_backward(float* dx, int b, int t, int ld, int heads, int hs, int pos0,
                             float theta) = 0;

  // SwiGLU (Llama's MLP): gu[N, 2F] holds the gate (columns [0, F)) then the up projection
  // ([F, 2F)); y[N,F] = silu(gate) * up, silu(g) = g * sigmoid(g).
  virtual void swiglu_forward(float* y, const float* gu, int n, int f) = 0;
  // dgu[N, 2F] = gradient w.r.t. gu (written): dgate = dy * up * silu'(gate),
  // dup = dy * silu(gate).
  virtual void swiglu_backward(float* dgu, const float* gu, const float* dy, int n, int f) = 0;

  // GELU, tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  virtual void gelu_forward(float* y, const float* x, std::int64_t n) = 0;
  virtual void gelu_backward(float* dx, const float* x, const float* dy, std::int64_t n) = 0;

  // y = a + b   (y may alias a or b)
  virtual void add(float* y, const float* a, const float* b, std::int64_t n) = 0;
  // x *= alpha
  virtual void scale(float* x, float alpha, std::int64_t n) = 0;
  // sum of x[i]^2, accumulated in double
  virtual double sum_squares(const float* x, std::int64_t n) = 0;
  virtual void fill(float* x, float value, std::int64_t n) = 0;
  virtual void copy(float* dst, const float* src, std::int64_t n) = 0;
  // rows x width floats between strided rows (row r at dst + r*ld_dst, src + r*ld_src; the
  // rows do not overlap): a column block of a wider matrix, e.g. the keys of a fused qkv.
  // The default copies row by row; backends do it in one call (CUDA: cudaMemcpy2DAsync).
  virtual void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                         std::int64_t rows, std::int64_t width);

  // ---- attention ----------------------------------------------------------------------
  // Causal (or, with !causal, full) softmax(q k^T / sqrt(hs)) v per query head, flash-style:
  // tiled over query and key blocks with the online softmax, never storing T x T. The forward
  // keeps out and one log-sum-exp per (batch, head, row); the backward recomputes the scores
  // tile by tile. q, k, v, out are row-major with row (b, t) at (b*T + t) * ld and head h's hs
  // columns at h*hs within the row, so GPT's fused qkv[B,T,3C] is q = qkv, k = qkv + C,
  // v = qkv + 2C with ld 3C. Grouped-query attention: query head h reads key/value head
  // h / (nh / nkv) (nkv = nh: multi-head; nkv = 1: multi-query). RoPE is applied to q and k
  // before.
  struct AttentionShape {
    int b = 0, t = 0;
    int nh = 0;   // query heads
    int nkv = 0;  // key/value heads, nh % nkv == 0
    int hs = 0;   // head size of q, k, v and out
    std::int64_t ld_q = 0, ld_k = 0, ld_v = 0, ld_o = 0;  // row strides (floats)
    // Blocks of a longer sequence (ring attention, model/ring_attention.hpp): the floats
    // between one sequence's row 0 and the next's (0: t * ld, rows packed), and between
    // consecutive (batch, head) rows of lse (0: t).
    std::int64_t bs_q = 0, bs_k = 0, bs_v = 0, bs_o = 0, bs_lse = 0;
    // causal: query i sees keys 0..i; else every query sees all t keys (a query block
    // against an earlier key/value block of the same sequence).
    bool causal = true;
    // The backward adds its gradients to dq, dk, dv instead of writing them.
    bool accumulate = false;
    std::int64_t batch_q() const { return bs_q ? bs_q : t * ld_q; }
    std::int64_t batch_k() const { return bs_k ? bs_k : t * ld_k; }
    std::int64_t batch_v() const { return bs_v ? bs_v : t * ld_v; }
    std::int64_t batch_o() const { return bs_o ? bs_o : t * ld_o; }
    std::int64_t lse_row() const { return bs_lse ? bs_lse : t; }
  };
  // out [.., ld_o] = attention; lse[B,NH,T] = log-sum-exp of each row's scaled scores.
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& s) = 0;
  // dq, dk, dv (strides ld_q, ld_k, ld_v) WRITTEN (added to with s.accumulate): the gradients
  // w.r.t. q, k, v (each key/value head summing its query heads); dout has stride ld_o; out
  // and lse from the forward. out and lse may be those of attention over more keys than k, v
  // (merged blocks): P = exp(S - lse) and D = rowsum(dout * out) then give this block's exact
  // share of the gradients.
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v, const AttentionShape& s) = 0;
  // Merges a partial result over another set of keys into a running one (both laid out as
  // out and lse of `s`; only b, t, nh, hs, ld_o, bs_o, bs_lse are read), per row:
  //   lse' = log(exp(lse) + exp(lse_part)),
  //   out' = out exp(lse - lse') + out_part exp(lse_part - lse').
  // A running lse of -inf (no keys yet) takes the partial as it is.
  virtual void attention_merge(float* out, float* lse, const float* out_part,
                               const float* lse_part, const AttentionShape& s) = 0;
  // attention_forward / attention_backward on bf16 storage (std::uint16_t, round to nearest
  // even): q, k, v, dout, out read as bf16, out, dq, dk, dv written as bf16 at the shape's
  // strides (in elements; the columns between them untouched), lse fp32. Gradients are
  // written: s.accumulate is refused. The default widens into host fp32, runs the fp32 entry
  // points and narrows (host memory: the CPU backends; tests only); CUDA runs them on the bf16
  // tensors (CudaOps, attention_bf16.cpp). The CP attention on the CUDA bf16 block calls them.
  virtual void attention_forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                      const std::uint16_t* k, const std::uint16_t* v,
                                      const AttentionShape& s);
  virtual void attention_backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                       const std::uint16_t* dout, const std::uint16_t* out,
                                       const float* lse, const std::uint16_t* q,
                                       const std::uint16_t* k, const std::uint16_t* v,
                                       const AttentionShape& s);
  // The backend scratch attention_forward / attention_backward of this shape take when they
  // run through a library's fused attention (CUDA under bf16: cuDNN, loaded and its plans
  // made by this call if not yet): the larger of the two, exact; 0 when they do not (the
  // CPU; no cuDNN; a shape it does not take). model::predict_memory counts it
  // (MemoryLayout::fused_attention_bytes). bf16_io: the plans of the bf16 entry points the
  // fused blocks call on their [q k v] rows (CUDA: no copies, cuDNN's workspace only).
  virtual std::int64_t fused_attention_bytes(const AttentionShape& s, bool bf16_io = false) {
    (void)s, (void)bf16_io;
    return 0;
  }

  // The reference path (tests and benchmarks only: it stores T x T per head).
  // qkv[B,T,3C]: columns q (C), then k (C), then v (C); inside each, head h owns columns
  // [h*hs, (h+1)*hs). Causal softmax(q k^T / sqrt(hs)) v per head, written to out[B,T,C]
  // with head h at columns [h*hs, (h+1)*hs). att[B,NH,T,T] keeps the probabilities for the
  // backward (entries above the diagonal are 0).
  virtual void attention_naive_forward(float* out, float* att, const float* qkv, int b, int t,
                                       int c, int nh) = 0;
  // dqkv[B,T,3C] = gradient w.r.t. qkv; datt[B,NH,T,T] is scratch.
  virtual void attention_naive_backward(float* dqkv, float* datt, const float* dout,
                                        const float* qkv, const float* att, int b, int t, int c,
                                        int nh) = 0;

  // One new query row per sequence against a key-value cache (generation): q[B, ld_q] holds
  // nh heads of hs columns; the cache holds s positions (the newest included) per sequence,
  // key row j of sequence b at k + b*kv_batch + j*ld_kv (v likewise), nkv heads of hs. Query
  // head h reads kv head h / (nh / nkv). out[B, ld_o] = softmax(q k^T / sqrt(hs)) v over the s
  // positions. `scratch` holds decode_scratch_floats(b, nh, s) floats of device memory.
  virtual void attention_decode(float* out, float* scratch, const float* q, const float* k,
                                const float* v, int b, int s, int nh, int nkv, int hs,
                                std::int64_t ld_q, std::int64_t ld_kv, std::int64_t kv_batch,
                                std::int64_t ld_o) = 0;
  static std::int64_t decode_scratch_floats(int b, int nh, int s) {
    return std::int64_t(b) * nh * s;
  }

  // ---- coarse ops: GPT-2's whole block on one rank (ops/fused_block.cpp) ----------------
  //   res2 = x + c_proj(attention(c_attn(ln_1(x))))
  //   out  = res2 + c_proj(gelu(c_fc(ln_2(res2))))
  // Training's block at any TP (below) and context parallelism (the shape's attention hook),
  // without a key-value cache (the model composes the fine ops itself for decode). The default
  // runs exactly the fine ops in model::Gpt2Block's order (the CPU backends' results are the
  // composition's bit for bit); a backend may fuse them (CUDA under bf16: bf16 activations
  // inside, residual adds and LayerNorms fused; cuda_ops.hpp; any TP, SP and CP).
  //
  // Tensor (and sequence) parallelism: the shape's tp names the collectives the model runs
  // between the products (BlockCollectives, over its TP group); c_attn and c_fc are then
  // column-parallel (ca attention columns and f MLP columns here), the c_projs row-parallel
  // (fp32 partials, their biases added on tp_rank 0 only, summed by leave_forward), and under
  // SP the residual stream holds nr of the n rows. The default composition is then THE
  // sequence for TP and SP too (model::Gpt2Block composes only decode itself).
  struct BlockCollectives {
    virtual ~BlockCollectives() = default;
    // Where a LayerNorm writes its local rows inside the full [N,C] buffer (full itself
    // without SP), and the full rows from every rank's local rows (SP: all-gather; else none).
    virtual float* local_part(float* full, std::int64_t local_n) = 0;
    virtual void enter_forward(float* full, std::int64_t local_n) = 0;
    // Where a row-parallel product's partial of y goes (y itself without SP), and the sum of
    // every rank's partial into this rank's local rows of y (allreduce / reduce-scatter).
    virtual float* partial_of(float* y) = 0;
    virtual void leave_forward(float* partial, float* local, std::int64_t local_n) = 0;
    // The adjoints: the local rows' gradient from the partial full-row gradients (dfull
    // itself, reduced in place, without SP) and the full rows' gradient from the local rows'.
    virtual const float* enter_backward(float* dfull, std::int64_t local_n) = 0;
    virtual const float* leave_backward(const float* dlocal, std::int64_t local_n) = 0;
  };
  // Context parallelism: the attention core over the CP group (model::Block's ring or Ulysses
  // attention), which the coarse ops call in place of attention_forward / attention_backward
  // (the same signatures, fp32 operands: a bf16 block converts around it). Null: this rank
  // holds every row of its sequences and the ops' own attention runs.
  // bf16_exact (an argument, so that every caller says it): q, k, v (dout, out) hold bf16
  // values widened, and the caller rounds out (dq, dk, dv) to bf16; a hook may then move
  // operands, and results it only permutes, as bf16 (the ring, Ulysses: half the bytes, the
  // same bits). lse is never rounded. The composition passes false.
  struct BlockAttention {
    virtual ~BlockAttention() = default;
    virtual void forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionShape& s, bool bf16_exact) = 0;
    virtual void backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const AttentionShape& s, bool bf16_exact) = 0;
    // bf16 entry points (the CUDA bf16 block's, where cp_attention_bf16() and takes_bf16()):
    // q, k, v, out, dout bf16 at the shape's strides (elements), out, dq, dk, dv written as
    // bf16 (dq, dk, dv: every column the heads read; others untouched), lse fp32; no fp32
    // copies on either side. A hook that does not take them is called on fp32 copies.
    virtual bool takes_bf16() const { return false; }
    virtual void forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                              const std::uint16_t* k, const std::uint16_t* v,
                              const AttentionShape& s) {
      (void)out, (void)lse, (void)q, (void)k, (void)v, (void)s;
      throw Error("internal: this attention hook takes no bf16 operands");
    }
    virtual void backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                               const std::uint16_t* dout, const std::uint16_t* out,
                               const float* lse, const std::uint16_t* q, const std::uint16_t* k,
                               const std::uint16_t* v, const AttentionShape& s) {
      (void)dq, (void)dk, (void)dv, (void)dout, (void)out, (void)lse, (void)q, (void)k, (void)v;
      (void)s;
      throw Error("internal: this attention hook takes no bf16 operands");
    }
  };
  // The backend's own attention_forward / attention_backward as a hook: what the coarse ops'
  // default runs where the shape names none (and, in tests, a one-rank stand-in for the ring).
  struct OwnAttention final : BlockAttention {
    explicit OwnAttention(Ops& o) : ops(o) {}
    void forward(float* out, float* lse, const float* q, const float* k, const float* v,
                 const AttentionShape& s, bool /*bf16_exact*/) override {
      ops.attention_forward(out, lse, q, k, v, s);
    }
    void backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                  const float* lse, const float* q, const float* k, const float* v,
                  const AttentionShape& s, bool /*bf16_exact*/) override {
      ops.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s);
    }
    Ops& ops;
  };
  struct Gpt2BlockShape {
    int b = 0, t = 0;
    int c = 0;   // channels
    int nh = 0;  // heads here (hs = ca / nh)
    int f = 0;   // MLP columns here
    // TP: this rank's attention columns (0: c), rank, local residual rows (0: b * t) and
    // collectives (null: one rank, TP 1).
    int ca = 0;
    int tp_rank = 0;
    int nr = 0;
    BlockCollectives* tp = nullptr;
    BlockAttention* attention = nullptr;  // context parallelism (null: attention_forward)
    int attn_c() const { return ca ? ca : c; }
    int rows() const { return nr ? nr : b * t; }
  };
  // The block's parameters (weights), or their gradients (ACCUMULATED, as linear_backward).
  struct Gpt2BlockParams {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
  };
  // The layer's stash, written by the forward and read by the backward. With bf16 (only where
  // gpt2_block_stash_bf16() says the backend keeps it so) ln1, qkv, atty, ln2, fch, fch_gelu
  // each have room for their elements at 2 bytes (half the floats) and hold the backend's bf16
  // values, readable only by its gpt2_block_backward; res2 and the row statistics are fp32.
  struct Gpt2BlockStash {
    // [N,C] [N] [N] [N,3C] [N,C] [B,NH,T] [N,C]
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2;
    // [N,C] [N] [N] [N,F] [N,F]
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
    bool bf16 = false;
    // Selective recompute: atty, lse and fch_gelu are one copy shared by every layer, which
    // gpt2_block_recompute fills again before the layer's backward; the forward then writes
    // them as the recompute will (bit for bit).
    bool recomputed = false;
  };
  // The backward's scratch: dbuf [N,C], dqkv [N,3C], dfch [N,F], dact [N,F] floats.
  struct Gpt2BlockScratch {
    float *dbuf, *dqkv, *dfch, *dact;
  };
  // The split backward (zero-bubble B and W): the gradients at c_attn's and c_fc's outputs
  // (Llama: [q k v]'s and [gate up]'s), which B keeps for W. Floats as the stash's qkv and fch
  // ([N,3C] and [N,F]; Llama [N,C+2kv] and [N,2F]); with la.bf16 they hold bf16 (room for
  // half the floats). They may be la.qkv and la.fch themselves: B writes them only after its
  // last read of those.
  struct BlockWStash {
    float *dfch, *dqkv;
  };
  // Whether this backend keeps the stash as bf16 (Gpt2BlockStash::bf16) when given room for
  // it: the model then carves half-size tensors and passes bf16 = true. Default: no.
  virtual bool gpt2_block_stash_bf16() const { return false; }
  // Whether the bf16 block (gpt2_block_stash_bf16) calls its context-parallel attention
  // hook's bf16 entry points (BlockAttention::takes_bf16) rather than the fp32 ones on fp32
  // copies of its operands (CUDA: unless TRIDENT_CUDA_CP_BF16=0). The model makes its ring
  // or Ulysses buffers bf16 then, and predict_memory counts them so.
  virtual bool cp_attention_bf16() const { return false; }
  // out[N,C] = the block of x[N,C] (out may be x); fills the stash.
  virtual void gpt2_block_forward(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                  const float* x, float* out, const Gpt2BlockStash& la);
  // dres[N,C]: d loss / d out in, d loss / d x out (in place); g += the parameter gradients.
  // Reads the stash of the forward of the same x. With w (the split backward's B): every
  // gradient but c_attn's and c_fc's weight gradients, whose output gradients go to *w for
  // gpt2_block_backward_weights; their bias gradients are taken here or there (the backend's
  // choice, once: the default there, as the model's composition; CUDA's bf16 block here).
  virtual void gpt2_block_backward(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                   const Gpt2BlockParams& g, const float* x, float* dres,
                                   const Gpt2BlockStash& la, const Gpt2BlockScratch& scratch,
                                   const BlockWStash* w = nullptr);
  // The split backward's W: g += what gpt2_block_backward left to it, from w and the stash's
  // ln1 and ln2 (the only activations it reads; the rest may be gone).
  virtual void gpt2_block_backward_weights(const Gpt2BlockShape& s, const Gpt2BlockParams& p,
                                           const Gpt2BlockParams& g, const Gpt2BlockStash& la,
                                           const BlockWStash& w);
  // Selective recompute: la's atty, lse (attention from its qkv) and fch_gelu (GELU of its
  // fch) as the forward wrote them, before gpt2_block_backward reads them. Default: the
  // composition's attention_forward and gelu_forward.
  virtual void gpt2_block_recompute(const Gpt2BlockShape& s, const Gpt2BlockStash& la);

  // ---- coarse ops: Llama's whole block on one rank (ops/fused_block.cpp) ----------------
  //   res2 = x + o(attention(rope([q k v](rmsnorm(x)))))     grouped-query attention
  //   out  = res2 + down(swiglu([gate up](rmsnorm(res2))))
  // The same contract as the GPT-2 block's (any TP and SP through the shape's collectives, CP
  // through its attention and slice; the default runs exactly model::LlamaBlock's fine ops).
  // Weights are [out, in] (y = x @ W^T), no biases. CUDA's bf16 Llama block: any TP, SP and
  // CP, as GPT-2's (stores_fused_block).
  // gpt2_block_stash_bf16() says whether the backend keeps this block's stash as bf16 too.
  struct LlamaBlockShape {
    int b = 0, t = 0;
    int c = 0;         // channels (= nh * hs)
    int nh = 0;        // query heads
    int nkv = 0;       // key-value heads (nh a multiple of it)
    int f = 0;         // MLP columns (gate | up: 2f)
    float eps = 0.0f;  // RMSNorm's
    float theta = 0.0f;  // RoPE's base
    // TP (as Gpt2BlockShape's): this rank's query columns (0: c), its k (and v) columns of
    // [q k v] (0: nkv heads'; more where every kv head is replicated here, n_kv_head < tp),
    // the first of them its query heads read, its TP rank (a fused block adds the residual
    // in a row-parallel product on rank 0 only), local residual rows (0: b * t), collectives
    // (null: TP 1).
    int ca = 0;
    int kv_cols = 0;
    int kv_head0 = 0;
    int tp_rank = 0;
    int nr = 0;
    BlockCollectives* tp = nullptr;
    // Context parallelism: the attention core over the CP group (null: attention_forward) and
    // the positions of the rows (RoPE per run; cp 1: positions 0..t-1 of every sequence).
    BlockAttention* attention = nullptr;
    CpSlice slice;
  };
  struct LlamaBlockParams {
    // [C] [C+2kv, C] [C, C] [C] [2F, C] [C, F]
    float *ln1_w, *qkv_w, *o_w, *ln2_w, *gateup_w, *down_w;
  };
  // As Gpt2BlockStash (qkv rotated; fch = [gate up] [N,2F], fch_gelu = swiglu [N,F]); with
  // bf16, ln1, qkv, atty, ln2, fch, fch_gelu hold bf16.
  struct LlamaBlockStash {
    float *ln1, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_rstd, *fch, *fch_gelu;
    bool bf16 = false;
  };
  // scratch: dbuf [N,C], dqkv [N,C+2kv], dfch [N,2F], dact [N,F] floats.
  virtual void llama_block_forward(const LlamaBlockShape& s, const LlamaBlockParams& p,
                                   const float* x, float* out, const LlamaBlockStash& la);
  // w: the split backward as gpt2_block_backward's ([q k v]'s and [gate up]'s weight
  // gradients left to llama_block_backward_weights; no biases).
  virtual void llama_block_backward(const LlamaBlockShape& s, const LlamaBlockParams& p,
                                    const LlamaBlockParams& g, const float* x, float* dres,
                                    const LlamaBlockStash& la, const Gpt2BlockScratch& scratch,
                                    const BlockWStash* w = nullptr);
  virtual void llama_block_backward_weights(const LlamaBlockShape& s, const LlamaBlockParams& p,
                                            const LlamaBlockParams& g, const LlamaBlockStash& la,
                                            const BlockWStash& w);
  // Selective recompute (the stash's atty, lse and fch_gelu one copy shared by the layers):
  // la's atty, lse (attention from its rotated qkv) and fch_gelu (SwiGLU of its [gate up]) as
  // the forward wrote them, before llama_block_backward reads them; local at any TP (this
  // rank's heads and columns). Default: the composition's attention_forward and
  // swiglu_forward (model::LlamaBlock's recompute, call for call).
  virtual void llama_block_recompute(const LlamaBlockShape& s, const LlamaBlockStash& la);

  // ---- embeddings -----------------------------------------------------------------
  // Masked (vocab-parallel) lookup: x[N,C] = wte[tok - vocab_start] when
  // vocab_start <= tok < vocab_start + v, else 0. wte is [v, C].
  virtual void embedding_forward(float* x, const std::int32_t* tokens, const float* wte, int n,
                                 int c, int vocab_start, int v) = 0;
  // dwte[v,C] += dx rows for the tokens in range
  virtual void embedding_backward(float* dwte, const float* dx, const std::int32_t* tokens,
                                  int n, int c, int vocab_start, int v) = 0;
  // x[B,T,C] += wpe[t] for each position t
  virtual void position_forward(float* x, const float* wpe, int b, int t, int c) = 0;
  // dwpe[T,C] += sum over the batch of dx[b,t]
  virtual void position_backward(float* dwpe, const float* dx, int b, int t, int c) = 0;

  // ---- softmax cross-entropy, in three passes so that the vocabulary may be sharded ----
  // (between the passes the caller reduces row_max with MAX and sumexp/target_logit with
  // SUM over the TP group). logits[N, ld]; only columns [0, v_valid) are real, the rest is
  // padding and is ignored (and gets zero gradient).
  virtual void xent_row_max(float* row_max, const float* logits, int n, int ld, int v_valid) = 0;
  // sumexp[N] = sum_j exp(logits[j] - row_max); target_logit[N] = logits[target - vocab_start]
  // when the target is in this shard, else 0.
  virtual void xent_sumexp(float* sumexp, float* target_logit, const float* logits,
                           const float* row_max, const std::int32_t* targets, int n, int ld,
                           int v_valid, int vocab_start) = 0;
  // loss[N] = log(sumexp) + row_max - target_logit
  virtual void xent_loss(float* loss, const float* row_max, const float* sumexp,
                         const float* target_logit, int n) = 0;
  // The three forward calls above in one, for a vocabulary that is not sharded (a TP group of
  // one: nothing to reduce between the passes). The default is those calls (so the CPU
  // backends' results are theirs exactly); the CUDA backend reads each row once, with an
  // online max and sum of exponentials (the same values up to the rounding of the sums).
  virtual void xent_forward(float* loss, float* row_max, float* sumexp, float* target_logit,
                            const float* logits, const std::int32_t* targets, int n, int ld,
                            int v_valid, int vocab_start) {
    xent_row_max(row_max, logits, n, ld, v_valid);
    xent_sumexp(sumexp, target_logit, logits, row_max, targets, n, ld, v_valid, vocab_start);
    xent_loss(loss, row_max, sumexp, target_logit, n);
  }
  // The first pass of a sharded vocabulary in one call: row_max[N] = this shard's row max,
  // sumexp[N] = sum_j exp(logits[j] - row_max) over the shard, target_logit as xent_sumexp.
  // The caller then reduces a copy of row_max with MAX, rescales sumexp to the global max
  // (xent_rescale_sumexp) and reduces sumexp/target_logit with SUM. Default: xent_row_max,
  // then xent_sumexp at the shard's max; the CUDA backend reads each row once.
  virtual void xent_shard_stats(float* row_max, float* sumexp, float* target_logit,
                                const float* logits, const std::int32_t* targets, int n, int ld,
                                int v_valid, int vocab_start) {
    xent_row_max(row_max, logits, n, ld, v_valid);
    xent_sumexp(sumexp, target_logit, logits, row_max, targets, n, ld, v_valid, vocab_start);
  }
  // sumexp[i] *= exp(shard_max[i] - row_max[i]) (formed in double): the shard's sum at the
  // global max row_max (>= shard_max); 0 where the shard had no columns (shard_max -inf).
  virtual void xent_rescale_sumexp(float* sumexp, const float* shard_max, const float* row_max,
                                   int n) = 0;
  // In place: logits[N,ld] becomes scale * (softmax - onehot(target)); padding columns 0.
  virtual void xent_backward(float* logits, const float* row_max, const float* sumexp,
                             const std::int32_t* targets, int n, int ld, int v_valid,
                             int vocab_start, float scale) = 0;
  // The loss summed where it is computed, read once a step: add_loss adds
  // sum_i loss[i] (i in order, in double) to the backend's total; take_loss returns the total
  // since the last take (then zero). The default copies loss to the host (when it is device
  // memory) and sums there, i.e. the order of a host loop; the CUDA backend sums on the
  // device (a deterministic tree of double partials: the same value up to double rounding)
  // and copies one double per take.
  // (Inline: the CUDA module, a separate library, must not need a symbol of this class.)
  virtual void add_loss(const float* loss, int n) {
    if (n <= 0) return;
    const float* host = loss;
    if (DeviceMemory* mem = memory(); mem && mem->holds(loss)) {
      loss_host_.resize(std::size_t(n));
      mem->to_host(loss_host_.data(), loss, std::size_t(n) * sizeof(float));
      host = loss_host_.data();
    }
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += host[i];
    loss_total_ += sum;
  }
  virtual double take_loss() {
    const double total = loss_total_;
    loss_total_ = 0;
    return total;
  }

  // ---- the LM head, its vocabulary whole or split over a TP group, in one call ------------
  // logits[N,V] = lnf[N,C] @ wte[V,C]^T; the softmax cross-entropy of each row against
  // targets[N] (columns [v_valid, V) are padding: ignored, zero gradient) into loss[N], added
  // to the loss total (add_loss). With with_backward, dlogits = loss_scale * (softmax -
  // onehot), then dlnf[N,C] = dlogits @ wte (written) and dwte[V,C] += dlogits^T @ lnf.
  // logits: storage of N*V floats, or of N*V bf16 (max(ceil(N*V/2), V) floats) where
  // fused_lm_head() (its contents afterwards are unspecified); row_max[N] and
  // stats[2N]: scratch for the row statistics. The final norm stays outside (the model's
  // LayerNorm or RMSNorm).
  // Vocabulary-parallel (Megatron's; tp non-null): wte holds this rank's V rows of the
  // vocabulary from vocab_start, the rows' statistics are combined over the group
  // (vocab_parallel_xent_forward), loss is the whole vocabulary's, and dlnf is this rank's
  // partial (the caller sums it over the group). tp null (a group of one): vocab_start 0.
  // Default (ops/lm_head.cpp): gemm, vocab_parallel_xent_forward, add_loss, xent_backward
  // and the two gemms, the model's calls in the model's order before the op existed, so the
  // CPU backends' results are theirs exactly. CUDA under bf16 (ops/cuda/lm_head.cpp): bf16
  // logits and a fused classifier (fused_lm_head()), at any TP.
  struct HeadCollectives {
    virtual ~HeadCollectives() = default;
    virtual void allreduce_max(float* x, std::int64_t n) = 0;  // over the TP group, in place
    virtual void allreduce_sum(float* x, std::int64_t n) = 0;
  };
  virtual void lm_head(float* loss, float* dlnf, float* dwte, float* logits, float* row_max,
                       float* stats, const float* lnf, const float* wte,
                       const std::int32_t* targets, int n, int c, int v, int v_valid,
                       float loss_scale, bool with_backward, int vocab_start,
                       HeadCollectives* tp);
  // The cross-entropy forward of logits[N,ld] (this rank's shard from vocab_start; stats =
  // sumexp[N] then target_logit[N]). tp null: xent_forward. Else one read of the shard
  // (xent_shard_stats, the shard's max held in loss meanwhile), the global max (allreduce
  // max of a copy), each shard's sum rescaled to it, then sumexp and target_logit summed in
  // one allreduce, then xent_loss. The one copy of this sequence (lm_head, model::xent2d).
  void vocab_parallel_xent_forward(float* loss, float* row_max, float* stats,
                                   const float* logits, const std::int32_t* targets, int n,
                                   int ld, int v_valid, int vocab_start, HeadCollectives* tp);
  // Whether lm_head runs fused rather than as the composition above: the logits are then
  // bf16 (the model's buffer is half the size) and its backend scratch is a bf16 copy of lnf
  // (2 N C bytes) instead of the products' bf16 copies of the logits (model::predict_memory,
  // MemoryLayout::fused_head).
  virtual bool fused_lm_head() const { return false; }

  // ---- optimizer --------------------------------------------------------------------
  // torch.optim.AdamW, step by step:  p *= 1 - lr*wd;  m = b1 m + (1-b1) g;
  // v = b2 v + (1-b2) g^2;  p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
  // with bc1 = 1 - b1^step, bc2 = 1 - b2^step (passed in). As in Python, the scalar
  // factors (1 - b, lr / bc1, ...) are formed in double, from the shortest decimal of each
  // float argument (1 - double(0.999f) would be 1.3e-5 off 1 - 0.999).
  virtual void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, float bc1,
                     float bc2) = 0;

  // ---- the optimizer step over many tensors (AdamW::grad_norm and AdamW::step) ---------
  // [x, x + n): one tensor's run of gradient elements.
  struct Span {
    const float* x = nullptr;
    std::int64_t n = 0;
  };
  // sums[i] = sum_squares(spans[i].x, spans[i].n), each bit for bit what that call returns
  // (the caller adds them in its own order). Default: sum_squares span by span; CUDA: every
  // span's reduction queued at once, one copy of the sums to the host, one synchronization.
  virtual void sum_squares_spans(const std::vector<Span>& spans, double* sums);
  // One AdamW update of n elements: p, g, m, v as adamw's; decay: weight decay applies.
  struct AdamWSegment {
    float* p = nullptr;
    float* g = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    std::int64_t n = 0;
    bool decay = false;
  };
  // For every segment: g scaled by grad_scale when grad_scale != 1 (g * grad_scale in float,
  // as scale), then adamw with weight_decay (decay) or 0, bit for bit what those calls give
  // (p, m, v). The gradients are left unspecified (scaled or not): nothing may read them
  // after. Default: scale over every segment, then adamw segment by segment; CUDA: one launch
  // for all, which also refreshes the weight cache's copy of every segment that lies in
  // set_weights' range (so the cache stays as fresh as it was: weights_changed() is then
  // needed only for writes from outside the backend, e.g. ZeRO-1's all-gather).
  virtual void adamw_segments(const std::vector<AdamWSegment>& segments, float grad_scale,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              float bc1, float bc2);

 private:
  double loss_total_ = 0;        // the default add_loss's total
  std::vector<float> loss_host_;  // and its host copy of a device loss
};

// The shape of GPT's multi-head attention on a fused qkv[B,T,3C] (C = this rank's channels,
// NH heads): q = qkv, k = qkv + C, v = qkv + 2C, all with row stride 3C; out[B,T,C].
inline Ops::AttentionShape attention_shape_qkv(int b, int t, int c, int nh) {
  Ops::AttentionShape s;
  s.b = b;
  s.t = t;
  s.nh = s.nkv = nh;
  s.hs = nh > 0 ? c / nh : 0;
  s.ld_q = s.ld_k = s.ld_v = 3 * std::int64_t(c);
  s.ld_o = c;
  return s;
}

// The shape of Llama's grouped-query attention on its [q k v] rows at TP 1 (q = qkv, k = qkv +
// C, v = k + nkv * hs, row stride C + 2 nkv hs; out[B,T,C]).
inline Ops::AttentionShape attention_shape_llama(const Ops::LlamaBlockShape& b) {
  Ops::AttentionShape s;
  s.b = b.b;
  s.t = b.t;
  s.nh = b.nh;
  s.nkv = b.nkv;
  const int ca = b.ca ? b.ca : b.c;  // TP: this rank's query columns
  s.hs = b.nh > 0 ? ca / b.nh : 0;
  const std::int64_t kv_cols = b.kv_cols ? b.kv_cols : std::int64_t(b.nkv) * s.hs;
  s.ld_q = s.ld_k = s.ld_v = ca + 2 * kv_cols;
  s.ld_o = ca;
  return s;
}


// threads: OpenMP and BLAS threads this rank uses (>= 1).
std::unique_ptr<Ops> make_cpu_ops(int threads);
// The CPU kernels on `arena_bytes` of guarded device memory (ops/cpu/guarded_ops.cpp): a test
// backend that fails at every missing host <-> device copy.
std::unique_ptr<Ops> make_guarded_ops(int threads, std::size_t arena_bytes);

// What a rank asks of its backend at start-up.
struct BackendOptions {
  std::string device = "cpu";  // "cpu" | "cuda" | "cpu-guarded"
  int threads = 1;             // OpenMP/BLAS threads (cpu, cpu-guarded)
  Precision precision = Precision::fp32;
  int local_rank = 0;  // rank within the node: cuda uses GPU local_rank % (GPUs on the node)
  int local_size = 1;  // ranks on the node (ranks sharing a GPU split its memory)
  // Device arena: 0 = cuda: 85% of the GPU's memory / the ranks sharing it (at most 90% of
  // what is free);
  // cpu-guarded: 2 GiB of address space (reserved, committed only as used).
  std::size_t arena_bytes = 0;
};
// The backend `options` names; a clear Error when it is not available (no GPU, built without
// CUDA, a precision the backend lacks: "cpu" and "cpu-guarded" are fp32 only).
std::unique_ptr<Ops> make_ops(const BackendOptions& options);
// make_ops for device "cpu" | "cuda" | "cpu-guarded" with everything else default.
std::unique_ptr<Ops> make_ops(const std::string& device, int threads,
                              Precision precision = Precision::fp32);

}  // namespace trident::ops
