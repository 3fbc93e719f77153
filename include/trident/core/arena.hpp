// trident/core/arena.hpp — the bookkeeping of one preallocated block of memory handed out in
// pieces: first fit over a free list ordered by offset, neighbours merged on release. Works on
// offsets only, so the same code manages a cudaMalloc'ed arena and a host one.
// defines: trident::ArenaAllocator
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace trident {

class ArenaAllocator {
 public:
  static constexpr std::size_t kAlign = 256;
  ArenaAllocator() = default;
  explicit ArenaAllocator(std::size_t capacity);

  // Offset of a free block of `bytes` (rounded up to kAlign; 0 bytes takes kAlign). An Error
  // "<what>: N bytes asked for, M free in K blocks (largest L) of C" when none fits.
  std::size_t allocate(std::size_t bytes, const char* what = "device arena");
  // Gives back the block at `offset` (from allocate); an Error when it is not one.
  void release(std::size_t offset);

  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }
  std::size_t peak() const { return peak_; }
  std::size_t blocks() const { return taken_.size(); }

  // For what bakes pointers in (CUDA graphs): the blocks taken now, and whether each of them
  // is still the same allocation (not released, or released and handed out again).
  // allocations() and releases() count the calls so far.
  struct Block {
    std::size_t offset = 0, size = 0;
    std::uint64_t serial = 0;  // allocations() when it was handed out
  };
  std::vector<Block> taken_blocks() const;
  bool still_taken(const std::vector<Block>& blocks) const;
  std::uint64_t allocations() const { return allocations_; }
  std::uint64_t releases() const { return releases_; }

 private:
  struct Taken {
    std::size_t size = 0;
    std::uint64_t serial = 0;
  };
  std::size_t capacity_ = 0, used_ = 0, peak_ = 0;
  std::uint64_t allocations_ = 0, releases_ = 0;
  std::map<std::size_t, std::size_t> free_;  // offset -> size, no two adjacent
  std::map<std::size_t, Taken> taken_;       // offset -> size, serial
};

}  // namespace trident
