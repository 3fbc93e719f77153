// A rank's model chunks over the ops interface (see trident/model/gpt.hpp): the embedding,
// the head and the pipeline chunks' buffers; each layer runs through the architecture's block
// (model/block.hpp).
#include "trident/model/gpt.hpp"
#include "trident/model/vocab_parallel_xent.hpp"

#include <algorithm>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"

namespace trident::model {

namespace {
bool any_head(const std::vector<StageLayout>& chunks) {
  return std::any_of(chunks.begin(), chunks.end(), [](const StageLayout& c) { return c.has_head; });
}
// The runtime hands back the activations this model made (make_activations).
ChunkActivations& own(StageActivations& a) { return dynamic_cast<ChunkActivations&>(a); }
}  // namespace

GptChunk::GptChunk(const ModelConfig& cfg, const StageLayout& stage, parallel::ParallelState& ps,
                   ops::Ops& ops, int micro_batch, Recompute recompute, bool sequence_parallel)
    : GptChunk(cfg, std::vector<StageLayout>{stage}, ps, ops, micro_batch, recompute,
               sequence_parallel) {}

GptChunk::GptChunk(const ModelConfig& cfg, const std::vector<StageLayout>& chunks,
                   parallel::ParallelState& ps, ops::Ops& ops, int micro_batch,
                   Recompute recompute, bool sequence_parallel, CpMode cp_mode)
    : StageModel(ops),
      cfg_(cfg),
      chunks_(chunks),
      ps_(ps),
      ops_(ops),
      tpm_(ps.tp, sequence_parallel),
      recompute_(recompute) {
  const int tp = ps.tp.size(), tp_rank = ps.tp.rank();
  TRIDENT_CHECK(!chunks_.empty(), "a pipeline rank needs at least one model chunk");
  // Chunks may differ in size (parallel.pipeline_layers): rank-local layer indices run
  // through the chunks in order; per-microbatch buffers are sized for the largest chunk.
  L_ = 0;
  local_first_.assign(1, 0);
  for (const StageLayout& c : chunks_) {
    TRIDENT_CHECK(c.last_layer >= c.first_layer, "model chunk with layers [", c.first_layer,
                  ", ", c.last_layer, ")");
    L_ = std::max(L_, c.last_layer - c.first_layer);
    local_first_.push_back(local_first_.back() + c.last_layer - c.first_layer);
  }
  TRIDENT_CHECK(cfg.d_model % cfg.n_head == 0, "model.d_model = ", cfg.d_model,
                " must be divisible by model.n_head = ", cfg.n_head);
  TRIDENT_CHECK(cfg.vocab_size > 0, "model.vocab_size must be positive");
  // Context parallelism: this rank holds seq_len / cp rows of each sequence (CpSlice).
  const int cp = ps.cp.size();
  TRIDENT_CHECK(cp == 1 || cfg.seq_len % (2 * cp) == 0, "model.seq_len = ", cfg.seq_len,
                " must be divisible by 2 * parallel.cp = ", 2 * cp);
  TRIDENT_CHECK(!sequence_parallel || (std::int64_t(micro_batch) * cfg.seq_len / cp) % tp == 0,
                "parallel.sequence_parallel: micro_batch_size * seq_len / cp = ",
                std::int64_t(micro_batch) * cfg.seq_len / cp,
                " tokens must be divisible by parallel.tp = ", tp);
  slice_ = CpSlice{cp, ps.cp.rank()};
  dims_ = chunk_dims(cfg, tp, micro_batch, sequence_parallel, cp);
  B_ = int(dims_.B);
  T_ = int(dims_.T);
  C_ = int(dims_.C);
  Vl_ = int(dims_.Vl);
  Nr_ = int(dims_.Nr);
  vocab_start_ = Vl_ * tp_rank;
  v_valid_ = std::max(0, std::min(cfg.vocab_size - vocab_start_, Vl_));

  specs_ = gpt_param_specs(cfg, chunks_, tp_rank, tp);
  for (const auto& s : specs_) num_params_ += s.local_numel();
  std::vector<int> local_layer(std::size_t(cfg.n_layer), -1);
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    for (int l = chunks_[c].first_layer; l < chunks_[c].last_layer; ++l)
      local_layer[std::size_t(l)] = local_first_[c] + (l - chunks_[c].first_layer);
  role_index_.assign(std::size_t(1 + local_first_.back()) * kRoleCount, -1);
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const ShardSpec& s = specs_[i];
    const int slot = s.layer < 0 ? 0 : 1 + local_layer[std::size_t(s.layer)];
    role_index_[std::size_t(slot) * kRoleCount + std::size_t(s.role)] = int(i);
  }
  // The LM head's matrix ([Vl, C]): the tied embedding, or an untied lm_head.
  if (find(Role::lm_head)) head_role_ = Role::lm_head;
  learned_positions_ = find(Role::position_embedding) != nullptr;
  params_ = buffer(num_params_);
  grads_ = buffer(num_params_);

