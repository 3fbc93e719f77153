// trident/model/stage_model.hpp — what the runtime needs of a pipeline rank's share of the
// model, and nothing more: its parameter specs and flat buffers, activations as an opaque
// object exposing only the tensors a pipeline stage sends and receives, forward / backward /
// backward-weights (split backward), the grad-ready hook, the once-per-step gradient
// reduction and the weight initialization. The executor, GradSync, AdamW, the trainer, the
// checkpointer, the commands and calibrate bind to StageModel; make_stage_model builds the
// implementation the deck asks for:
//   TpMode::one_d  model::GptChunk (model/gpt.hpp): GPT-2 or Llama, Megatron-style 1D TP,
//                  sequence parallelism, recompute, bf16 storage, split backward, vpp chunks
//   TpMode::two_d  model::Gpt2dStage (model/gpt2d_stage.hpp): GPT-2 on the q x q SUMMA grid,
//                  one chunk, fp32, host memory (the deck refuses the rest, docs/tp2d.md)
// defines: trident::model::StageActivations, StageModel, TpMode, StageModelOptions,
//          make_stage_model
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/model/spec.hpp"
#include "trident/model/ulysses_attention.hpp"
#include "trident/ops/ops.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::model {

// One microbatch in flight through one chunk. The runtime sees only the boundary tensors, each
// StageModel::boundary_numel() floats in the backend's memory; the rest is the model's.
class StageActivations {
 public:
  virtual ~StageActivations() = default;
  // Where the previous stage's activation lands before forward (unused on the embedding chunk).
  virtual float* forward_input() = 0;
  // The chunk's output after forward: what is sent to the next stage.
  virtual const float* forward_output() = 0;
  // Where the next stage's gradient lands before backward (the head chunk's forward sets it).
  virtual float* backward_input() = 0;
  // The gradient at the chunk's input after backward: what is sent back.
  virtual const float* backward_output() = 0;
  // Where the head chunk's next forward leaves its output gradient for the backward, for a
  // model that keeps it in shared scratch (StageModel::shares_boundary): `row`
  // (boundary_numel floats, the caller's until that backward has run), or null: the shared
  // scratch, which holds it only if that backward is the next thing the model runs. Other
  // models keep it in the activations and ignore this.
  virtual void keep_head_gradient(float* row) { (void)row; }
};

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual const ModelConfig& config() const = 0;
  // This rank's chunks (virtual stages) in chunk order.
  virtual int num_chunks() const = 0;
  virtual const StageLayout& chunk(int c) const = 0;
  // Every tensor this rank holds, laid out in one flat buffer (ShardSpec::offset).
  virtual const std::vector<ShardSpec>& specs() const = 0;
  std::int64_t num_params() const { return num_params_; }
  // The embedding this rank holds that is also the LM head (GPT-2's wte, a tied Llama's
  // embed_tokens), whose gradients the first and the last stage sum; null when none.
  const ShardSpec* tied_embedding() const;

  // The flat buffers, in the backend's memory (device memory on a GPU: copy through
  // read_params / write_params, or copy_to_host with memory()).
  virtual float* params() = 0;
  virtual float* grads() = 0;
  const float* params() const { return const_cast<StageModel*>(this)->params(); }
  const float* grads() const { return const_cast<StageModel*>(this)->grads(); }
  ops::Ops& ops() const { return ops_; }
  DeviceMemory* memory() const { return ops_.memory(); }
  // Host copies of the flat buffers in and out (plain copies on the CPU backend).
  void read_params(float* host) const;
  void write_params(const float* host);
  void read_grads(float* host) const;

  // Floats of one microbatch's chunk input or output on this rank: what the pipeline sends
  // between stages.
  virtual std::int64_t boundary_numel() const = 0;
  // Whether the chunk's output and its output gradient are shared scratch, not the
  // activations': forward_output() holds until the model runs again (send it first),
  // backward_input() is filled just before its backward, and the head chunk's output gradient
  // waits there from its forward to its backward unless given a row (keep_head_gradient).
  virtual bool shares_boundary() const { return false; }

  // The counter-based RNG's weights, keyed by global name and logical element index: the
  // same weights in every layout (GptChunk::init_weights).
  virtual void init_weights(std::uint64_t seed) = 0;
  virtual void zero_grads() = 0;

  // Activations of one microbatch through chunk `chunk`; -1: sized to fit any chunk of this
  // rank (the pipeline's stash slots are shared by the chunks). split_backward: also room
  // for the gradients the weight pass needs (backward with weight_grads = false).
  virtual std::unique_ptr<StageActivations> make_activations(int chunk = -1,
                                                             bool split_backward = false) const = 0;
  // One microbatch forward through chunk `chunk`: the embedding chunk embeds inputs [B,T]
  // (host memory), the others read a.forward_input(); the head chunk also scores targets,
  // runs the head's backward scaled by loss_scale (into a.backward_input()) unless
  // with_backward is false (evaluation), and returns the sum of token losses (0 elsewhere).
  virtual double forward(int chunk, StageActivations& a, const std::int32_t* inputs,
                         const std::int32_t* targets, float loss_scale,
                         bool with_backward = true) = 0;
  // One microbatch backward from a.backward_input(); gradients accumulate (+=). The
  // embedding chunk takes its embedding's gradients, the others write a.backward_output().
  // weight_grads = false (zero-bubble B): the blocks' weight gradients wait for
  // backward_weights (W); needs make_activations(.., true).
  virtual void backward(int chunk, StageActivations& a, const std::int32_t* inputs,
                        bool weight_grads = true) = 0;
  virtual void backward_weights(int chunk, StageActivations& a) = 0;
  // Graphs (runtime.cuda_graphs): copies a microbatch's tokens (host memory) into the
  // device buffers of `a` that forward and backward would copy them to, and returns those
  // buffers: given them instead of host pointers, forward copies nothing (a graph records no
  // host copy). Default: the host pointers (a model that copies nothing to a device).
  virtual std::pair<const std::int32_t*, const std::int32_t*> upload_tokens(
      int chunk, StageActivations& a, const std::int32_t* inputs, const std::int32_t* targets) {
    (void)chunk;
    (void)a;
    return {inputs, targets};
  }
  // Forgets the host state a forward or backward left when it stopped part way (a failed
  // graph capture), so that the microbatch can run again from its forward.
  virtual void abandon_microbatch() {}
  // on: the head's forward adds its loss sum to the backend's total (Ops::add_loss) and
  // returns 0, so that a step reads the loss once (Ops::take_loss) instead of per microbatch.
  // A model may ignore it (then forward returns the sum, as when off).
  virtual void set_loss_on_device(bool on) { (void)on; }
  // The gradients each tensor-parallel rank holds a part of (1D: sequence-parallel norms,
  // Llama's replicated k/v; 2D: the vectors, wte and wpe along grid columns), summed once per
  // step after the last backward.
  virtual void reduce_param_grads() = 0;

  // Data-parallel overlap (train/grad_sync.hpp): when set, backward calls hook(offset, count)
  // for each tensor whose gradient this microbatch has just finished (GptChunk's contract).
  // A model that never reports leaves every bucket to GradSync's end-of-step flush.
  using GradReadyHook = std::function<void(std::int64_t offset, std::int64_t count)>;
  virtual void set_grad_ready_hook(GradReadyHook hook) = 0;

  // Communicators the model's tensor parallelism runs over besides ParallelState's (2D: the
  // grid's rows and columns), for the per-communicator traffic counts.
  virtual std::vector<parallel::Comm*> tensor_parallel_parts() const { return {}; }

 protected:
  explicit StageModel(ops::Ops& ops) : ops_(ops) {}
  std::int64_t num_params_ = 0;  // set by the implementation's constructor

 private:
  ops::Ops& ops_;
};

// parallel.tp_mode, parsed once, by the deck (its words: train/layout.hpp).
enum class TpMode { one_d, two_d };

struct StageModelOptions {
  int micro_batch = 1;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  TpMode tp_mode = TpMode::one_d;
  // parallel.cp_mode (cp > 1): attention over the CP group by the ring or by Ulysses.
  CpMode cp_mode = CpMode::ring;
};

// This rank's chunks (chunk_layouts) of the model as the deck lays it out.
std::unique_ptr<StageModel> make_stage_model(const ModelConfig& cfg,
                                             const std::vector<StageLayout>& chunks,
                                             parallel::ParallelState& ps, ops::Ops& ops,
                                             const StageModelOptions& options);

}  // namespace trident::model
