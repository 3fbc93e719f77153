// trident/parallel/comm.hpp — communicators and every collective trident issues, with a
// call and byte counter per communicator (reported in the metrics as comm/<group>/bytes).
// defines: trident::parallel::Comm, CommCounters, ParallelState, make_parallel_state,
//          NodeRanks, node_ranks, node_sum
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "trident/core/placement.hpp"
#include "trident/parallel/grid.hpp"
#include "trident/parallel/request.hpp"
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

// A communicator with a name ("world", "tp", "cp", "dp", "dp_cp", "pp", "embedding"). Owns
// the MPI handle it created (not MPI_COMM_WORLD). Collectives on a size-1 communicator
// return at once without calling MPI or counting. A rank outside the group holds size 0.
// Device memory (set_staging): every call takes device buffers and passes them to MPI
// directly (a CUDA-aware MPI) or through host memory (parallel/staging.hpp): the blocking
// ones around the call, the non-blocking ones in the Request they return, which owns its
// host copy and moves the result back when it completes; a non-blocking collective starts
// once its copy has come down on the staging stream (parallel/request.hpp). Callers of
// raw() start no collective of their own while such calls are pending (none outside a step).
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

  // The MPI handle, for libraries that take one themselves (HDF5's MPI-IO driver,
  // H5Pset_fapl_mpio, through io's MPI_Comm arguments) and for agree(): the one way out of
  // parallel to raw MPI. MPI_COMM_NULL for a rank outside the group.
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
  // Host integers (counts and checksums of the data tools).
  void allreduce_sum(std::int64_t* data, std::int64_t n);
  void allreduce_sum(std::uint64_t* data, std::int64_t n);
  // Every rank's n host integers, in rank order, into all[size() * n].
  void all_gather(const std::int64_t* mine, std::int64_t* all, std::int64_t n);
  // Rank r's shard is full[r*shard_n, (r+1)*shard_n): reduce-scatter sums `full` over the
  // ranks into this rank's `shard`; all-gather fills every shard of `full` in place from
  // each rank's own (its rows of `full` already hold it).
  void reduce_scatter_sum(const float* full, float* shard, std::int64_t shard_n);
  void all_gather_inplace(float* full, std::int64_t shard_n);
  // The same from a separate `shard` (not read from `full`).
  void all_gather(const float* shard, float* full, std::int64_t shard_n);
  // All-to-all of equal blocks: block r of `send` (floats [r*block_n, (r+1)*block_n)) goes
  // to rank r, and rank r's block for this rank lands in block r of `recv` (separate
  // buffers). Counted as (p-1)/p of the buffer: the blocks that leave the rank.
  void all_to_all(const float* send, float* recv, std::int64_t block_n);
  // Non-blocking collectives over one bucket of a flat buffer (DP gradient sync, ZeRO-1);
  // the caller waits (Request::wait). On a size-1 communicator they return a complete
  // request at once (ireduce_scatter_sum copies this rank's part). Counted when started, with the
  // bus bytes of a bucket of n floats: allreduce 2(p-1)/p * 4n, reduce-scatter and
  // all-gather (p-1)/p * 4n each, whatever the split. Rank r's part of the bucket is
  // [displs[r], displs[r] + counts[r]) (counts/displs: size() entries, kept alive by the
  // caller until the wait).
  Request iallreduce_sum(float* data, std::int64_t n);
  Request ireduce_scatter_sum(const float* bucket, float* part, const int* counts,
                              std::int64_t n);
  Request iall_gather_inplace(float* bucket, const int* counts, const int* displs,
                              std::int64_t n);
  void broadcast(void* data, std::int64_t bytes, int root);
  // Non-blocking point-to-point (pipeline stages); the caller waits. Sends are counted.
  Request isend(const float* data, std::int64_t n, int peer, int tag);
  Request irecv(float* data, std::int64_t n, int peer, int tag);
  void barrier();
  // Blocking point-to-point of host bytes (start-up and data tools), counted and waited
  // for under the watchdog like the collectives.
  void send(const void* data, std::int64_t bytes, int peer, int tag);
  void recv(void* data, std::int64_t bytes, int peer, int tag);

 private:
  void allreduce(void* data, std::int64_t n, std::int64_t elem_bytes, MPI_Datatype type,
                 MPI_Op op);
  // Waits for a blocking collective's request under runtime.watchdog_s (a hang names it).
  void watch(MPI_Request& r, const char* what, std::int64_t n) const;
  // A non-blocking call's buffer as MPI gets it: itself (host memory, or device memory a
  // CUDA-aware MPI takes, once the device is done with it) or a host copy `r` owns, filled
  // when copy_in, moved back on completion when copy_back. With `landing` (a collective)
  // the copy in goes on the staging stream and landing says which copy the call waits for;
  // else it is made now.
  struct Landing {
    bool pending = false;
    std::uint64_t copy = 0;
  };
  void* stage(Request& r, const void* data, std::size_t bytes, bool copy_in, bool copy_back,
              Landing* landing = nullptr) const;
  // Starts a non-blocking call now, or once its input has landed (parallel/request.hpp),
  // in the order of this communicator's collectives.
  void start(Request& r, const Landing& landing, std::function<void(MPI_Request*)> call);
  // Starts the deferred collectives (waiting for their copies): before any other collective.
  void flush() const {
    if (starts_ && !starts_->empty()) starts_->advance(nullptr, true);
  }
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
  std::shared_ptr<DeferredStarts> starts_;  // made with the first deferred call
};