  const std::int64_t N = std::int64_t(B_) * T_;
  dres_ = buffer(N * C_);
  boundary_ = buffer(std::int64_t(Nr_) * C_);
  dbuf_ = buffer(N * C_);
  dqkv_ = buffer(N * dims_.C3);
  dfch_ = buffer(N * dims_.F1);
  dact_ = buffer(N * dims_.F);
  if (tpm_.sequence_parallel()) {
    full_scratch_ = buffer(N * C_);
    local_scratch_ = buffer(std::int64_t(Nr_) * C_);
  }
  // The architecture's block, once; the layers' tensors as it finds them.
  block_ = block_kind(cfg.arch.get())
               .make(BlockContext{cfg_, ops_, tpm_, tp_rank, tp, dims_, dbuf_.data(), dqkv_.data(),
                                  dfch_.data(), dact_.data(), full_scratch_.data(),
                                  local_scratch_.data(),
                                  cp > 1 ? &ps.cp : nullptr, cp_mode,
                                  stores_fused_block(ops_.precision() == ops::Precision::bf16,
                                                     ops_.gpt2_block_stash_bf16(),
                                                     cfg.arch.get()) &&
                                      ops_.cp_attention_bf16()});
  for (int l = 0; l < local_first_.back(); ++l) {
    block_->check_layer([&](Role role) { return find(role, l); });
    p_layers_.push_back(layer_params(params_.data(), l));
    g_layers_.push_back(layer_params(grads_.data(), l));
  }
  if (any_head(chunks_)) {
    // A backend that fuses the head (Ops::lm_head, at any TP: bf16 logits): half the floats,
    // at least one row for head_logits (sampling).
    const bool bf16_logits = ops_.fused_lm_head();
    logits_ = buffer(bf16_logits ? std::max<std::int64_t>((N * Vl_ + 1) / 2, Vl_) : N * Vl_);
    row_max_ = buffer(N);
    lnf_ = buffer(N * C_);
    lnf_mean_ = buffer(Nr_);
    lnf_rstd_ = buffer(Nr_);
    sumexp_ = buffer(2 * N);  // sumexp then target logit: one allreduce for both
    token_loss_ = buffer(N);
  }
  // runtime.precision = "bf16" on a device: the stash as bf16 (bf16_storage()). Not with
  // recomputation: full keeps no stash, selective's would need its shared views unpacked.
  bf16_store_ = stores_bf16(ops_.precision(), recompute_);
  fused_block_ = stores_fused_block(ops_.precision() == ops::Precision::bf16,
                                    ops_.gpt2_block_stash_bf16(), cfg.arch.get());
  if (recompute_ == Recompute::selective) {  // the fused block's shared copy in bf16
    selective_store_ = buffer(recomputed_floats(dims_, fused_block_));
    Carver bind{selective_store_.data()};
    carve_recomputed(dims_, bind, selective_, fused_block_);
  }
  // The gradients each TP rank holds only a part of, packed for one reduction per step: the
  // norms under sequence parallelism, Llama's replicated k/v weights.
  std::int64_t partial = 0;
  for (const auto& s : specs_)
    if ((tpm_.sequence_parallel() && s.norm) || s.tp_grad_sum) {
      sp_norms_.push_back(&s);
      partial += s.local_numel();
    }
  if (partial > 0) sp_grad_pack_ = buffer(partial);
  // Host staging for the TP and embedding collectives (device memory, MPI not CUDA-aware),
  // sized here so that the step loop allocates nothing: slot 0 the [N,C] activations or
  // wte's gradient, slot 1 the other side of a reduce-scatter or an all-gather.
  parallel::DeviceStaging* staging = ps.tp.staging();
  if (staging && staging->memory() && !staging->mpi_takes_device()) {
    std::int64_t most = N * C_;
    for (const auto& s : specs_)
      if (s.layer < 0) most = std::max(most, s.local_numel());  // the embedding, the head
    staging->host(std::size_t(most) * sizeof(float), 0);
    staging->host(std::size_t(N * C_) * sizeof(float), 1);
  }
}

FloatBuffer GptChunk::buffer(std::int64_t n) const {
  FloatBuffer b(std::size_t(n), ops_.memory());
  zero(b);
  return b;
}

void GptChunk::zero(FloatBuffer& b) const {
  if (!b.empty()) ops_.fill(b.data(), 0.0f, std::int64_t(b.size()));
}

const std::int32_t* GptChunk::stage_tokens(IntBuffer& device, const std::int32_t* host) const {
  // Device memory already (upload_tokens'): nothing to copy.
  if (!ops_.memory() || !host || holds_device(ops_.memory(), host)) return host;
  const std::size_t n = std::size_t(B_) * std::size_t(T_);
  if (device.size() < n) device = IntBuffer(n, ops_.memory());
  copy_to_device(ops_.memory(), device.data(), host, n * sizeof(std::int32_t));
  return device.data();
}

const ShardSpec* GptChunk::find(Role role, int local_layer) const {
  const int i = role_index_[std::size_t(1 + local_layer) * kRoleCount + std::size_t(role)];
  return i < 0 ? nullptr : &specs_[std::size_t(i)];
}

float* GptChunk::at_or_null(float* base, Role role, int local_layer) const {
  const ShardSpec* s = find(role, local_layer);
  return s ? base + s->offset : nullptr;
}

float* GptChunk::at(float* base, Role role, int local_layer) const {
  const ShardSpec* s = find(role, local_layer);
  TRIDENT_CHECK(s, "internal: parameter role ", int(role), " is not held by this pipeline stage");
  return base + s->offset;
}

