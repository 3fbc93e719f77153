// trident/model/memory.hpp — the bytes one rank will hold at its peak, predicted from the
// deck's numbers alone (pure arithmetic: no MPI, no allocation), so that `trident train` can
// print it at start-up and a planning tool can call it for layouts it never runs. It mirrors
// what GptChunk, the optimizer, ZeRO-1 and the pipeline executor allocate (fp32 but for the bf16 stash):
//   weights      the rank's parameter shards, times the weight versions an asynchronous
//                schedule keeps (PipeDream-2BW: 2), plus the small buffer they swap through
//   gradients    the same size again (+ the ZeRO-1 gradient shard)
//   optimizer    AdamW's two moments (over the ZeRO-1 shard when dp * cp > 1)
//   activations  the schedule's peak stash (pipeline::peak_activations microbatch-chunks in
//                flight) times one microbatch's stash (the chunk's input and every layer's
//                output but the last, which waits in shared scratch until its send), plus the
//                head's output gradients kept between F and B (head_gradients); attention
//                keeps [B,NH,T], never T x T;
//                a split backward's B -> W gradients live in the layers' dead qkv and fch
//                (a stash of their own only under the packed bf16 storage or full
//                recompute; bf16 under the fused block);
//                under bf16 storage the layers' large tensors count 2 bytes an element
//   scratch      the backward's shared buffers, the chunks' boundary tensor (the last
//                layer's output, the received output gradient), the head's final norm and logits, full
//                recomputation's one-layer store, sequence parallelism's gathers
//   ring         context parallelism (cp > 1): model::RingAttention's key/value blocks and
//                partial results (or UlyssesAttention's all-to-all buffers), one per rank
//                (every term above follows chunk_dims' T / cp)
//   staging      host memory of the start-up weight initialization (one copy of the
//                weights), freed before the first step: it counts only where it is larger
//                than the activations it precedes (host memory: CPU ranks only)
// defines: trident::model::MemoryLayout, MemoryEstimate, predict_memory, ring_floats, format_bytes
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "trident/core/memory_usage.hpp"
#include "trident/model/gpt.hpp"
#include "trident/model/spec.hpp"

