// Layout-independent batch sampling (see trident/train/data_loader.hpp).
#include "trident/train/data_loader.hpp"

#include <algorithm>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"

namespace trident::train {

DataLoader::DataLoader(std::vector<std::int32_t> tokens, int seq_len, std::uint64_t seed,
                       const std::string& stream, const std::string& source)
    : tokens_(std::move(tokens)), seq_len_(seq_len), seed_(seed),
      stream_key_(rng::key_of("data/" + stream)) {
  TRIDENT_CHECK(std::int64_t(tokens_.size()) > seq_len, source, ": ", tokens_.size(),
                " tokens, but a sequence of model.seq_len = ", seq_len,
                " needs at least ", seq_len + 1);
}

void DataLoader::fill(std::int64_t index, std::int64_t global_batch, std::int64_t first,
                      std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const {
  const std::uint64_t starts = std::uint64_t(tokens_.size()) - std::uint64_t(seq_len_);
  for (std::int64_t j = 0; j < count; ++j) {
    const std::uint64_t n = std::uint64_t(index) * std::uint64_t(global_batch) +
                            std::uint64_t(first + j);
    const std::size_t start = rng::uniform_u64(seed_, stream_key_, n) % starts;
    const std::int32_t* src = tokens_.data() + start;
    std::copy(src, src + seq_len_, inputs + j * seq_len_);
    std::copy(src + 1, src + 1 + seq_len_, targets + j * seq_len_);
  }
}

}  // namespace trident::train
