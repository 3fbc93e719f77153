// trident/model/gpt.hpp — a pipeline rank's share of a GPT-2 model: one or more model
// chunks (virtual stages, parallel.vpp of them) as Megatron-style tensor-parallel layers
// over the `ops` kernels, with a hand-written backward that mirrors the forward in reverse.
// All of the rank's chunks share ONE flat parameter buffer and one flat gradient buffer,
// described by one ShardSpec table (each logical tensor once: a rank holding both the
// embedding and the head chunk keeps one wte), so the optimizer, checkpoints and gradient
// dumps see "this rank's buffer" whatever vpp is. forward/backward take the chunk index.
// defines: trident::model::GptChunk, ChunkActivations, chunk_dims, Carver, carve_layer, carve_recomputed, carve_grad_stash,
//          LinearDims, block_linears, layer_floats, recomputed_floats, grad_stash_floats,
//          rank_kv_heads
//
// The architecture (model.arch) is the block's (model/block.hpp: Gpt2Block, LlamaBlock),
// picked once: the chunk runs every layer through it, in training, recomputation, inference
// and generation, and the head's final norm is the block's norm. The rest is the role table's
// (spec.hpp): learned positions where it has a position embedding (GPT-2; Llama's are rotary,
// in the block), the head's matrix tied or lm_head. The same TP layers, mappings, pipeline
// chunks, activations and ShardSpec table for every architecture.
//
// Legend: B = micro-batch, T = seq_len, C = d_model, NH = heads on this rank,
// C3 = 3*C/tp (this rank's q,k,v columns), F = 4*C/tp (this rank's MLP columns),
// Vl = vocabulary rows on this rank (padded), L = layers in one chunk (the same for all).
//
// TP communication (all over ps.tp, through parallel::TpMappings; free when tp == 1):
//   column-parallel c_attn, c_fc:  enter (identity fwd / allreduce bwd; SP: all-gather / reduce-scatter)
//   row-parallel c_proj:           leave (allreduce fwd / identity bwd; SP: reduce-scatter / all-gather),
//                                  bias added once (TP rank 0, before the reduction)
//   vocab-parallel embedding:      masked lookup, then leave
//   LM head + cross-entropy:       ln_f output enters; max / sum-exp / target logit reduced,
//                                  never the full logits
// The runtime binds to the StageModel interface (model/stage_model.hpp) this class
// implements; parallel.tp_mode = "2d" is another implementation (model/gpt2d_stage.hpp).
// Sequence parallelism: the residual stream, the LayerNorms and the chunk's input and
// output hold Nr = B*T/tp of the B*T token rows (rank r: rows [r*Nr, (r+1)*Nr) of the
// flattened [B,T]); LayerNorm gradients are summed over TP once per step
// (reduce_sequence_parallel_grads). Without it Nr = B*T.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/model/block.hpp"
#include "trident/model/ring_attention.hpp"
#include "trident/model/spec.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/parallel/tp_mappings.hpp"

