// Model tensors as HDF5 hyperslabs by ShardSpec, collectively (see trident/io/tensor_io.hpp).
#include "trident/io/tensor_io.hpp"

#include "trident/io/format.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "trident/core/error.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/comm.hpp"

namespace trident::io {

using model::ShardSpec;

namespace {

// SplitMix64's finalizer: a bijection on 64 bits that scatters nearby inputs.
inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline std::uint64_t element_hash(std::uint64_t global_index, float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return mix(mix(global_index + 0x9E3779B97F4A7C15ull) ^ bits);
}

// The shard as contiguous runs (model::for_each_local_run): fn(local_begin, global_begin,
// length) for every run of elements that exists in the logical tensor (TP padding rows are
// never visited).
template <typename Fn>
void for_each_run(const ShardSpec& s, Fn&& fn) {
  model::for_each_local_run(s, fn);
}

std::uint64_t shard_checksum(const ShardSpec& s, const float* shard) {
  std::uint64_t h = 0;
  for_each_run(s, [&](std::int64_t l, std::int64_t g, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) h += element_hash(std::uint64_t(g + i), shard[l + i]);
  });
  return h;
}

std::int64_t shard_count(const ShardSpec& s) {
  std::int64_t n = 0;
  for_each_run(s, [&](std::int64_t, std::int64_t, std::int64_t len) { n += len; });
  return n;
}

// The shard's blocks as a hyperslab union in `space` (the file's logical tensor when
// `global`, else the rank's local shard). HDF5 pairs the elements of the memory and file
// selections in row-major order of each space; the blocks are checked to be in the same
// order in both, so element k of one is element k of the other.
void select_shard(hid_t space, const ShardSpec& s, bool global) {
  if (s.split == model::Split::none) {
    H5Sselect_all(space);
    return;
  }
  const auto& dims = global ? s.shape : s.local_shape;
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  bool any = false;
  auto add = [&] {
    H5Sselect_hyperslab(space, any ? H5S_SELECT_OR : H5S_SELECT_SET, start.data(), nullptr,
                        count.data(), nullptr);
    any = true;
  };
  for (const auto& b : s.blocks) {
    if (b.count <= 0) continue;
    start[s.split_dim] = hsize_t(global ? b.global_start : b.local_start);
    count[s.split_dim] = hsize_t(b.count);
    if (s.split != model::Split::block2d) {
      add();
      continue;
    }
    for (const auto& c : s.col_blocks) {  // 2D TP: a rectangle per row and column block
      if (c.count <= 0) continue;
      start[1] = hsize_t(global ? c.global_start : c.local_start);
      count[1] = hsize_t(c.count);
      add();
    }
  }
  if (!any) H5Sselect_none(space);
}

void check_spec(const ShardSpec& s, const ShardSpec& logical) {
  TRIDENT_CHECK(s.shape == logical.shape, "internal: ShardSpec ", s.name, " has shape ",
                h5::shape_str(s.shape), ", the model has ", h5::shape_str(logical.shape));
  TRIDENT_CHECK(s.shape.size() == s.local_shape.size(), "internal: ShardSpec ", s.name,
                " has a local shape of another rank");
  for (const auto* blocks : {&s.blocks, &s.col_blocks})
    for (std::size_t i = 1; i < blocks->size(); ++i) {
      const auto &b = (*blocks)[i], &a = (*blocks)[i - 1];
      TRIDENT_CHECK(b.global_start >= a.global_start + a.count &&
                        b.local_start >= a.local_start + a.count,
                    "internal: ShardSpec ", s.name, " has blocks out of order");
    }
}

// This rank's specs by logical name (a name may repeat: see ShardRole).
std::map<std::string, std::vector<const ShardSpec*>> index_specs(
    const std::vector<ShardSpec>& all, const std::vector<ShardSpec>& specs) {
  std::map<std::string, const ShardSpec*> logical;
  for (const auto& t : all) logical[t.name] = &t;
  std::map<std::string, std::vector<const ShardSpec*>> mine;
  for (const auto& s : specs) {
    auto it = logical.find(s.name);
    TRIDENT_CHECK(it != logical.end(), "internal: ShardSpec ", s.name, " is not a model tensor");
    check_spec(s, *it->second);
    mine[s.name].push_back(&s);
  }
  return mine;
}

// Collective transfers through MPI-IO when the file is parallel.
h5::Hid transfer_plist(const h5::File& file) {
  h5::Hid dxpl(H5Pcreate(H5P_DATASET_XFER));
  if (file.parallel()) H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  return dxpl;
}

// One H5Dwrite / H5Dread of `shard` (nullptr: this rank transfers nothing, but still makes
// the call, as collective I/O requires).
void transfer(const h5::File& file, hid_t ds, const ShardSpec* s, float* shard, bool write,
              hid_t dxpl) {
  h5::Hid fspace(H5Dget_space(ds));
  h5::Hid mspace;
  static float dummy = 0.0f;
  float* buf = &dummy;
  if (s) {
    std::vector<hsize_t> ldims(s->local_shape.begin(), s->local_shape.end());
    mspace = h5::Hid(H5Screate_simple(int(ldims.size()), ldims.data(), nullptr));
    select_shard(fspace, *s, true);
    select_shard(mspace, *s, false);
    buf = shard;
  } else {
    hsize_t one = 1;
    mspace = h5::Hid(H5Screate_simple(1, &one, nullptr));
    H5Sselect_none(fspace);
    H5Sselect_none(mspace);
  }
  herr_t st = write ? H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, buf)
                    : H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, buf);
  auto check = [&] {
    if (st < 0)
      fail(file.path(), ": cannot ", write ? "write" : "read", " dataset ", h5::object_name(ds),
           write ? " (disk full?)" : "");
  };
  // A collective transfer can fail on some ranks only (a full disk fails the MPI-IO
  // aggregators' writes): every rank fails here, or the others would wait forever in the
  // next collective call while this one unwinds.
  if (file.parallel())
    parallel::agree(file.comm(), check);
  else
    check();
}

