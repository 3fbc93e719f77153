// trident/plan/cost.hpp — what one layout costs on one machine, predicted without running it:
// the peak memory per rank (model::predict_memory, the function `trident train`'s start-up
// report uses) and the time of one optimizer step:
//   compute   every matrix product of a microbatch through a chunk at the machine's rate for
//             its shape, the attention core at attention_flops, the memory-bound kernels at
//             kernel_bytes_per_s; the backward twice the forward's products (input and weight
//             gradients), plus what recomputation runs again; under context parallelism the
//             rank's seq_len / cp rows of each sequence and 1/cp of its causal attention
//   CP        the ring attention's key/value hops (cp - 1 a layer forward; backward the
//             same plus their gradients' cp), each overlapped with a step's attention tiles:
//             only the excess counts (cp_comm_s)
//   TP        the blocking allreduces (or reduce-scatter + all-gather pairs under sequence
//             parallelism) of each block, over the intra- or inter-node link (alpha-beta, ring)
//   pipeline  the schedule's simulation (pipeline::simulate) with each virtual stage's own
//             costs per action (its layers; the embedding on the first, the LM head and the
//             loss on the last, on whichever rank the schedule's placement puts them) and the
//             p2p time of one boundary tensor on every cross-stage dependency: the makespan,
//             and the bubble unequal stages leave
//   DP        the gradient allreduce over DP x CP (ZeRO-1: reduce-scatter, then the
//             all-gather of the updated weights) in buckets; the part longer than the last microbatch's
//             backward, during which the buckets start, is exposed
//   optimizer AdamW, the grad norm and zeroing at kernel_bytes_per_s
// Ranks are placed as the grid places them (tp fastest, then cp, then dp, then pp; DESIGN.md,
// grid order), so a group spans nodes when its stride times its size exceeds ranks_per_node.
// defines: trident::plan::Layout (= train::Layout), StepPrediction, predict, BlockCost,
//          block_cost, model_flops_per_step
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/model/gpt.hpp"
#include "trident/model/memory.hpp"
#include "trident/model/spec.hpp"
#include "trident/plan/machine.hpp"
#include "trident/train/layout.hpp"

namespace trident::plan {

// A layout the planner ranks: the deck's (train/layout.hpp), one type for both.
using Layout = train::Layout;

// The layers of each virtual stage under `layout` (pp * vpp counts, in virtual-stage order),
// as `trident train` cuts them (train::pipeline_stage_layers, the even split written out).
std::vector<int> stage_layers_of(const model::ModelConfig& cfg, const Layout& layout);

struct StepPrediction {
  Layout layout;
  int microbatches = 1;        // per DP rank per step
  model::MemoryEstimate memory;  // of the rank with the largest peak
  int memory_pp_rank = 0;        // that rank's pipeline stage
  std::int64_t rank0_peak_bytes = 0;  // world rank 0's (what `trident train` reports)
  std::vector<int> stage_layers;  // layers per virtual stage (stage_layers_of)
  bool fits = true;              // peak <= the machine's memory per rank
  // Seconds per optimizer step and its parts on the critical stage: the pipeline rank with
  // the most work (its chunks' forwards, backwards and TP collectives).
  double step_s = 0;
  double compute_s = 0;    // the stage's forwards and backwards (and recomputation)
  double tp_comm_s = 0;    // its blocking TP collectives
  double cp_comm_s = 0;    // its ring attention's communication the attention tiles do not hide
  double bubble_s = 0;     // pipeline idle time and p2p waits (makespan - compute - TP)
  double dp_exposed_s = 0; // DP reduction not hidden by the last backward (+ ZeRO all-gather)
  double embed_sync_s = 0; // tied embedding gradient between the first and last stage
  double optimizer_s = 0;
  double bubble_fraction = 0;  // the simulator's idle fraction with these costs
  double tokens_per_s = 0;
  double model_flops = 0;  // per step (6 N D + attention, no recomputation)
  double mfu = 0;          // model_flops / (step_s * ranks * peak_flops)
  std::string dominant;    // "compute" | "tp comm" | "cp comm" | "bubble" | "dp comm" | ...
};

// Predicts `layout` for a model trained on `global_batch` sequences per step. The layout must
// be valid (plan::enumerate_layouts checks); host_memory: CPU ranks (the start-up staging
// counts, as in predict_memory); precision: runtime.precision (bf16 on a device stashes the
// layers in bf16 and adds the backend's product scratch, as `trident train` reports). The
// machine's library_mib is added on every backend (a device's: the cuBLAS workspace, which
// the start-up report counts as libraries). open_files: the HDF5 files world rank 0 and
// the other ranks hold open (train::files_held_open of the deck). An Error when the
// schedule cannot be made.
struct OpenFiles {
  int rank0 = 0, others = 0;
};
StepPrediction predict(const model::ModelConfig& cfg, std::int64_t global_batch,
                       const Layout& layout, const Machine& machine, bool host_memory,
                       ops::Precision precision = ops::Precision::fp32,
                       OpenFiles open_files = {});

// One transformer block's forward and backward (no recomputation, no TP collectives) of one
// microbatch as the cost model sees it: matrix products and attention in seconds on
// `machine`, and the bytes its memory-bound kernels move (seconds: / kernel_bytes_per_s).
struct BlockCost {
  double matmul_s = 0, attention_s = 0, kernel_bytes = 0;
};
BlockCost block_cost(const model::ModelConfig& cfg, int tp, int micro_batch,
                     const Machine& machine);

// Model FLOPs of one step: 3 x (2 x matrix-product weights + the head's 2 C V + attention's
// 4 T C per layer, causal counted whole) per token: the numerator of MFU.
double model_flops_per_step(const model::ModelConfig& cfg, std::int64_t global_batch);

}  // namespace trident::plan
