// trident/io/metrics.hpp — <out_dir>/metrics.h5 (FORMAT.md): 1-D extendable datasets with
// one entry per optimizer step, `step` (int64), `loss`, `lr`, `grad_norm`, `step_time_s`,
// `tokens_per_s` (float64) and any extra float64 columns; `eval/step`, `eval/loss` one
// entry per evaluation. Written by rank 0 alone, serially.
// defines: trident::io::StepMetrics, MetricsWriter, read_metrics_column
//
// Every append ends with H5Fflush, so the file on disk is complete after each row, and the
// writer opens it without HDF5 file locking: `h5py.File(path, "r")` can read it while the
// run goes on (a read that races a flush may fail; read again). Each flush first reserves
// on disk the blocks it may write (h5::reserve_room); an append that fails (a full disk)
// abandons the file unflushed, so that it stays readable with every row flushed before.
// Appending after a failed append is not possible (the writer holds no file any more).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trident::io {

struct StepMetrics {
  std::int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double step_time_s = 0.0;
  double tokens_per_s = 0.0;
};

class MetricsWriter {
 public:
  // Opens <out_dir>/metrics.h5 (creating out_dir). resume_step < 0: a new file (an old one
  // is replaced). resume_step >= 0: the existing file, less every row (train and eval)
  // whose step > resume_step; a new file when there is none, and a damaged one is moved
  // aside to metrics.h5.bad with a warning. extra_columns: more float64 columns of the step
  // table (on resume, columns already in the file are kept too; a column new to the file
  // reads NaN for the earlier rows).
  explicit MetricsWriter(const std::string& out_dir, std::int64_t resume_step = -1,
                         const std::vector<std::string>& extra_columns = {});
  ~MetricsWriter();  // closes; errors there are warnings, never exceptions
  MetricsWriter(MetricsWriter&&) noexcept;
  MetricsWriter& operator=(MetricsWriter&&) noexcept;

  // The value of an extra column for the next append (NaN when not set for a row).
  void set(const std::string& column, double value);
  // Appends one row of the step table and flushes.
  void append(const StepMetrics& m);
  // Appends one row of the eval table (eval/step, eval/loss) and flushes.
  void append_eval(std::int64_t step, double loss);
  void close();

  const std::string& path() const;
  std::int64_t rows() const;       // of the step table
  std::int64_t eval_rows() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One float64 column of metrics.h5's step table (`step` too, as float64), every row; an
// error naming the file when the file or the column is missing.
std::vector<double> read_metrics_column(const std::string& path, const std::string& column);

}  // namespace trident::io