void allreduce_sums(const h5::File& file, std::vector<std::uint64_t>& sums,
                    std::vector<std::int64_t>& counts) {
  if (!file.parallel()) return;
  parallel::Comm comm(file.comm(), "io", false);  // the file's communicator, borrowed
  comm.allreduce_sum(sums.data(), std::int64_t(sums.size()));
  comm.allreduce_sum(counts.data(), std::int64_t(counts.size()));
}

}  // namespace

std::vector<ShardSpec> all_tensor_specs(const model::ModelConfig& cfg) {
  return model::gpt_param_specs(cfg, model::StageLayout{0, cfg.n_layer, true, true}, 0, 1);
}

std::int64_t tensor_file_bytes(const model::ModelConfig& cfg, int groups) {
  std::int64_t bytes = 64 << 10;  // the superblock, root attributes, the deck's text
  for (const auto& t : all_tensor_specs(cfg)) bytes += groups * (t.numel() * 4 + 1024);
  return bytes;
}

std::uint64_t tensor_checksum(const float* data, std::int64_t n) {
  std::uint64_t h = 0;
  for (std::int64_t i = 0; i < n; ++i) h += element_hash(std::uint64_t(i), data[i]);
  return h;
}

void write_tensors(const h5::File& file, hid_t group, const model::ModelConfig& cfg,
                   const std::vector<ShardSpec>& specs, const float* flat, const ShardRole& role) {
  const auto all = all_tensor_specs(cfg);
  const auto mine = index_specs(all, specs);
  // Every element is written, so HDF5 need not fill the space first.
  h5::Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  h5::Hid dxpl = transfer_plist(file);

  std::vector<h5::Hid> datasets;
  for (const auto& t : all)
    datasets.push_back(h5::create_dataset(group, t.name, H5T_IEEE_F32LE, t.shape, dcpl));

  std::vector<std::uint64_t> sums(all.size(), 0);
  std::vector<std::int64_t> counts(all.size(), 0);
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto it = mine.find(all[i].name);
    const ShardSpec* s = it == mine.end() ? nullptr : it->second.front();
    if (s && !role.responsible_for(*s)) s = nullptr;
    // H5Dwrite takes a non-const buffer pointer; it only reads from it.
    float* shard = s ? const_cast<float*>(flat + s->offset) : nullptr;
    transfer(file, datasets[i], s, shard, true, dxpl);
    if (s) {
      sums[i] = shard_checksum(*s, shard);
      counts[i] = shard_count(*s);
    }
  }
  allreduce_sums(file, sums, counts);
  for (std::size_t i = 0; i < all.size(); ++i)
    TRIDENT_CHECK(counts[i] == all[i].numel(), file.path(), ": internal: ", all[i].name,
                  " was written with ", counts[i], " of its ", all[i].numel(),
                  " elements (the ranks' ShardRoles do not cover the model exactly once)");
  for (std::size_t i = 0; i < all.size(); ++i) h5::write_attr_u64(datasets[i], "checksum", sums[i]);
}

