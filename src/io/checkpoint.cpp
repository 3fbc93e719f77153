// Checkpoints: atomic collective writes, any-layout reads, discovery and pruning
// (see trident/io/checkpoint.hpp).
#include "trident/io/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "trident/core/error.hpp"
#include "trident/core/fault.hpp"
#include "trident/core/log.hpp"
#include "trident/io/format.hpp"
#include "trident/io/tensor_io.hpp"

namespace fs = std::filesystem;

namespace trident::io {

namespace {

constexpr const char* kExpAvg = "optimizer/exp_avg";
constexpr const char* kExpAvgSq = "optimizer/exp_avg_sq";
constexpr const char* kPreviousWeights = "previous_model";

struct Entry {
  std::int64_t step;
  fs::path path;
  bool tmp;
};

// "step-<8 or more digits>.h5[.tmp]": the step and whether it is a .tmp; false otherwise.
bool parse_name(const std::string& name, std::int64_t& step, bool& tmp) {
  const std::string prefix = "step-";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  std::size_t i = prefix.size(), digits = 0;
  step = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 18; ++i, ++digits)
    step = step * 10 + (name[i] - '0');
  if (digits < 8) return false;
  const std::string rest = name.substr(i);
  tmp = rest == ".h5.tmp";
  return tmp || rest == ".h5";
}

// step-*.h5 and step-*.h5.tmp files of a directory, newest step first.
std::vector<Entry> scan(const std::string& dir) {
  std::vector<Entry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::int64_t step;
    bool tmp;
    if (e.is_regular_file(ec) && parse_name(e.path().filename().string(), step, tmp))
      out.push_back({step, e.path(), tmp});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.step != b.step ? a.step > b.step : a.tmp < b.tmp;
  });
  return out;
}

// read_checkpoint_state and the name/attribute agreement; the reason when unusable.
std::optional<std::string> unusable(const Entry& e) {
  try {
    CheckpointState st = read_checkpoint_state(e.path.string());
    if (st.step != e.step)
      return str(e.path.string(), ": attribute step = ", st.step, " does not match the name");
    return std::nullopt;
  } catch (const Error& err) {
    return std::string(err.what());
  }
}

CheckpointState read_state(const h5::File& f) {
  check_format(f, {kCheckpointFormat});
  CheckpointState st;
  st.step = h5::read_attr_int(f, "step");
  st.consumed_samples = h5::read_attr_int(f, "consumed_samples");
  st.seed = h5::read_attr_u64(f, "seed");
  st.config = h5::read_attr_string(f, "config");
  st.optimizer_steps =
      h5::has_attr(f, "optimizer_steps") ? h5::read_attr_int(f, "optimizer_steps") : st.step;
  if (st.step < 0 || st.consumed_samples < 0)
    fail(f.path(), ": step = ", st.step, ", consumed_samples = ", st.consumed_samples,
         ", expected non-negative integers");
  return st;
}

}  // namespace

std::string checkpoint_path(const std::string& checkpoint_dir, std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08lld.h5", static_cast<long long>(step));
  return (fs::path(checkpoint_dir) / name).string();
}

std::string write_checkpoint(const std::string& checkpoint_dir, MPI_Comm comm,
                             const model::ModelConfig& cfg,
                             const std::vector<model::ShardSpec>& specs,
                             const CheckpointState& state, const float* params,
                             const float* exp_avg, const float* exp_avg_sq,
                             const ShardRole& role, const float* previous_params) {
  TRIDENT_CHECK(params && exp_avg && exp_avg_sq, "write_checkpoint: a buffer is missing");
  const std::string path = checkpoint_path(checkpoint_dir, state.step);
  const std::string tmp = path + ".tmp";
  h5::make_parent_dir(path, comm);
  h5::check_room(path,
                 tensor_file_bytes(cfg, previous_params ? 4 : 3) +
                     std::int64_t(state.config.size()),
                 comm);
  {
    h5::File f = create_output(tmp, comm);
    write_format(f, kCheckpointFormat);
    write_model_attrs(f, cfg);
    h5::write_attr_int(f, "step", state.step);
    h5::write_attr_int(f, "consumed_samples", state.consumed_samples);
    h5::write_attr_int(f, "optimizer_steps",
                       state.optimizer_steps < 0 ? state.step : state.optimizer_steps);
    h5::write_attr_u64(f, "seed", state.seed);
    h5::write_attr_string(f, "config", state.config);
    {
      h5::Hid g = h5::create_group(f, "model");
      write_tensors(f, g, cfg, specs, params, role);
    }
    fault::at_checkpoint_write();  // tests: a rank killed mid-write (core/fault.hpp)
    {
      h5::Hid g = h5::create_group(f, kExpAvg);
      write_tensors(f, g, cfg, specs, exp_avg, role);
    }
    {
      h5::Hid g = h5::create_group(f, kExpAvgSq);
      write_tensors(f, g, cfg, specs, exp_avg_sq, role);
    }
    if (previous_params) {
      h5::Hid g = h5::create_group(f, kPreviousWeights);
      write_tensors(f, g, cfg, specs, previous_params, role);
    }
    f.flush();
    f.close();
  }
  h5::commit_file(tmp, path, comm);
  return path;
}

