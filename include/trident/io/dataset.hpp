// trident/io/dataset.hpp — the token dataset (FORMAT.md), written by `trident
// prepare-data` and read by training: /tokens, a 1-D integer dataset of token ids (uint16
// when vocab_size <= 65536, else int32), root attributes vocab_size and tokenizer ("byte"
// or "sentencepiece"), and for SentencePiece the serialized model as the uint8 dataset
// /tokenizer/model.
// defines: trident::io::TokenDataset, write_token_dataset, read_token_dataset,
//          read_token_dataset_header
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident::io {

struct TokenDataset {
  int vocab_size = 0;
  std::string tokenizer;             // "byte" | "sentencepiece"
  std::string tokenizer_model;       // serialized SentencePiece model; empty for "byte"
  std::int64_t num_tokens = 0;
  std::vector<std::int32_t> tokens;  // (num_tokens,); empty from read_token_dataset_header
};

// Writes atomically (path + ".tmp", renamed). Checks the tokens are non-empty and in
// [0, vocab_size), that "byte" has vocab_size 256 and "sentencepiece" a model.
void write_token_dataset(const std::string& path, const TokenDataset& data);

// Reads everything, checking: vocab_size a positive integer, tokenizer "byte" or
// "sentencepiece" (then /tokenizer/model present), /tokens a non-empty 1-D integer
// dataset, every id in [0, vocab_size). Ids come back as int32 whatever the stored type.
TokenDataset read_token_dataset(const std::string& path);

// The same checks and fields without reading /tokens (num_tokens is set, tokens empty).
TokenDataset read_token_dataset_header(const std::string& path);

}  // namespace trident::io