namespace trident::model {

// The sizes of a rank's chunks (ChunkDims, model/block.hpp), the block's part by its BlockKind.
// cp: context-parallel ranks; each holds seq_len / cp rows of every sequence (T below).
ChunkDims chunk_dims(const ModelConfig& cfg, int tp, int micro_batch, bool sequence_parallel,
                     int cp = 1);

// The key/value heads a rank's attention reads at tensor parallelism tp: kv_heads() / tp
// where TP splits them, one where n_kv_head < tp replicates them (each rank's query heads
// read one copy); GPT-2: its query heads, n_head / tp. What the ring and Ulysses pass on.
int rank_kv_heads(const ModelConfig& cfg, int tp);

// A block's linears on one TP rank, [rows, in] -> [rows, out], in forward order: q|k|v
// (C -> C3), the attention's output projection (Ca -> C), the MLP's first product (C -> F1:
// GPT-2's fc, Llama's gate|up) and its second (F -> C). What the memory model, the planner's
// cost model and `trident calibrate` size their products by.
struct LinearDims {
  std::int64_t in = 0, out = 0;
};
std::array<LinearDims, 4> block_linears(const ChunkDims& d);

// Views into one buffer from one layout run twice: once counting (no base: null views) to
// size the buffer, then binding; so each size is written once.
struct Carver {
  float* base = nullptr;
  std::int64_t used = 0;
  float* operator()(std::int64_t n) {
    float* r = base ? base + used : nullptr;
    used += n;
    return r;
  }
};
// One layer's activations, carved in LayerActivations' order; with `shared` (selective
// recompute) its atty, lse and fch_gelu are shared's, the one copy all layers reuse.
void carve_layer(const ChunkDims& d, Carver& take, LayerActivations& la,
                 const LayerActivations* shared = nullptr);
// What selective recompute recomputes, carved: atty, lse and fch_gelu (the rest null); bf16:
// the fused block's (atty and fch_gelu at 2 bytes an element, la.bf16).
void carve_recomputed(const ChunkDims& d, Carver& take, LayerActivations& la, bool bf16 = false);
// The split backward's gradient stash of one layer (LayerGradStash) when it has one of its
// own: where grad_stash_separate (packed: the layers keep the packed bf16 stash, whose qkv
// and fch are not theirs), else the layer's qkv and fch are it (no floats). bf16: the fused
// block's (la.bf16: Ops::BlockWStash in bf16), at 2 bytes an element.
void carve_grad_stash(const ChunkDims& d, Carver& take, LayerGradStash& g, bool bf16 = false);
bool grad_stash_separate(bool packed, Recompute recompute);
// bf16 storage (GptChunk::bf16_storage): a layer keeps its large tensors (ln1 qkv atty res2
// ln2 fch fch_gelu, stashed_tensors' order) as bf16, packed in `packed`, and its per-row
// statistics (ln*_mean, ln*_rstd, lse: log-sum-exps lose too much in bf16) as fp32. Carves
// the statistics, then the packed bf16 (its large views stay null).
void carve_packed_layer(const ChunkDims& d, Carver& take, LayerActivations& la,
                        std::uint16_t*& packed);
// The coarse block op's bf16 stash (Ops::gpt2_block_stash_bf16, GptChunk::fused_block): a
// layer carved in LayerActivations' order with ln1, qkv, atty, ln2, fch and fch_gelu at 2
// bytes an element (half the floats, rounded up) and the rest fp32; la.bf16 set. With
// `shared` (selective recompute) its atty, lse and fch_gelu are shared's (carve_recomputed's
// bf16 copy).
void carve_fused_layer(const ChunkDims& d, Carver& take, LayerActivations& la,
                       const LayerActivations* shared = nullptr);
std::int64_t fused_layer_floats(const ChunkDims& d, bool selective = false);
// Whether a chunk's layers use that stash (or, with full recompute, its one recomputed layer):
// bf16 products, a backend whose coarse block op keeps it, GPT-2's or Llama's block at any TP
// (with or without sequence parallelism), any context parallelism, any recompute (selective:
// the coarse ops' recompute into the shared bf16 copy). The split backward too (the coarse
// ops' W stash, bf16).
// One rule for the chunk and for predict_memory.
bool stores_fused_block(bool bf16_products, bool backend_bf16_block, Arch arch);
// The large tensors of one layer with their elements, in packing order.
struct StashedTensor {
  float* LayerActivations::*field;
  std::int64_t numel;
};
std::vector<StashedTensor> stashed_tensors(const ChunkDims& d);
// The floats of each carving.
std::int64_t layer_floats(const ChunkDims& d, bool selective);
std::int64_t packed_layer_floats(const ChunkDims& d);
std::int64_t recomputed_floats(const ChunkDims& d, bool bf16 = false);
std::int64_t grad_stash_floats(const ChunkDims& d, bool bf16 = false);
// Whether a chunk keeps its layers' stash as bf16 (GptChunk::bf16_storage): bf16 products
// (only a device backend computes them) and no recomputation. One rule for the chunk and for
// predict_memory (MemoryLayout::set_precision), so `trident plan` predicts what runs.
bool stores_bf16(ops::Precision precision, Recompute recompute);

// Activations of one microbatch in flight through one chunk (the pipeline stashes several).
// The chunk's output and its gradient are not kept here: the last block writes the output into
// the model's boundary scratch, which the pipeline sends right away, and the output gradient is
// received into it just before the backward (GptChunk::shares_boundary).
struct ChunkActivations final : StageActivations {
  FloatBuffer input;                     // [Nr,C] embedding output, or received from the previous stage
  FloatBuffer outputs;                   // [L-1,Nr,C] each block's output but the last (the next one's input)
  FloatBuffer store;                     // per-layer activations (empty with full recompute)
  std::vector<LayerActivations> layers;  // views into store
  std::vector<std::uint16_t*> packed;    // bf16 storage: each layer's bf16 tensors (in store)
  // The layers (full recompute: the recomputed one) carved by carve_fused_layer (no packing)
  bool fused = false;
  // [Nr,C] d loss / d chunk output, from the head's forward or received when B starts: the
  // model's boundary scratch, or for the head chunk the row keep_head_gradient gave.
  float* doutput = nullptr;
  float* head_gradient_row = nullptr;    // keep_head_gradient's row (null: the boundary scratch)
  // [Nr,C] d loss / d chunk input, to send back right after B: the chunk's own scratch (the
  // residual gradient B ends with), which the next backward overwrites.
  float* dinput = nullptr;
  IntBuffer tokens, targets;             // [B,T] device copies of the microbatch's tokens
                                         // (empty when the backend works on host memory)
  FloatBuffer grad_store;                // split backward only: the layers' gradient stashes
  std::vector<LayerGradStash> grad_stash;  // views into grad_store, one per layer
  double loss_sum = 0;                   // sum of token losses (last stage)
  float* last_output = nullptr;          // the chunk's output: the boundary scratch, or input