BlockParams GptChunk::layer_params(float* base, int l) const {
  auto p = [&](Role r) { return at_or_null(base, r, l); };
  return {p(Role::attn_norm_weight), p(Role::attn_norm_bias), p(Role::qkv_weight),
          p(Role::qkv_bias),         p(Role::attn_proj_weight), p(Role::attn_proj_bias),
          p(Role::mlp_norm_weight),  p(Role::mlp_norm_bias),  p(Role::fc_weight),
          p(Role::fc_bias),          p(Role::fc_proj_weight), p(Role::fc_proj_bias)};
}

void GptChunk::init_weights(std::uint64_t seed) {
  std::vector<float> host(std::size_t(num_params_), 0.0f);  // drawn here, then copied over
  for (const auto& s : specs_) {
    float* p = host.data() + s.offset;
    std::fill(p, p + s.local_numel(), 0.0f);  // TP padding rows stay 0
    if (s.init == Init::zeros) continue;
    if (s.init == Init::ones) {
      std::fill(p, p + s.local_numel(), 1.0f);
      continue;
    }
    const std::uint64_t key = rng::key_of(s.name);
    const double sd = s.init_std;
    for_each_local_element(s, [&](std::int64_t local, std::int64_t global) {
      p[local] = float(sd * rng::normal(seed, key, std::uint64_t(global)));
    });
  }
  write_params(host.data());
}

void GptChunk::zero_grads() {
  zero(grads_);
}

ChunkDims chunk_dims(const ModelConfig& cfg, int tp, int micro_batch, bool sequence_parallel,
                     int cp) {
  ChunkDims d;
  d.B = micro_batch;
  d.T = cfg.seq_len / cp;
  d.C = cfg.d_model;
  d.N = d.B * d.T;
  d.Nr = sequence_parallel ? d.N / tp : d.N;
  d.NH = cfg.n_head / tp;
  d.Ca = d.C / tp;
  d.Vl = vocab_per_rank(cfg.vocab_size, tp);
  d.F = cfg.d_ff() / tp;
  block_kind(cfg.arch.get()).size(cfg, tp, d);  // C3, F1, kv_cols
  return d;
}

int rank_kv_heads(const ModelConfig& cfg, int tp) {
  const int kv = cfg.kv_heads();
  return kv >= tp ? kv / tp : 1;
}

std::array<LinearDims, 4> block_linears(const ChunkDims& d) {
  return {{{d.C, d.C3}, {d.Ca, d.C}, {d.C, d.F1}, {d.F, d.C}}};
}

void carve_recomputed(const ChunkDims& d, Carver& take, LayerActivations& la, bool bf16) {
  auto elements = [&](std::int64_t n) { return take(bf16 ? (n + 1) / 2 : n); };
  la = LayerActivations{};
  la.atty = elements(d.N * d.Ca);
  la.lse = take(d.B * d.NH * d.T);
  la.fch_gelu = elements(d.N * d.F);
  la.bf16 = bf16;
  la.recomputed = true;
}

void carve_layer(const ChunkDims& d, Carver& take, LayerActivations& la,
                 const LayerActivations* shared) {
  la.ln1 = take(d.N * d.C);
  la.ln1_mean = take(d.Nr);
  la.ln1_rstd = take(d.Nr);
  la.qkv = take(d.N * d.C3);
  la.atty = shared ? shared->atty : take(d.N * d.Ca);
  la.lse = shared ? shared->lse : take(d.B * d.NH * d.T);
  la.res2 = take(d.Nr * d.C);
  la.ln2 = take(d.N * d.C);
  la.ln2_mean = take(d.Nr);
  la.ln2_rstd = take(d.Nr);
  la.fch = take(d.N * d.F1);
  la.fch_gelu = shared ? shared->fch_gelu : take(d.N * d.F);
  la.recomputed = shared != nullptr;
}

std::vector<StashedTensor> stashed_tensors(const ChunkDims& d) {
  using LA = LayerActivations;
  return {{&LA::ln1, d.N * d.C},  {&LA::qkv, d.N * d.C3}, {&LA::atty, d.N * d.Ca},
          {&LA::res2, d.Nr * d.C}, {&LA::ln2, d.N * d.C},  {&LA::fch, d.N * d.F1},
          {&LA::fch_gelu, d.N * d.F}};
}

void carve_packed_layer(const ChunkDims& d, Carver& take, LayerActivations& la,
                        std::uint16_t*& packed) {
  la = LayerActivations{};
  la.ln1_mean = take(d.Nr);
  la.ln1_rstd = take(d.Nr);
  la.lse = take(d.B * d.NH * d.T);
  la.ln2_mean = take(d.Nr);
  la.ln2_rstd = take(d.Nr);
  std::int64_t bf16 = 0;
  for (const StashedTensor& t : stashed_tensors(d)) bf16 += t.numel;
  packed = reinterpret_cast<std::uint16_t*>(take((bf16 + 1) / 2));  // two per float
}

