// Bucketed DP gradient averaging and the ZeRO-1 partition (see trident/train/grad_sync.hpp).
#include "trident/train/grad_sync.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"
#include "trident/parallel/wait.hpp"

namespace trident::train {

std::vector<int> split_counts(std::int64_t n, int p) {
  std::vector<int> counts;
  for (int k = 0; k < p; ++k) counts.push_back(int(n / p + (k < n % p ? 1 : 0)));
  return counts;
}

GradSync::GradSync(model::GptChunk& chunk, parallel::Comm& dp, double bucket_mb, bool zero)
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
  if (zero_) shard_grads_ = FloatBuffer(shard_numel_);
  requests_.assign(buckets_.size(), MPI_REQUEST_NULL);
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
  requests_[i] = zero_ ? dp_.ireduce_scatter_sum(g, shard_grads_.data() + b.shard,
                                                 b.counts.data(), b.n)
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
  int flag = 0;
  MPI_Testall(int(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE);
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
  for (MPI_Request& r : requests_)
    parallel::wait(r, [&] {
      return str("rank ", log::rank(), " (dp rank ", dp_.rank(), ") waits in ", what,
                 " on communicator ", dp_.name());
    });
}

float* GradSync::grad_base() { return zero_ ? shard_grads_.data() : chunk_.grads(); }

void GradSync::gather_params() {
  if (!zero_) return;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    requests_[i] = dp_.iall_gather_inplace(chunk_.params() + b.offset, b.counts.data(),
                                           b.displs.data(), b.n);
  }
  wait_buckets("the ZeRO-1 parameter all-gather (bucketed)");
}

void GradSync::gather_full(const float* shard, float* full) {
  if (!zero_) {
    if (shard != full) std::copy(shard, shard + chunk_.num_params(), full);
    return;
  }
  const int r = dp_.rank();
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    std::copy(shard + b.shard, shard + b.shard + b.counts[r], full + b.offset + b.displs[r]);
    requests_[i] = dp_.iall_gather_inplace(full + b.offset, b.counts.data(), b.displs.data(), b.n);
  }
  wait_buckets("the ZeRO-1 moment all-gather of a checkpoint");
}

void GradSync::scatter_full(const float* full, float* shard) const {
  if (!zero_) {
    if (shard != full) std::copy(full, full + chunk_.num_params(), shard);
    return;
  }
  const int r = dp_.rank();
  for (const Bucket& b : buckets_)
    std::copy(full + b.offset + b.displs[r], full + b.offset + b.displs[r] + b.counts[r],
              shard + b.shard);
}

double GradSync::time_alone() {
  if (!active()) return 0;
  FloatBuffer scratch(chunk_.num_params()), part(zero_ ? shard_numel_ : 1);
  std::copy(chunk_.grads(), chunk_.grads() + chunk_.num_params(), scratch.data());
  MPI_Barrier(dp_.raw());
  const auto t0 = std::chrono::steady_clock::now();
  for (const Bucket& b : buckets_) {
    MPI_Request r = zero_ ? dp_.ireduce_scatter_sum(scratch.data() + b.offset,
                                                    part.data() + b.shard, b.counts.data(), b.n)
                          : dp_.iallreduce_sum(scratch.data() + b.offset, b.n);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return dt;
}

}  // namespace trident::train
