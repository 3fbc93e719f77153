// trident/train/data_loader.hpp — batches drawn from a token stream as a function of
// (seed, batch index, sequence index) alone (DESIGN.md, decision 5): the global batch of
// step s is the same whatever the layout, and resuming at step s needs no loader state.
// defines: trident::train::DataLoader
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident::train {

class DataLoader {
 public:
  // tokens: the whole dataset; `stream` separates independent draws ("train", "valid").
  // `source` names the dataset in errors.
  DataLoader(std::vector<std::int32_t> tokens, int seq_len, std::uint64_t seed,
             const std::string& stream, const std::string& source);

  // Sequences [first, first + count) of batch `index` (G = global_batch sequences per
  // batch): sequence j starts at a uniformly drawn offset; inputs are T tokens from it,
  // targets the same shifted by one. inputs/targets are [count, T].
  void fill(std::int64_t index, std::int64_t global_batch, std::int64_t first, std::int64_t count,
            std::int32_t* inputs, std::int32_t* targets) const;

  std::int64_t num_tokens() const { return std::int64_t(tokens_.size()); }

 private:
  std::vector<std::int32_t> tokens_;
  int seq_len_;
  std::uint64_t seed_, stream_key_;
};

}  // namespace trident::train