void carve_fused_layer(const ChunkDims& d, Carver& take, LayerActivations& la,
                       const LayerActivations* shared) {
  auto half = [&take](std::int64_t n) { return take((n + 1) / 2); };  // n bf16
  la = LayerActivations{};
  la.ln1 = half(d.N * d.C);
  la.ln1_mean = take(d.Nr);
  la.ln1_rstd = take(d.Nr);
  la.qkv = half(d.N * d.C3);
  la.atty = shared ? shared->atty : half(d.N * d.Ca);
  la.lse = shared ? shared->lse : take(d.B * d.NH * d.T);
  la.res2 = take(d.Nr * d.C);
  la.ln2 = half(d.N * d.C);
  la.ln2_mean = take(d.Nr);
  la.ln2_rstd = take(d.Nr);
  la.fch = half(d.N * d.F1);
  la.fch_gelu = shared ? shared->fch_gelu : half(d.N * d.F);
  la.bf16 = true;
  la.recomputed = shared != nullptr;
}

std::int64_t fused_layer_floats(const ChunkDims& d, bool selective) {
  Carver count;
  LayerActivations la, shared{};
  carve_fused_layer(d, count, la, selective ? &shared : nullptr);
  return count.used;
}

bool stores_fused_block(bool bf16_products, bool backend_bf16_block, Arch arch) {
  // GPT-2's and Llama's bf16 blocks take TP, with or without SP (their collectives), CP (the
  // ring or Ulysses through their attention hook) and any recompute (selective:
  // Ops::gpt2_block_recompute, llama_block_recompute).
  return bf16_products && backend_bf16_block && (arch == Arch::gpt2 || arch == Arch::llama);
}

std::int64_t packed_layer_floats(const ChunkDims& d) {
  Carver count;
  LayerActivations la;
  std::uint16_t* packed = nullptr;
  carve_packed_layer(d, count, la, packed);
  return count.used;
}

void carve_grad_stash(const ChunkDims& d, Carver& take, LayerGradStash& g, bool bf16) {
  auto elements = [&](std::int64_t n) { return take(bf16 ? (n + 1) / 2 : n); };
  g.dfch = elements(d.N * d.F1);
  g.dqkv = elements(d.N * d.C3);
}

bool grad_stash_separate(bool packed, Recompute recompute) {
  return packed || recompute == Recompute::full;
}

std::int64_t layer_floats(const ChunkDims& d, bool selective) {
  Carver count;
  LayerActivations la{}, shared{};
  carve_layer(d, count, la, selective ? &shared : nullptr);
  return count.used;
}

std::int64_t recomputed_floats(const ChunkDims& d, bool bf16) {
  Carver count;
  LayerActivations la;
  carve_recomputed(d, count, la, bf16);
  return count.used;
}

bool stores_bf16(ops::Precision precision, Recompute recompute) {
  return precision == ops::Precision::bf16 && recompute == Recompute::none;
}

std::int64_t grad_stash_floats(const ChunkDims& d, bool bf16) {
  Carver count;
  LayerGradStash g{};
  carve_grad_stash(d, count, g, bf16);
  return count.used;
}

void GptChunk::bind_layers(FloatBuffer& store, std::vector<LayerActivations>& views,
                           int count) const {
  views.resize(std::size_t(count));
  // Selective recompute: every layer's atty, lse and fch_gelu are the one shared copy.
  const LayerActivations* shared = recompute_ == Recompute::selective ? &selective_ : nullptr;
  store = buffer(layer_floats(dims_, shared != nullptr) * count);
  Carver take{store.data()};
  for (auto& la : views) carve_layer(dims_, take, la, shared);
}

std::unique_ptr<StageActivations> GptChunk::make_activations(int chunk,
                                                             bool split_backward) const {
  return make_chunk_activations(chunk, split_backward);
}

std::unique_ptr<ChunkActivations> GptChunk::make_chunk_activations(int chunk,
                                                                   bool split_backward) const {
  const std::int64_t NrC = boundary_numel();
  const int L = chunk < 0 ? L_ : chunk_layers(chunk);  // -1: any chunk (the largest)
  auto a = std::make_unique<ChunkActivations>();
  a->input = buffer(NrC);
  a->outputs = buffer(std::max(0, L - 1) * NrC);  // the last layer's: boundary_
  a->doutput = const_cast<float*>(boundary_.data());
  a->dinput = const_cast<float*>(dres_.data());  // one backward at a time (backward())
  // Full recompute's one layer: fp32, or the fused block's stash; each made at first need.
  if (recompute_ == Recompute::full) {
    a->fused = fused_block_;
    if (a->fused && recompute_fused_.empty()) {
      recompute_fused_.resize(1);
      recompute_fused_store_ = buffer(fused_layer_floats(dims_));
      Carver take{recompute_fused_store_.data()};
      carve_fused_layer(dims_, take, recompute_fused_[0]);
    } else if (!a->fused && recompute_layer_.empty()) {
      bind_layers(recompute_store_, recompute_layer_, 1);
    }
  } else if (fused_block_) {
    a->fused = true;
    a->layers.resize(std::size_t(L));
    // Selective recompute: every layer's atty, lse and fch_gelu are the one bf16 copy.
    const LayerActivations* shared = recompute_ == Recompute::selective ? &selective_ : nullptr;
    a->store = buffer(fused_layer_floats(dims_, shared != nullptr) * L);
    Carver take{a->store.data()};
    for (LayerActivations& la : a->layers) carve_fused_layer(dims_, take, la, shared);
  } else if (bf16_store_) {
    if (bf16_work_store_.empty()) {  // the working copy, once
      Carver count;
      carve_layer(dims_, count, bf16_work_);
      bf16_work_store_ = buffer(count.used);
      Carver bind{bf16_work_store_.data()};
      carve_layer(dims_, bind, bf16_work_);
    }
    a->layers.resize(std::size_t(L));
    a->packed.resize(std::size_t(L));
    a->store = buffer(packed_layer_floats(dims_) * L);
    Carver take{a->store.data()};
    for (int l = 0; l < L; ++l) carve_packed_layer(dims_, take, a->layers[l], a->packed[l]);
  } else if (recompute_ != Recompute::full) {
    bind_layers(a->store, a->layers, L);
  }
  if (split_backward) {
    // B's gradients for W go where B leaves the layer's qkv and fch dead (the fused block's:
    // bf16 in its bf16 qkv and fch); a layer without a copy of its own (the packed bf16
    // stash, full recompute) keeps them apart (the fused block's at 2 bytes an element).
    a->grad_stash.resize(std::size_t(L));
    if (grad_stash_separate(bf16_store_ && !a->fused, recompute_)) {
      a->grad_store = buffer(grad_stash_floats(dims_, a->fused) * L);
      Carver take{a->grad_store.data()};
      for (LayerGradStash& g : a->grad_stash) carve_grad_stash(dims_, take, g, a->fused);
    } else {
      for (int l = 0; l < L; ++l) a->grad_stash[l] = {a->layers[l].fch, a->layers[l].qkv};
    }
  }
  a->last_output = L == 0 ? a->input.data() : const_cast<float*>(boundary_.data());
  return a;
}

