// Communicators and counted collectives (see trident/parallel/comm.hpp).
#include "trident/parallel/comm.hpp"

#include <algorithm>
#include <climits>
#include <utility>

#include "trident/core/error.hpp"
#include "trident/parallel/wait.hpp"

namespace trident::parallel {

namespace {
int as_count(std::int64_t n) {
  TRIDENT_CHECK(n >= 0 && n <= INT_MAX, "MPI message of ", n, " elements exceeds INT_MAX");
  return static_cast<int>(n);
}
}  // namespace

Comm Comm::world() { return Comm(MPI_COMM_WORLD, "world", false); }

Comm::Comm(MPI_Comm comm, std::string name, bool owned)
    : comm_(comm), name_(std::move(name)), owned_(owned) {
  if (comm_ == MPI_COMM_NULL) {  // this rank is not a member (MPI_UNDEFINED color)
    rank_ = -1;
    size_ = 0;
    return;
  }
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Comm::Comm(Comm&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
      name_(std::move(o.name_)),
      owned_(std::exchange(o.owned_, false)),
      rank_(o.rank_),
      size_(o.size_),
      counters_(o.counters_),
      staging_(std::move(o.staging_)),
      starts_(std::move(o.starts_)) {}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    Comm tmp(std::move(o));
    std::swap(comm_, tmp.comm_);
    std::swap(name_, tmp.name_);
    std::swap(owned_, tmp.owned_);
    std::swap(rank_, tmp.rank_);
    std::swap(size_, tmp.size_);
    std::swap(counters_, tmp.counters_);
    std::swap(staging_, tmp.staging_);
    std::swap(starts_, tmp.starts_);
  }
  return *this;
}

Comm Comm::split(int color, int key, std::string name) const {
  flush();
  MPI_Comm out;
  MPI_Comm_split(comm_, color, key, &out);
  Comm c(out, std::move(name), true);
  c.staging_ = staging_;
  return c;
}

void* Comm::stage(Request& r, const void* data, std::size_t bytes, bool copy_in,
                  bool copy_back, Landing* landing) const {
  void* p = const_cast<void*>(data);  // written only when copy_back
  if (!staging_ || !staging_->on_device(p)) return p;
  if (!staging_->staged(p)) {
    staging_->sync_for_mpi(p);
    return p;
  }
  Request::Staged& side = copy_back ? r.out_ : r.in_;
  side.host = staging_->lease(bytes);
  side.device = p;
  side.bytes = bytes;
  r.memory_ = staging_->memory();
  if (copy_in && landing) {
    landing->pending = true;
    landing->copy = r.memory_->to_host_async(side.host.get(), p, bytes);
  } else if (copy_in) {
    r.memory_->to_host(side.host.get(), p, bytes);
  }
  return side.host.get();
}

void Comm::start(Request& r, const Landing& landing, std::function<void(MPI_Request*)> call) {
  if (!landing.pending) {
    flush();
    call(&r.mpi_);
    return;
  }
  if (!starts_) starts_ = std::make_shared<DeferredStarts>(staging_->memory());
  auto deferred = std::make_shared<DeferredStarts::Call>();
  deferred->copy = landing.copy;
  deferred->start = std::move(call);
  starts_->push(deferred);
  r.deferred_ = std::move(deferred);
  r.starts_ = starts_;
  starts_->advance(nullptr, false);  // whatever has landed already
}

void Comm::allreduce(void* data, std::int64_t n, std::int64_t elem_bytes, MPI_Datatype type,
                     MPI_Op op) {
  if (size_ <= 1) return;
  flush();
  count(2.0 * double(size_ - 1) / double(size_) * double(n * elem_bytes));
  HostStage stage(staging_.get(), data, std::size_t(n * elem_bytes), true, true);
  if (watchdog_seconds() <= 0) {
    MPI_Allreduce(MPI_IN_PLACE, stage.ptr(), as_count(n), type, op, comm_);
  } else {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, stage.ptr(), as_count(n), type, op, comm_, &r);
    watch(r, "an allreduce", n);
  }
  stage.finish();
}

// Under the watchdog (runtime.watchdog_s) a rank whose peer stopped names this wait.
void Comm::watch(MPI_Request& r, const char* what, std::int64_t n) const {
  wait(r, [&] {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    return str("rank ", world_rank, " (", name_, " rank ", rank_, ") waits in ", what, " of ", n,
               " elements on communicator ", name_);
  });
}

