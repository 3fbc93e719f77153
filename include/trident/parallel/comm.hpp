// trident/parallel/comm.hpp — communicators and every collective trident issues, with a
// call and byte counter per communicator (reported in the metrics as comm/<group>/bytes).
// defines: trident::parallel::Comm, CommCounters, ParallelState, make_parallel_state,
//          NodeRanks, node_ranks
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "trident/parallel/grid.hpp"
#include "trident/parallel/staging.hpp"

namespace trident::parallel {

// Bytes are what this rank puts on the wire in the bandwidth-optimal (ring) algorithm for
// a buffer of S bytes over p ranks: allreduce 2(p-1)/p * S, reduce-scatter and all-gather
// (p-1)/p * S each (so a reduce-scatter + all-gather pair moves what one allreduce moves,
// the equality sequence parallelism rests on), broadcast S on the root, send S. The same
// measure nccl-tests call "bus bytes".
struct CommCounters {
  std::int64_t calls = 0;
  double bytes = 0;
};

// A communicator with a name ("world", "tp", "pp", "dp", "embedding"). Owns the MPI
// handle it created (not MPI_COMM_WORLD). Collectives on a size-1 communicator return at
// once without calling MPI or counting. A rank outside the group holds size 0.
// Device memory (set_staging): the blocking collectives take device buffers and pass them to
// MPI directly or through host memory (parallel/staging.hpp); the non-blocking ones and the
// point-to-point calls take device buffers only when MPI is CUDA-aware (their callers, the
// DP buckets and the pipeline, stage for themselves), else an Error.
class Comm {
 public:
  Comm() = default;
  static Comm world();
  Comm(MPI_Comm comm, std::string name, bool owned);
  ~Comm();
  Comm(Comm&& o) noexcept;
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Collective over this communicator: members with the same color form a new one.
  Comm split(int color, int key, std::string name) const;

  MPI_Comm raw() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }
  void set_staging(std::shared_ptr<DeviceStaging> staging) { staging_ = std::move(staging); }
  DeviceStaging* staging() const { return staging_.get(); }

  void allreduce_sum(float* data, std::int64_t n);
  void allreduce_sum(double* data, std::int64_t n);
  void allreduce_max(float* data, std::int64_t n);
  void allreduce_max(double* data, std::int64_t n);
  void allreduce_max(int* data, std::int64_t n);
  // Rank r's shard is full[r*shard_n, (r+1)*shard_n): reduce-scatter sums `full` over the
  // ranks into this rank's `shard`; all-gather fills every shard of `full` in place from
  // each rank's own (its rows of `full` already hold it).
  void reduce_scatter_sum(const float* full, float* shard, std::int64_t shard_n);
  void all_gather_inplace(float* full, std::int64_t shard_n);
  // The same from a separate `shard` (not read from `full`).
  void all_gather(const float* shard, float* full, std::int64_t shard_n);
  // Non-blocking collectives over one bucket of a flat buffer (DP gradient sync, ZeRO-1);
  // the caller waits (MPI_Wait*). On a size-1 communicator they return MPI_REQUEST_NULL
  // at once (ireduce_scatter_sum copies this rank's part). Counted when started, with the
  // bus bytes of a bucket of n floats: allreduce 2(p-1)/p * 4n, reduce-scatter and
  // all-gather (p-1)/p * 4n each, whatever the split. Rank r's part of the bucket is
  // [displs[r], displs[r] + counts[r]) (counts/displs: size() entries, kept alive by the
  // caller until the wait).
  MPI_Request iallreduce_sum(float* data, std::int64_t n);
  MPI_Request ireduce_scatter_sum(const float* bucket, float* part, const int* counts,
                                  std::int64_t n);
  MPI_Request iall_gather_inplace(float* bucket, const int* counts, const int* displs,
                                  std::int64_t n);
  void broadcast(void* data, std::int64_t bytes, int root);
  // Non-blocking point-to-point (pipeline stages); the caller waits. Sends are counted.
  MPI_Request isend(const float* data, std::int64_t n, int peer, int tag);
  MPI_Request irecv(float* data, std::int64_t n, int peer, int tag);
  void barrier();

 private:
  void allreduce(void* data, std::int64_t n, std::int64_t elem_bytes, MPI_Datatype type,
                 MPI_Op op);
  // Waits for a blocking collective's request under runtime.watchdog_s (a hang names it).
  void watch(MPI_Request& r, const char* what, std::int64_t n) const;
  // A non-blocking call's device buffer: synced for a CUDA-aware MPI, refused otherwise.
  void direct_only(const void* p, const char* call) const;
  void count(double bytes) {
    counters_.calls += 1;
    counters_.bytes += bytes;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
  CommCounters counters_;
  std::shared_ptr<DeviceStaging> staging_;
};

// The parallel state passed explicitly to every layer (no globals).
struct ParallelState {
  GridShape shape;
  GridCoord coord;
  int world_rank = 0;
  Comm world, tp, dp, pp, embedding;

  bool first_stage() const { return coord.pp == 0; }
  // The backend's device memory (null: host) and whether MPI takes device pointers: every
  // communicator above stages accordingly.
  void use_device_memory(DeviceMemory* memory, bool mpi_takes_device);
  bool last_stage() const { return coord.pp == shape.pp - 1; }
};

// Builds the tp/dp/pp/embedding communicators with MPI_Comm_split (collective on world).
// The caller has checked that the world size equals shape.world_size().
ParallelState make_parallel_state(const GridShape& shape);

// This rank's index among the ranks of this job on its node (MPI_COMM_TYPE_SHARED; picks its
// GPU) and their number; collective on world.
struct NodeRanks {
  int rank = 0;
  int size = 1;
};
NodeRanks node_ranks();

}  // namespace trident::parallel
