// trident/io/h5.hpp — thin RAII over the HDF5 C API (the parallel build has no C++ API):
// handles that close themselves, files opened serially or through MPI-IO, attribute and
// dataset helpers whose errors are one line naming the file and what was expected.
// defines: trident::io::h5::Hid, Mode, File, quiet, open_file, open_file_parallel,
//          file_name, object_name, shape_str, exists, create_group, open_group,
//          open_dataset, create_dataset, dataset_shape, dataset_class, class_name,
//          read_attr_int/_u64/_double/_string/_ints/_doubles, write_attr_* (same kinds),
//          has_attr, commit_file, make_parent_dir, check_room, reserve_room, start_library,
//          stop_library
//
// Every function here silences HDF5's own error-stack printing first (quiet()), so that a
// user sees only our line, e.g. "run/ck.h5: missing dataset /model/wte".
//
// Parallel rules (HDF5's, not ours): with a file opened by open_file_parallel, every
// operation that changes metadata (creating groups, datasets, attributes, writing
// attributes) and, because we turn on collective metadata reads, every open/read of
// metadata is COLLECTIVE: all ranks of the file's communicator make the same calls in
// the same order with the same arguments.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trident::io::h5 {

// Turns off HDF5's automatic printing of its error stack (H5Eset_auto2(H5E_DEFAULT,
// nullptr, nullptr)). Called by every open; cheap to call again.
void quiet();

// HDF5's start and end, around MPI's (main calls them). Started before MPI_Init, HDF5 does
// not hook its shutdown into MPI_Finalize (nor, with H5dont_atexit, into exit): a file whose
// H5Fclose failed (a full disk) is left half-closed by HDF5 1.10, and its shutdown then
// crashes in H5F__close_cb. stop_library shuts HDF5 down unless such a close failed (then
// the process exits with the error it already has; the OS closes the descriptors).
void start_library();
void stop_library();

// An owned HDF5 identifier of any kind; closed with the function for its type (H5Fclose,
// H5Gclose, H5Dclose, H5Sclose, H5Tclose, H5Aclose, H5Pclose) when it goes away.
class Hid {
 public:
  Hid() = default;
  explicit Hid(hid_t id) : id_(id) {}
  ~Hid() { reset(); }
  Hid(Hid&& o) noexcept : id_(o.release()) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.release();
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // so that a Hid goes straight into H5* calls
  bool valid() const { return id_ >= 0; }
  hid_t release() {
    hid_t i = id_;
    id_ = H5I_INVALID_HID;
    return i;
  }
  // Closes now; returns the close function's status (negative on failure).
  herr_t close();
  void reset() noexcept { (void)close(); }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

enum class Mode {
  read,        // existing file, read-only
  create,      // new file; an existing one is truncated
  read_write,  // existing file, read and write
};

// An open HDF5 file, with its path (for messages) and, when opened through MPI-IO, the
// communicator it was opened on (not owned: it must outlive the File).
class File {
 public:
  File() = default;
  // A parallel file being written that is dropped by an error (an exception unwinding) is
  // abandoned, not closed:
  // H5Fclose is collective, and after a failed collective write (a full disk) the ranks
  // take different paths through it and wait in different barriers (issue 32). Its
  // descriptors stay open until exit; HDF5 is then not shut down (see stop_library).
  ~File();
  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;

  hid_t id() const { return id_.get(); }
  operator hid_t() const { return id_.get(); }
  bool valid() const { return id_.valid(); }
  const std::string& path() const { return path_; }
  MPI_Comm comm() const { return comm_; }  // MPI_COMM_NULL for a serial file
  bool parallel() const { return comm_ != MPI_COMM_NULL; }

  // H5Fflush(H5F_SCOPE_GLOBAL): the file on disk is complete and consistent afterwards
  // (and, with MPI-IO, MPI_File_sync'ed). Collective for a parallel file.
  void flush();
  // Closes the file, throwing an Error that names it if HDF5 cannot (the last flush of
  // metadata happens here, so a full disk shows up at close). Collective when parallel.
  void close();
  // Drops the file without writing anything more to it (no flush, no close): what is on
  // disk stays the last successful flush. For a serial writer whose write failed: closing
  // would flush HDF5's changed metadata into a file that may have no room for it. The
  // descriptor stays open until exit; HDF5 is then not shut down (see stop_library).
  void abandon();

