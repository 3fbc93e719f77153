// The whole GPT-2 on the 2D TP grid (see trident/model/gpt2d.hpp).
#include "trident/model/gpt2d.hpp"

#include <algorithm>
#include <cstring>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"

namespace trident::model {

namespace {
std::vector<ShardSpec> specs_2d(const ModelConfig& cfg, const parallel::Tp2dGrid& g) {
  TRIDENT_CHECK(!cfg.llama(), "2D tensor parallelism is built for GPT-2 only");
  return gpt_param_specs(cfg, StageLayout{0, cfg.n_layer, true, true},
                         parallel::tp2d_rank(g.coord, g.q), g.q * g.q, 0, true);
}
std::int64_t total(const std::vector<ShardSpec>& specs) {
  return specs.empty() ? 0 : specs.back().offset + specs.back().local_numel();
}
}  // namespace

Gpt2d::Gpt2d(const ModelConfig& cfg, parallel::Tp2dGrid& grid, ops::Ops& ops, int micro_batch)
    : cfg_(cfg),
      grid_(grid),
      ops_(ops),
      B_(micro_batch),
      T_(cfg.seq_len),
      C_(cfg.d_model),
      q_(grid.q),
      mb_(micro_batch * cfg.seq_len / grid.q),
      cb_(cfg.d_model / grid.q),
      specs_(specs_2d(cfg, grid)),
      num_params_(total(specs_)),
      params_(std::size_t(num_params_), ops.memory()),
      grads_(std::size_t(num_params_), ops.memory()),
      emb_(ops, grid, {micro_batch, cfg.seq_len, cfg.vocab_size, cfg.d_model}),
      block_(ops, grid, {micro_batch, cfg.seq_len, cfg.d_model, cfg.n_head}),
      lnf_(ops, grid, micro_batch * cfg.seq_len, cfg.d_model, 1e-5f),
      xent_(ops, grid, micro_batch * cfg.seq_len, cfg.vocab_size) {
  for (int l = 0; l < cfg.n_layer; ++l) acts_.push_back(block_.make_activations());
  const std::size_t x = std::size_t(mb_) * std::size_t(cb_);
  xs_ = FloatBuffer(std::size_t(cfg.n_layer + 1) * x, ops.memory());
  lnf_out_ = FloatBuffer(x, ops.memory());
  lnf_mean_ = FloatBuffer(std::size_t(mb_), ops.memory());
  lnf_rstd_ = FloatBuffer(std::size_t(mb_), ops.memory());
  logits_ = FloatBuffer(std::size_t(mb_) * std::size_t(emb_.vocab_per_block()), ops.memory());
  loss_ = FloatBuffer(std::size_t(mb_), ops.memory());
  dx_ = FloatBuffer(x, ops.memory());
  dy_ = FloatBuffer(x, ops.memory());
  tokens_.resize(std::size_t(mb_));
  targets_.resize(std::size_t(mb_));
  ops.fill(params_.data(), 0.0f, num_params_);
  zero_grads();
}

float* Gpt2d::at(float* base, Role role, int layer) const {
  for (const ShardSpec& s : specs_)
    if (s.role == role && s.layer == layer) return base + s.offset;
  TRIDENT_CHECK(false, "internal: no 2D tensor for role ", int(role), " of layer ", layer);
  return nullptr;
}

Block2dTensors<float> Gpt2d::layer(float* base, int l) const {
  auto p = [&](Role r) { return at(base, r, l); };
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

double Gpt2d::forward_backward(const std::int32_t* inputs, const std::int32_t* targets,
                               float loss_scale) {
  const int L = cfg_.n_layer;
  const std::int64_t x = std::int64_t(mb_) * cb_;
  const std::int64_t first = std::int64_t(grid_.coord.row) * mb_;  // this rank's rows
  std::copy(inputs + first, inputs + first + mb_, tokens_.begin());
  std::copy(targets + first, targets + first + mb_, targets_.begin());
  float* P = params_.data();
  float* G = grads_.data();
  const float* wte = at(P, Role::token_embedding);
  float* dwte = at(G, Role::token_embedding);
  float* xs = xs_.data();
  emb_.forward(xs, tokens_.data(), wte, at(P, Role::position_embedding));
  for (int l = 0; l < L; ++l) {
    const auto p = layer(P, l);
    const Block2dParams cp{p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.proj_w, p.proj_b,
                           p.ln2_w, p.ln2_b, p.fc_w,  p.fc_b,  p.fcproj_w, p.fcproj_b};
    block_.forward(xs + (l + 1) * x, xs + l * x, cp, acts_[std::size_t(l)]);
  }
  const float* lnf_w = at(P, Role::final_norm_weight);
  lnf_.forward(lnf_out_.data(), lnf_mean_.data(), lnf_rstd_.data(), xs + L * x, lnf_w,
               at(P, Role::final_norm_bias));
  emb_.head_forward(logits_.data(), lnf_out_.data(), wte);
  xent_.forward(loss_.data(), logits_.data(), targets_.data());
  double loss = 0;
  for (int i = 0; i < mb_; ++i) loss += loss_.data()[i];
  grid_.col.allreduce_sum(&loss, 1);  // the q row blocks' sequences
  // Backward: the head, ln_f, the blocks in reverse, the embedding.
  xent_.backward(logits_.data(), targets_.data(), loss_scale);
  emb_.head_backward(dy_.data(), dwte, logits_.data(), lnf_out_.data(), wte);
  lnf_.backward(dx_.data(), at(G, Role::final_norm_weight), at(G, Role::final_norm_bias),
                dy_.data(), xs + L * x, lnf_mean_.data(), lnf_rstd_.data(), lnf_w);
  for (int l = L - 1; l >= 0; --l) {
    const auto p = layer(P, l);
    const Block2dParams cp{p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.proj_w, p.proj_b,
                           p.ln2_w, p.ln2_b, p.fc_w,  p.fc_b,  p.fcproj_w, p.fcproj_b};
    Block2dGrads g = layer(G, l);
    block_.backward(dy_.data(), dx_.data(), xs + l * x, cp, g, acts_[std::size_t(l)]);
    std::swap(dx_, dy_);  // dx_ is the gradient at this layer's input
  }
  emb_.backward(dwte, at(G, Role::position_embedding), dx_.data(), tokens_.data());
  return loss;
}

void Gpt2d::reduce_param_grads() {
  float* G = grads_.data();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    Block2dGrads g = layer(G, l);
    block_.reduce_param_grads(g);
  }
  lnf_.reduce_param_grads(at(G, Role::final_norm_weight), at(G, Role::final_norm_bias));
  emb_.reduce_param_grads(at(G, Role::token_embedding), at(G, Role::position_embedding));
}

}  // namespace trident::model