void Comm::allreduce_sum(float* d, std::int64_t n) { allreduce(d, n, 4, MPI_FLOAT, MPI_SUM); }
void Comm::allreduce_sum(double* d, std::int64_t n) { allreduce(d, n, 8, MPI_DOUBLE, MPI_SUM); }
void Comm::allreduce_max(float* d, std::int64_t n) { allreduce(d, n, 4, MPI_FLOAT, MPI_MAX); }
void Comm::allreduce_max(double* d, std::int64_t n) { allreduce(d, n, 8, MPI_DOUBLE, MPI_MAX); }
void Comm::allreduce_max(int* d, std::int64_t n) {
  allreduce(d, n, std::int64_t(sizeof(int)), MPI_INT, MPI_MAX);
}
void Comm::allreduce_sum(std::int64_t* d, std::int64_t n) {
  allreduce(d, n, 8, MPI_INT64_T, MPI_SUM);
}
void Comm::allreduce_sum(std::uint64_t* d, std::int64_t n) {
  allreduce(d, n, 8, MPI_UINT64_T, MPI_SUM);
}

void Comm::all_gather(const std::int64_t* mine, std::int64_t* all, std::int64_t n) {
  if (size_ <= 1) {
    std::copy(mine, mine + n, all);
    return;
  }
  flush();
  count(double(size_ - 1) * double(n) * 8.0);
  MPI_Request r;
  MPI_Iallgather(mine, as_count(n), MPI_INT64_T, all, as_count(n), MPI_INT64_T, comm_, &r);
  watch(r, "an all-gather", n * size_);
}
void Comm::reduce_scatter_sum(const float* full, float* shard, std::int64_t shard_n) {
  TRIDENT_CHECK(size_ > 1 || shard == full || !staging_ || !staging_->on_device(full),
                "Comm::reduce_scatter_sum on one rank copies host memory only");
  if (size_ <= 1) {
    if (shard != full) std::copy(full, full + shard_n, shard);
    return;
  }
  flush();
  count(double(size_ - 1) * double(shard_n) * 4.0);
  const std::size_t shard_bytes = std::size_t(shard_n) * 4;
  HostStage in(staging_.get(), const_cast<float*>(full), shard_bytes * std::size_t(size_), true,
               false, 0);
  HostStage out(staging_.get(), shard, shard_bytes, false, true, 1);
  if (watchdog_seconds() <= 0) {
    MPI_Reduce_scatter_block(in.ptr(), out.ptr(), as_count(shard_n), MPI_FLOAT, MPI_SUM, comm_);
  } else {
    MPI_Request r;
    MPI_Ireduce_scatter_block(in.ptr(), out.ptr(), as_count(shard_n), MPI_FLOAT, MPI_SUM, comm_,
                              &r);
    watch(r, "a reduce-scatter", shard_n * size_);
  }
  out.finish();
}

void Comm::all_gather_inplace(float* full, std::int64_t shard_n) {
  if (size_ <= 1) return;
  flush();
  count(double(size_ - 1) * double(shard_n) * 4.0);
  HostStage stage(staging_.get(), full, std::size_t(shard_n) * 4 * std::size_t(size_), true,
                  true);
  if (watchdog_seconds() <= 0) {
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, stage.ptr(), as_count(shard_n), MPI_FLOAT,
                  comm_);
  } else {
    MPI_Request r;
    MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, stage.ptr(), as_count(shard_n), MPI_FLOAT,
                   comm_, &r);
    watch(r, "an all-gather", shard_n * size_);
  }
  stage.finish();
}

void Comm::all_gather(const float* shard, float* full, std::int64_t shard_n) {
  TRIDENT_CHECK(size_ > 1, "Comm::all_gather on one rank");
  flush();
  count(double(size_ - 1) * double(shard_n) * 4.0);
  const std::size_t shard_bytes = std::size_t(shard_n) * 4;
  HostStage in(staging_.get(), const_cast<float*>(shard), shard_bytes, true, false, 0);
  HostStage out(staging_.get(), full, shard_bytes * std::size_t(size_), false, true, 1);
  if (watchdog_seconds() <= 0) {
    MPI_Allgather(in.ptr(), as_count(shard_n), MPI_FLOAT, out.ptr(), as_count(shard_n), MPI_FLOAT,
                  comm_);
  } else {
    MPI_Request r;
    MPI_Iallgather(in.ptr(), as_count(shard_n), MPI_FLOAT, out.ptr(), as_count(shard_n),
                   MPI_FLOAT, comm_, &r);
    watch(r, "an all-gather", shard_n * size_);
  }
  out.finish();
}

