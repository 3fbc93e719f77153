// trident/model/spec.hpp — the model's shape and the ShardSpec of every parameter: the one
// place that knows how a logical tensor maps onto this rank's shard and onto the rank's
// flat buffer (DESIGN.md, decision 2). Checkpoint hyperslabs, gradient gathering, ZeRO
// ranges and the grad-norm "count each parameter once" rule all read it.
// defines: trident::model::Arch (its words: choice_words, choice_key), ModelConfig,
//          llama_ffn_hidden, Recompute, Split, Init, Role, Place, Extent, RoleRow, RoleTable,
//          model_roles, ShardBlock, ShardSpec, StageLayout, chunk_layouts, gpt_param_specs,
//          param_specs, for_each_local_run, for_each_local_element
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trident/core/choice.hpp"
#include "trident/core/placement.hpp"

namespace trident::model {

// model.arch, parsed once (a deck, a file's attribute, an import): the architectures the
// blocks are written for. Its words are the deck's, the files' and the messages' names.
enum class Arch { gpt2, llama };
inline const ChoiceWords<Arch>& choice_words(Arch) {
  static const ChoiceWords<Arch> w = {{Arch::gpt2, "gpt2"}, {Arch::llama, "llama"}};
  return w;
}
inline const char* choice_key(Arch) { return "model.arch"; }

struct ModelConfig {
  int vocab_size = 0;  // the true vocabulary (any TP padding is internal)
  int seq_len = 128;
  int n_layer = 4;
  int n_head = 4;
  int d_model = 256;
  // model.arch = "llama" (FORMAT.md): RMSNorm, rotary embedding, SwiGLU, grouped-query
  // attention, no biases. The keys below are Llama's (GPT-2 has none of them).
  Choice<Arch> arch = Arch::gpt2;  // "gpt2" | "llama"
  int n_kv_head = 0;               // key/value heads, dividing n_head (1: multi-query); 0: n_head
  int ffn_hidden = 0;              // MLP width; 0: Llama's rule (llama_ffn_hidden)
  int ffn_multiple_of = 256;       // the rule rounds up to a multiple of this
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie_embeddings = false;  // lm_head = embed_tokens (GPT-2 is always tied)