  float* forward_input() override { return input.data(); }
  const float* forward_output() override { return last_output; }
  float* backward_input() override { return doutput; }
  const float* backward_output() override { return dinput; }
  void keep_head_gradient(float* row) override { head_gradient_row = row; }
};

class GptChunk final : public StageModel {
 public:
  // chunks: this rank's chunks in chunk order (model::chunk_layouts), all with the same
  // number of layers.
  GptChunk(const ModelConfig& cfg, const std::vector<StageLayout>& chunks,
           parallel::ParallelState& ps, ops::Ops& ops, int micro_batch,
           Recompute recompute = Recompute::none, bool sequence_parallel = false,
           CpMode cp_mode = CpMode::ring);
  // One chunk (vpp = 1, or the whole model).
  GptChunk(const ModelConfig& cfg, const StageLayout& stage, parallel::ParallelState& ps,
           ops::Ops& ops, int micro_batch, Recompute recompute = Recompute::none,
           bool sequence_parallel = false);
  // Not copied or moved: the block keeps references to the chunk's config and TP mappings.
  GptChunk(const GptChunk&) = delete;
  GptChunk& operator=(const GptChunk&) = delete;

  const ModelConfig& config() const override { return cfg_; }
  int num_chunks() const override { return int(chunks_.size()); }
  const StageLayout& chunk(int c) const override { return chunks_.at(std::size_t(c)); }
  const std::vector<ShardSpec>& specs() const override { return specs_; }
  // The tensor of `role` (of rank-local layer `local_layer` for a block's role, -1 for the
  // others); null when this rank holds none.
  const ShardSpec* find(Role role, int local_layer = -1) const;
  int micro_batch() const { return B_; }
  // The layers' stash kept as bf16 (carve_packed_layer): runtime.precision = "bf16" on a
  // device backend without recomputation. Each block's forward writes a one-layer fp32
  // working copy, then packs it; its backward unpacks into that copy (bf16_work_). Where the
  // backend's fused GPT-2 block takes the chunk (stores_fused_block), the activations carve
  // its bf16 stash instead (carve_fused_layer; no packing).
  bool bf16_storage() const { return bf16_store_; }
  // Floats of one microbatch's chunk input or output on this rank (Nr * C): what the
  // pipeline sends between stages.
  std::int64_t boundary_numel() const override { return std::int64_t(Nr_) * C_; }
  // True: a chunk's last block writes its output into boundary_, which a microbatch's output
  // gradient also waits in (StageModel::shares_boundary). So does the head chunk's, from its
  // forward to its backward, unless its activations were given a row (keep_head_gradient);
  // without one that backward must come next, which the model checks (anything else fails).
  bool shares_boundary() const override { return true; }
  bool sequence_parallel() const { return tpm_.sequence_parallel(); }
  using StageModel::params;
  using StageModel::grads;
  float* params() override { return params_.data(); }
  float* grads() override { return grads_.data(); }

