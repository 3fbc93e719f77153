// trident/train/data_loader.hpp — the training data: one or more token datasets (each a
// file, a directory of shards or a glob), blended by weight, read sequence by sequence.
//
// A dataset's sequences are the windows [i*T, i*T + T + 1) of each of its shards (inputs
// T tokens, targets the same shifted by one; neighbouring windows share one token, as in
// Megatron-LM). Each epoch of a dataset draws all of its sequences once, in an order
// shuffled from (seed, stream, dataset, epoch) alone. With several datasets, global
// sequence n goes to the dataset whose share is furthest behind its weight (Megatron's
// blending): after n sequences dataset d has had w_d * n of them, rounded up or down,
// and exactly w_d * n whenever that is a whole number (for 0.7 / 0.3: every 10 sequences).
//
// The order lives in a sample index (FORMAT.md, "Sample index"), an HDF5 file beside the
// run built once by rank 0, checked against the datasets' sizes and checksums and rebuilt
// when they, the seed or the sequence length change. The global batch of step s is then a
// function of the seed and s alone, whatever the layout (DESIGN.md, decision 5), and a
// resume needs no loader state. A rank holds open files, never the corpus: it reads only
// the tokens (and index entries) of the sequences it trains on.
// defines: trident::train::DataSource, parse_data_sources, shard_files, LoaderOptions,
//          loader_files_held_open,
//          build_sample_index, DataLoader
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/io/dataset.hpp"

namespace trident::train {

// One entry of data.train (or data.valid): a token dataset and its share of the blend.
struct DataSource {
  std::string path;  // a file, a directory of *.h5 shards, or a glob ("shard-*.h5")
  double weight = 1.0;
  bool operator==(const DataSource& o) const { return path == o.path && weight == o.weight; }
};

// data.train's value: a path, or (as the deck stores a list) the TOML array text
// `[{path = "a.h5", weight = 0.7}, ...]`. `where` names the key in errors. Checks: paths
// non-empty, weights finite and >= 0, not all zero.
std::vector<DataSource> parse_data_sources(const std::string& value, const std::string& where);
// The list back as the one-line TOML array (a single weight-1 source as its plain path).
std::string data_sources_toml(const std::vector<DataSource>& sources);

// The files of one source, sorted: the path itself, the *.h5 files of a directory, or the
// matches of a glob. Fails on no match.
std::vector<std::string> shard_files(const std::string& path, const std::string& key);

// The first file of data.train's value (every file shares its tokenizer and vocabulary).
std::string first_token_file(const std::string& value, const std::string& key);

// The HDF5 files a DataLoader of data.train's (or data.valid's) value holds open at most:
// its sample index and its shards, up to the number it keeps open at once. Sources whose
// files cannot be listed (not there yet, as under `trident plan`) count one shard each; an
// empty value counts none.
int loader_files_held_open(const std::string& value, const std::string& key);

struct LoaderOptions {
  std::string key;            // "data.train": names the deck key in errors
  std::string stream;         // "train" | "valid": separates the orders
  int seq_len = 0;
  std::uint64_t seed = 0;
  int vocab_limit = 0;        // the model's vocab_size: no dataset may have more
  std::int64_t sequences = 0; // how many the run draws (steps * global batch)
  std::string index_path;     // the sample index file
};

// Rank 0, under agree(): checks every file (ids, vocabularies, checksums, sizes) and makes
// sure opt.index_path is a valid index for them, rebuilding it when stale. Fails on a
// damaged index (naming it; delete it to rebuild). Returns a line for the log.
std::string build_sample_index(const std::vector<DataSource>& sources, const LoaderOptions& opt);

class DataLoader {
 public:
  // Every rank, after build_sample_index: opens the files and the index.
  DataLoader(const std::vector<DataSource>& sources, const LoaderOptions& opt);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  // Sequences [first, first + count) of batch `batch` of G = global_batch sequences: the
  // global sequences batch * G + first + j. inputs/targets are [count, T].
  void fill(std::int64_t batch, std::int64_t global_batch, std::int64_t first,
            std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const;

  // Passes over the data after `sequences` global sequences: for a blend, that of the
  // dataset most passed over (weight * sequences / its sequences per epoch).
  double epoch(std::int64_t sequences) const;
  std::int64_t num_tokens() const;  // over all datasets and shards

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trident::train
