// metrics.h5: extendable columns, appended and flushed per step (see trident/io/metrics.hpp).
#include "trident/io/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "trident/core/error.hpp"
#include "trident/core/fault.hpp"
#include "trident/core/log.hpp"
#include "trident/io/h5.hpp"

namespace fs = std::filesystem;

namespace trident::io {

namespace {

constexpr hsize_t kChunkRows = 1024;
const char* const kStandard[] = {"loss", "lr", "grad_norm", "step_time_s", "tokens_per_s"};

// A table: 1-D datasets of one length in one group; "step" (int64) and float64 columns.
struct Table {
  std::string group;  // "" (the root) or "eval"
  std::vector<std::pair<std::string, h5::Hid>> columns;
  std::int64_t rows = 0;

  hid_t find(const std::string& name) const {
    for (const auto& c : columns)
      if (c.first == name) return c.second;
    return H5I_INVALID_HID;
  }
  std::string full(const std::string& name) const {
    return group.empty() ? name : group + "/" + name;
  }
};

h5::Hid new_column(const h5::File& f, const std::string& name, bool is_step,
                   std::int64_t rows) {
  h5::Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl, 1, &kChunkRows);
  if (is_step) {
    std::int64_t fill = -1;
    H5Pset_fill_value(dcpl, H5T_NATIVE_INT64, &fill);
  } else {
    double fill = std::numeric_limits<double>::quiet_NaN();
    H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &fill);
  }
  return h5::create_dataset(f, name, is_step ? H5T_STD_I64LE : H5T_IEEE_F64LE, {rows}, dcpl, {-1});
}

void resize(const h5::File& f, hid_t ds, std::int64_t rows) {
  hsize_t n = hsize_t(rows);
  if (H5Dset_extent(ds, &n) < 0) fail(f.path(), ": cannot resize ", h5::object_name(ds));
}

// Writes one value at row `row` (the dataset already holds row + 1 rows).
void put(const h5::File& f, hid_t ds, std::int64_t row, hid_t mem_type, const void* value) {
  h5::Hid fspace(H5Dget_space(ds));
  hsize_t start = hsize_t(row), count = 1;
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  h5::Hid mspace(H5Screate_simple(1, &count, nullptr));
  if (H5Dwrite(ds, mem_type, mspace, fspace, H5P_DEFAULT, value) < 0)
    fail(f.path(), ": cannot write ", h5::object_name(ds), " (disk full?)");
}

// Opens every 1-D dataset of a table's group (an existing file).
void open_table(const h5::File& f, Table& t) {
  h5::Hid g = t.group.empty() ? h5::open_group(f, "/") : h5::open_group(f, t.group);
  H5G_info_t info;
  H5Gget_info(g, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256];
    if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name,
                           H5P_DEFAULT) < 0)
      continue;
    H5O_info_t oi;
    if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET) continue;
    h5::Hid ds = h5::open_dataset(g, name);
    if (h5::dataset_shape(ds).size() == 1) t.columns.emplace_back(name, std::move(ds));
  }
  hid_t step = t.find("step");
  if (step < 0) fail(f.path(), ": missing dataset /", t.full("step"));
  t.rows = h5::dataset_shape(step)[0];
}

// Drops the rows whose step > resume_step and makes every column the same length.
void truncate(const h5::File& f, Table& t, std::int64_t resume_step) {
  std::vector<std::int64_t> steps(std::size_t(t.rows));
  if (t.rows > 0 &&
      H5Dread(t.find("step"), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()) < 0)
    fail(f.path(), ": cannot read /", t.full("step"));
  auto keep = std::find_if(steps.begin(), steps.end(),
                           [&](std::int64_t s) { return s > resume_step || s < 0; });
  t.rows = keep - steps.begin();
  for (auto& c : t.columns) resize(f, c.second, t.rows);
}

// Adds the columns of `names` that the table lacks (NaN for the rows it has).
void ensure_columns(const h5::File& f, Table& t, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (t.find(n) < 0) t.columns.emplace_back(n, new_column(f, t.full(n), n == "step", t.rows));
}

}  // namespace

