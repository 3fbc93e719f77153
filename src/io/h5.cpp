// RAII handles, file opening and attribute helpers over the HDF5 C API (see trident/io/h5.hpp).
#include "trident/io/h5.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <system_error>

#include "trident/core/error.hpp"
#include "trident/core/fault.hpp"
#include "trident/core/memory_usage.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/comm.hpp"

namespace fs = std::filesystem;

namespace trident::io::h5 {

// Alignment of large objects in files written through MPI-IO. Parallel file systems hand
// out a file in stripes (Lustre: 1 MiB by default) or blocks (GPFS: 1-16 MiB) and lock at
// that granularity; an object that starts on a stripe boundary never shares its first
// stripe with another tensor (or with metadata), so ranks writing different tensors do not
// contend for the same lock and the MPI-IO aggregators get whole stripes. Only objects of
// at least 1 MiB are aligned: the many small tensors (biases, LayerNorms) stay packed, and
// the gaps before large ones are holes in a sparse file, not written bytes.
constexpr hsize_t kAlignThreshold = hsize_t(1) << 20;
constexpr hsize_t kAlignment = hsize_t(1) << 20;

void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

// The most specific message on HDF5's error stack (for the tail of our own messages).
herr_t first_desc(unsigned, const H5E_error2_t* e, void* data) {
  auto* s = static_cast<std::string*>(data);
  if (s->empty() && e && e->desc) *s = e->desc;
  return 0;
}
std::string hdf5_detail() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_desc, &s);
  // The sec2 driver's write/read failures span two lines with a time, buffer addresses and
  // offsets: keep "file write failed: No space left on device", so the error stays one line.
  const std::string tag = "error message = '";
  const std::size_t at = s.find(tag);
  const std::size_t end = at == std::string::npos ? at : s.find('\'', at + tag.size());
  if (end != std::string::npos)
    s = s.substr(0, s.find(':')) + ": " + s.substr(at + tag.size(), end - at - tag.size());
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s.empty() ? std::string() : " (HDF5: " + s + ")";
}

std::string abs_name(hid_t loc, const std::string& name) {
  if (!name.empty() && name[0] == '/') return name;
  std::string base = object_name(loc);
  if (base.empty() || base == "/") return "/" + name;
  return base + "/" + name;
}

// "<file>: " prefix for messages about an object.
std::string in(hid_t obj) { return file_name(obj) + ": "; }

void check(herr_t status, hid_t obj, const std::string& what) {
  if (status < 0) fail(in(obj), what, hdf5_detail());
}

// H5Fcreate / H5Fopen with our checks and messages; returns the file id.
hid_t open_with(const std::string& path, Mode mode, hid_t fapl) {
  hid_t id;
  if (mode == Mode::create) {
    id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (id < 0)
      fail(path, ": cannot create the HDF5 file (does its directory exist, is it writable?)",
           hdf5_detail());
    return id;
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, ": no such file");
  if (fs::is_directory(path, ec)) fail(path, ": is a directory, expected an HDF5 file");
  htri_t is = H5Fis_hdf5(path.c_str());
  if (is == 0) fail(path, ": not an HDF5 file");
  if (is < 0) fail(path, ": cannot read the file", hdf5_detail());
  id = H5Fopen(path.c_str(), mode == Mode::read ? H5F_ACC_RDONLY : H5F_ACC_RDWR, fapl);
  if (id < 0) fail(path, ": HDF5 cannot open it, truncated or damaged?", hdf5_detail());
  return id;
}