  // GPT-2 initialization from the counter-based RNG: normal(0, 0.02), residual
  // projections 0.02/sqrt(2*n_layer), biases 0, LayerNorm weights 1. Keyed by global
  // name and logical element index: the same weights in every layout.
  void init_weights(std::uint64_t seed) override;
  void zero_grads() override;

  // Activations of one microbatch through chunk `chunk`; -1: sized to fit any chunk of this
  // rank (the pipeline's stash slots are shared by the chunks). split_backward: also room
  // for the gradients the weight pass needs (backward with weight_grads = false).
  std::unique_ptr<StageActivations> make_activations(int chunk = -1,
                                                     bool split_backward = false) const override;
  // The same, as this model's own type (inference, tests).
  std::unique_ptr<ChunkActivations> make_chunk_activations(int chunk = -1,
                                                           bool split_backward = false) const;

  // One microbatch forward through chunk `chunk`. The embedding chunk (virtual stage 0):
  // embeds inputs[B,T]; others read a.input. The head chunk (the last virtual stage): also
  // computes the loss of targets[B,T] and the head's backward (the gradients of ln_f and
  // the LM head accumulate here, so no logits stay alive), scaled by loss_scale = 1 /
  // (target tokens in the global batch); returns the sum of losses.
  // With with_backward = false (evaluation) the head computes the loss only.
  double forward(int chunk, StageActivations& a, const std::int32_t* inputs,
                 const std::int32_t* targets, float loss_scale, bool with_backward = true) override;
  // One microbatch backward through chunk `chunk` from a.doutput (set by forward on the head
  // chunk, received otherwise). Parameter gradients accumulate (+=). The embedding chunk:
  // into wte/wpe; others: writes a.dinput.
  // weight_grads = false (zero-bubble schedules' B): the input gradients and the weight
  // gradients but c_attn's and c_fc's, whose output gradients wait in a.grad_stash
  // (make_activations(.., true)) for backward_weights (their W). The embedding's wte/wpe
  // gradients are still taken here.
  void backward(int chunk, StageActivations& a, const std::int32_t* inputs,
                bool weight_grads = true) override;
  // The blocks' c_attn and c_fc weight gradients of a backward run with weight_grads =
  // false (+=). With full recompute each block's forward runs again first.
  std::pair<const std::int32_t*, const std::int32_t*> upload_tokens(
      int chunk, StageActivations& a, const std::int32_t* inputs,
      const std::int32_t* targets) override;
  void abandon_microbatch() override { head_gradient_pending_ = nullptr; }
  void backward_weights(int chunk, StageActivations& a) override;
  // Under sequence parallelism each TP rank's LayerNorm gradients cover its token rows
  // only, and a Llama's k/v weights replicated over TP (n_kv_head < tp) get from each rank
  // the part its query heads contribute: sums those over TP. Once per step, after the last
  // backward (no-op when there are none).
  void reduce_param_grads() override;

  float* output(ChunkActivations& a) const;  // [Nr,C] the chunk's output (a.last_output)
  void set_output(ChunkActivations& a, int chunk) const;  // points last_output at chunk's
  // Where chunk `chunk`'s layer l writes its output (after set_output): a.outputs' row l, or
  // for the last layer the chunk's output.
  float* layer_output(ChunkActivations& a, int chunk, int l) const;

  // ---- grad-ready hook (data-parallel overlap, train/grad_sync.hpp) ----
  // When set, backward() calls hook(offset, count) for each tensor (flat range) whose
  // gradient this microbatch has just finished: ln_f first (the head's backward ran in
  // forward), a block's tensors after the block's backward, wpe (and wte when this chunk
  // also holds the head) after the embedding's. Not reported, because a later reduction
  // still changes them: wte when tied across stages, the LayerNorms under sequence
  // parallelism. Once per microbatch: the m-th report of a tensor means it is final.
  void set_loss_on_device(bool on) override { loss_on_device_ = on; }
  void set_grad_ready_hook(GradReadyHook hook) override { grad_ready_ = std::move(hook); }

