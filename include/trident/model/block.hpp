// trident/model/block.hpp — one transformer block per architecture (model.arch), the way
// Megatron-Core builds a layer from a module spec and llm.c keeps one forward/backward pair
// per layer: each Block subclass (model/gpt2_block.hpp, model/llama_block.hpp) holds its
// architecture's forward, backward, weight pass (split backward), selective recomputation
// and single-token key-value-cache step, and its norm (the head's final norm is one of the
// block's kind). GptChunk picks the block once (block_kind) and runs every layer, in
// training, recomputation, inference and generation, through it.
//
// A new architecture: a Block subclass in its own file, one line in block_kind
// (src/model/block.cpp), and its role table (model_roles, spec.cpp).
//
// Legend as gpt.hpp: B = micro-batch, T = seq_len, C = d_model, N = B*T rows (all rows:
// gathered under sequence parallelism), Nr residual-stream rows here, NH heads here,
// Ca = C/tp, C3 this rank's q|k|v columns, F its MLP columns, F1 the MLP's first product's.
// defines: trident::model::LayerActivations, LayerGradStash, ChunkDims, BlockParams,
//          BlockContext, Block, BlockKind, block_kind
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "trident/model/ring_attention.hpp"
#include "trident/model/spec.hpp"
#include "trident/model/ulysses_attention.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/tp_mappings.hpp"