void read_tensors(const h5::File& file, hid_t group, const model::ModelConfig& cfg,
                  const std::vector<ShardSpec>& specs, float* flat, const ShardRole& role,
                  bool verify) {
  const auto all = all_tensor_specs(cfg);
  const auto mine = index_specs(all, specs);
  h5::Hid dxpl = transfer_plist(file);

  std::vector<h5::Hid> datasets;
  for (const auto& t : all) {
    h5::Hid ds = h5::open_dataset(group, t.name);
    H5T_class_t c = h5::dataset_class(ds);
    if (c != H5T_FLOAT)
      fail(file.path(), ": dataset ", h5::object_name(ds), " is ", h5::class_name(c),
           ", expected float32");
    auto shape = h5::dataset_shape(ds);
    if (shape != t.shape)
      fail(file.path(), ": dataset ", h5::object_name(ds), " has shape ", h5::shape_str(shape),
           ", expected ", h5::shape_str(t.shape), " for the deck's model");
    datasets.push_back(std::move(ds));
  }

  std::vector<std::uint64_t> sums(all.size(), 0);
  std::vector<std::int64_t> counts(all.size(), 0);
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto it = mine.find(all[i].name);
    const ShardSpec* s = it == mine.end() ? nullptr : it->second.front();
    float* shard = s ? flat + s->offset : nullptr;
    if (s && shard_count(*s) != s->local_numel())
      std::fill(shard, shard + s->local_numel(), 0.0f);  // TP padding rows
    transfer(file, datasets[i], s, shard, false, dxpl);
    if (!s) continue;
    for (std::size_t k = 1; k < it->second.size(); ++k)  // the same tensor again (tied wte)
      std::memcpy(flat + it->second[k]->offset, shard, std::size_t(s->local_numel()) * sizeof(float));
    if (verify && role.responsible_for(*s)) {
      sums[i] = shard_checksum(*s, shard);
      counts[i] = shard_count(*s);
    }
  }
  if (!verify) return;
  allreduce_sums(file, sums, counts);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (counts[i] != all[i].numel() || !h5::has_attr(datasets[i], "checksum")) continue;
    std::uint64_t stored = h5::read_attr_u64(datasets[i], "checksum");
    if (stored != sums[i])
      fail(file.path(), ": dataset ", h5::object_name(datasets[i]),
           " does not match its checksum (the file is damaged)");
  }
}

void write_tensor_file(const std::string& path, MPI_Comm comm, const char* format,
                       const char* group, const model::ModelConfig& cfg,
                       const std::vector<model::ShardSpec>& specs, const float* flat,
                       const ShardRole& role,
                       const std::function<void(const h5::File&)>& extra_attrs) {
  const std::string tmp = path + ".tmp";
  h5::make_parent_dir(path, comm);
  h5::check_room(path, tensor_file_bytes(cfg, 1), comm);
  {
    h5::File f = create_output(tmp, comm);
    write_format(f, format);
    write_model_attrs(f, cfg);
    if (extra_attrs) extra_attrs(f);
    {
      h5::Hid g = h5::create_group(f, group);
      write_tensors(f, g, cfg, specs, flat, role);
    }
    f.flush();
    f.close();
  }
  h5::commit_file(tmp, path, comm);
}

}  // namespace trident::io
