// GPT-2 chunk forward and backward over the ops interface (see trident/model/gpt.hpp).
// The backward of each block mirrors its forward line by line in reverse order.
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
                   Recompute recompute, bool sequence_parallel)
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
  TRIDENT_CHECK(!sequence_parallel || (std::int64_t(micro_batch) * cfg.seq_len) % tp == 0,
                "parallel.sequence_parallel: micro_batch_size * seq_len = ",
                std::int64_t(micro_batch) * cfg.seq_len, " tokens must be divisible by parallel.tp = ",
                tp);
  dims_ = chunk_dims(cfg, tp, micro_batch, sequence_parallel);
  B_ = int(dims_.B);
  T_ = int(dims_.T);
  C_ = int(dims_.C);
  NH_ = int(dims_.NH);
  C3_ = int(dims_.C3);
  F_ = int(dims_.F);
  F1_ = int(dims_.F1);
  Vl_ = int(dims_.Vl);
  Nr_ = int(dims_.Nr);
  switch (cfg.architecture()) {  // the blocks, the head's norm, the embedding's positions
    case Arch::gpt2: llama_ = false; break;
    case Arch::llama: llama_ = true; break;
  }
  if (llama_) {
    // Its query heads read one kv head each: its own (split over TP), or one of all of them
    // (n_kv_head < tp: replicated), the first at kv_head0_.
    const int kv = cfg.kv_heads();
    const bool kv_split = kv >= tp;
    kv_cols_ = int(dims_.kv_cols);
    kv_heads_ = kv_split ? kv / tp : 1;
    kv_head0_ = kv_split ? 0 : tp_rank * NH_ / (cfg.n_head / kv);  // its first query head's
  }
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
  params_ = buffer(num_params_);
  grads_ = buffer(num_params_);
  for (int l = 0; l < local_first_.back(); ++l) {
    p_layers_.push_back(layer_params(params_.data(), l));
    g_layers_.push_back(layer_params(grads_.data(), l));
  }

  const std::int64_t N = std::int64_t(B_) * T_;
  dres_ = buffer(N * C_);
  dbuf_ = buffer(N * C_);
  dqkv_ = buffer(N * C3_);
  dfch_ = buffer(N * F1_);
  dgelu_ = buffer(N * F_);
  if (tpm_.sequence_parallel()) {
    full_scratch_ = buffer(N * C_);
    local_scratch_ = buffer(std::int64_t(Nr_) * C_);
  }
  if (any_head(chunks_)) {
    logits_ = buffer(N * Vl_);
    row_max_ = buffer(N);
    sumexp_ = buffer(2 * N);  // sumexp then target logit: one allreduce for both
    token_loss_ = buffer(N);
    host_loss_.resize(std::size_t(N));
  }
  if (recompute_ == Recompute::full) bind_layers(recompute_store_, recompute_layer_, 1);
  if (recompute_ == Recompute::selective) {
    Carver count;
    carve_recomputed(dims_, count, selective_);
    selective_store_ = buffer(count.used);
    Carver bind{selective_store_.data()};
    carve_recomputed(dims_, bind, selective_);
  }
  // runtime.precision = "bf16" on a device: the stash as bf16 (bf16_storage()). Not with
  // recomputation: full keeps no stash, selective's would need its shared views unpacked.
  bf16_store_ = stores_bf16(ops_.precision(), recompute_);
  if (bf16_store_) {
    Carver count;
    carve_layer(dims_, count, bf16_work_);
    bf16_work_store_ = buffer(count.used);
    Carver bind{bf16_work_store_.data()};
    carve_layer(dims_, bind, bf16_work_);
  }
  ln_discard_ = buffer(2 * std::int64_t(C_));
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
  if (!ops_.memory() || !host) return host;
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

