// Token datasets: /tokens, vocab_size, tokenizer (see trident/io/dataset.hpp).
#include "trident/io/dataset.hpp"

#include <climits>

#include "trident/core/error.hpp"
#include "trident/io/h5.hpp"

namespace trident::io {

namespace {

void check_tokens(const std::string& path, const std::vector<std::int32_t>& t, int vocab) {
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i] < 0 || t[i] >= vocab)
      fail(path, ": /tokens[", i, "] = ", t[i], " is not a token id in [0, vocab_size = ", vocab,
           ")");
}

// The header, with the dataset /tokens left open for the caller.
TokenDataset read_header(const h5::File& f, h5::Hid& tokens) {
  TokenDataset d;
  std::int64_t vocab = h5::read_attr_int(f, "vocab_size");
  if (vocab <= 0 || vocab > INT_MAX)
    fail(f.path(), ": vocab_size = ", vocab, ", expected a positive integer");
  d.vocab_size = int(vocab);
  d.tokenizer = h5::read_attr_string(f, "tokenizer");
  if (d.tokenizer == "sentencepiece") {
    h5::Hid m = h5::open_dataset(f, "tokenizer/model");
    auto shape = h5::dataset_shape(m);
    if (h5::dataset_class(m) != H5T_INTEGER || shape.size() != 1 || shape[0] <= 0)
      fail(f.path(), ": /tokenizer/model must be a non-empty 1-D uint8 dataset (the serialized "
                     "SentencePiece model)");
    d.tokenizer_model.resize(std::size_t(shape[0]));
    if (H5Dread(m, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.tokenizer_model.data()) < 0)
      fail(f.path(), ": cannot read /tokenizer/model");
  } else if (d.tokenizer != "byte") {
    fail(f.path(), ": tokenizer = \"", d.tokenizer, "\", expected \"byte\" or \"sentencepiece\"");
  }
  tokens = h5::open_dataset(f, "tokens");
  H5T_class_t c = h5::dataset_class(tokens);
  if (c != H5T_INTEGER)
    fail(f.path(), ": dataset /tokens is ", h5::class_name(c), ", expected integer token ids");
  auto shape = h5::dataset_shape(tokens);
  if (shape.size() != 1)
    fail(f.path(), ": dataset /tokens has shape ", h5::shape_str(shape), ", expected 1-D");
  if (shape[0] == 0) fail(f.path(), ": dataset /tokens is empty");
  d.num_tokens = shape[0];
  return d;
}

}  // namespace

void write_token_dataset(const std::string& path, const TokenDataset& d) {
  TRIDENT_CHECK(!d.tokens.empty(), path, ": no tokens to write (empty input?)");
  TRIDENT_CHECK(d.vocab_size > 0, path, ": vocab_size = ", d.vocab_size, ", expected > 0");
  if (d.tokenizer == "byte")
    TRIDENT_CHECK(d.vocab_size == 256 && d.tokenizer_model.empty(), path,
                  ": the byte tokenizer has vocab_size 256 and no model");
  else if (d.tokenizer == "sentencepiece")
    TRIDENT_CHECK(!d.tokenizer_model.empty(), path, ": a SentencePiece dataset needs its model");
  else
    fail(path, ": tokenizer = \"", d.tokenizer, "\", expected \"byte\" or \"sentencepiece\"");
  check_tokens(path, d.tokens, d.vocab_size);

  const std::string tmp = path + ".tmp";
  h5::make_parent_dir(path, MPI_COMM_NULL);
  {
    h5::File f = h5::open_file(tmp, h5::Mode::create);
    h5::write_attr_int(f, "vocab_size", d.vocab_size);
    h5::write_attr_string(f, "tokenizer", d.tokenizer);
    {
      hid_t type = d.vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_I32LE;
      h5::Hid ds = h5::create_dataset(f, "tokens", type, {std::int64_t(d.tokens.size())});
      if (H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.tokens.data()) < 0)
        fail(tmp, ": cannot write /tokens (disk full?)");
    }
    if (!d.tokenizer_model.empty()) {
      h5::Hid ds = h5::create_dataset(f, "tokenizer/model", H5T_STD_U8LE,
                                      {std::int64_t(d.tokenizer_model.size())});
      if (H5Dwrite(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                   d.tokenizer_model.data()) < 0)
        fail(tmp, ": cannot write /tokenizer/model");
    }
    f.close();
  }
  h5::commit_file(tmp, path, MPI_COMM_NULL);
}

TokenDataset read_token_dataset(const std::string& path) {
  h5::File f = h5::open_file(path, h5::Mode::read);
  h5::Hid ds;
  TokenDataset d = read_header(f, ds);
  d.tokens.resize(std::size_t(d.num_tokens));
  // HDF5 converts any stored integer type to int32 (saturating: an id beyond int32 reads
  // as INT32_MAX and fails the range check below).
  if (H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.tokens.data()) < 0)
    fail(path, ": cannot read /tokens");
  check_tokens(path, d.tokens, d.vocab_size);
  return d;
}

TokenDataset read_token_dataset_header(const std::string& path) {
  h5::File f = h5::open_file(path, h5::Mode::read);
  h5::Hid ds;
  return read_header(f, ds);
}

}  // namespace trident::io