 private:
  friend File open_file(const std::string&, Mode, bool);
  friend File open_file_parallel(const std::string&, MPI_Comm, Mode);
  Hid id_;
  std::string path_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool writing_ = false;  // opened to create or change it
};

// Opens a file with the default (POSIX, sec2) driver, for one process. Errors: a missing
// file ("no such file"), a file that is not HDF5, a file HDF5 cannot open (truncated,
// damaged, locked). `file_locking = false` lets a reader open the file while another
// process writes it (the metrics file); see metrics.hpp.
File open_file(const std::string& path, Mode mode, bool file_locking = true);

// Opens a file on every rank of `comm` through MPI-IO (H5Pset_fapl_mpio), with collective
// metadata reads and writes and large objects aligned for parallel file systems.
// Collective: every rank of comm calls it with the same path and mode.
File open_file_parallel(const std::string& path, MPI_Comm comm, Mode mode);

// Names for messages: the file an object lives in, and the object's path in it.
std::string file_name(hid_t obj);
std::string object_name(hid_t obj);
// "[50, 8]"
std::string shape_str(const std::vector<std::int64_t>& shape);

// True when every link along `path` ("a/b/c", relative to loc or absolute) exists.
bool exists(hid_t loc, const std::string& path);

// Creates a group, and any missing groups above it. Collective when parallel.
Hid create_group(hid_t loc, const std::string& name);
// Errors name the file and the missing group or dataset ("x.h5: missing dataset /inputs").
// A dataset another tool wrote with a filter this HDF5 library cannot decode (h5py's lzf,
// a plugin's compressor) is refused here, naming the filter, instead of failing its reads.
Hid open_group(hid_t loc, const std::string& name);
Hid open_dataset(hid_t loc, const std::string& name, hid_t dapl = H5P_DEFAULT);

// Creates a dataset of `file_type` with dims (empty: a scalar), a dataset creation property
// list (e.g. chunking) and maxdims for extendable datasets (-1: unlimited; empty: = dims);
// intermediate groups are created. Collective when parallel.
Hid create_dataset(hid_t loc, const std::string& name, hid_t file_type,
                   const std::vector<std::int64_t>& dims, hid_t dcpl = H5P_DEFAULT,
                   const std::vector<std::int64_t>& maxdims = {});

// A dataset's shape (empty for a scalar) and type class (H5T_FLOAT, H5T_INTEGER, ...).
std::vector<std::int64_t> dataset_shape(hid_t dataset);
H5T_class_t dataset_class(hid_t dataset);
const char* class_name(H5T_class_t c);  // "float", "integer", "string", ...

// Attributes on a file (its root group), group or dataset. Readers convert from any
// integer (resp. float or integer) type and throw an Error naming the file, the object
// and the attribute when it is missing or of another kind. Writers replace an existing
// attribute of the same name. Strings are written as variable-length UTF-8 (h5py reads
// them as str); fixed-length strings are read too.
bool has_attr(hid_t obj, const std::string& name);
std::int64_t read_attr_int(hid_t obj, const std::string& name);
std::uint64_t read_attr_u64(hid_t obj, const std::string& name);
double read_attr_double(hid_t obj, const std::string& name);
std::string read_attr_string(hid_t obj, const std::string& name);
std::vector<std::int64_t> read_attr_ints(hid_t obj, const std::string& name);
std::vector<double> read_attr_doubles(hid_t obj, const std::string& name);
void write_attr_int(hid_t obj, const std::string& name, std::int64_t value);
void write_attr_u64(hid_t obj, const std::string& name, std::uint64_t value);
void write_attr_double(hid_t obj, const std::string& name, double value);
void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
void write_attr_ints(hid_t obj, const std::string& name, const std::vector<std::int64_t>& v);
void write_attr_doubles(hid_t obj, const std::string& name, const std::vector<double>& v);

// Atomic publication of a file written under a temporary name: after every rank of comm
// has closed `tmp_path`, rank 0 renames it to `final_path` (rename(2) is atomic, so a
// reader sees the old file or the complete new one, never a partial one) and syncs the
// directory; every rank returns only after the rename, or throws the same Error.
// comm may be MPI_COMM_NULL (one process, no MPI).
void commit_file(const std::string& tmp_path, const std::string& final_path, MPI_Comm comm);

// Creates the parent directory of `path` (rank 0 of comm, then a barrier). comm may be
// MPI_COMM_NULL.
void make_parent_dir(const std::string& path, MPI_Comm comm);

// Fails (the same Error on every rank of comm) when a file of about `bytes` cannot be
// written at `path`: more than its file system has free (rank 0 asks), or more than a
// rank's file size limit (ulimit -f). Writers of large parallel files call it before
// creating them: parallel HDF5 cannot close a file whose write failed on some ranks only
// without hanging, so a full disk is caught here, while every rank can still fail cleanly.
void check_room(const std::string& path, std::int64_t bytes, MPI_Comm comm);

// Allocates disk blocks from the end of the existing file `path` up to byte `end` (nothing
// when the file reaches there already), with fallocate's FALLOC_FL_KEEP_SIZE: the file's
// size and contents are unchanged (file systems with the plain mode only grow the file to
// `end` with zeros). So HDF5's next flush, which writes there, cannot meet a full disk
// halfway (and leave a superblock pointing past the end of the file). An Error naming the
// file and the figure when the file system has no room (ENOSPC, EDQUOT, EFBIG); nothing
// where it has no fallocate at all (the flush then meets a full disk itself).
// `injected_errno` (tests only, core/fault.hpp) fails as if fallocate had returned it.
// One process; no MPI.
void reserve_room(const std::string& path, std::int64_t end, int injected_errno = 0);

}  // namespace trident::io::h5