namespace trident::model {

// What one transformer block keeps from its forward for its backward.
struct LayerActivations {
  float* ln1;       // [B,T,C]     (all rows: gathered under SP)
  float* ln1_mean;  // [Nr]
  float* ln1_rstd;  // [Nr]
  float* qkv;       // [B,T,C3]
  float* atty;      // [B,T,C/tp]  attention output before c_proj
  float* lse;       // [B,NH,T]    attention's log-sum-exp per row (flash: no T x T)
  float* res2;      // [Nr,C]      residual after attention
  float* ln2;       // [B,T,C]     (all rows: gathered under SP)
  float* ln2_mean;  // [Nr]
  float* ln2_rstd;  // [Nr]
  float* fch;       // [B,T,F1]    c_fc output (Llama: gate | up)
  float* fch_gelu;  // [B,T,F]     its activation (GELU; Llama: SwiGLU)
  // Carved for the backend's bf16 block stash (carve_fused_layer: ln1, qkv, atty, ln2, fch,
  // fch_gelu at 2 bytes an element, only the backend's coarse block op reads them).
  bool bf16 = false;
  // Selective recompute: atty, lse and fch_gelu are the one shared copy (carve_layer's,
  // carve_fused_layer's `shared`), filled again by Block::recompute before the backward.
  bool recomputed = false;
};

// What the weight-gradient pass (Block::backward_weights) of one transformer block needs
// from its input-gradient pass besides the linears' inputs (ln1, ln2): the gradients at the
// outputs of c_attn and c_fc, the only weight gradients it defers (B computes the c_projs'
// and the norms' with the input gradients). GptChunk points them at the layer's own qkv and
// fch, dead once B has read them (same sizes), unless the layer keeps no copy of its own
// (the packed bf16 storage, full recompute: a stash of their own, grad_stash_separate).
// Where the layer's stash is the fused block's (la.bf16) they hold bf16 (Ops::BlockWStash).
struct LayerGradStash {
  float* dfch;   // [B,T,F1]  at the c_fc output
  float* dqkv;   // [B,T,C3]  at the c_attn output
};

// The sizes a rank's chunks are allocated by, for one microbatch: B micro_batch, T seq_len,
// C d_model, N = B*T, Nr residual-stream rows here (N, or N/tp under SP), NH heads here,
// Ca = C/tp this rank's attention columns, C3 its q|k|v columns, F its MLP columns and F1
// the MLP's first product's (F; Llama's gate | up: 2F), Vl its vocabulary rows (padded),
// kv_cols the k (and v) columns of its qkv rows (Llama: its kv heads, or all of them when
// n_kv_head < tp replicates them). GptChunk carves its buffers by these and predict_memory
// (model/memory.hpp) counts the same carving; the block sizes C3, F1 and kv_cols
// (BlockKind::size).
struct ChunkDims {
  std::int64_t B = 0, T = 0, C = 0, N = 0, Nr = 0, NH = 0, Ca = 0, C3 = 0, F = 0, F1 = 0,
               Vl = 0, kv_cols = 0;
};

// One layer's tensors in a flat buffer (parameters or gradients), by role; null where the
// architecture has none (Llama's biases). Llama's [q; k; v] and [gate; up] are adjacent, so
// qkv_w and fc_w are the whole stacked matrices.
struct BlockParams {
  float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
  float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};

// What every block of a chunk shares with the chunk: the model, the kernels, the TP
// mappings, the sizes and the backward scratch the chunk owns (one backward runs at a time).
struct BlockContext {
  const ModelConfig& cfg;
  ops::Ops& ops;
  parallel::TpMappings& tpm;
  int tp_rank, tp_size;
  ChunkDims dims;
  float* dbuf;        // [N,C] partial input gradients of column-parallel layers
  float* dqkv;        // [N,C3]
  float* dfch;        // [N,F1]
  float* dact;        // [N,F]   d loss / d the MLP activation's output
  float* full;        // SP: [N,C] partial sums and gathers (null without SP)
  float* local;       // SP: [Nr,C] reduce-scattered norm gradients (null without SP)
  // Context parallelism: the CP ring (null, or one rank: every row of the sequence is here).
  // Its rank's rows are chunks r and 2·cp−1−r of each sequence (dims.T = seq_len / cp).
  parallel::Comm* cp_group = nullptr;
  // parallel.cp_mode: the ring (RingAttention) or all-to-all over heads (UlyssesAttention).
  CpMode cp_mode = CpMode::ring;
  // The fused bf16 block calls the CP attention's bf16 entry points (Ops::cp_attention_bf16):
  // the ring or Ulysses is made for bf16 operands (where the head size is even).
  bool cp_bf16 = false;
};

// The keys and values of the positions generated so far (per layer, [T, kv width] each) and
// where the next token goes.
struct KvCache {
  float* k;
  float* v;
  int pos;  // the new token's position; the cache holds 0..pos-1
};

class Block {
 public:
  explicit Block(const BlockContext& ctx);
  virtual ~Block() = default;
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  // Forward over b*t rows (b, t: the microbatch's B, T; inference's 1, t): x [Nr,C] the
  // block's input, out [Nr,C] its output, la what the backward needs.
  virtual void forward(const BlockParams& p, const float* x, float* out, LayerActivations& la,
                       int b, int t) = 0;
  // Backward over the microbatch: dres [Nr,C] holds d loss / d out and becomes d loss / d x.
  // stash null: the input and the parameter gradients (+= into g); otherwise (zero-bubble B)
  // all but c_attn's and c_fc's weight gradients, whose output gradients go to *stash, which
  // may alias la.qkv and la.fch (written only after B's last read of them).
  virtual void backward(const BlockParams& p, const BlockParams& g, const float* x, float* dres,
                        LayerActivations& la, LayerGradStash* stash) = 0;
  // The rest of backward (zero-bubble W, += into g): c_attn's and c_fc's weight gradients
  // from *stash and la.ln1, la.ln2 (the only activations it reads).
  virtual void backward_weights(const BlockParams& p, const BlockParams& g,
                                const LayerActivations& la, const LayerGradStash& stash) = 0;
  // Selective recompute: la's attention core (atty, lse) and MLP activation (fch_gelu) again
  // over the microbatch, from its kept qkv and fch.
  virtual void recompute(LayerActivations& la) = 0;
  // Generation (one rank, TP 1): ONE token's residual x [C] at cache.pos through the block,
  // in place; its keys and values join the cache. Uses decode_scratch.
  virtual void decode(const BlockParams& p, float* x, const KvCache& cache) = 0;
  // Floats of one position's keys (and of its values) in the cache.
  std::int64_t kv_width() const { return d_.kv_cols; }
  // Floats of the scratch decode uses (set_decode_scratch).
  std::int64_t decode_scratch_floats() const;
  void set_decode_scratch(float* scratch) { decode_scratch_ = scratch; }

