// Bucketed DP gradient averaging and the ZeRO-1 partition (see trident/train/grad_sync.hpp).
#include "trident/train/grad_sync.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"
#include "trident/parallel/wait.hpp"

namespace trident::train {

namespace {
// n floats between any two of host memory and `mem` (device to device only in place).
void copy_floats(DeviceMemory* mem, float* dst, const float* src, std::int64_t n) {
  const std::size_t bytes = std::size_t(n) * sizeof(float);
  if (dst == src || n == 0) return;
  TRIDENT_CHECK(!(holds_device(mem, dst) && holds_device(mem, src)),
                "grad sync: a device-to-device copy outside the ops");
  if (holds_device(mem, dst))
    copy_to_device(mem, dst, src, bytes);
  else
    copy_to_host(mem, dst, src, bytes);
}
}  // namespace

std::vector<int> split_counts(std::int64_t n, int p) {
  std::vector<int> counts;
  for (int k = 0; k < p; ++k) counts.push_back(int(n / p + (k < n % p ? 1 : 0)));
  return counts;
}

GradSync::GradSync(model::StageModel& chunk, parallel::Comm& dp, double bucket_mb, bool zero)
    : chunk_(chunk), dp_(dp), zero_(zero && dp.size() > 1) {
  const auto& specs = chunk.specs();
  const int ns = int(specs.size());
  for (int i = 1; i < ns; ++i)
    TRIDENT_CHECK(specs[i].offset == specs[i - 1].offset + specs[i - 1].local_numel(),
                  "grad sync: the chunk's tensors are not packed in order");
  const std::int64_t cap =
      std::max<std::int64_t>(1, std::int64_t(std::llround(bucket_mb * 1048576.0 / 4.0)));
  // Buckets of whole tensors from the end of the buffer.
  bucket_of_spec_.assign(std::size_t(ns), -1);
  for (int i = ns - 1; i >= 0;) {
    Bucket b;
    b.last_spec = i + 1;
    std::int64_t n = 0;
    while (i >= 0 && (n == 0 || n + specs[i].local_numel() <= cap)) n += specs[i--].local_numel();
    b.first_spec = i + 1;
    b.offset = specs[b.first_spec].offset;
    b.n = n;
    for (int s = b.first_spec; s < b.last_spec; ++s) bucket_of_spec_[s] = int(buckets_.size());
    buckets_.push_back(std::move(b));
  }
  // Each bucket's parts over DP; this rank's parts back to back (flat order) form its shard.
  const int p = dp.size(), r = std::max(0, dp.rank());
  for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) {
    Bucket& b = *it;
    b.counts = split_counts(b.n, zero_ ? p : 1);
    for (int k = 0, at = 0; k < int(b.counts.size()); at += b.counts[std::size_t(k++)])
      b.displs.push_back(at);
    const int mine = zero_ ? r : 0;
    b.shard = zero_ ? shard_numel_ : b.offset;
    const std::int64_t lo = b.offset + b.displs[mine], hi = lo + b.counts[mine];
    for (int s = b.first_spec; s < b.last_spec; ++s) {
      const std::int64_t a = std::max(lo, specs[s].offset),
                         e = std::min(hi, specs[s].offset + specs[s].local_numel());
      if (a < e) segments_.push_back(Segment{a, e - a, b.shard + (a - lo), &specs[s]});
    }
    shard_numel_ += b.counts[mine];
  }
  if (!zero_) shard_numel_ = chunk.num_params();
  if (zero_) {
    shard_grads_ = FloatBuffer(std::size_t(shard_numel_), chunk.memory());
    chunk.ops().fill(shard_grads_.data(), 0.0f, shard_numel_);
  }
  requests_.resize(buckets_.size());
}

void GradSync::begin(int microbatches) {
  for (Bucket& b : buckets_) {
    b.started = false;
    b.pending = (b.last_spec - b.first_spec) * microbatches;
  }
}

void GradSync::start(int i) {
  Bucket& b = buckets_[i];
  b.started = true;
  float* g = chunk_.grads() + b.offset;
  // The ZeRO-1 part lands in shard_grads_.
  float* shard = zero_ ? shard_grads_.data() + b.shard : nullptr;
  requests_[i] = zero_ ? dp_.ireduce_scatter_sum(g, shard, b.counts.data(), b.n)
                       : dp_.iallreduce_sum(g, b.n);
}