// An attribute opened for reading, with the checks every reader does.
Hid open_attr(hid_t obj, const std::string& name) {
  quiet();
  htri_t e = H5Aexists(obj, name.c_str());
  if (e <= 0) fail(in(obj), "missing attribute '", name, "' on ", object_name(obj));
  Hid a(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  check(a.valid() ? 0 : -1, obj, "cannot open attribute '" + name + "'");
  return a;
}

H5T_class_t attr_class(hid_t attr) {
  Hid t(H5Aget_type(attr));
  return H5Tget_class(t);
}

hssize_t attr_points(hid_t attr) {
  Hid s(H5Aget_space(attr));
  return H5Sget_simple_extent_npoints(s);
}

[[noreturn]] void wrong_kind(hid_t obj, const std::string& name, hid_t attr,
                             const char* expected) {
  fail(in(obj), "attribute '", name, "' on ", object_name(obj), " is ",
       class_name(attr_class(attr)), ", expected ", expected);
}

// Reads a numeric attribute of any element count into `mem_type` values.
template <typename T>
std::vector<T> read_numeric(hid_t obj, const std::string& name, hid_t mem_type, bool allow_float,
                            const char* expected) {
  Hid a = open_attr(obj, name);
  H5T_class_t c = attr_class(a);
  if (!(c == H5T_INTEGER || (allow_float && c == H5T_FLOAT))) wrong_kind(obj, name, a, expected);
  hssize_t n = attr_points(a);
  std::vector<T> v(std::size_t(n < 0 ? 0 : n));
  if (!v.empty()) check(H5Aread(a, mem_type, v.data()), obj, "cannot read attribute '" + name + "'");
  return v;
}

template <typename T>
T read_scalar(hid_t obj, const std::string& name, hid_t mem_type, bool allow_float,
              const char* expected) {
  auto v = read_numeric<T>(obj, name, mem_type, allow_float, expected);
  if (v.size() != 1)
    fail(in(obj), "attribute '", name, "' on ", object_name(obj), " has ", v.size(),
         " values, expected one");
  return v[0];
}

// Creates (replacing) an attribute of `file_type` with `n` values (n < 0: scalar).
Hid new_attr(hid_t obj, const std::string& name, hid_t file_type, hssize_t n) {
  quiet();
  if (H5Aexists(obj, name.c_str()) > 0)
    check(H5Adelete(obj, name.c_str()), obj, "cannot replace attribute '" + name + "'");
  Hid space;
  if (n < 0) {
    space = Hid(H5Screate(H5S_SCALAR));
  } else {
    hsize_t dim = hsize_t(n);
    space = Hid(H5Screate_simple(1, &dim, nullptr));
  }
  Hid a(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT));
  check(a.valid() ? 0 : -1, obj, "cannot create attribute '" + name + "'");
  return a;
}

template <typename T>
void write_numeric(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type,
                   const T* v, hssize_t n) {
  Hid a = new_attr(obj, name, file_type, n);
  check(H5Awrite(a, mem_type, v), obj, "cannot write attribute '" + name + "'");
}

// fsync(2) of a file or directory; best effort (some file systems refuse directories).
void sync_path(const char* path, int flags) {
  int fd = ::open(path, flags);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

int rank_of(MPI_Comm comm) {
  return comm == MPI_COMM_NULL ? 0 : parallel::Comm(comm, "io", false).rank();
}

}  // namespace

namespace {
bool g_file_close_failed = false;  // see stop_library
}  // namespace

void start_library() {
  H5dont_atexit();
  H5open();
}

void stop_library() {
  if (!g_file_close_failed) H5close();
}

herr_t Hid::close() {
  if (id_ < 0) return 0;
  hid_t id = release();
  switch (H5Iget_type(id)) {
    case H5I_FILE: {
      const herr_t status = H5Fclose(id);
      if (status < 0) g_file_close_failed = true;
      return status;
    }
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_ATTR: return H5Aclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    default: return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}

File::~File() {
  if (valid() && parallel() && writing_ && std::uncaught_exceptions() > 0) {
    (void)id_.release();
    g_file_close_failed = true;
  }
}

void File::abandon() {
  if (!valid()) return;
  (void)id_.release();
  g_file_close_failed = true;
}

void File::flush() {
  if (!valid()) return;
  quiet();
  std::string err;
  if (H5Fflush(id(), H5F_SCOPE_GLOBAL) < 0)
    err = str(path_, ": cannot flush the HDF5 file (disk full?)", hdf5_detail());
  parallel::agree_on_errors(err, comm_);
}

void File::close() {
  if (!valid()) return;
  quiet();
  std::string err;
  if (id_.close() < 0)
    err = str(path_, ": cannot close the HDF5 file (disk full, or objects still open?)",
              hdf5_detail());
  parallel::agree_on_errors(err, comm_);
}

File open_file(const std::string& path, Mode mode, bool file_locking) {
  quiet();
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  // SEMI: H5Fclose fails instead of silently deferring the close while objects are open,
  // so that "closed" means "on disk" before a rename publishes the file.
  H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI);
  // ignore_when_disabled: file systems without flock (some Lustre mounts) still work.
  H5Pset_file_locking(fapl, file_locking, true);
  File f;
  f.id_ = Hid(open_with(path, mode, fapl));
  f.path_ = path;
  return f;
}

