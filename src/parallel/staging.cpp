// Device buffers and MPI: direct or through host memory (see trident/parallel/staging.hpp).
#include "trident/parallel/staging.hpp"

#include <utility>

namespace trident::parallel {

DeviceStaging::DeviceStaging(DeviceMemory* memory, bool mpi_takes_device)
    : memory_(memory), direct_(mpi_takes_device) {}

DeviceStaging::~DeviceStaging() {
  for (Block& b : blocks_)
    if (b.p) memory_->release_host(b.p);
  for (Block& b : pool_) memory_->release_host(b.p);
}

void* DeviceStaging::host(std::size_t bytes, int slot) {
  if (blocks_.size() <= std::size_t(slot)) blocks_.resize(std::size_t(slot) + 1);
  Block& b = blocks_[std::size_t(slot)];
  if (b.bytes < bytes) {
    if (b.p) memory_->release_host(b.p);
    b.p = nullptr;
    b.p = memory_->allocate_host(bytes);
    b.bytes = bytes;
  }
  return b.p;
}

HostLease DeviceStaging::lease(std::size_t bytes) {
  // The smallest free block that fits, else a new one.
  auto best = pool_.end();
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (it->bytes >= bytes && (best == pool_.end() || it->bytes < best->bytes)) best = it;
  HostLease l;
  l.owner_ = shared_from_this();
  if (best != pool_.end()) {
    l.p_ = best->p;
    l.bytes_ = best->bytes;
    pool_.erase(best);
  } else {
    l.p_ = memory_->allocate_host(bytes);
    l.bytes_ = bytes;
  }
  return l;
}

void DeviceStaging::give_back(void* p, std::size_t bytes) { pool_.push_back({p, bytes}); }

HostLease& HostLease::operator=(HostLease&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::move(o.owner_);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void HostLease::reset() {
  if (p_) owner_->give_back(p_, bytes_);
  p_ = nullptr;
  bytes_ = 0;
  owner_.reset();
}

HostStage::HostStage(DeviceStaging* staging, void* data, std::size_t bytes, bool copy_in,
                     bool copy_out, int slot)
    : staging_(staging), data_(data), mpi_(data), bytes_(bytes), copy_out_(copy_out) {
  if (!staging_ || !staging_->on_device(data)) return;
  if (!staging_->staged(data)) {
    staging_->sync_for_mpi(data);
    return;
  }
  mpi_ = staging_->host(bytes, slot);
  if (copy_in) staging_->memory()->to_host(mpi_, data_, bytes_);
}

void HostStage::finish() {
  if (mpi_ != data_ && copy_out_) staging_->memory()->to_device(data_, mpi_, bytes_);
}

}  // namespace trident::parallel