void GradSync::ready(std::int64_t offset, std::int64_t count) {
  const auto& specs = chunk_.specs();
  auto before = [](const model::ShardSpec& s, std::int64_t o) { return s.offset < o; };
  auto it = std::lower_bound(specs.begin(), specs.end(), offset, before);
  TRIDENT_CHECK(it != specs.end() && it->offset == offset,
                "grad sync: reported range does not start at a tensor");
  for (; it != specs.end() && it->offset < offset + count; ++it) {
    Bucket& b = buckets_[std::size_t(bucket_of_spec_[std::size_t(it - specs.begin())])];
    TRIDENT_CHECK(b.pending > 0 && !b.started, "grad sync: ", it->name,
                  " reported final more often than there are microbatches");
    --b.pending;
  }
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    if (!buckets_[i].started && buckets_[i].pending == 0) start(int(i));
  parallel::test_all(requests_);  // drives the collectives already started
}

void GradSync::reduce_tied_embedding(model::StageModel& chunk, parallel::ParallelState& ps) {
  const model::ShardSpec* tied = chunk.tied_embedding();
  if (ps.shape.pp <= 1 || ps.embedding.size() <= 1 || !tied) return;
  // Staged through host memory by the Comm where needed.
  ps.embedding.allreduce_sum(chunk.grads() + tied->offset, tied->local_numel());
}

void GradSync::finish() {
  last_early_ = 0;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i].started)
      ++last_early_;
    else
      start(int(i));
  }
  const auto t0 = std::chrono::steady_clock::now();
  wait_buckets("the DP gradient reduction (bucketed allreduce)");
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Under runtime.watchdog_s a DP peer that never arrives ends the job with a diagnosis.
void GradSync::wait_buckets(const char* what) {
  for (parallel::Request& r : requests_)
    r.wait([&] {
      return str("rank ", log::rank(), " (dp rank ", dp_.rank(), ") waits in ", what,
                 " on communicator ", dp_.name());
    });
}

float* GradSync::grad_base() { return zero_ ? shard_grads_.data() : chunk_.grads(); }

void GradSync::gather_params() {
  if (!zero_) return;
  // In place: each rank's parts of the parameters are already where the gather puts them.
  float* params = chunk_.params();
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    requests_[i] = dp_.iall_gather_inplace(params + b.offset, b.counts.data(), b.displs.data(),
                                           b.n);
  }
  wait_buckets("the ZeRO-1 parameter all-gather (bucketed)");
}

void GradSync::gather_full(const float* shard, float* full) {
  DeviceMemory* mem = chunk_.memory();
  if (!zero_) return copy_floats(mem, full, shard, chunk_.num_params());
  // Gathered in host memory (a checkpoint's or a gradient dump's way, not the step's), then
  // copied to `full` when that is device memory.
  FloatBuffer scratch;
  float* target = full;
  if (holds_device(mem, full)) {
    scratch = FloatBuffer(std::size_t(chunk_.num_params()));
    target = scratch.data();
  }
  const std::size_t r = std::size_t(dp_.rank());
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    copy_floats(mem, target + b.offset + b.displs[r], shard + b.shard, b.counts[r]);
    requests_[i] =
        dp_.iall_gather_inplace(target + b.offset, b.counts.data(), b.displs.data(), b.n);
  }
  wait_buckets("the ZeRO-1 moment all-gather of a checkpoint");
  copy_floats(mem, full, target, chunk_.num_params());
}

void GradSync::scatter_full(const float* full, float* shard) const {
  DeviceMemory* mem = chunk_.memory();
  if (!zero_) return copy_floats(mem, shard, full, chunk_.num_params());
  const std::size_t r = std::size_t(dp_.rank());
  for (const Bucket& b : buckets_)
    copy_floats(mem, shard + b.shard, full + b.offset + b.displs[r], b.counts[r]);
}

double GradSync::time_alone() {
  if (!active()) return 0;
  FloatBuffer scratch(chunk_.num_params()), part(zero_ ? shard_numel_ : 1);  // host memory
  chunk_.read_grads(scratch.data());
  dp_.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (const Bucket& b : buckets_) {
    parallel::Request r =
        zero_ ? dp_.ireduce_scatter_sum(scratch.data() + b.offset, part.data() + b.shard,
                                        b.counts.data(), b.n)
              : dp_.iallreduce_sum(scratch.data() + b.offset, b.n);
    r.wait([] { return std::string("the timed gradient reduction"); });
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return dt;
}

}  // namespace trident::train