  bool llama() const { return arch == Arch::llama; }
  int kv_heads() const { return llama() && n_kv_head > 0 ? n_kv_head : n_head; }
  // The MLP's hidden width: 4 d_model (GPT-2); ffn_hidden or Llama's rule (Llama).
  int d_ff() const;
  int head_dim() const { return d_model / n_head; }
  bool tied() const { return !llama() || tie_embeddings; }
  // Equal as models: the same architecture and resolved sizes (n_kv_head 0 and n_head
  // compare equal, as do ffn_hidden 0 and the width Llama's rule gives).
  bool operator==(const ModelConfig& o) const {
    bool same = vocab_size == o.vocab_size && seq_len == o.seq_len && n_layer == o.n_layer &&
                n_head == o.n_head && d_model == o.d_model && arch == o.arch;
    if (same && llama())
      same = kv_heads() == o.kv_heads() && d_ff() == o.d_ff() && rope_theta == o.rope_theta &&
             norm_eps == o.norm_eps && tie_embeddings == o.tie_embeddings;
    return same;
  }
  bool operator!=(const ModelConfig& o) const { return !(*this == o); }
};

// What a block's backward recomputes instead of keeping from its forward:
//   none       everything kept
//   selective  the attention core (its output and LSE, from the kept q, k, v) and the GELU
//              output (from the kept c_fc output): 1 + 4/tp of ~15 channel-widths per token,
//              for one flash attention forward and one GELU per layer (Megatron's choice)
//   full       only each block's input kept; its whole forward runs again in the backward
enum class Recompute { none, selective, full };

// How tensor parallelism splits a parameter along split_dim.
enum class Split {
  none,        // replicated on every TP rank (LayerNorms, row-parallel biases, wpe)
  contiguous,  // one contiguous slice per rank (c_fc columns, c_proj rows, wte rows)
  qkv,         // c_attn: q, k and v blocks each split by heads, one slice of each per rank
  block2d,     // 2D TP (parallel.tp_mode = "2d", docs/tp2d.md): a 2-D tensor split along both
               // dims, rows by `blocks` and columns by `col_blocks` (split_dim is 0)
};

enum class Init { normal, zeros, ones };

// What a parameter is for. The model reaches its tensors by role (and, in a block, by
// layer), never by name; names exist for files (FORMAT.md) and the initial RNG keys. A
// role names the job, so GPT-2 and Llama share the roles they have in common.
enum class Role {
  token_embedding,                   // wte / embed_tokens (tied: also the LM head)
  position_embedding,                // wpe (GPT-2)
  attn_norm_weight, attn_norm_bias,  // ln_1 / input_layernorm
  qkv_weight,                        // c_attn; Llama's q_proj, first of the adjacent [q; k; v]
  k_weight, v_weight,                // Llama's k_proj, v_proj (right after q_proj)
  qkv_bias,                          // c_attn's
  attn_proj_weight, attn_proj_bias,  // attention c_proj / o_proj
  mlp_norm_weight, mlp_norm_bias,    // ln_2 / post_attention_layernorm
  fc_weight,                         // mlp c_fc; Llama's gate_proj, first of [gate; up]
  up_weight,                         // Llama's up_proj (right after gate_proj)
  fc_bias,                           // c_fc's
  fc_proj_weight, fc_proj_bias,      // mlp c_proj / down_proj
  final_norm_weight, final_norm_bias,  // ln_f / model.norm
  lm_head,                           // an untied LM head (Llama's lm_head)
  count
};
constexpr int kRoleCount = int(Role::count);

// Which part of the model holds a role's tensor.
enum class Place {
  embedding,       // the chunk with the embedding (virtual stage 0)
  tied_embedding,  // the embedding chunk AND the head chunk (an embedding tied with the LM
                   // head): the two copies' gradients are summed across pipeline stages
  block,           // every transformer block, once per layer
  head,            // the chunk with the head (the last virtual stage)
};

// A logical extent, read from the ModelConfig (Extent::none: the tensor has fewer dims).
enum class Extent { none, vocab, seq, model, qkv, ff, kv };
std::int64_t extent(const ModelConfig& cfg, Extent e);

// One parameter of a model kind: everything its ShardSpec is built from.
struct RoleRow {
  Role role;
  Place place;
  std::string name;  // file name (a block's follows RoleTable::block_prefix and the layer)
  Extent rows, cols = Extent::none;  // logical shape: [rows] or [rows, cols]
  Split split = Split::none;
  int split_dim = -1;
  Init init = Init::normal;
  bool residual_init = false;  // normal(0, 0.02 / sqrt(2 * n_layer)) instead of 0.02
  bool norm = false;           // a normalization's parameter: replicated, and under sequence
                               // parallelism summed over TP once per step
  bool kv_heads = false;       // split by kv heads only when there are at least tp of them;
                               // else replicated with partial gradients (tp_grad_sum)
};

// A model kind's parameters: rows in flat-buffer order within each place (embedding, every
// block, head).
struct RoleTable {
  std::string block_prefix;  // "h." (a block's names are prefix + layer + "." + row name)
  std::vector<RoleRow> rows;
};
// GPT-2's table, or Llama's (tied or not) for cfg.llama().
const RoleTable& model_roles(const ModelConfig& cfg);

// A contiguous run of the split dimension: `count` indices starting at `global_start` in
// the logical tensor land at `local_start` in this rank's shard.
struct ShardBlock {
  std::int64_t global_start;
  std::int64_t local_start;
  std::int64_t count;
};

struct ShardSpec {
  std::string name;                   // global name, as in FORMAT.md ("h.3.mlp.c_fc.weight")
  std::vector<std::int64_t> shape;    // logical shape (what files hold)
  std::vector<std::int64_t> local_shape;  // this rank's shard (may include TP padding rows)
  int split_dim = -1;                 // -1 when Split::none
  Split split = Split::none;
  std::vector<ShardBlock> blocks;     // along split_dim; empty when Split::none
  std::vector<ShardBlock> col_blocks;  // Split::block2d only: along dim 1
  std::int64_t offset = 0;            // first element in the rank's flat buffer
  Init init = Init::normal;
  float init_std = 0.0f;
  bool weight_decay = false;          // AdamW decay: 2-D weights only
  int layer = -1;                     // transformer block index, -1 for embeddings / ln_f
  Role role = Role::count;            // what it is for (RoleRow)
  Place place = Place::block;
  bool norm = false;       // a normalization's parameter: under sequence parallelism each TP
                           // rank's gradient covers its token rows only (summed over TP)
  bool tp_grad_sum = false;  // replicated over TP but each rank's gradient is a partial sum
                             // (Llama's k/v weights when n_kv_head < tp): summed over TP
  // Which of the TP ranks holding this same shard this rank is: copy 0 writes and hashes it
  // in files and counts it in the grad norm (each element once). 1D: a replicated tensor's
  // copy is the tp_rank, a split one's 0. 2D: tensors split by grid column only (vectors,
  // wte, wpe) are copied down the grid column, their copy being the grid row.
  int tp_copy = 0;