File open_file_parallel(const std::string& path, MPI_Comm comm, Mode mode) {
  quiet();
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0)
    fail(path, ": cannot set up MPI-IO access", hdf5_detail());
  // Metadata through collective MPI-IO: one rank reads, all get it (no metadata storm on
  // the file system's metadata server); writes go out collectively at flush/close.
  H5Pset_all_coll_metadata_ops(fapl, true);
  H5Pset_coll_metadata_write(fapl, true);
  H5Pset_alignment(fapl, kAlignThreshold, kAlignment);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI);
  File f;
  f.id_ = Hid(open_with(path, mode, fapl));
  f.path_ = path;
  f.comm_ = comm;
  f.writing_ = mode != Mode::read;
  return f;
}

namespace {
// A name HDF5 hands out in two calls (its length, then the text): H5Fget_name, H5Iget_name.
std::string hdf5_name(hid_t obj, ssize_t (*get)(hid_t, char*, size_t), const char* none) {
  const ssize_t n = get(obj, nullptr, 0);
  if (n <= 0) return none;
  std::string s(std::size_t(n) + 1, '\0');
  get(obj, s.data(), s.size());
  s.resize(std::size_t(n));
  return s;
}
}  // namespace

std::string file_name(hid_t obj) { return hdf5_name(obj, H5Fget_name, "<hdf5>"); }

std::string object_name(hid_t obj) { return hdf5_name(obj, H5Iget_name, "/"); }

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool exists(hid_t loc, const std::string& path) {
  quiet();
  std::string prefix = (!path.empty() && path[0] == '/') ? "/" : "";
  std::size_t pos = prefix.size();
  while (pos < path.size()) {
    std::size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    if (next > pos) {
      if (!prefix.empty() && prefix.back() != '/') prefix += '/';
      prefix += path.substr(pos, next - pos);
      if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    pos = next + 1;
  }
  return true;
}

Hid create_group(hid_t loc, const std::string& name) {
  quiet();
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl, 1);
  Hid g(H5Gcreate2(loc, name.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
  check(g.valid() ? 0 : -1, loc, "cannot create group " + abs_name(loc, name));
  return g;
}

Hid open_group(hid_t loc, const std::string& name) {
  if (!exists(loc, name)) fail(in(loc), "missing group ", abs_name(loc, name));
  Hid g(H5Gopen2(loc, name.c_str(), H5P_DEFAULT));
  check(g.valid() ? 0 : -1, loc, abs_name(loc, name) + " is not a group");
  return g;
}

Hid open_dataset(hid_t loc, const std::string& name, hid_t dapl) {
  if (!exists(loc, name)) fail(in(loc), "missing dataset ", abs_name(loc, name));
  Hid d(H5Dopen2(loc, name.c_str(), dapl));
  check(d.valid() ? 0 : -1, loc, abs_name(loc, name) + " is not a dataset");
  Hid dcpl(H5Dget_create_plist(d));
  const int filters = dcpl.valid() ? H5Pget_nfilters(dcpl) : 0;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    std::size_t values = 0;
    char filter[64] = "";
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl, unsigned(i), &flags, &values, nullptr, sizeof filter, filter, &config);
    if (id >= 0 && H5Zfilter_avail(id) <= 0)
      fail(in(loc), abs_name(loc, name), " is stored with HDF5 filter ", id,
           filter[0] ? " ('" + std::string(filter) + "')" : std::string(),
           ", which this HDF5 library cannot decode: rewrite the file without it "
           "(h5repack -f NONE in.h5 out.h5) or with gzip");
  }
  return d;
}