  // Inference (single stage and TP group of 1): logits [V] (host memory) of the last position
  // of tokens[0..t) (host memory), 1 <= t <= seq_len: the whole context through the blocks.
  void logits_last(const std::int32_t* tokens, int t, float* logits);

  // Generation with a key-value cache (single stage and TP group of 1): generation_reset()
  // empties the cache; each generation_step(token, logits) runs ONE token through the blocks
  // at the next position (0, 1, ..., seq_len - 1), its keys and values joining the cache, and
  // writes the logits [V] (host memory) of the token that follows. n tokens cost n steps of
  // one token (attention reads the cache: O(position) each).
  void generation_reset() { gen_pos_ = 0; }
  void generation_step(std::int32_t token, float* logits);
  int generation_position() const { return gen_pos_; }

 private:
  BlockParams layer_params(float* base, int local_layer) const;
  // The tensor of `role` in a flat buffer (params or grads): fails when this rank holds none.
  float* at(float* base, Role role, int local_layer = -1) const;
  // The same, or null when the model has no such tensor (Llama's biases).
  float* at_or_null(float* base, Role role, int local_layer = -1) const;
  // count layers' activations carved into one store (views: one per layer).
  void bind_layers(FloatBuffer& store, std::vector<LayerActivations>& views, int count) const;
  FloatBuffer buffer(std::int64_t n) const;        // n floats of the backend's memory, zeroed
  void zero(FloatBuffer& b) const;
  // The tokens a kernel may read: `host` itself on a host backend, else its copy in `device`.
  const std::int32_t* stage_tokens(IntBuffer& device, const std::int32_t* host) const;

  // The token embedding of b x t tokens, plus the learned positions (wpe, from position
  // pos0) where the model has them: training, inference and generation alike.
  void embed_forward(float* x, const std::int32_t* inputs, int b, int t, int pos0 = 0);
  // Inference: the logits [V] (host memory) of one row x [C] through the final norm (into
  // lnf [C] and its statistics) and the LM head.
  void head_logits(const float* x, float* lnf, float* mean, float* rstd, float* logits);
  // Rank-local layer l's forward through the block.
  void block_forward(int l, const float* x, float* out, LayerActivations& la, int b, int t);
  void report_grads_ready(int layer);  // global block index; -1: embedding, -2: head
  LayerActivations& layer_activations(ChunkActivations& a, int chunk, int l, const float* x);
  // What the weight pass reads of layer l: its ln1 and ln2 (no recomputed attention: its qkv
  // may hold the stashed gradient).
  LayerActivations& weight_pass_inputs(ChunkActivations& a, int chunk, int l, const float* x);
  double head_forward_backward(ChunkActivations& a, const std::int32_t* targets,
                               float loss_scale, bool with_backward);

  ModelConfig cfg_;
  std::vector<StageLayout> chunks_;
  int L_;  // layers of the largest chunk (buffers are sized for it)
  std::vector<int> local_first_;  // rank-local index of each chunk's first layer (+ the total)
  int chunk_layers(int c) const {
    return local_first_[std::size_t(c) + 1] - local_first_[std::size_t(c)];
  }
  parallel::ParallelState& ps_;
  ops::Ops& ops_;  // StageModel::ops(), kept here for the kernels' calls
  parallel::TpMappings tpm_;
  ChunkDims dims_;
  CpSlice slice_;  // the positions of this rank's rows (context parallelism)
  int B_, T_, C_, Vl_, vocab_start_, v_valid_;
  // The architecture's block (block_kind(model.arch)), made once: every layer runs through it.
  std::unique_ptr<Block> block_;
  // Whether the model learns positions: its role table has a position embedding (GPT-2's
  // wpe; none where the positions are the block's, Llama's rotary). Embedding chunk only.
  bool learned_positions_ = false;
  Role head_role_ = Role::token_embedding;  // the LM head's matrix: tied, or lm_head
  int Nr_;  // token rows of the residual stream on this rank (B*T, or B*T/tp under SP)
  Recompute recompute_;
  std::vector<ShardSpec> specs_;
  // specs_ index by role: [slot * kRoleCount + role], slot 0 for the embedding and the head,
  // 1 + l for rank-local layer l; -1 where not held. Built once: no name lookups.
  std::vector<int> role_index_;
  FloatBuffer params_, grads_;
  // Views, by rank-local layer index: chunk c's layer i is local_first_[c] + i.
  std::vector<BlockParams> p_layers_, g_layers_;

