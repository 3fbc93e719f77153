// First-fit arena bookkeeping (see trident/core/arena.hpp).
#include "trident/core/arena.hpp"

#include <algorithm>
#include <iterator>

#include "trident/core/error.hpp"

namespace trident {

ArenaAllocator::ArenaAllocator(std::size_t capacity) : capacity_(capacity / kAlign * kAlign) {
  if (capacity_ > 0) free_[0] = capacity_;
}

std::size_t ArenaAllocator::allocate(std::size_t bytes, const char* what) {
  const std::size_t size = std::max<std::size_t>(1, (bytes + kAlign - 1) / kAlign) * kAlign;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const std::size_t offset = it->first, left = it->second - size;
    free_.erase(it);
    if (left > 0) free_[offset + size] = left;
    taken_[offset] = Taken{size, ++allocations_};
    used_ += size;
    peak_ = std::max(peak_, used_);
    return offset;
  }
  std::size_t largest = 0;
  for (const auto& f : free_) largest = std::max(largest, f.second);
  fail(what, ": ", bytes, " bytes asked for, ", capacity_ - used_, " free in ", free_.size(),
       " blocks (largest ", largest, ") of ", capacity_);
}

void ArenaAllocator::release(std::size_t offset) {
  auto t = taken_.find(offset);
  TRIDENT_CHECK(t != taken_.end(), "arena: release of offset ", offset, ", not an allocated block");
  std::size_t start = offset, size = t->second.size;
  taken_.erase(t);
  ++releases_;
  used_ -= size;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {  // merge with the block after
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the block before
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
}

std::vector<ArenaAllocator::Block> ArenaAllocator::taken_blocks() const {
  std::vector<Block> blocks;
  blocks.reserve(taken_.size());
  for (const auto& [offset, t] : taken_) blocks.push_back({offset, t.size, t.serial});
  return blocks;
}

bool ArenaAllocator::still_taken(const std::vector<Block>& blocks) const {
  for (const Block& b : blocks) {
    auto t = taken_.find(b.offset);
    if (t == taken_.end() || t->second.size != b.size || t->second.serial != b.serial)
      return false;
  }
  return true;
}

}  // namespace trident
