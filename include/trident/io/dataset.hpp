// trident/io/dataset.hpp — the token dataset (FORMAT.md), written by `trident
// prepare-data` and read by training: /tokens, a 1-D integer dataset of token ids (uint16
// when vocab_size <= 65536, else int32), root attributes vocab_size and tokenizer ("byte",
// "sentencepiece" or "gpt2"), and for SentencePiece and GPT-2 the serialized model as the
// uint8 dataset /tokenizer/model (GPT-2: also tokenizer_files, tokenizer_sha256). Files written since issue 17 also hold /documents (int64, the offset
// of each document's first token) and the attribute tokens_checksum (token_checksum of
// /tokens); older files without them are still read.
// defines: trident::io::TokenDataset, token_checksum, write_token_dataset,
//          read_token_dataset, read_token_dataset_header, TokenFile, TokenWriter
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trident/io/h5.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::io {

struct TokenDataset {
  int vocab_size = 0;
  std::string tokenizer;             // "byte" | "sentencepiece"
  std::string tokenizer_model;       // serialized SentencePiece model or GPT-2 tables; empty for "byte"
  // Written only: the files the tokenizer was read from, (name, SHA-256 hex) (GPT-2).
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
  std::int64_t num_tokens = 0;
  std::vector<std::int32_t> tokens;  // (num_tokens,); empty from read_token_dataset_header
  // Offsets of the documents' first tokens, ascending, the first 0 (empty: not recorded).
  std::vector<std::int64_t> documents;
  bool has_checksum = false;         // the file has tokens_checksum (files before issue 17 not)
  std::uint64_t checksum = 0;
};

// Checksum of ids[0..n), the ids being tokens first..first+n of a dataset: the sum mod
// 2^64 of a 64-bit mix of (position, id). Depends on order; sums of disjoint slices add
// up, so ranks that each hold a slice agree on the whole without moving tokens.
std::uint64_t token_checksum(const std::int32_t* ids, std::int64_t n, std::int64_t first);

// Writes atomically (path + ".tmp", renamed). Checks the tokens are non-empty and in
// [0, vocab_size), that "byte" has vocab_size 256 and "sentencepiece" a model.
// data.documents may be empty (one document).
void write_token_dataset(const std::string& path, const TokenDataset& data);

// Reads everything, checking: vocab_size a positive integer, tokenizer "byte" or
// "sentencepiece" (then /tokenizer/model present), /tokens a non-empty 1-D integer
// dataset, every id in [0, vocab_size). Ids come back as int32 whatever the stored type.
TokenDataset read_token_dataset(const std::string& path);

// The same checks and fields without reading /tokens or /documents (num_tokens is set).
TokenDataset read_token_dataset_header(const std::string& path);

// One token dataset open for reading ranges of tokens: what a training rank holds of a
// corpus is this handle, never the tokens (hyperslab reads of only the tokens asked for,
// HDF5's chunk cache off, so resident memory does not grow with the corpus).
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);  // header checks as read_token_dataset_header
  const std::string& path() const { return file_.path(); }
  const TokenDataset& header() const { return header_; }
  std::int64_t num_tokens() const { return header_.num_tokens; }
  // Tokens [start, start + count) as int32, each checked against vocab_size.
  void read(std::int64_t start, std::int64_t count, std::int32_t* out) const;
  // Streams every token (bounded memory): checks each id, and the tokens_checksum attribute
  // when the file has one. Returns the checksum.
  std::uint64_t verify() const;

 private:
  h5::File file_;
  h5::Hid tokens_, space_;
  TokenDataset header_;
};

// Writes a token dataset in pieces, as text streams in: serially (comm = null)
// or with every rank of comm appending its own piece of each round, in rank order, into
// one file through MPI-IO. Published atomically by finish(); a writer destroyed without
// finish() removes its temporary file.
class TokenWriter {
 public:
  // header: vocab_size, tokenizer, tokenizer_model (its tokens are ignored).
  TokenWriter(const std::string& path, const TokenDataset& header,
              parallel::Comm* comm = nullptr);
  ~TokenWriter();
  TokenWriter(const TokenWriter&) = delete;
  TokenWriter& operator=(const TokenWriter&) = delete;
  // Collective over comm: this rank's tokens follow those of lower ranks in this round.
  // doc_starts: offsets (within `tokens`) where documents begin.
  void append(const std::vector<std::int32_t>& tokens, const std::vector<std::int64_t>& doc_starts);
  // Collective: attributes, close, rename. Fails on an empty dataset.
  void finish();
  std::int64_t num_tokens() const { return total_; }
  std::int64_t num_documents() const { return docs_total_; }

 private:
  // The handle HDF5's MPI-IO takes (MPI_COMM_NULL: serial), the Comm for the rest.
  MPI_Comm mpi_comm() const { return comm_ ? comm_->raw() : MPI_COMM_NULL; }
  std::string path_, tmp_;
  parallel::Comm* comm_;
  TokenDataset header_;
  h5::File file_;
  h5::Hid tokens_, documents_;
  std::int64_t total_ = 0, docs_total_ = 0;
  std::uint64_t checksum_ = 0;
  bool done_ = false;
};

}  // namespace trident::io