  // Backward scratch, shared by all microbatches (only one backward runs at a time). dres_
  // also holds the chunk's input gradient until its send (ChunkActivations::dinput).
  FloatBuffer dres_, dbuf_, dqkv_, dfch_, dact_;  // the blocks' (BlockContext) but dres_
  // [Nr,C] the last block's output until it is sent (or the head has read it), and the output
  // gradient from its receive (or the head's forward) until the backward reads it.
  FloatBuffer boundary_;
  // The activations whose head gradient waits in boundary_ (their backward must come next).
  const ChunkActivations* head_gradient_pending_ = nullptr;
  // Fails when a forward or backward would overwrite a head gradient waiting in boundary_.
  void check_no_head_gradient_pending(const ChunkActivations* backward_of, const char* what) const;
  FloatBuffer full_scratch_, local_scratch_;  // SP: [B*T,C] partial sums / gathers, [Nr,C]
  FloatBuffer sp_grad_pack_;                  // the gradients summed over TP, packed
  std::vector<const ShardSpec*> sp_norms_;    // their tensors (SP: the norms; Llama's
                                              // replicated k/v), in pack order
  FloatBuffer logits_, row_max_, sumexp_, target_logit_, token_loss_;
  // The head's final norm output [B,T,C] (all rows) and its statistics [Nr]: read only within
  // the head's forward (its backward runs there too), so one copy serves every microbatch.
  FloatBuffer lnf_, lnf_mean_, lnf_rstd_;
  bool loss_on_device_ = false;   // set_loss_on_device
  // Full recompute: one layer's worth (fp32), made with the first activations that need it,
  // and the fused block's bf16 stash for the activations it takes (a.fused).
  mutable FloatBuffer recompute_store_, recompute_fused_store_;
  mutable std::vector<LayerActivations> recompute_layer_, recompute_fused_;
  LayerActivations& recomputed_layer(const ChunkActivations& a);
  bool bf16_store_ = false;
  // The backend's fused GPT-2 block takes this chunk (stores_fused_block): activations carve
  // carve_fused_layer (recompute none: each layer, and no fp32 working copy; full: the one
  // recomputed layer) and, for the split backward, a bf16 W stash.
  bool fused_block_ = false;
  // bf16 storage: one layer's fp32 working copy, made with the first packed activations.
  mutable FloatBuffer bf16_work_store_;
  mutable LayerActivations bf16_work_{};  // its views (the statistics: the stored layer's)
  // bf16 storage: the working copy, its statistics bound to the stored layer `kept`.
  LayerActivations& bf16_working(const LayerActivations& kept);
  void pack_layer(ChunkActivations& a, int l);    // working copy -> a.packed[l]
  // a.packed[l] -> working copy (norms_only: ln1 and ln2, what the weight pass reads)
  void unpack_layer(ChunkActivations& a, int l, bool norms_only = false);
  FloatBuffer selective_store_;  // selective recompute: one layer's atty, lse, fch_gelu
  LayerActivations selective_;   // its views (atty, lse, fch_gelu)
  std::unique_ptr<ChunkActivations> infer_acts_;    // for logits_last, made on first use
  // Generation (made on first use): per layer the keys then the values of every position so
  // far, [T, kv width] each; the block's decode scratch, then the token's residual [C] and
  // the final norm's output [C] and statistics [2]; its id on the device.
  FloatBuffer kv_cache_, gen_scratch_;
  IntBuffer gen_token_;
  int gen_pos_ = 0;
  GradReadyHook grad_ready_;
};

}  // namespace trident::model