// The parallel state passed explicitly to every layer (no globals).
struct ParallelState {
  GridShape shape;
  GridCoord coord;
  int world_rank = 0;
  // cp: the context-parallel ring (each rank a slice of every sequence). dp_cp: the DP × CP
  // ranks holding the same shard of the weights, where weight gradients are summed under
  // context parallelism; with cp == 1 the same ranks as dp (a separate communicator, so
  // its counters are its own).
  Comm world, tp, cp, dp, dp_cp, pp, embedding;

  // Which pipeline ranks hold virtual stage 0 (the embedding) and the last one (the head):
  // the schedule's placement (core/placement.hpp). Under zb-v's V both are rank 0.
  StageMap stage_map;
  bool first_stage() const { return coord.pp == stage_map.embedding_rank(); }
  // The backend's device memory (null: host) and whether MPI takes device pointers: every
  // communicator above stages accordingly.
  void use_device_memory(DeviceMemory* memory, bool mpi_takes_device);
  bool last_stage() const { return coord.pp == stage_map.head_rank(); }
  // The ranks whose weight gradients (and losses) are summed: dp, or dp_cp under context
  // parallelism (dp itself when cp == 1, so that the traffic counts as dp's).
  Comm& replicas() { return shape.cp > 1 ? dp_cp : dp; }
};

// Builds the tp/cp/dp/dp_cp/pp/embedding communicators with MPI_Comm_split (collective on
// world), their members and order those of group_ranks (grid.hpp).
// The caller has checked that the world size equals shape.world_size(). The embedding
// group joins the ranks that hold virtual stage 0 and the last one under `placement` with
// vpp chunks per rank (one rank under zb-v's V placement: the group is then that rank).
ParallelState make_parallel_state(const GridShape& shape,
                                  Placement placement = Placement::round_robin, int vpp = 1);

// This rank's index among the ranks of this job on its node (MPI_COMM_TYPE_SHARED; picks its
// GPU) and their number; collective on world.
struct NodeRanks {
  int rank = 0;
  int size = 1;
};
NodeRanks node_ranks();
// The sum of `value` over the ranks of MPI_COMM_WORLD on this rank's node. Collective.
std::int64_t node_sum(std::int64_t value);

}  // namespace trident::parallel