LayerActivations& GptChunk::recomputed_layer(const ChunkActivations& a) {
  return a.fused ? recompute_fused_[0] : recompute_layer_[0];
}

LayerActivations& GptChunk::bf16_working(const LayerActivations& kept) {
  bf16_work_.ln1_mean = kept.ln1_mean;
  bf16_work_.ln1_rstd = kept.ln1_rstd;
  bf16_work_.lse = kept.lse;
  bf16_work_.ln2_mean = kept.ln2_mean;
  bf16_work_.ln2_rstd = kept.ln2_rstd;
  return bf16_work_;
}

void GptChunk::pack_layer(ChunkActivations& a, int l) {
  std::uint16_t* dst = a.packed[std::size_t(l)];
  for (const StashedTensor& t : stashed_tensors(dims_)) {
    ops_.to_bf16(dst, bf16_work_.*t.field, t.numel);
    dst += t.numel;
  }
}

void GptChunk::unpack_layer(ChunkActivations& a, int l, bool norms_only) {
  const std::uint16_t* src = a.packed[std::size_t(l)];
  for (const StashedTensor& t : stashed_tensors(dims_)) {
    if (!norms_only || t.field == &LayerActivations::ln1 || t.field == &LayerActivations::ln2)
      ops_.from_bf16(bf16_work_.*t.field, src, t.numel);
    src += t.numel;
  }
}

float* GptChunk::output(ChunkActivations& a) const { return a.last_output; }

void GptChunk::set_output(ChunkActivations& a, int chunk) const {
  a.last_output = chunk_layers(chunk) == 0 ? a.input.data() : const_cast<float*>(boundary_.data());
}

// Layer l's output: the next layer's input in the activations, the last one's in boundary_.
float* GptChunk::layer_output(ChunkActivations& a, int chunk, int l) const {
  return l + 1 == chunk_layers(chunk) ? a.last_output : a.outputs.data() + l * boundary_numel();
}

void GptChunk::check_no_head_gradient_pending(const ChunkActivations* backward_of,
                                              const char* what) const {
  TRIDENT_CHECK(!head_gradient_pending_ || head_gradient_pending_ == backward_of, "internal: ",
                what, " while the head chunk's output gradient waits in the shared boundary "
                "scratch for its backward (StageActivations::keep_head_gradient)");
}

// ---- forward ---------------------------------------------------------------------------

// x: [local rows of b*t, C]. Each TP rank looks up its vocabulary rows (zeros elsewhere)
// and TP rank 0 adds the positions (pos0, ..., pos0 + t - 1; under context parallelism the
// two chunks' own); the reduction leaves the sum, which is exact because every other term is 0.
void GptChunk::embed_forward(float* x, const std::int32_t* inputs, int b, int t, int pos0) {
  const int n = b * t;
  const std::int64_t local_n = tpm_.local_rows(n) * C_;
  float* partial = tpm_.sequence_parallel() ? full_scratch_.data() : x;
  ops_.embedding_forward(partial, inputs, at(params_.data(), Role::token_embedding), n, C_,
                         vocab_start_, Vl_);
  if (learned_positions_ && ps_.tp.rank() == 0) {
    const float* wpe = at(params_.data(), Role::position_embedding);
    slice_.for_each_run(b, t, pos0, [&](std::int64_t row, int seqs, int rows, int pos) {
      ops_.position_forward(partial + row * C_, wpe + std::int64_t(pos) * C_, seqs, rows, C_);
    });
  }
  tpm_.leave_forward(partial, x, local_n);
}