CheckpointState read_checkpoint(const std::string& path, MPI_Comm comm,
                                const model::ModelConfig& cfg,
                                const std::vector<model::ShardSpec>& specs, float* params,
                                float* exp_avg, float* exp_avg_sq, const ShardRole& role,
                                float* previous_params) {
  h5::File f = open_input(path, comm);
  CheckpointState st = read_state(f);
  check_model_attrs(f, cfg);
  {
    h5::Hid g = h5::open_group(f, "model");
    read_tensors(f, g, cfg, specs, params, role);
  }
  if (exp_avg) {
    h5::Hid g = h5::open_group(f, kExpAvg);
    read_tensors(f, g, cfg, specs, exp_avg, role);
  }
  if (exp_avg_sq) {
    h5::Hid g = h5::open_group(f, kExpAvgSq);
    read_tensors(f, g, cfg, specs, exp_avg_sq, role);
  }
  st.has_previous_params = h5::exists(f, kPreviousWeights);
  if (previous_params && st.has_previous_params) {
    h5::Hid g = h5::open_group(f, kPreviousWeights);
    read_tensors(f, g, cfg, specs, previous_params, role);
  }
  return st;
}

CheckpointState read_checkpoint_state(const std::string& path) {
  h5::File f = h5::open_file(path, h5::Mode::read);
  CheckpointState st = read_state(f);
  read_model_attrs(f);
  for (const char* g : {"model", kExpAvg, kExpAvgSq})
    if (!h5::exists(f, g)) fail(path, ": missing group /", g);
  return st;
}

std::optional<std::string> find_latest_checkpoint(const std::string& checkpoint_dir,
                                                  bool set_damaged_aside_too) {
  for (const auto& e : scan(checkpoint_dir)) {
    if (e.tmp) continue;
    if (auto why = unusable(e)) {
      if (set_damaged_aside_too)
        set_damaged_aside(e.path.string(), *why);
      else
        log::warn("skipping checkpoint: ", *why);
      continue;
    }
    return e.path.string();
  }
  return std::nullopt;
}

std::string set_damaged_aside(const std::string& path, const std::string& why) {
  std::string aside = path + ".damaged";
  std::error_code ec;
  for (int k = 1; fs::exists(aside, ec); ++k) aside = str(path, ".damaged.", k);
  fs::rename(path, aside, ec);
  if (ec) {
    log::warn("skipping damaged checkpoint (", why, "); cannot rename it to ", aside, ": ",
              ec.message());
    return path;
  }
  log::warn("skipping damaged checkpoint, kept as ", aside, ": ", why);
  return aside;
}

std::vector<std::string> prune_checkpoints(const std::string& checkpoint_dir, int keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  const auto entries = scan(checkpoint_dir);
  int kept = 0;
  std::int64_t oldest_kept = -1;
  for (const auto& e : entries) {
    if (e.tmp || unusable(e)) continue;
    oldest_kept = e.step;
    if (++kept == keep) break;
  }
  if (kept < keep) return removed;  // not more complete checkpoints than we keep
  for (const auto& e : entries) {
    if (e.step >= oldest_kept) continue;
    std::error_code ec;
    if (fs::remove(e.path, ec))
      removed.push_back(e.path.string());
    else if (ec)
      log::warn("cannot delete old checkpoint ", e.path.string(), ": ", ec.message());
  }
  return removed;
}

}  // namespace trident::io