struct MetricsWriter::Impl {
  std::string path;
  h5::File file;
  Table train{"", {}, 0}, eval{"eval", {}, 0};
  std::map<std::string, double> pending;  // extra columns of the next row

  void open(std::int64_t resume_step, const std::vector<std::string>& extra) {
    std::vector<std::string> train_cols = {"step"};
    for (const char* c : kStandard) train_cols.push_back(c);
    train_cols.insert(train_cols.end(), extra.begin(), extra.end());
    const std::vector<std::string> eval_cols = {"step", "loss"};

    std::error_code ec;
    if (resume_step >= 0 && fs::exists(path, ec)) {
      try {
        file = h5::open_file(path, h5::Mode::read_write, /*file_locking=*/false);
        open_table(file, train);
        // Extra columns in subgroups (comm/tp/bytes) are not direct children of the root.
        for (const auto& n : extra)
          if (n.find('/') != std::string::npos && train.find(n) < 0 && h5::exists(file, n))
            train.columns.emplace_back(n, h5::open_dataset(file, n));
        if (h5::exists(file, "eval")) open_table(file, eval);
        truncate(file, train, resume_step);
        truncate(file, eval, resume_step);
      } catch (const Error& e) {
        log::warn(e.what(), "; moving it to ", path, ".bad and starting a new metrics file");
        train.columns.clear();
        eval.columns.clear();
        train.rows = eval.rows = 0;
        file = h5::File();
        fs::rename(path, path + ".bad", ec);
      }
    }
    const bool fresh = !file.valid();
    if (fresh) file = h5::open_file(path, h5::Mode::create, /*file_locking=*/false);
    try {
      ensure_columns(file, train, train_cols);
      ensure_columns(file, eval, eval_cols);
      flush_within(0);  // the headers just created are inside HDF5's end of file already
    } catch (const Error&) {
      // Nothing of this run is in the file: a new one holds no rows and goes; an old one
      // stays as the last run left it (its rows past resume_step are dropped next time).
      abandon();
      if (fresh) {
        std::error_code ignored;
        fs::remove(path, ignored);
      }
      throw;
    }
  }

  // Flushes, once the blocks the flush may write past the end of the file are allocated on
  // disk: up to HDF5's end of file (what it has allocated, metadata included), plus
  // `chunk_bytes` (raw chunks get their file space at the flush) and 16 KiB of slack. A disk
  // filled since the room check then fails the reservation, before HDF5 has written
  // anything, never the flush halfway (which left a superblock pointing past the end of the
  // file: unreadable). On any failure the file is abandoned unflushed: on disk it stays as
  // the last good flush left it, every row up to there readable.
  void flush_within(std::int64_t chunk_bytes) {
    try {
      hsize_t hdf5_end = 0;
      if (H5Fget_filesize(file.id(), &hdf5_end) < 0)
        fail(path, ": cannot ask HDF5 for the file's size");
      const int injected = fault::armed(fault::Kind::disk_full_in_metrics) ? ENOSPC : 0;
      h5::reserve_room(path, std::int64_t(hdf5_end) + chunk_bytes + (16 << 10), injected);
      file.flush();
    } catch (const Error&) {
      abandon();
      throw;
    }
  }

  // After a failed write: nothing more goes to the file. Not even the columns are closed
  // (H5Dclose writes a dataset's cached chunks out); the process exits with the error.
  void abandon() {
    failed = true;
    for (Table* t : {&train, &eval}) {
      for (auto& c : t->columns) (void)c.second.release();
      t->columns.clear();
    }
    file.abandon();
  }