void Comm::all_to_all(const float* send, float* recv, std::int64_t block_n) {
  const std::size_t block_bytes = std::size_t(block_n) * 4;
  if (size_ <= 1) {
    TRIDENT_CHECK(!staging_ || (!staging_->on_device(send) && !staging_->on_device(recv)),
                  "Comm::all_to_all on one rank copies host memory only");
    std::copy(send, send + block_n, recv);
    return;
  }
  flush();
  count(double(size_ - 1) * double(block_bytes));
  HostStage in(staging_.get(), const_cast<float*>(send), block_bytes * std::size_t(size_), true,
               false, 0);
  HostStage out(staging_.get(), recv, block_bytes * std::size_t(size_), false, true, 1);
  if (watchdog_seconds() <= 0) {
    MPI_Alltoall(in.ptr(), as_count(block_n), MPI_FLOAT, out.ptr(), as_count(block_n), MPI_FLOAT,
                 comm_);
  } else {
    MPI_Request r;
    MPI_Ialltoall(in.ptr(), as_count(block_n), MPI_FLOAT, out.ptr(), as_count(block_n),
                  MPI_FLOAT, comm_, &r);
    watch(r, "an all-to-all", block_n * size_);
  }
  out.finish();
}

Request Comm::iallreduce_sum(float* data, std::int64_t n) {
  Request r;
  if (size_ <= 1) return r;
  count(2.0 * double(size_ - 1) / double(size_) * double(n) * 4.0);
  Landing landing;
  void* p = stage(r, data, std::size_t(n) * 4, true, true, &landing);
  start(r, landing, [p, elems = as_count(n), comm = comm_](MPI_Request* req) {
    MPI_Iallreduce(MPI_IN_PLACE, p, elems, MPI_FLOAT, MPI_SUM, comm, req);
  });
  return r;
}

Request Comm::ireduce_scatter_sum(const float* bucket, float* part, const int* counts,
                                  std::int64_t n) {
  Request r;
  if (size_ <= 1) {
    TRIDENT_CHECK(!staging_ || (!staging_->on_device(part) && !staging_->on_device(bucket)),
                  "Comm::ireduce_scatter_sum on one rank copies host memory only");
    std::copy(bucket, bucket + counts[0], part);
    return r;
  }
  count(double(size_ - 1) / double(size_) * double(n) * 4.0);
  Landing landing;
  const void* in = stage(r, bucket, std::size_t(n) * 4, true, false, &landing);
  void* out = stage(r, part, std::size_t(counts[rank_]) * 4, false, true);
  start(r, landing, [in, out, counts, comm = comm_](MPI_Request* req) {
    MPI_Ireduce_scatter(in, out, counts, MPI_FLOAT, MPI_SUM, comm, req);
  });
  return r;
}

Request Comm::iall_gather_inplace(float* bucket, const int* counts, const int* displs,
                                  std::int64_t n) {
  Request r;
  if (size_ <= 1) return r;
  count(double(size_ - 1) / double(size_) * double(n) * 4.0);
  Landing landing;
  void* p = stage(r, bucket, std::size_t(n) * 4, true, true, &landing);
  start(r, landing, [p, counts, displs, comm = comm_](MPI_Request* req) {
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, counts, displs, MPI_FLOAT, comm, req);
  });
  return r;
}

Request Comm::isend(const float* data, std::int64_t n, int peer, int tag) {
  Request r;
  count(double(n) * 4.0);
  const void* p = stage(r, data, std::size_t(n) * 4, true, false);
  MPI_Isend(p, as_count(n), MPI_FLOAT, peer, tag, comm_, &r.mpi_);
  return r;
}

Request Comm::irecv(float* data, std::int64_t n, int peer, int tag) {
  Request r;
  counters_.calls += 1;
  void* p = stage(r, data, std::size_t(n) * 4, false, true);
  MPI_Irecv(p, as_count(n), MPI_FLOAT, peer, tag, comm_, &r.mpi_);
  return r;
}