std::pair<const std::int32_t*, const std::int32_t*> GptChunk::upload_tokens(
    int chunk, StageActivations& activations, const std::int32_t* inputs,
    const std::int32_t* targets) {
  ChunkActivations& a = own(activations);
  const StageLayout& st = this->chunk(chunk);
  return {st.has_embedding ? stage_tokens(a.tokens, inputs) : inputs,
          st.has_head ? stage_tokens(a.targets, targets) : targets};
}

void GptChunk::block_forward(int l, const float* x, float* out, LayerActivations& la, int b,
                             int t) {
  block_->forward(p_layers_[std::size_t(l)], x, out, la, b, t);
}

double GptChunk::forward(int chunk, StageActivations& activations, const std::int32_t* inputs,
                         const std::int32_t* targets, float loss_scale, bool with_backward) {
  ChunkActivations& a = own(activations);
  check_no_head_gradient_pending(nullptr, "a forward");
  const StageLayout& st = this->chunk(chunk);
  const std::int64_t NC = boundary_numel();
  if (st.has_embedding) embed_forward(a.input.data(), stage_tokens(a.tokens, inputs), B_, T_);
  if (st.has_head) targets = stage_tokens(a.targets, targets);
  set_output(a, chunk);  // pooled activations serve chunks of any size
  // The output gradient: received into boundary_ before the backward, or the head's, kept
  // in the row given for it or in boundary_ (then the backward must come next).
  a.doutput = st.has_head && a.head_gradient_row ? a.head_gradient_row : boundary_.data();
  const int L = chunk_layers(chunk), first = local_first_[std::size_t(chunk)];
  for (int l = 0; l < L; ++l) {
    const float* x = l == 0 ? a.input.data() : a.outputs.data() + (l - 1) * NC;
    LayerActivations& la = recompute_ == Recompute::full ? recomputed_layer(a)
                           : bf16_store_ && !a.fused       ? bf16_working(a.layers[l])
                                                           : a.layers[l];
    block_forward(first + l, x, layer_output(a, chunk, l), la, B_, T_);
    if (bf16_store_ && !a.fused) pack_layer(a, l);
  }
  a.loss_sum = st.has_head ? head_forward_backward(a, targets, loss_scale, with_backward) : 0.0;
  return a.loss_sum;
}

double GptChunk::head_forward_backward(ChunkActivations& a, const std::int32_t* targets,
                                       float loss_scale, bool with_backward) {
  const int N = B_ * T_;
  const std::int64_t local_n = boundary_numel();
  float* wte = at(params_.data(), head_role_);  // [Vl, C]
  float* dwte = at(grads_.data(), head_role_);
  float* lnf_w = at(params_.data(), Role::final_norm_weight);
  const float* x = output(a);  // [Nr,C]
  float* lnf = lnf_.data();
  block_->norm_forward(tpm_.local_part(lnf, local_n), lnf_mean_.data(), lnf_rstd_.data(), x, lnf_w,
                       at_or_null(params_.data(), Role::final_norm_bias), Nr_);
  tpm_.enter_forward(lnf, local_n);
  float* logits = logits_.data();
  float* dlnf_partial = dbuf_.data();  // [N,C] this rank's vocabulary share
  // The head in one op (the backend may fuse it), over this rank's vocabulary rows: it adds
  // the loss to the backend's total and, with the backward, writes this rank's d lnf partial
  // and adds d wte. The sum in the backend (one host loop's order on the CPU); read now, or
  // once a step.
  model::GroupCollectives tp(ps_.tp);
  ops_.lm_head(token_loss_.data(), dlnf_partial, dwte, logits, row_max_.data(), sumexp_.data(),
               lnf, wte, targets, N, C_, Vl_, v_valid_, loss_scale, with_backward, vocab_start_,
               tp.or_null());
  const double loss_sum = loss_on_device_ ? 0.0 : ops_.take_loss();
  if (!with_backward) return loss_sum;
  // every rank's vocabulary share of d lnf summed (TP; SP: this rank's rows)
  const float* dlnf =
      ps_.tp.size() == 1 ? dlnf_partial
                         : tpm_.enter_backward(dlnf_partial, local_scratch_.data(), local_n);
  // d loss / d x into dres_ (free: no backward runs, its last input gradient is sent), then
  // a.doutput: its row, or boundary_, which may be x itself (read for the last time above).
  float* dx = dres_.data();
  ops_.fill(dx, 0.0f, local_n);
  block_->norm_backward(dx, at(grads_.data(), Role::final_norm_weight),
                        at_or_null(grads_.data(), Role::final_norm_bias), dlnf, x, lnf_w,
                        lnf_mean_.data(), lnf_rstd_.data(), Nr_);
  ops_.copy(a.doutput, dx, local_n);
  if (a.doutput == boundary_.data()) head_gradient_pending_ = &a;
  return loss_sum;
}

// ---- backward --------------------------------------------------------------------------

