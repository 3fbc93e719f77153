// trident/model/block2d.hpp — one GPT-2 transformer block on the q x q grid of 2D tensor
// parallelism (docs/tp2d.md): LayerNorm2d, SUMMA c_attn, the local attention core, SUMMA
// c_proj, the residual add, LayerNorm2d, SUMMA c_fc, GELU, SUMMA c_proj, the residual add;
// forward and backward. What GptChunk runs per layer when parallel.tp_mode = "2d".
// defines: trident::model::Block2dShape, Block2dParams, Block2dActivations, Block2d
//
// Legend: B sequences of T tokens (q | B), C = d_model, NH heads (q | NH), F = 4C; the
// residual stream X [B*T, C] lies in blocks: rank (r, c) holds rows block r (whole
// sequences) and columns block c, [mb, cb] with mb = B*T/q, cb = C/q. The parameters are
// this rank's blocks as model/spec.hpp's 2D ShardSpecs place them (c_attn's columns in
// attention2d.hpp's order; biases and LayerNorms by grid column). Every activation a layer
// keeps is 1/q^2 of the serial one (Block2dActivations::floats).
// Communication per forward: 4 SUMMA forwards and 2 LayerNorm row reductions; per backward:
// 4 SUMMA backwards and 2 LayerNorm row reductions. Parameter gradients of the vectors
// (biases, LayerNorms) stay partial over the rank's rows until reduce_param_grads.
#pragma once

#include <cstdint>

#include "trident/core/buffer.hpp"
#include "trident/model/layernorm2d.hpp"
#include "trident/model/summa.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/tp_grid2d.hpp"

namespace trident::model {

struct Block2dShape {
  int batch = 0;   // B (divisible by q)
  int seq = 0;     // T
  int d_model = 0;
  int n_head = 0;  // divisible by q
};

// Pointers to this rank's blocks of one layer's parameters (or of their gradients).
template <typename T>
struct Block2dTensors {
  T* ln1_w;
  T* ln1_b;
  T* qkv_w;     // [C/q, 3C/q]
  T* qkv_b;     // [3C/q]
  T* proj_w;    // [C/q, C/q]
  T* proj_b;    // [C/q]
  T* ln2_w;
  T* ln2_b;
  T* fc_w;      // [C/q, F/q]
  T* fc_b;      // [F/q]
  T* fcproj_w;  // [F/q, C/q]
  T* fcproj_b;  // [C/q]
};
using Block2dParams = Block2dTensors<const float>;
using Block2dGrads = Block2dTensors<float>;

// What one layer's forward keeps for its backward, this rank's blocks.
struct Block2dActivations {
  FloatBuffer ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch,
      fch_gelu;
  std::int64_t floats() const;  // their total size
};

class Block2d {
 public:
  // An Error unless q divides B, C and NH (and on a device backend: LayerNorm2d is host-only).
  Block2d(ops::Ops& ops, parallel::Tp2dGrid& grid, const Block2dShape& shape);

  Block2dActivations make_activations() const;
  // out[mb, cb] = the block applied to x[mb, cb]; `a` keeps what the backward needs.
  // Collective over the grid.
  void forward(float* out, const float* x, const Block2dParams& p, Block2dActivations& a);
  // dx[mb, cb] (overwritten) from dout[mb, cb]; g += this rank's parameter gradients (the
  // vectors' partial over its rows). Collective over the grid.
  void backward(float* dx, const float* dout, const float* x, const Block2dParams& p,
                Block2dGrads& g, Block2dActivations& a);
  // The vectors' gradients (biases, LayerNorms) summed along the grid column, once per step.
  void reduce_param_grads(Block2dGrads& g);

 private:
  ops::Ops& ops_;
  parallel::Tp2dGrid& grid_;
  Block2dShape shape_;
  int q_ = 1, mb_ = 0, cb_ = 0, fb_ = 0;
  LayerNorm2d ln1_, ln2_;
  SummaLinear c_attn_, c_proj_, c_fc_, mlp_proj_;
  ops::Ops::AttentionShape att_;
  FloatBuffer d_small_, d_res2_, d_tmp_, d_qkv_, d_fch_, d_gelu_;  // backward scratch
};

}  // namespace trident::model