void Comm::broadcast(void* data, std::int64_t bytes, int root) {
  if (size_ <= 1) return;
  flush();
  count(rank_ == root ? double(bytes) : 0.0);
  HostStage stage(staging_.get(), data, std::size_t(bytes), rank_ == root, rank_ != root);
  if (watchdog_seconds() <= 0) {
    MPI_Bcast(stage.ptr(), as_count(bytes), MPI_BYTE, root, comm_);
  } else {
    MPI_Request r;
    MPI_Ibcast(stage.ptr(), as_count(bytes), MPI_BYTE, root, comm_, &r);
    watch(r, "a broadcast", bytes);
  }
  stage.finish();
}

void Comm::barrier() {
  if (size_ <= 1) return;
  flush();
  count(0);
  if (watchdog_seconds() <= 0) return (void)MPI_Barrier(comm_);
  MPI_Request r;
  MPI_Ibarrier(comm_, &r);
  watch(r, "a barrier", 0);
}

void Comm::send(const void* data, std::int64_t bytes, int peer, int tag) {
  count(double(bytes));
  MPI_Request r;
  MPI_Isend(data, as_count(bytes), MPI_BYTE, peer, tag, comm_, &r);
  watch(r, "a send", bytes);
}

void Comm::recv(void* data, std::int64_t bytes, int peer, int tag) {
  counters_.calls += 1;
  MPI_Request r;
  MPI_Irecv(data, as_count(bytes), MPI_BYTE, peer, tag, comm_, &r);
  watch(r, "a receive", bytes);
}

void ParallelState::use_device_memory(DeviceMemory* memory, bool mpi_takes_device) {
  auto staging = memory ? std::make_shared<DeviceStaging>(memory, mpi_takes_device) : nullptr;
  for (Comm* c : {&world, &tp, &cp, &dp, &dp_cp, &pp, &embedding}) c->set_staging(staging);
}

ParallelState make_parallel_state(const GridShape& shape, Placement placement, int vpp) {
  ParallelState ps;
  ps.shape = shape;
  ps.stage_map = StageMap{placement, shape.pp, vpp};
  ps.world = Comm::world();
  ps.world_rank = ps.world.rank();
  TRIDENT_CHECK(ps.world.size() == shape.world_size(), "world size ", ps.world.size(),
                " is not tp * cp * dp * pp = ", shape.tp, " * ", shape.cp, " * ", shape.dp,
                " * ", shape.pp);
  ps.coord = coord_of(shape, ps.world_rank);
  const GridCoord& c = ps.coord;
  // color = the group's index along the other axes, key = position along the axis (the
  // order of group_ranks, grid.hpp).
  const int tp_cp = c.tp + shape.tp * c.cp;                 // index of the (tp, cp) pair
  const int tp_cp_dp = tp_cp + shape.tp * shape.cp * c.dp;  // of the (tp, cp, dp) triple
  ps.tp = ps.world.split(c.cp + shape.cp * (c.dp + shape.dp * c.pp), c.tp, "tp");
  ps.cp = ps.world.split(c.tp + shape.tp * (c.dp + shape.dp * c.pp), c.cp, "cp");
  ps.dp = ps.world.split(tp_cp + shape.tp * shape.cp * c.pp, c.dp, "dp");
  ps.dp_cp = ps.world.split(c.tp + shape.tp * c.pp, c.cp + shape.cp * c.dp, "dp_cp");
  ps.pp = ps.world.split(tp_cp_dp, c.pp, "pp");
  const bool in_embedding =
      c.pp == ps.stage_map.embedding_rank() || c.pp == ps.stage_map.head_rank();
  ps.embedding = ps.world.split(in_embedding ? tp_cp_dp : MPI_UNDEFINED, c.pp, "embedding");
  return ps;
}

NodeRanks node_ranks() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  NodeRanks r;
  MPI_Comm_rank(node, &r.rank);
  MPI_Comm_size(node, &r.size);
  MPI_Comm_free(&node);
  return r;
}

std::int64_t node_sum(std::int64_t value) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  std::int64_t sum = 0;
  MPI_Allreduce(&value, &sum, 1, MPI_INT64_T, MPI_SUM, node);
  MPI_Comm_free(&node);
  return sum;
}

}  // namespace trident::parallel