// Layer l's stashed activations, or with full recompute its forward run again into the
// one-layer scratch (its output is not needed, so it lands in scratch too).
LayerActivations& GptChunk::layer_activations(ChunkActivations& a, int chunk, int l,
                                              const float* x) {
  if (recompute_ == Recompute::none) {
    if (!bf16_store_ || a.fused) return a.layers[l];
    unpack_layer(a, l);
    return bf16_working(a.layers[l]);
  }
  if (recompute_ == Recompute::selective) {
    // The attention core and the MLP activation again, from the kept qkv and c_fc output.
    LayerActivations& la = a.layers[l];
    block_->recompute(la);
    return la;
  }
  LayerActivations& la = recomputed_layer(a);
  block_forward(local_first_[std::size_t(chunk)] + l, x, dbuf_.data(), la, B_, T_);
  return la;
}

LayerActivations& GptChunk::weight_pass_inputs(ChunkActivations& a, int chunk, int l,
                                               const float* x) {
  if (recompute_ == Recompute::full) return layer_activations(a, chunk, l, x);
  // selective: ln1 and ln2 are kept; the fused block's W reads its bf16 ln1 and ln2
  if (!bf16_store_ || a.fused) return a.layers[l];
  unpack_layer(a, l, true);
  return bf16_working(a.layers[l]);
}

void GptChunk::backward(int chunk, StageActivations& activations, const std::int32_t* inputs,
                        bool weight_grads) {
  ChunkActivations& a = own(activations);
  const StageLayout& st = this->chunk(chunk);
  const std::int64_t NC = boundary_numel();
  TRIDENT_CHECK(weight_grads || int(a.grad_stash.size()) >= chunk_layers(chunk),
                "an input-gradient-only backward needs make_activations(chunk, true)");
  check_no_head_gradient_pending(&a, "another backward");
  head_gradient_pending_ = nullptr;
  float* dres = dres_.data();  // [Nr,C] d loss / d residual stream, walking down the blocks
  ops_.copy(dres, a.doutput, NC);
  if (grad_ready_ && st.has_head) report_grads_ready(-2);  // ln_f: done in forward
  set_output(a, chunk);
  const int L = chunk_layers(chunk), first = local_first_[std::size_t(chunk)];
  for (int l = L - 1; l >= 0; --l) {
    const float* x = l == 0 ? a.input.data() : a.outputs.data() + (l - 1) * NC;
    LayerActivations& la = layer_activations(a, chunk, l, x);
    block_->backward(p_layers_[std::size_t(first + l)], g_layers_[std::size_t(first + l)], x, dres,
                     la, weight_grads ? nullptr : &a.grad_stash[l]);
    // A split backward's B (zb-h1, zb-v) leaves two of the block's weights to its W, which
    // reports the block once both are done (every W follows its own B).
    if (grad_ready_ && weight_grads) report_grads_ready(st.first_layer + l);
  }
  if (st.has_embedding) {
    // Every TP rank needs every token's gradient: its vocabulary rows, and wpe (replicated).
    const float* demb = tpm_.leave_backward(dres, full_scratch_.data(), NC);
    if (ops_.memory()) inputs = a.tokens.data();  // uploaded by this microbatch's forward
    ops_.embedding_backward(at(grads_.data(), Role::token_embedding), demb, inputs, B_ * T_, C_,
                            vocab_start_, Vl_);
    if (learned_positions_) {
      float* dwpe = at(grads_.data(), Role::position_embedding);
      slice_.for_each_run(B_, T_, 0, [&](std::int64_t row, int seqs, int rows, int pos) {
        ops_.position_backward(dwpe + std::int64_t(pos) * C_, demb + row * C_, seqs, rows, C_);
      });
    }
    if (grad_ready_) report_grads_ready(-1);
  }  // else a.dinput is dres: sent before the next backward
}

void GptChunk::backward_weights(int chunk, StageActivations& activations) {
  ChunkActivations& a = own(activations);
  const StageLayout& chunk_layout = this->chunk(chunk);
  TRIDENT_CHECK(int(a.grad_stash.size()) >= chunk_layers(chunk),
                "backward_weights needs make_activations(chunk, true)");
  check_no_head_gradient_pending(nullptr, "a weight pass");
  const std::int64_t NC = boundary_numel();
  const int L = chunk_layers(chunk), first = local_first_[std::size_t(chunk)];
  for (int l = L - 1; l >= 0; --l) {
    const float* x = l == 0 ? a.input.data() : a.outputs.data() + (l - 1) * NC;
    const LayerActivations& la = weight_pass_inputs(a, chunk, l, x);
    block_->backward_weights(p_layers_[std::size_t(first + l)], g_layers_[std::size_t(first + l)],
                             la, a.grad_stash[l]);
    if (grad_ready_) report_grads_ready(chunk_layout.first_layer + l);
  }
}

void GptChunk::reduce_param_grads() {
  if (sp_norms_.empty()) return;
  // One allreduce for all of them: pack, reduce, unpack.
  float* pack = sp_grad_pack_.data();
  for (const ShardSpec* s : sp_norms_) {
    ops_.copy(pack, grads_.data() + s->offset, s->local_numel());
    pack += s->local_numel();
  }
  ps_.tp.allreduce_sum(sp_grad_pack_.data(), std::int64_t(sp_grad_pack_.size()));
  pack = sp_grad_pack_.data();
  for (const ShardSpec* s : sp_norms_) {
    ops_.copy(grads_.data() + s->offset, pack, s->local_numel());
    pack += s->local_numel();
  }
}

// ---- grad-ready hook (see set_grad_ready_hook) -------------------------------------------