  std::int64_t numel() const;        // logical
  std::int64_t local_numel() const;  // in the flat buffer
  bool tp_replicated() const { return split == Split::none; }
  // The embedding that is also the LM head (GPT-2's wte; a tied Llama's embed_tokens): held
  // by the first and the last stage, gradients summed between them.
  bool tied_across_stages() const { return place == Place::tied_embedding; }
};

// Which part of the model a pipeline chunk (one virtual stage) owns.
struct StageLayout {
  int first_layer = 0;      // [first_layer, last_layer)
  int last_layer = 0;
  bool has_embedding = true;  // wte, wpe (virtual stage 0)
  bool has_head = true;       // ln_f and the tied LM head (the last virtual stage)
};

// The chunks of pipeline rank `pp_rank` with vpp chunks per rank, in chunk order. The model
// is cut into pp * vpp virtual stages, placed by `placement` (core/placement.hpp; the
// schedule's): round robin (Megatron's) puts chunk c of rank r on virtual stage c * pp + r;
// the V placement of zb-v puts chunk 1 of rank r on 2 pp - 1 - r, so rank 0 holds the
// embedding (virtual stage 0) and the head (the last) and the tied wte is within one rank.
// stage_layers names each virtual stage's layer count, in virtual-stage order (summing to
// n_layer, each >= 1: parallel.pipeline_layers); empty: n_layer / (pp * vpp) each, which
// needs n_layer divisible by pp * vpp. Example, n_layer 8, pp 2, vpp 2, even: rank 0 holds
// layers 0-1 (chunk 0, with the embedding) and 4-5 (chunk 1); rank 1 holds 2-3 and 6-7
// (with the head). With stage_layers {1, 3, 3, 1}: rank 0 holds 0 and 4-6, rank 1 1-3 and 7.
std::vector<StageLayout> chunk_layouts(const ModelConfig& cfg, int pp, int vpp, int pp_rank,
                                       const std::vector<int>& stage_layers = {},
                                       Placement placement = Placement::round_robin);

// Why a split is refused ("" when it is fine): `stages` entries, each >= 1, summing to n_layer.
std::string stage_layers_problem(const std::vector<int>& stage_layers, int n_layer, int stages);

// The split of n_layer layers over `stages` virtual stages that balances a predicted cost
// per stage (parallel.pipeline_layers = "auto"): every layer costs the same, the first stage
// also carries the embedding and the last the final norm, LM head and cross-entropy
// (stage_cost_units). Minimises the largest stage's cost; ties keep the layers toward the
// middle stages. Needs n_layer >= stages. With no extra cost on the ends and n_layer
// divisible by stages it is the even split. Under the V placement (zb-v: rank r holds
// stages r and 2pp-1-r, rank 0 both ends) it balances each rank's two stages together
// first, then the two within each rank.
std::vector<int> balanced_stage_layers(const ModelConfig& cfg, int stages, int tp,
                                       Placement placement = Placement::round_robin);

// The predicted cost of the embedding and of the head (ln_f, LM head, cross-entropy), in
// layers (forward + backward FLOPs per token, relative to one block's), the model
// balanced_stage_layers uses. A block: 24 T d^2 + 4 T^2 d FLOPs forward (its matrices and
// attention); the head: 2 T d V/tp forward for the logits, x3 with the backward, relative to
// the block's (also x3); the embedding: a lookup, costed as the head's softmax-sized memory
// pass, 2 T d (tiny). Both per TP rank.
struct EndCosts {
  double embedding = 0.0;  // in units of one layer
  double head = 0.0;
};
EndCosts stage_end_costs(const ModelConfig& cfg, int tp);

// The share of a block's forward FLOPs that a split backward's W recomputes as weight
// gradients: c_attn's and c_fc's (model::Block::backward_weights; B takes the c_projs' and
// the norms'), 2 d (C3 + F1) of 2 d (C3 + d + F1 + F) + 4 T d per token (GPT-2: 14 d^2 of
// 24 d^2 + 4 T d).
double weight_pass_share(const ModelConfig& cfg);

// Llama's MLP width: 2/3 of 4 d_model, rounded up to a multiple of multiple_of
// (d_model 4096 -> 11008 with 256).
int llama_ffn_hidden(int d_model, int multiple_of);

// Vocabulary rows each TP rank holds: the vocabulary padded up to a multiple of tp_size.
int vocab_per_rank(int vocab_size, int tp_size);

// The ShardSpecs of a chunk, with offsets packed in order from `offset0`. GPT-2's tensors, or
// with cfg.llama() Llama's (FORMAT.md): per layer the q, k, v weights are adjacent in the
// flat buffer, so that this rank's [q; k; v] rows form one [out, in] matrix (one product),
// and gate, up likewise. Under TP: q, gate, up split by rows (heads / columns of the
// MLP), o and down by columns; k and v split by kv heads when n_kv_head >= tp, else
// replicated (every rank holds every kv head; tp_grad_sum).
// With tp_2d (parallel.tp_mode = "2d", GPT-2 only; tp_size = q*q, tp_rank = row*q + col on
// the grid of parallel/tp_grid2d.hpp) every tensor follows docs/tp2d.md: a block's 2-D
// weights are Split::block2d (rows by grid row, columns by grid column; c_attn's columns
// by q, k and v of the grid column's heads), its vectors (biases, LayerNorms) and ln_f are
// split by grid column, wte [Vp, C/q] (vocabulary padded up to a multiple of q) and
// wpe [T, C/q] keep every row and are split by grid column; the last three are the same
// on the q ranks of a grid column (tp_copy = grid row).
std::vector<ShardSpec> gpt_param_specs(const ModelConfig& cfg, const StageLayout& stage,
                                       int tp_rank, int tp_size, std::int64_t offset0 = 0,
                                       bool tp_2d = false);
// The ShardSpecs of all of a rank's chunks as one table over one flat buffer: wte (once,
// when any chunk has the embedding or the head), wpe, every chunk's layers in chunk order
// (ascending global layer index), then ln_f. Each logical tensor appears at most once.
std::vector<ShardSpec> gpt_param_specs(const ModelConfig& cfg,
                                       const std::vector<StageLayout>& chunks, int tp_rank,
                                       int tp_size, std::int64_t offset0 = 0,
                                       bool tp_2d = false);
// The same from any table of rows (gpt_param_specs: model_roles(cfg)).
std::vector<ShardSpec> param_specs(const RoleTable& table, const ModelConfig& cfg,
                                   const std::vector<StageLayout>& chunks, int tp_rank,
                                   int tp_size, std::int64_t offset0 = 0,
                                   bool tp_2d = false);

// Calls fn(local_begin, global_begin, length) for every contiguous run of the shard's
// elements that exist in the logical tensor (padding rows are skipped): row-major flat
// indices into the local shard and the logical tensor, in increasing order of both.
void for_each_local_run(const ShardSpec& spec,
                        const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn);

// Calls fn(local_index, global_index) for every element of the shard that exists in the
// logical tensor (padding rows are skipped); indices are row-major flat indices into the
// local shard and the logical tensor.
void for_each_local_element(const ShardSpec& spec,
                            const std::function<void(std::int64_t, std::int64_t)>& fn);

}  // namespace trident::model
