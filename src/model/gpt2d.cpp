// GPT-2 on the 2D TP grid, one pipeline stage (see trident/model/gpt2d.hpp).
#include "trident/model/gpt2d.hpp"

#include <algorithm>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"

namespace trident::model {

namespace {
std::vector<ShardSpec> specs_2d(const ModelConfig& cfg, const StageLayout& stage,
                                const parallel::Tp2dGrid& g) {
  TRIDENT_CHECK(cfg.arch == Arch::gpt2, "2D tensor parallelism is built for GPT-2 only");
  return gpt_param_specs(cfg, stage, parallel::tp2d_rank(g.coord, g.q), g.q * g.q, 0, true);
}
std::int64_t total(const std::vector<ShardSpec>& specs) {
  return specs.empty() ? 0 : specs.back().offset + specs.back().local_numel();
}
}  // namespace

Gpt2d::Gpt2d(const ModelConfig& cfg, parallel::Tp2dGrid& grid, ops::Ops& ops, int micro_batch)
    : Gpt2d(cfg, StageLayout{0, cfg.n_layer, true, true}, grid, ops, micro_batch) {}

Gpt2d::Gpt2d(const ModelConfig& cfg, const StageLayout& stage, parallel::Tp2dGrid& grid,
             ops::Ops& ops, int micro_batch)
    : cfg_(cfg),
      stage_(stage),
      grid_(grid),
      ops_(ops),
      L_(stage.last_layer - stage.first_layer),
      q_(grid.q),
      mb_(micro_batch * cfg.seq_len / grid.q),
      cb_(cfg.d_model / grid.q),
      specs_(specs_2d(cfg, stage, grid)),
      num_params_(total(specs_)),
      params_(std::size_t(num_params_), ops.memory()),
      grads_(std::size_t(num_params_), ops.memory()),
      emb_(ops, grid, {micro_batch, cfg.seq_len, cfg.vocab_size, cfg.d_model}),
      block_(ops, grid, {micro_batch, cfg.seq_len, cfg.d_model, cfg.n_head}),
      lnf_(ops, grid, micro_batch * cfg.seq_len, cfg.d_model, 1e-5f),
      xent_(ops, grid, micro_batch * cfg.seq_len, cfg.vocab_size) {
  const std::size_t x = std::size_t(mb_) * std::size_t(cb_);
  dx_ = FloatBuffer(x, ops.memory());
  dy_ = FloatBuffer(x, ops.memory());
  targets_.resize(std::size_t(mb_));
  ops.fill(params_.data(), 0.0f, num_params_);
  zero_grads();
}

std::unique_ptr<Gpt2dActivations> Gpt2d::make_activations() const {
  auto* mem = ops_.memory();
  const std::size_t x = std::size_t(mb_) * std::size_t(cb_), rows = std::size_t(mb_);
  auto a = std::make_unique<Gpt2dActivations>();
  a->xs = FloatBuffer(std::size_t(L_ + 1) * x, mem);
  for (int l = 0; l < L_; ++l) a->layers.push_back(block_.make_activations());
  if (stage_.has_head) {
    a->lnf = FloatBuffer(x, mem);
    a->lnf_mean = FloatBuffer(rows, mem);
    a->lnf_rstd = FloatBuffer(rows, mem);
    a->logits = FloatBuffer(rows * std::size_t(emb_.vocab_per_block()), mem);
    a->loss = FloatBuffer(rows, mem);
  }
  a->doutput = FloatBuffer(x, mem);
  a->dinput = FloatBuffer(x, mem);
  a->tokens.resize(rows);
  return a;
}

float* Gpt2d::at(float* base, Role role, int layer) const {
  for (const ShardSpec& s : specs_)
    if (s.role == role && s.layer == layer) return base + s.offset;
  TRIDENT_CHECK(false, "internal: no 2D tensor for role ", int(role), " of layer ", layer);
  return nullptr;
}

Block2dTensors<float> Gpt2d::layer(float* base, int l) const {
  const int g = stage_.first_layer + l;  // the specs name global layers
  auto p = [&](Role r) { return at(base, r, g); };
  return {p(Role::attn_norm_weight), p(Role::attn_norm_bias),  p(Role::qkv_weight),
          p(Role::qkv_bias),         p(Role::attn_proj_weight), p(Role::attn_proj_bias),
          p(Role::mlp_norm_weight),  p(Role::mlp_norm_bias),  p(Role::fc_weight),
          p(Role::fc_bias),          p(Role::fc_proj_weight), p(Role::fc_proj_bias)};
}

void Gpt2d::init_weights(std::uint64_t seed) {  // host memory (LayerNorm2d is host-only)
  float* base = params_.data();
  for (const auto& s : specs_) {
    float* p = base + s.offset;
    std::fill(p, p + s.local_numel(), s.init == Init::ones ? 1.0f : 0.0f);
    if (s.init != Init::normal) continue;
    const std::uint64_t key = rng::key_of(s.name);
    for_each_local_element(s, [&](std::int64_t local, std::int64_t global) {
      p[local] = float(double(s.init_std) * rng::normal(seed, key, std::uint64_t(global)));
    });
  }
}

void Gpt2d::zero_grads() { ops_.fill(grads_.data(), 0.0f, num_params_); }

float* Gpt2d::output(Gpt2dActivations& a) const {
  return a.xs.data() + std::int64_t(L_) * mb_ * cb_;
}

double Gpt2d::forward(Gpt2dActivations& a, const std::int32_t* inputs,
                      const std::int32_t* targets, float loss_scale, bool with_backward) {
  const std::int64_t x = std::int64_t(mb_) * cb_;
  const std::int64_t first = std::int64_t(grid_.coord.row) * mb_;  // this rank's rows
  float* P = params_.data();
  float* G = grads_.data();
  float* xs = a.xs.data();
  if (stage_.has_embedding) {
    std::copy(inputs + first, inputs + first + mb_, a.tokens.begin());
    emb_.forward(xs, a.tokens.data(), at(P, Role::token_embedding),
                 at(P, Role::position_embedding));
  }
  for (int l = 0; l < L_; ++l) {
    const auto p = layer(P, l);
    const Block2dParams cp{p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.proj_w, p.proj_b,
                           p.ln2_w, p.ln2_b, p.fc_w,  p.fc_b,  p.fcproj_w, p.fcproj_b};
    block_.forward(xs + (l + 1) * x, xs + l * x, cp, a.layers[std::size_t(l)]);
  }
  a.loss_sum = 0;
  if (!stage_.has_head) return 0;
  std::copy(targets + first, targets + first + mb_, targets_.begin());
  const float* wte = at(P, Role::token_embedding);
  const float* lnf_w = at(P, Role::final_norm_weight);
  lnf_.forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), output(a), lnf_w,
               at(P, Role::final_norm_bias));
  emb_.head_forward(a.logits.data(), a.lnf.data(), wte);
  xent_.forward(a.loss.data(), a.logits.data(), targets_.data());
  double loss = 0;
  for (int i = 0; i < mb_; ++i) loss += a.loss.data()[i];
  grid_.col.allreduce_sum(&loss, 1);  // the q row blocks' sequences
  a.loss_sum = loss;
  if (!with_backward) return loss;
  // The head's backward now, as GptChunk's: no logits stay alive past the forward.
  xent_.backward(a.logits.data(), targets_.data(), loss_scale);
  emb_.head_backward(dy_.data(), at(G, Role::token_embedding), a.logits.data(), a.lnf.data(),
                     wte);
  lnf_.backward(a.doutput.data(), at(G, Role::final_norm_weight), at(G, Role::final_norm_bias),
                dy_.data(), output(a), a.lnf_mean.data(), a.lnf_rstd.data(), lnf_w);
  return loss;
}