namespace trident::model {

// What the prediction needs beyond the model's shape.
// MPI's temporaries per byte of a non-blocking collective in flight on a CPU rank (Open MPI
// 4.1's libnbc holds one copy of each in-place MPI_Iallreduce / MPI_Ireduce_scatter until it
// completes): the default of MemoryLayout and of machine.nonblocking_temp_ratio, so that
// `trident train`'s report, which has no machine file, and `trident plan` agree.
constexpr double kNonblockingTempRatio = 1.0;
// The same for MPI_Ireduce_scatter (ZeRO-1's buckets) over 3 or more ranks, where libnbc holds
// two copies (measured 2.0 at 3, 4 and 8 ranks; over 2 ranks one, as kNonblockingTempRatio):
// the default of MemoryLayout and of machine.reduce_scatter_temp_ratio.
constexpr double kReduceScatterTempRatio = 2.0;

struct MemoryLayout {
  int tp = 1, pp = 1, dp = 1, vpp = 1;
  // parallel.cp: each rank holds seq_len / cp rows of every sequence (chunk_dims), one
  // RingAttention, and shares its gradients with dp * cp ranks (the dp_cp communicator: the
  // DP buckets and the ZeRO-1 shard span DP x CP). Not with tp_2d (the deck refuses it).
  int cp = 1;
  // parallel.cp_mode: cp > 1 holds one UlyssesAttention's buffers instead of the ring's.
  CpMode cp_mode = CpMode::ring;
  int pp_rank = 0, tp_rank = 0;  // the rank predicted for (its stage and shard)
  std::vector<int> stage_layers;  // parallel.pipeline_layers resolved (empty: even split)
  Placement placement = Placement::round_robin;  // the schedule's (pipeline::placement_of)
  int micro_batch = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  bool zero1 = false;
  int peak_stash = 1;           // pipeline::peak_activations of this stage's actions (>= 1)
  bool split_backward = false;  // zero-bubble schedules: the B/W gradient stash
  int weight_versions = 1;      // pipeline::weight_versions of this stage (>= 1)
  // The pipeline executor's boundary-message buffers at their peak (one boundary tensor each;
  // pipeline::peak_message_buffers). The four fields above come from the schedule through
  // pipeline::set_schedule_memory.
  int message_buffers = 0;
  // The head chunk's output gradients the executor keeps in rows of their own between their F
  // and B (pipeline::peak_head_gradients; one boundary tensor each, counted with the
  // activations): 0 where every head F is followed by its B, whose gradient waits in the
  // chunk's shared boundary scratch. From the schedule too (set_schedule_memory).
  int head_gradients = 0;
  // The HDF5 files the rank holds open at its peak (train::files_held_open), each with
  // HDF5's metadata cache (kHdf5FileBytes).
  int open_files = 0;
  bool host_memory = true;      // CPU ranks: the start-up staging shares the same memory
  // GptChunk::bf16_storage(): runtime.precision = "bf16" on a device, recompute none: each
  // layer's large tensors stashed at 2 bytes (carve_packed_layer), plus one layer's fp32
  // working copy in scratch.
  bool bf16_activations = false;
  // runtime.precision = "bf16" on a device: each matrix product converts its fp32 activation
  // inputs to bf16 in the backend's scratch, which grows to 1.25x the largest product's need
  // (ops/cuda/cuda_ops.cpp), and reads its weight operand from the weight cache (a bf16 copy
  // of the rank's parameters, 2 bytes each): both counted in scratch (the LM head's need is
  // the largest, ~N * Vl).
  bool bf16_products = false;
  // The backend runs the LM head fused, at any TP (Ops::fused_lm_head(): CUDA under bf16):
  // bf16 logits, in a logits buffer of half the size, and as the head's product scratch only a bf16 copy of lnf (2 N C bytes) instead of the bf16 copies of the
  // logits (2 N Vl + 2 N C). set_precision sets it with bf16_products; the trainer asks the
  // backend.
  bool fused_head = false;
  // Ops::gpt2_block_stash_bf16() of the rank's backend (CUDA under bf16 unless
  // TRIDENT_CUDA_FUSED_BLOCK=0 or the baseline; set_precision assumes that default, Trainer
  // asks its backend): GPT-2 or Llama at any TP without context parallelism (any recompute)
  // then keeps carve_fused_layer's stash and no fp32 working copy, and a split backward's W
  // stash in bf16 (stores_fused_block).
  bool block_stash_bf16 = false;
  // Ops::cp_attention_bf16() of the rank's backend (CUDA unless TRIDENT_CUDA_CP_BF16=0;
  // set_precision assumes it with block_stash_bf16): the fused block under CP calls the ring
  // or Ulysses on its bf16 rows (cp_bf16_operands): their buffers in bf16, no fp32 copies.
  bool cp_bf16 = false;
  // The device backend's scratch for one causal attention call of shape (b, t, nh, nkv, hs)
  // when it runs through a library (CUDA under bf16: cuDNN's bf16 copies and workspace;
  // Ops::fused_attention_bytes, exact from the plans it will use), counted with the other
  // scratch needs; qkv_rows: the fused block's (stores_fused_block) bf16 attention on its
  // [q k v] rows (row stride (nh + 2 nkv) hs, no copies). Unset (the CPU, `trident plan`,
  // which has no backend) or 0: none.
  std::function<std::int64_t(int b, int t, int nh, int nkv, int hs, bool qkv_rows)>
      fused_attention_bytes;
  // parallel.tp_mode = "2d": tp = q*q, tp_rank row-major on the grid; the 2D model's buffers
  // (model/gpt2d: [B*T/q, C/q] blocks, wte and wpe by grid column) instead of GptChunk's.
  bool tp_2d = false;
  // The DP buckets (GradSync: MPI_Iallreduce, or MPI_Ireduce_scatter under ZeRO-1) are all in
  // flight at the end of a step: on a CPU rank with dp * cp > 1, MPI holds this many bytes per
  // gradient byte more (`trident plan`: machine.nonblocking_temp_ratio, calibrate measures it).
  double nonblocking_temp_ratio = kNonblockingTempRatio;
  // Under ZeRO-1 over dp * cp >= 3 ranks the buckets are reduce-scatters, which hold this
  // many (machine.reduce_scatter_temp_ratio).
  double reduce_scatter_temp_ratio = kReduceScatterTempRatio;
  // Sets the two above from runtime.precision as GptChunk (stores_bf16) and the device
  // backend apply it; call after recompute and host_memory are set. `trident train`'s report
  // and `trident plan` both set them here, so that they agree.
  void set_precision(ops::Precision precision);
};

// HDF5's own memory for one open file: its metadata cache's hash table of 64 Ki entry
// pointers (H5C__HASH_TABLE_LEN: 512 KiB) and the cache's state, allocated at H5Fopen
// whatever the file's size (heaptrack, HDF5 1.10 on Debian 12: 528 kB per open file).
constexpr std::int64_t kHdf5FileBytes = 516 * 1024;

// Floats of the buffer an asynchronous schedule swaps two weight versions through
// (train::WeightVersions), at most this many or the rank's parameters.
constexpr std::int64_t kVersionSwapFloats = std::int64_t(1) << 18;

struct MemoryEstimate {
  std::int64_t weights = 0, gradients = 0, optimizer = 0, activations = 0, scratch = 0,
               staging = 0;
  // Memory the libraries touch during a step beyond trident's own buffers (OpenBLAS's packing
  // buffers, MPI's for collectives): not known from the deck, so predict_memory leaves it 0;
  // `trident plan` fills it from the machine file (calibrate measures it).
  std::int64_t libraries = 0;
  // MPI's temporaries of the DP buckets in flight (MemoryLayout::nonblocking_temp_ratio).
  std::int64_t collectives = 0;
  // The pipeline's boundary messages in flight (MemoryLayout::message_buffers).
  std::int64_t messages = 0;
  // HDF5's metadata caches of the files held open (MemoryLayout::open_files).
  std::int64_t files = 0;
  // Context parallelism (MemoryLayout::cp > 1): the ring attention's buffers (ring_floats).
  std::int64_t ring = 0;
  bool ulysses = false;  // `ring` holds UlyssesAttention's buffers (ulysses_floats) instead
  std::int64_t activations_per_microbatch = 0;
  // weights + gradients + optimizer + scratch + max(activations, staging) + collectives
  // + messages + files + ring + libraries
  std::int64_t peak() const;
  // One line: "peak 812.0 MiB = weights 124.4 MiB + gradients ..."
  std::string describe() const;
};

MemoryEstimate predict_memory(const ModelConfig& cfg, const MemoryLayout& layout);

// Floats of the buffers model::RingAttention's constructor allocates for the local attention
// shape of a chunk of dimensions d (chunk_dims with cp: d.T = seq_len / cp) on a rank of tp:
// two key/value blocks in flight, two gradient blocks and the one received (2 * B*t*nkv*hs
// each), the partial output [B*t, Ca], its log-sum-exps [B, NH, t], the packed q and the dq
// accumulator [B*t, NH*hs] each. nkv: the key/value heads the rank's attention reads
// (Llama with n_kv_head < tp: one).
std::int64_t ring_floats(const ModelConfig& cfg, int tp, const ChunkDims& d, bool bf16 = false);

// "812.0 MiB" (trident/core/memory_usage.hpp)
using trident::format_bytes;

}  // namespace trident::model