Hid create_dataset(hid_t loc, const std::string& name, hid_t file_type,
                   const std::vector<std::int64_t>& dims, hid_t dcpl,
                   const std::vector<std::int64_t>& maxdims) {
  quiet();
  Hid space;
  if (dims.empty()) {
    space = Hid(H5Screate(H5S_SCALAR));
  } else {
    std::vector<hsize_t> d(dims.begin(), dims.end()), m;
    for (auto x : maxdims) m.push_back(x < 0 ? H5S_UNLIMITED : hsize_t(x));
    space = Hid(H5Screate_simple(int(d.size()), d.data(), m.empty() ? nullptr : m.data()));
  }
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl, 1);
  Hid ds(H5Dcreate2(loc, name.c_str(), file_type, space, lcpl, dcpl, H5P_DEFAULT));
  check(ds.valid() ? 0 : -1, loc, "cannot create dataset " + abs_name(loc, name));
  return ds;
}

std::vector<std::int64_t> dataset_shape(hid_t dataset) {
  Hid space(H5Dget_space(dataset));
  int n = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> d(std::size_t(n < 0 ? 0 : n));
  if (n > 0) H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return std::vector<std::int64_t>(d.begin(), d.end());
}

H5T_class_t dataset_class(hid_t dataset) {
  Hid t(H5Dget_type(dataset));
  return H5Tget_class(t);
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "of unknown type";
  }
}

bool has_attr(hid_t obj, const std::string& name) {
  quiet();
  return H5Aexists(obj, name.c_str()) > 0;
}

std::int64_t read_attr_int(hid_t obj, const std::string& name) {
  return read_scalar<std::int64_t>(obj, name, H5T_NATIVE_INT64, false, "an integer");
}

std::uint64_t read_attr_u64(hid_t obj, const std::string& name) {
  return read_scalar<std::uint64_t>(obj, name, H5T_NATIVE_UINT64, false, "an integer");
}

double read_attr_double(hid_t obj, const std::string& name) {
  return read_scalar<double>(obj, name, H5T_NATIVE_DOUBLE, true, "a number");
}

std::vector<std::int64_t> read_attr_ints(hid_t obj, const std::string& name) {
  return read_numeric<std::int64_t>(obj, name, H5T_NATIVE_INT64, false, "integers");
}

std::vector<double> read_attr_doubles(hid_t obj, const std::string& name) {
  return read_numeric<double>(obj, name, H5T_NATIVE_DOUBLE, true, "numbers");
}

std::string read_attr_string(hid_t obj, const std::string& name) {
  Hid a = open_attr(obj, name);
  if (attr_class(a) != H5T_STRING) wrong_kind(obj, name, a, "a string");
  if (attr_points(a) != 1)
    fail(in(obj), "attribute '", name, "' on ", object_name(obj), " is not a single string");
  Hid ftype(H5Aget_type(a));
  Hid mtype(H5Tcopy(H5T_C_S1));
  H5Tset_cset(mtype, H5Tget_cset(ftype));
  std::string out;
  if (H5Tis_variable_str(ftype) > 0) {
    H5Tset_size(mtype, H5T_VARIABLE);
    char* p = nullptr;
    check(H5Aread(a, mtype, &p), obj, "cannot read attribute '" + name + "'");
    if (p) out = p;
    H5free_memory(p);
  } else {
    std::size_t n = H5Tget_size(ftype);
    H5Tset_size(mtype, n);
    std::string buf(n, '\0');
    check(H5Aread(a, mtype, buf.data()), obj, "cannot read attribute '" + name + "'");
    out = buf.substr(0, buf.find('\0'));
  }
  return out;
}

void write_attr_int(hid_t obj, const std::string& name, std::int64_t value) {
  write_numeric(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, -1);
}

void write_attr_u64(hid_t obj, const std::string& name, std::uint64_t value) {
  write_numeric(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, -1);
}

void write_attr_double(hid_t obj, const std::string& name, double value) {
  write_numeric(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, -1);
}

