// trident/train/grad_sync.hpp — data-parallel gradient averaging in buckets of the flat
// gradient buffer, overlapped with the backward, and the ZeRO-1 partition of the optimizer
// state (DESIGN.md: "Grad sync").
// defines: trident::train::GradSync, Segment, split_counts
//
// Buckets: whole tensors, walked from the end of the flat buffer (the order the backward
// finishes them: ln_f, the last block, ..., the first block, wpe, wte), closed once they
// hold parallel.grad_bucket_mb MiB. A bucket is started (MPI_Iallreduce, or
// MPI_Ireduce_scatter under ZeRO-1) as soon as every tensor in it has been reported final
// `microbatches` times by the model's grad-ready hook (once per microbatch backward, so the
// last microbatch's report releases it); finish() starts whatever is left (tensors the
// hook does not report: the tied wte across stages, LayerNorms under sequence
// parallelism) and waits for all of them just before the optimizer. Every rank of a DP
// group holds the same specs and runs the same schedule, so all start the same buckets in
// the same order, as MPI requires of collectives.
//
// Scaling: each replica's gradients are already scaled by 1 / (target tokens of the global
// batch), so the sum over DP is the mean over the global batch, whatever dp and the
// microbatch count.
//
// ZeRO-1 (Megatron's distributed optimizer): bucket b of n elements is split over the
// p = dp ranks into contiguous parts of n/p (+1 for the first n%p ranks) elements, along
// the flat buffer and across tensor boundaries (so no padding is needed). DP rank r owns
// part r of every bucket: the reduce-scatter leaves the summed gradients of its parts in
// shard_grads() (the shard layout: the owned parts back to back, in flat-buffer order), it
// keeps and updates the AdamW moments of those elements only, and gather_params()
// all-gathers the updated parameters. Without ZeRO (or with dp = 1) the "shard" is the
// whole buffer and shard offsets equal flat offsets.
#pragma once

#include <cstdint>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::train {

// ZeRO-1's split of a bucket of n elements over p ranks: contiguous parts, the first n % p
// of them one element longer. Returns the p counts.
std::vector<int> split_counts(std::int64_t n, int p);

// A run of owned elements inside one tensor: flat [offset, offset + count) of the chunk's
// buffers is element `shard` of the shard layout (moments, shard_grads()).
struct Segment {
  std::int64_t offset = 0;
  std::int64_t count = 0;
  std::int64_t shard = 0;
  const model::ShardSpec* spec = nullptr;
};

class GradSync {
 public:
  // bucket_mb: parallel.grad_bucket_mb; zero: parallel.zero_stage == 1 (a no-op at dp 1).
  GradSync(model::StageModel& chunk, parallel::Comm& dp, double bucket_mb, bool zero);
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  bool active() const { return dp_.size() > 1; }  // anything to communicate
  bool zero() const { return zero_; }
  int num_buckets() const { return int(buckets_.size()); }

  // The owned elements split at tensor boundaries, in flat-buffer order.
  const std::vector<Segment>& segments() const { return segments_; }
  std::int64_t shard_numel() const { return shard_numel_; }

  // Before a step's first backward: each tensor is final after `microbatches` reports.
  void begin(int microbatches);
  // The model's grad-ready hook: flat [offset, offset + count) (whole tensors) has
  // received one more microbatch's gradient. Starts the buckets this completes, and tests
  // the ones in flight (Open MPI progresses non-blocking collectives inside MPI calls).
  void ready(std::int64_t offset, std::int64_t count);
  // After the last backward: wte's gradient from the first stage's lookup and the last
  // stage's LM head, summed over the embedding group so that both copies take the same
  // optimizer step (once per step, also with several chunks per rank; no-op at pp = 1).
  // Collective over ps.embedding; before the sequence-parallel reduction and finish().
  static void reduce_tied_embedding(model::StageModel& chunk, parallel::ParallelState& ps);
  // After the last backward (and the tied-wte and sequence-parallel reductions): starts
  // the remaining buckets and waits for all. Then the reduced gradients are in the
  // chunk's buffer (segments' offsets) or, under ZeRO-1, in shard_grads() (their shards).
  void finish();
  // Where the optimizer reads the reduced gradient of segment s: base + s.shard.
  float* grad_base();

  // ZeRO-1: all-gathers the updated parameters (every bucket) over DP. No-op otherwise.
  void gather_params();
  // ZeRO-1 state in and out of the layout-independent form (checkpoints, grad dumps):
  // full (the chunk's flat layout) from every rank's shard, and back. shard is the backend's
  // memory (device memory on a GPU); full may be host or device memory.
  void gather_full(const float* shard, float* full);
  void scatter_full(const float* full, float* shard) const;

  // Seconds the last finish() spent waiting, and the seconds the same buckets take
  // reduced alone and blocking, one after the other on a scratch copy (a benchmark's
  // yardstick; collective over DP; call it outside the step loop: it allocates and its
  // traffic is counted like any other).
  double last_wait_s() const { return last_wait_s_; }
  int last_early() const { return last_early_; }  // buckets the last step started in backward
  double time_alone();

 private:
  void wait_buckets(const char* what);  // every request, under the watchdog

  struct Bucket {
    std::int64_t offset = 0, n = 0;       // flat range
    int first_spec = 0, last_spec = 0;    // spec indices [first, last)
    std::vector<int> counts, displs;      // per DP rank: its part of the bucket
    std::int64_t shard = 0;               // where this rank's part starts in the shard layout
    int pending = 0;                      // reports still missing
    bool started = false;
  };
  // The bucket is final: its collective starts (on device memory an MPI cannot take, once
  // its request's copy has come down on the staging stream: parallel/request.hpp).
  void start(int b);

  model::StageModel& chunk_;
  parallel::Comm& dp_;
  bool zero_;
  std::vector<Bucket> buckets_;      // in start order: highest offsets first
  std::vector<int> bucket_of_spec_;  // spec index -> bucket index
  std::vector<Segment> segments_;
  std::int64_t shard_numel_ = 0;
  FloatBuffer shard_grads_;           // ZeRO-1 only
  std::vector<parallel::Request> requests_;  // one per bucket, complete when idle
  double last_wait_s_ = 0;
  int last_early_ = 0;
};

}  // namespace trident::train