GptChunk::LayerParams GptChunk::layer_params(float* base, int l) const {
  if (llama_) {
    // q, k, v (and gate, up) are adjacent in the buffer: one [q; k; v] ([gate; up]) matrix.
    const ShardSpec &q = *find(Role::qkv_weight, l), &k = *find(Role::k_weight, l),
                    &v = *find(Role::v_weight, l), &gate = *find(Role::fc_weight, l),
                    &up = *find(Role::up_weight, l);
    TRIDENT_CHECK(k.offset == q.offset + q.local_numel() && v.offset == k.offset + k.local_numel() &&
                      up.offset == gate.offset + gate.local_numel(),
                  "internal: Llama's q, k, v (gate, up) shards are not adjacent");
  }
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

ChunkDims chunk_dims(const ModelConfig& cfg, int tp, int micro_batch, bool sequence_parallel) {
  ChunkDims d;
  d.B = micro_batch;
  d.T = cfg.seq_len;
  d.C = cfg.d_model;
  d.N = d.B * d.T;
  d.Nr = sequence_parallel ? d.N / tp : d.N;
  d.NH = cfg.n_head / tp;
  d.Ca = d.C / tp;
  d.Vl = vocab_per_rank(cfg.vocab_size, tp);
  d.F = cfg.d_ff() / tp;
  if (cfg.llama()) {
    // [q | k | v] columns of this rank: its query heads, then its kv heads (split over TP),
    // or every kv head (n_kv_head < tp: replicated).
    const int kv = cfg.kv_heads();
    d.kv_cols = std::int64_t(kv >= tp ? kv / tp : kv) * cfg.head_dim();
    d.C3 = d.Ca + 2 * d.kv_cols;
    d.F1 = 2 * d.F;  // gate | up
  } else {
    d.kv_cols = d.Ca;
    d.C3 = 3 * d.Ca;
    d.F1 = d.F;
  }
  return d;
}

void carve_recomputed(const ChunkDims& d, Carver& take, LayerActivations& la) {
  la = LayerActivations{};
  la.atty = take(d.N * d.Ca);
  la.lse = take(d.B * d.NH * d.T);
  la.fch_gelu = take(d.N * d.F);
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

std::int64_t packed_layer_floats(const ChunkDims& d) {
  Carver count;
  LayerActivations la;
  std::uint16_t* packed = nullptr;
  carve_packed_layer(d, count, la, packed);
  return count.used;
}

void carve_grad_stash(const ChunkDims& d, Carver& take, LayerGradStash& g) {
  g.dmlp = take(d.N * d.C);
  g.dfch = take(d.N * d.F1);
  g.dln2 = take(d.Nr * d.C);
  g.dattn = take(d.N * d.C);
  g.dqkv = take(d.N * d.C3);
  g.dln1 = take(d.Nr * d.C);
}

std::int64_t layer_floats(const ChunkDims& d, bool selective) {
  Carver count;
  LayerActivations la{}, shared{};
  carve_layer(d, count, la, selective ? &shared : nullptr);
  return count.used;
}

std::int64_t recomputed_floats(const ChunkDims& d) {
  Carver count;
  LayerActivations la;
  carve_recomputed(d, count, la);
  return count.used;
}

bool stores_bf16(ops::Precision precision, Recompute recompute) {
  return precision == ops::Precision::bf16 && recompute == Recompute::none;
}

std::int64_t grad_stash_floats(const ChunkDims& d) {
  Carver count;
  LayerGradStash g{};
  carve_grad_stash(d, count, g);
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
  const std::int64_t N = std::int64_t(B_) * T_, NrC = boundary_numel();
  const int L = chunk < 0 ? L_ : chunk_layers(chunk);  // -1: any chunk (the largest)
  const bool head = chunk < 0 ? any_head(chunks_) : this->chunk(chunk).has_head;
  auto a = std::make_unique<ChunkActivations>();
  a->input = buffer(NrC);
  a->outputs = buffer(std::max(1, L) * NrC);
  a->doutput = buffer(NrC);
  a->dinput = buffer(NrC);
  if (bf16_store_) {
    a->layers.resize(std::size_t(L));
    a->packed.resize(std::size_t(L));
    a->store = buffer(packed_layer_floats(dims_) * L);
    Carver take{a->store.data()};
    for (int l = 0; l < L; ++l) carve_packed_layer(dims_, take, a->layers[l], a->packed[l]);
  } else if (recompute_ != Recompute::full) {
    bind_layers(a->store, a->layers, L);
  }
  if (split_backward) {
    a->grad_stash.resize(std::size_t(L));
    a->grad_store = buffer(std::max<std::int64_t>(1, grad_stash_floats(dims_) * L));
    Carver take{a->grad_store.data()};
    for (LayerGradStash& g : a->grad_stash) carve_grad_stash(dims_, take, g);
  }
  if (head) {
    a->lnf = buffer(N * C_);
    a->lnf_mean = buffer(Nr_);
    a->lnf_rstd = buffer(Nr_);
  }
  a->last_output = L == 0 ? a->input.data() : a->outputs.data() + std::int64_t(L - 1) * NrC;
  return a;
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

void GptChunk::unpack_layer(ChunkActivations& a, int l) {
  const std::uint16_t* src = a.packed[std::size_t(l)];
  for (const StashedTensor& t : stashed_tensors(dims_)) {
    ops_.from_bf16(bf16_work_.*t.field, src, t.numel);
    src += t.numel;
  }
}

float* GptChunk::output(ChunkActivations& a) const { return a.last_output; }

void GptChunk::set_output(ChunkActivations& a, int chunk) const {
  const int L = chunk_layers(chunk);
  a.last_output = L == 0 ? a.input.data() : a.outputs.data() + std::int64_t(L - 1) * boundary_numel();
}

// ---- forward ---------------------------------------------------------------------------

// x: [local rows of b*t, C]. Each TP rank looks up its vocabulary rows (zeros elsewhere)
// and TP rank 0 adds the positions; the reduction leaves the sum, which is exact because
// every other term is 0.
void GptChunk::embed_forward(float* x, const std::int32_t* inputs, int b, int t) {
  const int n = b * t;
  const std::int64_t local_n = tpm_.local_rows(n) * C_;
  float* partial = tpm_.sequence_parallel() ? full_scratch_.data() : x;
  ops_.embedding_forward(partial, inputs, at(params_.data(), Role::token_embedding), n, C_,
                         vocab_start_, Vl_);
  if (!llama_ && ps_.tp.rank() == 0)  // Llama's positions are rotary, in attention
    ops_.position_forward(partial, at(params_.data(), Role::position_embedding), b, t, C_);
  tpm_.leave_forward(partial, x, local_n);
}

void GptChunk::row_parallel_forward(float* y, const float* x, const float* w, const float* bias,
                                    int n, int in, int out) {
  // The bias joins on TP rank 0 only, so that the reduction adds it exactly once.
  float* partial = tpm_.sequence_parallel() ? full_scratch_.data() : y;
  if (llama_)  // w [out, in] (no bias)
    ops_.gemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, partial, out);
  else
    ops_.linear_forward(partial, x, w, ps_.tp.rank() == 0 ? bias : nullptr, n, in, out);
  tpm_.leave_forward(partial, y, tpm_.local_rows(n) * out);
}

void GptChunk::block_forward(int l, const float* x, float* out, LayerActivations& la, int b,
                             int t) {
  if (llama_) return llama_block_forward(l, x, out, la, b, t);
  const LayerParams& p = p_layers_[l];
  const int n = b * t, Ca = C_ / ps_.tp.size();
  const int nr = int(tpm_.local_rows(n));  // residual-stream rows here
  const std::int64_t local_n = std::int64_t(nr) * C_;
  float* ln1 = tpm_.local_part(la.ln1, local_n);
  ops_.layernorm_forward(ln1, la.ln1_mean, la.ln1_rstd, x, p.ln1_w, p.ln1_b, nr, C_);
  tpm_.enter_forward(la.ln1, local_n);
  ops_.linear_forward(la.qkv, la.ln1, p.qkv_w, p.qkv_b, n, C_, C3_);
  const ops::Ops::AttentionShape att = ops::attention_shape_qkv(b, t, Ca, NH_);
  ops_.attention_forward(la.atty, la.lse, la.qkv, la.qkv + Ca, la.qkv + 2 * Ca, att);
  row_parallel_forward(la.res2, la.atty, p.attproj_w, p.attproj_b, n, Ca, C_);
  ops_.add(la.res2, la.res2, x, local_n);
  float* ln2 = tpm_.local_part(la.ln2, local_n);
  ops_.layernorm_forward(ln2, la.ln2_mean, la.ln2_rstd, la.res2, p.ln2_w, p.ln2_b, nr, C_);
  tpm_.enter_forward(la.ln2, local_n);
  ops_.linear_forward(la.fch, la.ln2, p.fc_w, p.fc_b, n, C_, F_);
  ops_.gelu_forward(la.fch_gelu, la.fch, std::int64_t(n) * F_);
  row_parallel_forward(out, la.fch_gelu, p.fcproj_w, p.fcproj_b, n, F_, C_);
  ops_.add(out, out, la.res2, local_n);
}

double GptChunk::forward(int chunk, StageActivations& activations, const std::int32_t* inputs,
                         const std::int32_t* targets, float loss_scale, bool with_backward) {
  ChunkActivations& a = own(activations);
  const StageLayout& st = this->chunk(chunk);
  const std::int64_t NC = boundary_numel();
  if (st.has_embedding) embed_forward(a.input.data(), stage_tokens(a.tokens, inputs), B_, T_);
  if (st.has_head) targets = stage_tokens(a.targets, targets);
  set_output(a, chunk);  // pooled activations serve chunks of any size
  const int L = chunk_layers(chunk), first = local_first_[std::size_t(chunk)];
  for (int l = 0; l < L; ++l) {
    const float* x = l == 0 ? a.input.data() : a.outputs.data() + (l - 1) * NC;
    LayerActivations& la = recompute_ == Recompute::full ? recompute_layer_[0]
                           : bf16_store_                   ? bf16_working(a.layers[l])
                                                           : a.layers[l];
    block_forward(first + l, x, a.outputs.data() + l * NC, la, B_, T_);
    if (bf16_store_) pack_layer(a, l);
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
  if (llama_)
    ops_.rmsnorm_forward(tpm_.local_part(a.lnf.data(), local_n), a.lnf_rstd.data(), x, lnf_w,
                         Nr_, C_, float(cfg_.norm_eps));
  else
    ops_.layernorm_forward(tpm_.local_part(a.lnf.data(), local_n), a.lnf_mean.data(),
                           a.lnf_rstd.data(), x, lnf_w, at(params_.data(), Role::final_norm_bias),
                           Nr_, C_);
  tpm_.enter_forward(a.lnf.data(), local_n);
  // logits[N,Vl] = lnf @ wte^T (this rank's vocabulary rows)
  float* logits = logits_.data();
  ops_.gemm(false, true, N, Vl_, C_, 1.0f, a.lnf.data(), C_, wte, C_, 0.0f, logits, Vl_);
  vocab_parallel_xent_forward(ops_, ps_.tp, token_loss_.data(), row_max_.data(), sumexp_.data(),
                              logits, targets, N, Vl_, v_valid_, vocab_start_);
  copy_to_host(ops_.memory(), host_loss_.data(), token_loss_.data(), std::size_t(N) * sizeof(float));
  double loss_sum = 0;
  for (int i = 0; i < N; ++i) loss_sum += host_loss_[std::size_t(i)];
  if (!with_backward) return loss_sum;

  // The head's backward right away: dlogits in place, then d lnf and d wte.
  ops_.xent_backward(logits, row_max_.data(), sumexp_.data(), targets, N, Vl_, v_valid_, vocab_start_,
                     loss_scale);
  float* dlnf_partial = dbuf_.data();  // [N,C] this rank's vocabulary share
  ops_.gemm(false, false, N, C_, Vl_, 1.0f, logits, Vl_, wte, C_, 0.0f, dlnf_partial, C_);
  const float* dlnf = tpm_.enter_backward(dlnf_partial, local_scratch_.data(), local_n);
  ops_.gemm(true, false, Vl_, C_, N, 1.0f, logits, Vl_, a.lnf.data(), C_, 1.0f, dwte, C_);
  zero(a.doutput);
  if (llama_)
    ops_.rmsnorm_backward(a.doutput.data(), at(grads_.data(), Role::final_norm_weight), dlnf, x, lnf_w,
                          a.lnf_rstd.data(), Nr_, C_);
  else
    ops_.layernorm_backward(a.doutput.data(), at(grads_.data(), Role::final_norm_weight),
                            at(grads_.data(), Role::final_norm_bias), dlnf, x, lnf_w,
                            a.lnf_mean.data(), a.lnf_rstd.data(), Nr_, C_);
  return loss_sum;
}

// ---- backward --------------------------------------------------------------------------

void GptChunk::block_backward(int l, const float* x, float* dres, LayerActivations& la,
                              LayerGradStash* stash) {
  if (llama_) return llama_block_backward(l, x, dres, la, stash);
  const LayerParams& p = p_layers_[l];
  const LayerParams& g = g_layers_[l];
  const int n = B_ * T_, Ca = C_ / ps_.tp.size();
  const std::int64_t local_n = boundary_numel();
  float* dbuf = dbuf_.data();  // [N,C] partial input gradients of column-parallel layers
  float* dfull = full_scratch_.data();     // SP: the gathered [N,C] residual gradient
  float* dlocal = local_scratch_.data();   // SP: [Nr,C] reduce-scattered LayerNorm gradient
  // Without a stash: ops' fused backward (input and parameter gradients). With one (the
  // zero-bubble B): the input gradient only, and the output gradient kept for W.
  auto linear = [&](float* dx, float* dw, float* db, const float* dy, const float* in_x,
                    const float* w, int in, int out, float* keep) {
    if (!keep) return ops_.linear_backward(dx, dw, db, dy, in_x, w, n, in, out);
    ops_.gemm(false, true, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in);
    ops_.copy(keep, dy, std::int64_t(n) * out);
  };
  auto layernorm = [&](float* dx, float* dw, float* db, const float* dy, const float* in_x,
                       const float* w, const float* mean, const float* rstd, float* keep) {
    if (keep) {
      ops_.copy(keep, dy, local_n);
      dw = ln_discard_.data();
      db = ln_discard_.data() + C_;
    }
    ops_.layernorm_backward(dx, dw, db, dy, in_x, w, mean, rstd, Nr_, C_);
  };
  // MLP: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))   (dres: [Nr,C])
  const float* dout = tpm_.leave_backward(dres, dfull, local_n);
  linear(dgelu_.data(), g.fcproj_w, g.fcproj_b, dout, la.fch_gelu, p.fcproj_w, F_, C_,
         stash ? stash->dmlp : nullptr);
  ops_.gelu_backward(dfch_.data(), la.fch, dgelu_.data(), std::int64_t(n) * F_);
  linear(dbuf, g.fc_w, g.fc_b, dfch_.data(), la.ln2, p.fc_w, C_, F_,
         stash ? stash->dfch : nullptr);
  const float* dln2 = tpm_.enter_backward(dbuf, dlocal, local_n);
  layernorm(dres, g.ln2_w, g.ln2_b, dln2, la.res2, p.ln2_w, la.ln2_mean, la.ln2_rstd,
            stash ? stash->dln2 : nullptr);
  // Attention: res2 = x + c_proj(attention(c_attn(ln_1(x))))
  const float* dres2 = tpm_.leave_backward(dres, dfull, local_n);
  float* datty = dbuf;  // [N, Ca], free again once attention_backward has read it
  linear(datty, g.attproj_w, g.attproj_b, dres2, la.atty, p.attproj_w, Ca, C_,
         stash ? stash->dattn : nullptr);
  const ops::Ops::AttentionShape att = ops::attention_shape_qkv(B_, T_, Ca, NH_);
  float* dqkv = dqkv_.data();
  ops_.attention_backward(dqkv, dqkv + Ca, dqkv + 2 * Ca, datty, la.atty, la.lse, la.qkv,
                          la.qkv + Ca, la.qkv + 2 * Ca, att);
  linear(dbuf, g.qkv_w, g.qkv_b, dqkv_.data(), la.ln1, p.qkv_w, C_, C3_,
         stash ? stash->dqkv : nullptr);
  const float* dln1 = tpm_.enter_backward(dbuf, dlocal, local_n);
  layernorm(dres, g.ln1_w, g.ln1_b, dln1, x, p.ln1_w, la.ln1_mean, la.ln1_rstd,
            stash ? stash->dln1 : nullptr);
}

// The parameter half of block_backward, from the output gradients it stashed.
void GptChunk::block_backward_weights(int l, const float* x, LayerActivations& la,
                                      const LayerGradStash& st) {
  if (llama_) return llama_block_backward_weights(l, x, la, st);
  const LayerParams& p = p_layers_[l];
  const LayerParams& g = g_layers_[l];
  const int n = B_ * T_, Ca = C_ / ps_.tp.size();
  float* discard = dbuf_.data();  // [Nr,C] the LayerNorms' input gradients, not needed here
  ops_.linear_backward(nullptr, g.fcproj_w, g.fcproj_b, st.dmlp, la.fch_gelu, p.fcproj_w, n,
                       F_, C_);
  ops_.linear_backward(nullptr, g.fc_w, g.fc_b, st.dfch, la.ln2, p.fc_w, n, C_, F_);
  ops_.layernorm_backward(discard, g.ln2_w, g.ln2_b, st.dln2, la.res2, p.ln2_w, la.ln2_mean,
                          la.ln2_rstd, Nr_, C_);
  ops_.linear_backward(nullptr, g.attproj_w, g.attproj_b, st.dattn, la.atty, p.attproj_w, n,
                       Ca, C_);
  ops_.linear_backward(nullptr, g.qkv_w, g.qkv_b, st.dqkv, la.ln1, p.qkv_w, n, C_, C3_);
  ops_.layernorm_backward(discard, g.ln1_w, g.ln1_b, st.dln1, x, p.ln1_w, la.ln1_mean,
                          la.ln1_rstd, Nr_, C_);
}

// Layer l's stashed activations, or with full recompute its forward run again into the
// one-layer scratch (its output is not needed, so it lands in scratch too).
LayerActivations& GptChunk::layer_activations(ChunkActivations& a, int chunk, int l,
                                              const float* x) {
  if (recompute_ == Recompute::none) {
    if (!bf16_store_) return a.layers[l];
    unpack_layer(a, l);
    return bf16_working(a.layers[l]);
  }
  if (recompute_ == Recompute::selective) {
    // The attention core and the GELU (Llama: SwiGLU) again, from the kept qkv (Llama's
    // already rotated) and c_fc (gate | up) output.
    LayerActivations& la = a.layers[l];
    const int Ca = C_ / ps_.tp.size();
    if (llama_) {
      const float* k = la.qkv + Ca + std::int64_t(kv_head0_) * cfg_.head_dim();
      ops_.attention_forward(la.atty, la.lse, la.qkv, k, k + kv_cols_,
                             llama_attention_shape(B_, T_));
      ops_.swiglu_forward(la.fch_gelu, la.fch, B_ * T_, F_);
      return la;
    }
    ops_.attention_forward(la.atty, la.lse, la.qkv, la.qkv + Ca, la.qkv + 2 * Ca,
                           ops::attention_shape_qkv(B_, T_, Ca, NH_));
    ops_.gelu_forward(la.fch_gelu, la.fch, std::int64_t(B_) * T_ * F_);
    return la;
  }
  LayerActivations& la = recompute_layer_[0];
  block_forward(local_first_[std::size_t(chunk)] + l, x, dbuf_.data(), la, B_, T_);
  return la;
}

void GptChunk::backward(int chunk, StageActivations& activations, const std::int32_t* inputs,
                        bool weight_grads) {
  ChunkActivations& a = own(activations);
  const StageLayout& st = this->chunk(chunk);
  const std::int64_t NC = boundary_numel();
  TRIDENT_CHECK(weight_grads || int(a.grad_stash.size()) >= chunk_layers(chunk),
                "an input-gradient-only backward needs make_activations(chunk, true)");
  float* dres = dres_.data();  // [Nr,C] d loss / d residual stream, walking down the blocks
  ops_.copy(dres, a.doutput.data(), NC);
  if (grad_ready_ && st.has_head) report_grads_ready(-2);  // ln_f: done in forward
  set_output(a, chunk);
  const int L = chunk_layers(chunk), first = local_first_[std::size_t(chunk)];
  for (int l = L - 1; l >= 0; --l) {
    const float* x = l == 0 ? a.input.data() : a.outputs.data() + (l - 1) * NC;
    LayerActivations& la = layer_activations(a, chunk, l, x);
    block_backward(first + l, x, dres, la, weight_grads ? nullptr : &a.grad_stash[l]);
    // An input-gradient-only backward (zb-h1's B) leaves the block's weights to its W.
    if (grad_ready_ && weight_grads) report_grads_ready(st.first_layer + l);
  }
  if (st.has_embedding) {
    // Every TP rank needs every token's gradient: its vocabulary rows, and wpe (replicated).
    const float* demb = tpm_.leave_backward(dres, full_scratch_.data(), NC);
    if (ops_.memory()) inputs = a.tokens.data();  // uploaded by this microbatch's forward
    ops_.embedding_backward(at(grads_.data(), Role::token_embedding), demb, inputs, B_ * T_, C_,
                            vocab_start_, Vl_);
    if (!llama_) ops_.position_backward(at(grads_.data(), Role::position_embedding), demb, B_, T_, C_);
    if (grad_ready_) report_grads_ready(-1);
  } else {
    ops_.copy(a.dinput.data(), dres, NC);
  }
}

void GptChunk::backward_weights(int chunk, StageActivations& activations) {
  ChunkActivations& a = own(activations);
  const StageLayout& chunk_layout = this->chunk(chunk);
  TRIDENT_CHECK(int(a.grad_stash.size()) >= chunk_layers(chunk),
                "backward_weights needs make_activations(chunk, true)");
  const std::int64_t NC = boundary_numel();
  const int L = chunk_layers(chunk), first = local_first_[std::size_t(chunk)];
  for (int l = L - 1; l >= 0; --l) {
    const float* x = l == 0 ? a.input.data() : a.outputs.data() + (l - 1) * NC;
    LayerActivations& la = layer_activations(a, chunk, l, x);
    block_backward_weights(first + l, x, la, a.grad_stash[l]);
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
                    !tpm_.sequence_parallel(),
                "sampling needs the whole model on one rank");
  TRIDENT_CHECK(t >= 1 && t <= T_, "context of ", t, " tokens outside [1, ", T_, "]");
  if (!infer_acts_) infer_acts_ = make_chunk_activations();
  const std::int64_t tC = std::int64_t(t) * C_;
  ChunkActivations& a = *infer_acts_;
  std::vector<std::int32_t> context(std::size_t(B_) * std::size_t(T_), 0);  // B*T for staging
  std::copy(tokens, tokens + t, context.begin());
  embed_forward(a.input.data(), stage_tokens(a.tokens, context.data()), 1, t);
  // The chunks one after the other (all on this rank), each from the previous one's output.
  const float* x = a.input.data();
  for (int c = 0; c < num_chunks(); ++c) {
    for (int l = 0; l < chunk_layers(c); ++l) {
      LayerActivations& la = recompute_ == Recompute::full ? recompute_layer_[0]
                             : bf16_store_ ? bf16_working(a.layers[l])  // nothing to keep
                                           : a.layers[l];
      float* out = a.outputs.data() + l * tC;
      if (x == out) {  // the next chunk starts from the last output: move it to the input
        ops_.copy(a.input.data(), x, tC);
        x = a.input.data();
      }
      block_forward(local_first_[std::size_t(c)] + l, x, out, la, 1, t);
      x = out;
    }
  }
  const float* last = x + (t - 1) * C_;
  if (llama_)
    ops_.rmsnorm_forward(a.lnf.data(), a.lnf_rstd.data(), last, at(params_.data(), Role::final_norm_weight),
                         1, C_, float(cfg_.norm_eps));
  else
    ops_.layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), last,
                           at(params_.data(), Role::final_norm_weight),
                           at(params_.data(), Role::final_norm_bias), 1, C_);
  ops_.gemm(false, true, 1, Vl_, C_, 1.0f, a.lnf.data(), C_, at(params_.data(), head_role_), C_,
            0.0f, logits_.data(), Vl_);
  copy_to_host(ops_.memory(), logits, logits_.data(), std::size_t(v_valid_) * sizeof(float));
}

// ---- generation with a key-value cache ------------------------------------------------
//
// One token at position `pos`; legend as the blocks' with N = 1, and the kv width W = C for
// GPT-2 (its k and v columns), kv columns for Llama. Scratch of one token, laid out in
// generation_step: ln [C], qkv [C3], atty [C], res2 [C], tmp [C], fch [F1], act [F],
// scores [NH * T].

namespace {
struct GenScratch {
  float *ln, *stat, *qkv, *atty, *res2, *tmp, *fch, *act, *scores;
};
GenScratch gen_views(float* p, int C, int C3, int F1, int F, int NH, int T) {
  GenScratch g;
  auto take = [&p](std::int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  g.ln = take(C), g.stat = take(2), g.qkv = take(C3), g.atty = take(C), g.res2 = take(C);
  g.tmp = take(C), g.fch = take(F1), g.act = take(F);
  g.scores = take(ops::Ops::decode_scratch_floats(1, NH, T));
  return g;
}
}  // namespace

void GptChunk::generation_block(int l, float* x, float* k_cache, float* v_cache, int pos) {
  const LayerParams& p = p_layers_[l];
  const int hd = cfg_.head_dim(), W = llama_ ? kv_cols_ : C_;
  GenScratch s = gen_views(gen_scratch_.data(), C_, C3_, F1_, F_, NH_, T_);
  // attention: the new token's q, k, v; k and v join the cache; q reads positions 0..pos
  if (llama_) {
    ops_.rmsnorm_forward(s.ln, s.stat, x, p.ln1_w, 1, C_, float(cfg_.norm_eps));
    ops_.gemm(false, true, 1, C3_, C_, 1.0f, s.ln, C_, p.qkv_w, C_, 0.0f, s.qkv, C3_);
    ops_.rope_forward(s.qkv, 1, 1, C3_, NH_ + kv_cols_ / hd, hd, pos, float(cfg_.rope_theta));
  } else {
    ops_.layernorm_forward(s.ln, s.stat, s.stat + 1, x, p.ln1_w, p.ln1_b, 1, C_);
    ops_.linear_forward(s.qkv, s.ln, p.qkv_w, p.qkv_b, 1, C_, C3_);
  }
  ops_.copy(k_cache + std::int64_t(pos) * W, s.qkv + C_, W);
  ops_.copy(v_cache + std::int64_t(pos) * W, s.qkv + C_ + W, W);
  ops_.attention_decode(s.atty, s.scores, s.qkv, k_cache, v_cache, 1, pos + 1, NH_,
                        llama_ ? kv_heads_ : NH_, hd, C3_, W, 0, C_);
  if (llama_)
    ops_.gemm(false, true, 1, C_, C_, 1.0f, s.atty, C_, p.attproj_w, C_, 0.0f, s.tmp, C_);
  else
    ops_.linear_forward(s.tmp, s.atty, p.attproj_w, p.attproj_b, 1, C_, C_);
  ops_.add(s.res2, s.tmp, x, C_);
  // MLP
  if (llama_) {
    ops_.rmsnorm_forward(s.ln, s.stat, s.res2, p.ln2_w, 1, C_, float(cfg_.norm_eps));
    ops_.gemm(false, true, 1, F1_, C_, 1.0f, s.ln, C_, p.fc_w, C_, 0.0f, s.fch, F1_);
    ops_.swiglu_forward(s.act, s.fch, 1, F_);
    ops_.gemm(false, true, 1, C_, F_, 1.0f, s.act, F_, p.fcproj_w, F_, 0.0f, s.tmp, C_);
  } else {
    ops_.layernorm_forward(s.ln, s.stat, s.stat + 1, s.res2, p.ln2_w, p.ln2_b, 1, C_);
    ops_.linear_forward(s.fch, s.ln, p.fc_w, p.fc_b, 1, C_, F_);
    ops_.gelu_forward(s.act, s.fch, F_);
    ops_.linear_forward(s.tmp, s.act, p.fcproj_w, p.fcproj_b, 1, F_, C_);
  }
  ops_.add(x, s.tmp, s.res2, C_);
}

void GptChunk::generation_step(std::int32_t token, float* logits) {
  TRIDENT_CHECK(chunks_.front().has_embedding && chunks_.back().has_head && ps_.tp.size() == 1 &&
                    !tpm_.sequence_parallel(),
                "generation needs the whole model on one rank");
  TRIDENT_CHECK(gen_pos_ < T_, "generation: the key-value cache holds ", T_,
                " positions (model.seq_len); generation_reset() first");
  const int W = llama_ ? kv_cols_ : C_;
  const int layers = int(p_layers_.size());
  if (kv_cache_.empty()) {
    kv_cache_ = buffer(std::int64_t(layers) * 2 * T_ * W);
    gen_scratch_ = buffer(2 * std::int64_t(C_) + 2 + C3_ + 3 * C_ + F1_ + F_ +
                          ops::Ops::decode_scratch_floats(1, NH_, T_));
  }
  const int pos = gen_pos_++;
  if (!ops_.memory()) {
    gen_token_ = IntBuffer(1);
    gen_token_.data()[0] = token;
  } else {
    if (gen_token_.empty()) gen_token_ = IntBuffer(1, ops_.memory());
    copy_to_device(ops_.memory(), gen_token_.data(), &token, sizeof token);
  }
  float* x = gen_scratch_.data() + (gen_scratch_.size() - std::size_t(C_));  // the residual
  ops_.embedding_forward(x, gen_token_.data(), at(params_.data(), Role::token_embedding), 1, C_, 0, Vl_);
  if (!llama_) ops_.position_forward(x, at(params_.data(), Role::position_embedding) + std::int64_t(pos) * C_, 1, 1, C_);
  for (int l = 0; l < layers; ++l) {
    float* k_cache = kv_cache_.data() + std::int64_t(l) * 2 * T_ * W;
    generation_block(l, x, k_cache, k_cache + std::int64_t(T_) * W, pos);
  }
  float* lnf = gen_scratch_.data();  // GenScratch::ln
  if (llama_)
    ops_.rmsnorm_forward(lnf, lnf + C_, x, at(params_.data(), Role::final_norm_weight), 1, C_,
                         float(cfg_.norm_eps));
  else
    ops_.layernorm_forward(lnf, lnf + C_, lnf + C_ + 1, x, at(params_.data(), Role::final_norm_weight),
                           at(params_.data(), Role::final_norm_bias), 1, C_);
  ops_.gemm(false, true, 1, Vl_, C_, 1.0f, lnf, C_, at(params_.data(), head_role_), C_, 0.0f,
            logits_.data(), Vl_);
  copy_to_host(ops_.memory(), logits, logits_.data(), std::size_t(v_valid_) * sizeof(float));
}

}  // namespace trident::model