  // The architecture's norm over `rows` rows of C, as the head's final norm applies it
  // (mean is unused and b null where the norm has none). The backward adds into dx.
  virtual void norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int rows) = 0;
  virtual void norm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                             const float* w, const float* mean, const float* rstd,
                             int rows) = 0;

  // Checks a layer's tensors against what the block assumes of their layout (Llama: q, k, v
  // and gate, up adjacent); spec(role) is the layer's tensor of that role, null if none.
  virtual void check_layer(const std::function<const ShardSpec*(Role)>& spec) const;

 protected:
  // A row-parallel linear's output: its product goes to partial_of(y) (y itself without
  // SP), then leave() sums it over TP into this rank's rows of y.
  float* partial_of(float* y) const { return tpm_.sequence_parallel() ? ctx_.full : y; }
  void leave(float* partial, float* y, int n, int out);
  // One token's activations for decode: views into the decode scratch (lse null).
  LayerActivations decode_views() const;

  // Context parallelism's attention core as the coarse block ops take it (their shape's
  // attention): the ring or Ulysses over the CP group, only for the microbatch's own shape
  // (B x T); null without a CP group of more than one rank (the ops' own attention).
  struct CpAttention final : ops::Ops::BlockAttention {
    explicit CpAttention(const Block& b) : block(b) {}
    void forward(float* out, float* lse, const float* q, const float* k, const float* v,
                 const ops::Ops::AttentionShape& shape, bool bf16_exact) override;
    void backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                  const float* lse, const float* q, const float* k, const float* v,
                  const ops::Ops::AttentionShape& shape, bool bf16_exact) override;
    bool takes_bf16() const override;
    void forward_bf16(std::uint16_t* out, float* lse, const std::uint16_t* q,
                      const std::uint16_t* k, const std::uint16_t* v,
                      const ops::Ops::AttentionShape& shape) override;
    void backward_bf16(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                       const std::uint16_t* dout, const std::uint16_t* out, const float* lse,
                       const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                       const ops::Ops::AttentionShape& shape) override;
    const Block& block;
  };
  ops::Ops::BlockAttention* cp_attention() {
    return ring_ || ulysses_ ? &cp_attention_ : nullptr;
  }
  // Makes the ring (or Ulysses, ctx.cp_mode) for the microbatch's attention shape when there
  // is a CP group of more than one rank (the subclass's constructor: the shape is the
  // architecture's).
  void make_ring(const ops::Ops::AttentionShape& local);

  // decode's attention: the token's k and v (kv_width() floats each from column k_col of
  // its qkv row) join the cache; its query heads read positions 0..pos through kv_heads.
  void attend_cached(LayerActivations& la, const KvCache& cache, int kv_heads,
                     std::int64_t k_col);

  const BlockContext ctx_;  // as given (its scratch: ctx_.dbuf, ...)
  const ModelConfig& cfg_;
  ops::Ops& ops_;
  parallel::TpMappings& tpm_;
  // The TP mappings as the coarse block ops take them (over tpm_, SP's scratch full and local),
  // so that device buffers go through the same communicator paths as the composition's.
  struct TpCollectives final : ops::Ops::BlockCollectives {
    explicit TpCollectives(const BlockContext& c) : ctx(c) {}
    float* local_part(float* full, std::int64_t local_n) override;
    void enter_forward(float* full, std::int64_t local_n) override;
    float* partial_of(float* y) override;
    void leave_forward(float* partial, float* local, std::int64_t local_n) override;
    const float* enter_backward(float* dfull, std::int64_t local_n) override;
    const float* leave_backward(const float* dlocal, std::int64_t local_n) override;
    const BlockContext& ctx;
  };
  TpCollectives collectives_{ctx_};
  const ChunkDims d_;
  // Shorthands (the kernels take int).
  const int tp_rank_, B_, T_, C_, NH_, Ca_, C3_, F_, F1_, Nr_;
  float* decode_scratch_ = nullptr;
  // Which positions the local rows hold (RoPE angles); the ring when cp > 1.
  const CpSlice slice_;
  std::unique_ptr<RingAttention> ring_;
  std::unique_ptr<UlyssesAttention> ulysses_;
  CpAttention cp_attention_{*this};
};

// An architecture's block: how it sizes a chunk's q|k|v and MLP columns (C3, F1, kv_cols of
// dims, whose other fields are set), and how to make one.
struct BlockKind {
  void (*size)(const ModelConfig& cfg, int tp, ChunkDims& dims);
  std::unique_ptr<Block> (*make)(const BlockContext& ctx);
};
// The block of model.arch; an Error for an architecture without one.
const BlockKind& block_kind(Arch arch);

}  // namespace trident::model