void write_attr_ints(hid_t obj, const std::string& name, const std::vector<std::int64_t>& v) {
  write_numeric(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v.data(), hssize_t(v.size()));
}

void write_attr_doubles(hid_t obj, const std::string& name, const std::vector<double>& v) {
  write_numeric(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, v.data(), hssize_t(v.size()));
}

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
  Hid type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  Hid a = new_attr(obj, name, type, -1);
  const char* p = value.c_str();
  check(H5Awrite(a, type, &p), obj, "cannot write attribute '" + name + "'");
}

void make_parent_dir(const std::string& path, MPI_Comm comm) {
  std::string err;
  if (rank_of(comm) == 0) {
    fs::path parent = fs::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (ec) err = str(parent.string(), ": cannot create the directory: ", ec.message());
  }
  parallel::agree_on_root_error(err, comm);  // also the barrier: nobody opens before the directory exists
}

void reserve_room(const std::string& path, std::int64_t end, int injected_errno) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open it to reserve room for the next write: ",
                   std::strerror(errno));
  struct stat st;
  int err = fstat(fd, &st) == 0 ? 0 : errno;
  const std::int64_t bytes = err == 0 ? std::max<std::int64_t>(0, end - st.st_size) : 0;
  if (err == 0 && injected_errno != 0) {
    err = injected_errno;
  } else if (err == 0 && bytes > 0) {
    // KEEP_SIZE: the file's size stays HDF5's; where a file system has only the plain mode,
    // the file grows to `end` with zeros past HDF5's end of file, which readers
    // accept (only a file shorter than its superblock says is "truncated").
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, st.st_size, off_t(bytes)) != 0) {
      err = errno;
      if (err == EOPNOTSUPP) err = fallocate(fd, 0, st.st_size, off_t(bytes)) == 0 ? 0 : errno;
    }
  }
  ::close(fd);
  if (err == 0 || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) return;
  fail(path, ": cannot reserve ", format_bytes(bytes), " for its next write: ", std::strerror(err),
       err == ENOSPC || err == EDQUOT || err == EFBIG ? " (disk full?)" : "");
}

void check_room(const std::string& path, std::int64_t bytes, MPI_Comm comm) {
  std::string err;
  struct rlimit limit;
  if (fault::armed(fault::Kind::no_room_check)) {
    // tests only (TRIDENT_FAULT): the write meets the full disk itself
  } else if (getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      rlim_t(bytes) > limit.rlim_cur)
    err = str(path, ": needs about ", format_bytes(bytes), ", more than the file size limit of ",
              format_bytes(std::int64_t(limit.rlim_cur)), " (ulimit -f)");
  if (err.empty() && rank_of(comm) == 0 && !fault::armed(fault::Kind::no_room_check)) {
    fs::path dir = fs::path(path).parent_path();
    struct statvfs st;
    if (statvfs(dir.empty() ? "." : dir.c_str(), &st) == 0) {
      const double avail = double(st.f_bavail) * double(st.f_frsize);
      if (avail < double(bytes))
        err = str(path, ": needs about ", format_bytes(bytes), ", but its file system has ",
                  format_bytes(std::int64_t(avail)), " free (disk full?)");
    }
  }
  parallel::agree_on_errors(err, comm);
}

void commit_file(const std::string& tmp_path, const std::string& final_path, MPI_Comm comm) {
  if (comm != MPI_COMM_NULL) parallel::Comm(comm, "io", false).barrier();  // all closed tmp_path
  std::string err;
  if (rank_of(comm) == 0) {
    // The data first (the serial driver does not fsync; MPI-IO already did, at flush).
    sync_path(tmp_path.c_str(), O_RDONLY);
    std::error_code ec;
    fs::rename(tmp_path, final_path, ec);
    if (ec) {
      err = str(final_path, ": cannot rename ", tmp_path, " to it: ", ec.message());
    } else {
      // Make the rename itself durable: fsync the directory that holds the entry.
      fs::path dir = fs::path(final_path).parent_path();
      sync_path(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    }
  }
  parallel::agree_on_root_error(err, comm);
}

}  // namespace trident::io::h5