void Gpt2d::backward(Gpt2dActivations& a) {
  const std::int64_t x = std::int64_t(mb_) * cb_;
  float* P = params_.data();
  float* G = grads_.data();
  float* xs = a.xs.data();
  ops_.copy(dx_.data(), a.doutput.data(), x);
  for (int l = L_ - 1; l >= 0; --l) {
    const auto p = layer(P, l);
    const Block2dParams cp{p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.proj_w, p.proj_b,
                           p.ln2_w, p.ln2_b, p.fc_w,  p.fc_b,  p.fcproj_w, p.fcproj_b};
    Block2dGrads g = layer(G, l);
    block_.backward(dy_.data(), dx_.data(), xs + l * x, cp, g, a.layers[std::size_t(l)]);
    std::swap(dx_, dy_);  // dx_ is the gradient at this layer's input
  }
  if (stage_.has_embedding)
    emb_.backward(at(G, Role::token_embedding), at(G, Role::position_embedding), dx_.data(),
                  a.tokens.data());
  else
    ops_.copy(a.dinput.data(), dx_.data(), x);
}

double Gpt2d::forward_backward(const std::int32_t* inputs, const std::int32_t* targets,
                               float loss_scale) {
  TRIDENT_CHECK(stage_.has_embedding && stage_.has_head,
                "internal: Gpt2d::forward_backward needs the whole model as one stage");
  if (!single_) single_ = make_activations();
  const double loss = forward(*single_, inputs, targets, loss_scale);
  backward(*single_);
  return loss;
}

void Gpt2d::reduce_param_grads() {
  float* G = grads_.data();
  for (int l = 0; l < L_; ++l) {
    Block2dGrads g = layer(G, l);
    block_.reduce_param_grads(g);
  }
  if (stage_.has_head)
    lnf_.reduce_param_grads(at(G, Role::final_norm_weight), at(G, Role::final_norm_bias));
  // wte: the head's and the embedding's parts (a stage with either holds it); wpe: first stage.
  if (stage_.has_embedding)
    emb_.reduce_param_grads(at(G, Role::token_embedding), at(G, Role::position_embedding));
  else if (stage_.has_head)
    grid_.col.allreduce_sum(at(G, Role::token_embedding),
                            std::int64_t(emb_.padded_vocab()) * cb_);
}

}  // namespace trident::model
