// Token datasets: /tokens, /documents, vocab_size, tokenizer (see trident/io/dataset.hpp).
#include "trident/io/dataset.hpp"

#include <algorithm>
#include <climits>
#include <filesystem>

#include "trident/core/error.hpp"

namespace trident::io {

namespace {

constexpr std::int64_t kChunkTokens = 1 << 20;  // 2 MB of uint16 per chunk
constexpr std::int64_t kChunkDocs = 1 << 16;

void check_ids(const std::string& path, const std::int32_t* t, std::int64_t n, std::int64_t first,
               int vocab) {
  for (std::int64_t i = 0; i < n; ++i)
    if (t[i] < 0 || t[i] >= vocab)
      fail(path, ": /tokens[", first + i, "] = ", t[i], " is not a token id in [0, vocab_size = ",
           vocab, ")");
}

// The header, with the dataset /tokens left open for the caller.
TokenDataset read_header(const h5::File& f, h5::Hid& tokens) {
  TokenDataset d;
  std::int64_t vocab = h5::read_attr_int(f, "vocab_size");
  if (vocab <= 0 || vocab > INT_MAX)
    fail(f.path(), ": vocab_size = ", vocab, ", expected a positive integer");
  d.vocab_size = int(vocab);
  d.tokenizer = h5::read_attr_string(f, "tokenizer");
  if (d.tokenizer == "sentencepiece" || d.tokenizer == "gpt2") {
    h5::Hid m = h5::open_dataset(f, "tokenizer/model");
    auto shape = h5::dataset_shape(m);
    if (h5::dataset_class(m) != H5T_INTEGER || shape.size() != 1 || shape[0] <= 0)
      fail(f.path(), ": /tokenizer/model must be a non-empty 1-D uint8 dataset (the serialized ",
           d.tokenizer == "gpt2" ? "GPT-2 vocabulary and merges)" : "SentencePiece model)");
    d.tokenizer_model.resize(std::size_t(shape[0]));
    if (H5Dread(m, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.tokenizer_model.data()) < 0)
      fail(f.path(), ": cannot read /tokenizer/model");
  } else if (d.tokenizer != "byte") {
    fail(f.path(), ": tokenizer = \"", d.tokenizer, "\", expected \"byte\", \"sentencepiece\" or \"gpt2\"");
  }
  // Chunk cache off: a random read of one sequence must not pull (and keep) whole chunks.
  h5::Hid dapl(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl, 0, 0, 1.0);
  tokens = h5::open_dataset(f, "tokens", dapl);
  H5T_class_t c = h5::dataset_class(tokens);
  if (c != H5T_INTEGER)
    fail(f.path(), ": dataset /tokens is ", h5::class_name(c), ", expected integer token ids");
  auto shape = h5::dataset_shape(tokens);
  if (shape.size() != 1)
    fail(f.path(), ": dataset /tokens has shape ", h5::shape_str(shape), ", expected 1-D");
  if (shape[0] == 0) fail(f.path(), ": dataset /tokens is empty");
  d.num_tokens = shape[0];
  d.has_checksum = h5::has_attr(f, "tokens_checksum");
  if (d.has_checksum) d.checksum = h5::read_attr_u64(f, "tokens_checksum");
  return d;
}

std::vector<std::int64_t> read_documents(const h5::File& f, std::int64_t num_tokens) {
  if (!h5::exists(f, "documents")) return {};
  h5::Hid ds = h5::open_dataset(f, "documents");
  auto shape = h5::dataset_shape(ds);
  if (h5::dataset_class(ds) != H5T_INTEGER || shape.size() != 1)
    fail(f.path(), ": /documents must be a 1-D integer dataset (document start offsets)");
  std::vector<std::int64_t> d(static_cast<std::size_t>(shape[0]));
  if (!d.empty() && H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.data()) < 0)
    fail(f.path(), ": cannot read /documents");
  for (std::size_t i = 0; i < d.size(); ++i)
    if ((i == 0 && d[0] != 0) || (i > 0 && d[i] <= d[i - 1]) || d[i] >= num_tokens)
      fail(f.path(), ": /documents[", i, "] = ", d[i],
           " is not an ascending document start in [0, ", num_tokens, ") beginning at 0");
  return d;
}

std::uint64_t mix64(std::uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Appends n values at `offset` of a 1-D extendable dataset whose new size is `new_size`;
// collective when the file is parallel (a rank with n = 0 selects nothing).
void append_slab(const h5::File& f, hid_t ds, hid_t mem_type, const void* data, std::int64_t n,
                 std::int64_t offset, std::int64_t new_size) {
  hsize_t size = hsize_t(new_size);
  if (H5Dset_extent(ds, &size) < 0) fail(f.path(), ": cannot extend ", h5::object_name(ds));
  h5::Hid fspace(H5Dget_space(ds));
  hsize_t start = hsize_t(offset), count = hsize_t(n);
  h5::Hid mspace(H5Screate_simple(1, &count, nullptr));
  if (n > 0) {
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  } else {
    H5Sselect_none(fspace);
    H5Sselect_none(mspace);
  }
  h5::Hid dxpl(H5Pcreate(H5P_DATASET_XFER));
  if (f.parallel()) H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  if (H5Dwrite(ds, mem_type, mspace, fspace, dxpl, data) < 0)
    fail(f.path(), ": cannot write ", h5::object_name(ds), " (disk full?)");
}

}  // namespace

std::uint64_t token_checksum(const std::int32_t* ids, std::int64_t n, std::int64_t first) {
  std::uint64_t sum = 0;
  for (std::int64_t i = 0; i < n; ++i)
    sum += mix64(std::uint64_t(first + i) * 0x9E3779B97F4A7C15ull ^
                 std::uint64_t(std::uint32_t(ids[i])));
  return sum;
}

// ---- TokenWriter -------------------------------------------------------------------------

TokenWriter::TokenWriter(const std::string& path, const TokenDataset& d, parallel::Comm* comm)
    : path_(path), tmp_(path + ".tmp"), comm_(comm) {
  header_.vocab_size = d.vocab_size;
  header_.tokenizer = d.tokenizer;
  header_.tokenizer_model = d.tokenizer_model;
  TRIDENT_CHECK(d.vocab_size > 0, path, ": vocab_size = ", d.vocab_size, ", expected > 0");
  if (d.tokenizer == "byte")
    TRIDENT_CHECK(d.vocab_size == 256 && d.tokenizer_model.empty(), path,
                  ": the byte tokenizer has vocab_size 256 and no model");
  else if (d.tokenizer == "sentencepiece" || d.tokenizer == "gpt2")
    TRIDENT_CHECK(!d.tokenizer_model.empty(), path, ": a ", d.tokenizer, " dataset needs its model");
  else
    fail(path, ": tokenizer = \"", d.tokenizer, "\", expected \"byte\", \"sentencepiece\" or \"gpt2\"");

  h5::make_parent_dir(path, mpi_comm());
  file_ = mpi_comm() == MPI_COMM_NULL ? h5::open_file(tmp_, h5::Mode::create)
                                      : h5::open_file_parallel(tmp_, mpi_comm(), h5::Mode::create);
  h5::write_attr_int(file_, "vocab_size", d.vocab_size);
  h5::write_attr_string(file_, "tokenizer", d.tokenizer);
  // Where the tokenizer came from (GPT-2: its files' names and SHA-256), for provenance.
  if (!d.tokenizer_files.empty()) {
    std::string names, sums;
    for (const auto& [name, sum] : d.tokenizer_files) {
      names += (names.empty() ? "" : "\n") + name;
      sums += (sums.empty() ? "" : "\n") + sum;
    }
    h5::write_attr_string(file_, "tokenizer_files", names);
    h5::write_attr_string(file_, "tokenizer_sha256", sums);
  }
  auto extendable = [&](const char* name, hid_t type, std::int64_t chunk) {
    h5::Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
    hsize_t c = hsize_t(chunk);
    H5Pset_chunk(dcpl, 1, &c);
    return h5::create_dataset(file_, name, type, {0}, dcpl, {-1});
  };
  tokens_ = extendable("tokens", d.vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_I32LE,
                       kChunkTokens);
  documents_ = extendable("documents", H5T_STD_I64LE, kChunkDocs);
  if (!d.tokenizer_model.empty()) {
    h5::Hid ds = h5::create_dataset(file_, "tokenizer/model", H5T_STD_U8LE,
                                    {std::int64_t(d.tokenizer_model.size())});
    h5::Hid dxpl(H5Pcreate(H5P_DATASET_XFER));
    if (file_.parallel()) H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
    if (H5Dwrite(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, dxpl, d.tokenizer_model.data()) < 0)
      fail(tmp_, ": cannot write /tokenizer/model");
  }
}

TokenWriter::~TokenWriter() {
  if (done_) return;
  // An unfinished file is never published; only rank 0 removes it (after every rank closed).
  try {
    tokens_.reset();
    documents_.reset();
    file_ = h5::File();
  } catch (...) {
  }
  std::error_code ec;
  if (!comm_ || comm_->rank() == 0) std::filesystem::remove(tmp_, ec);
}

void TokenWriter::append(const std::vector<std::int32_t>& tokens,
                         const std::vector<std::int64_t>& doc_starts) {
  check_ids(tmp_, tokens.data(), std::int64_t(tokens.size()), total_, header_.vocab_size);
  std::int64_t mine[2] = {std::int64_t(tokens.size()), std::int64_t(doc_starts.size())};
  const int size = comm_ ? comm_->size() : 1;
  std::vector<std::int64_t> all(std::size_t(2 * size));
  if (comm_)
    comm_->all_gather(mine, all.data(), 2);
  else
    all = {mine[0], mine[1]};
  std::int64_t tok_before = 0, doc_before = 0, tok_round = 0, doc_round = 0;
  const int me = comm_ ? comm_->rank() : 0;
  for (int r = 0; r < size; ++r) {
    if (r < me) tok_before += all[2 * r], doc_before += all[2 * r + 1];
    tok_round += all[2 * r];
    doc_round += all[2 * r + 1];
  }
  const std::int64_t at = total_ + tok_before;
  checksum_ += token_checksum(tokens.data(), std::int64_t(tokens.size()), at);
  append_slab(file_, tokens_, H5T_NATIVE_INT32, tokens.data(), std::int64_t(tokens.size()), at,
              total_ + tok_round);
  std::vector<std::int64_t> docs(doc_starts);
  for (auto& s : docs) s += at;
  append_slab(file_, documents_, H5T_NATIVE_INT64, docs.data(), std::int64_t(docs.size()),
              docs_total_ + doc_before, docs_total_ + doc_round);
  total_ += tok_round;
  docs_total_ += doc_round;
}

void TokenWriter::finish() {
  TRIDENT_CHECK(total_ > 0, path_, ": no tokens to write (empty input?)");
  if (comm_) comm_->allreduce_sum(&checksum_, 1);
  h5::write_attr_u64(file_, "tokens_checksum", checksum_);
  h5::write_attr_int(file_, "num_documents", docs_total_);
  tokens_.reset();
  documents_.reset();
  file_.close();
  h5::commit_file(tmp_, path_, mpi_comm());
  done_ = true;
}

void write_token_dataset(const std::string& path, const TokenDataset& d) {
  TRIDENT_CHECK(!d.tokens.empty(), path, ": no tokens to write (empty input?)");
  // Refuse before creating anything (the writer would also check, on the temporary name).
  check_ids(path, d.tokens.data(), std::int64_t(d.tokens.size()), 0, d.vocab_size > 0 ? d.vocab_size : INT_MAX);
  TokenWriter w(path, d);
  w.append(d.tokens, d.documents.empty() ? std::vector<std::int64_t>{0} : d.documents);
  w.finish();
}

// ---- readers ---------------------------------------------------------------------------

TokenDataset read_token_dataset(const std::string& path) {
  TokenFile f(path);
  TokenDataset d = f.header();
  d.tokens.resize(std::size_t(d.num_tokens));
  f.read(0, d.num_tokens, d.tokens.data());
  {
    h5::File file = h5::open_file(path, h5::Mode::read);
    d.documents = read_documents(file, d.num_tokens);
  }
  return d;
}

TokenDataset read_token_dataset_header(const std::string& path) {
  h5::File f = h5::open_file(path, h5::Mode::read);
  h5::Hid ds;
  return read_header(f, ds);
}

TokenFile::TokenFile(const std::string& path) {
  file_ = h5::open_file(path, h5::Mode::read);
  header_ = read_header(file_, tokens_);
  space_ = h5::Hid(H5Dget_space(tokens_));
}

void TokenFile::read(std::int64_t start, std::int64_t count, std::int32_t* out) const {
  TRIDENT_CHECK(start >= 0 && count >= 0 && start + count <= num_tokens(), path(),
                ": tokens [", start, ", ", start + count, ") are outside /tokens of ",
                num_tokens());
  if (count == 0) return;
  hsize_t s = hsize_t(start), c = hsize_t(count);
  h5::Hid fspace(H5Scopy(space_));
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &s, nullptr, &c, nullptr);
  h5::Hid mspace(H5Screate_simple(1, &c, nullptr));
  // HDF5 converts any stored integer type to int32 (saturating: an id beyond int32 reads
  // as INT32_MAX and fails the range check below).
  if (H5Dread(tokens_, H5T_NATIVE_INT32, mspace, fspace, H5P_DEFAULT, out) < 0)
    fail(path(), ": cannot read /tokens[", start, ":", start + count, "] (truncated file?)");
  check_ids(path(), out, count, start, header_.vocab_size);
}

std::uint64_t TokenFile::verify() const {
  std::vector<std::int32_t> buf(std::size_t(std::min(kChunkTokens, num_tokens())));
  std::uint64_t sum = 0;
  for (std::int64_t at = 0; at < num_tokens(); at += std::int64_t(buf.size())) {
    const std::int64_t n = std::min<std::int64_t>(std::int64_t(buf.size()), num_tokens() - at);
    read(at, n, buf.data());
    sum += token_checksum(buf.data(), n, at);
  }
  if (header_.has_checksum && sum != header_.checksum)
    fail(path(), ": /tokens do not match their tokens_checksum attribute (the file was changed "
                 "or damaged after prepare-data wrote it)");
  return sum;
}

}  // namespace trident::io