  // One row, all or nothing (issue 32: a full disk left a row of step -1 and NaN). The
  // room for a new chunk of every column is checked before the columns grow into it, and
  // reserved on disk before the flush (flush_within); the values go in before the step (a
  // row with a step is complete). On a failure nothing more is written to the file: on
  // disk it holds the rows of the last good flush.
  void append_row(Table& t, std::int64_t step, const std::map<std::string, double>& values) {
    const std::int64_t row = t.rows;
    const bool new_chunk = row % std::int64_t(kChunkRows) == 0;
    // A chunk of every column, 8 bytes a row, and room for its entry in the chunk index.
    const std::int64_t chunk_bytes =
        new_chunk ? std::int64_t(t.columns.size()) * (std::int64_t(kChunkRows) * 8 + (4 << 10))
                  : 0;
    if (new_chunk) h5::check_room(path, chunk_bytes + (16 << 10), MPI_COMM_NULL);
    try {
      for (auto& c : t.columns) resize(file, c.second, row + 1);
      for (auto& c : t.columns) {
        if (c.first == "step") continue;
        auto it = values.find(c.first);
        if (it != values.end()) put(file, c.second, row, H5T_NATIVE_DOUBLE, &it->second);
      }
      put(file, t.find("step"), row, H5T_NATIVE_INT64, &step);
    } catch (const Error&) {
      // Only in HDF5's caches so far: abandoned, the file on disk is the last flush's.
      abandon();
      throw;
    }
    flush_within(chunk_bytes);
    t.rows = row + 1;
  }

  bool failed = false;  // an append failed and said so: closing is best effort, quietly
};

MetricsWriter::MetricsWriter(const std::string& out_dir, std::int64_t resume_step,
                             const std::vector<std::string>& extra_columns)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = (fs::path(out_dir) / "metrics.h5").string();
  for (const auto& c : extra_columns) {
    bool standard = c == "step";
    for (const char* s : kStandard) standard = standard || c == s;
    // A column may sit in a subgroup ("comm/tp/bytes"), never in eval/ or at a path's ends.
    const bool path_ok = !c.empty() && c.front() != '/' && c.back() != '/' &&
                         c.find("//") == std::string::npos && c.rfind("eval/", 0) != 0;
    TRIDENT_CHECK(!standard && path_ok, impl_->path,
                  ": bad extra metrics column '", c, "'");
  }
  h5::make_parent_dir(impl_->path, MPI_COMM_NULL);
  impl_->open(resume_step, extra_columns);
}

MetricsWriter::~MetricsWriter() {
  if (!impl_) return;
  try {
    close();
  } catch (const Error& e) {
    if (!impl_->failed) log::warn(e.what());
  }
}

MetricsWriter::MetricsWriter(MetricsWriter&&) noexcept = default;
MetricsWriter& MetricsWriter::operator=(MetricsWriter&&) noexcept = default;

void MetricsWriter::set(const std::string& column, double value) {
  TRIDENT_CHECK(impl_->train.find(column) >= 0 && column != "step", impl_->path,
                ": no metrics column '", column, "' (extra columns are named at creation)");
  impl_->pending[column] = value;
}

void MetricsWriter::append(const StepMetrics& m) {
  auto values = std::move(impl_->pending);
  impl_->pending.clear();
  values["loss"] = m.loss;
  values["lr"] = m.lr;
  values["grad_norm"] = m.grad_norm;
  values["step_time_s"] = m.step_time_s;
  values["tokens_per_s"] = m.tokens_per_s;
  impl_->append_row(impl_->train, m.step, values);
}

void MetricsWriter::append_eval(std::int64_t step, double loss) {
  impl_->append_row(impl_->eval, step, {{"loss", loss}});
}

void MetricsWriter::close() {
  if (!impl_->file.valid()) return;
  impl_->train.columns.clear();
  impl_->eval.columns.clear();
  impl_->file.close();
}

std::vector<double> read_metrics_column(const std::string& path, const std::string& column) {
  h5::File f = h5::open_file(path, h5::Mode::read, /*file_locking=*/false);
  TRIDENT_CHECK(h5::exists(f, column), path, ": no metrics column '", column, "'");
  h5::Hid ds = h5::open_dataset(f, column);
  const std::vector<std::int64_t> shape = h5::dataset_shape(ds);
  TRIDENT_CHECK(shape.size() == 1, path, ": /", column, " is not a 1-D column");
  std::vector<double> v(static_cast<std::size_t>(shape[0]));
  if (!v.empty() && H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    fail(path, ": cannot read /", column);
  return v;
}

const std::string& MetricsWriter::path() const { return impl_->path; }
std::int64_t MetricsWriter::rows() const { return impl_->train.rows; }
std::int64_t MetricsWriter::eval_rows() const { return impl_->eval.rows; }

}  // namespace trident::io