void GptChunk::report_grads_ready(int layer) {
  const bool holds_head = chunks_.back().has_head;  // wte is tied within this rank
  for (const auto& s : specs_) {
    if (layer == -2) {  // the head: the final norm, an untied lm_head (wte: with the embedding)
      if (s.place != Place::head) continue;
    } else if (s.layer != layer) {
      continue;
    } else if (layer == -1 && (s.place == Place::head || (s.tied_across_stages() && !holds_head))) {
      continue;  // the embedding: wpe, an untied embedding, a tied one held with its head
    }
    if ((tpm_.sequence_parallel() && s.norm) || s.tp_grad_sum) continue;  // summed over TP later
    grad_ready_(s.offset, s.local_numel());
  }
}

// ---- inference -------------------------------------------------------------------------

void GptChunk::logits_last(const std::int32_t* tokens, int t, float* logits) {
  TRIDENT_CHECK(chunks_.front().has_embedding && chunks_.back().has_head && ps_.tp.size() == 1 &&
                    ps_.cp.size() == 1 && !tpm_.sequence_parallel(),
                "sampling needs the whole model on one rank");
  TRIDENT_CHECK(t >= 1 && t <= T_, "context of ", t, " tokens outside [1, ", T_, "]");
  if (!infer_acts_) infer_acts_ = make_chunk_activations();
  const std::int64_t tC = std::int64_t(t) * C_;
  ChunkActivations& a = *infer_acts_;
  std::vector<std::int32_t> context(std::size_t(B_) * std::size_t(T_), 0);  // B*T for staging
  std::copy(tokens, tokens + t, context.begin());
  embed_forward(a.input.data(), stage_tokens(a.tokens, context.data()), 1, t);
  // The chunks one after the other (all on this rank), each from the previous one's output.
  // Rows of t tokens: layer l's output at row l of the outputs, the last layer's in boundary_.
  const float* x = a.input.data();
  for (int c = 0; c < num_chunks(); ++c) {
    for (int l = 0; l < chunk_layers(c); ++l) {
      LayerActivations& la = recompute_ == Recompute::full ? recomputed_layer(a)
                             : bf16_store_ && !a.fused
                                 ? bf16_working(a.layers[l])  // nothing to keep
                                 : a.layers[l];
      float* out = l + 1 == chunk_layers(c) ? boundary_.data() : a.outputs.data() + l * tC;
      if (x == out) {  // the next chunk starts from the last output: move it to the input
        ops_.copy(a.input.data(), x, tC);
        x = a.input.data();
      }
      block_forward(local_first_[std::size_t(c)] + l, x, out, la, 1, t);
      x = out;
    }
  }
  head_logits(x + (t - 1) * C_, lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), logits);
}

void GptChunk::head_logits(const float* x, float* lnf, float* mean, float* rstd, float* logits) {
  block_->norm_forward(lnf, mean, rstd, x, at(params_.data(), Role::final_norm_weight),
                       at_or_null(params_.data(), Role::final_norm_bias), 1);
  ops_.gemm(false, true, 1, Vl_, C_, 1.0f, lnf, C_, at(params_.data(), head_role_), C_, 0.0f,
            logits_.data(), Vl_);
  copy_to_host(ops_.memory(), logits, logits_.data(), std::size_t(v_valid_) * sizeof(float));
}

// ---- generation with a key-value cache ------------------------------------------------

void GptChunk::generation_step(std::int32_t token, float* logits) {
  TRIDENT_CHECK(chunks_.front().has_embedding && chunks_.back().has_head && ps_.tp.size() == 1 &&
                    ps_.cp.size() == 1 && !tpm_.sequence_parallel(),
                "generation needs the whole model on one rank");
  TRIDENT_CHECK(gen_pos_ < T_, "generation: the key-value cache holds ", T_,
                " positions (model.seq_len); generation_reset() first");
  const std::int64_t W = block_->kv_width();
  const int layers = int(p_layers_.size());
  const std::int64_t block_scratch = block_->decode_scratch_floats();
  if (kv_cache_.empty()) {
    kv_cache_ = buffer(std::int64_t(layers) * 2 * T_ * W);
    gen_scratch_ = buffer(block_scratch + 2 * std::int64_t(C_) + 2);
    block_->set_decode_scratch(gen_scratch_.data());
  }
  const int pos = gen_pos_++;
  if (!ops_.memory()) {
    gen_token_ = IntBuffer(1);
    gen_token_.data()[0] = token;
  } else {
    if (gen_token_.empty()) gen_token_ = IntBuffer(1, ops_.memory());
    copy_to_device(ops_.memory(), gen_token_.data(), &token, sizeof token);
  }
  float* x = gen_scratch_.data() + block_scratch;  // the residual [C]
  embed_forward(x, gen_token_.data(), 1, 1, pos);
  for (int l = 0; l < layers; ++l) {
    float* k_cache = kv_cache_.data() + std::int64_t(l) * 2 * T_ * W;
    block_->decode(p_layers_[std::size_t(l)], x, KvCache{k_cache, k_cache + T_ * W, pos});
  }
  float* lnf = x + C_;  // [C], then its statistics [2]
  head_logits(x, lnf, lnf + C_, lnf + C_ + 1, logits);
}

}  // namespace trident::model
