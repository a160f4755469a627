#include "src/io/h5.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sys/stat.h>

#include <type_traits>

#include "src/core/check.h"
#include "src/core/host.h"

// A failing call is fatal (a bug), unless the system refused a file's read or write (its
// errno is on HDF5's error stack: a full disk, a quota, a file size limit): that throws
// WriteFailed, for the caller to say which file and what it means.
#define H5_CHECK(call)                                                           \
  do {                                                                           \
    if (int64_t(call) < 0) ::llmhpc::h5::call_failed(__FILE__, __LINE__, #call); \
  } while (0)

namespace llmhpc::h5 {
namespace {

// `text` without the part from `from` up to the next ", " (and that).
std::string drop_field(std::string text, const std::string& from) {
  const size_t at = text.find(from);
  if (at == std::string::npos) return text;
  const size_t end = text.find(", ", at);
  return text.erase(at, end == std::string::npos ? std::string::npos : end + 2 - at);
}

// The innermost entry of HDF5's error stack, where the failure was found.
std::string innermost_error() {
  std::string innermost;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &innermost);
  return innermost;
}

// What HDF5 found wrong, from the innermost entry of its error stack (kept, not printed: see
// quiet()). A failed write names the file and the system's reason there: "file write failed:
// filename = '...', errno = 28, error message = 'No space left on device'" (its time, file
// descriptor and buffer addresses left out).
std::string failure_text() {
  std::string innermost = innermost_error();
  innermost = drop_field(drop_field(innermost.substr(0, innermost.find(", buf = ")), "time = "), "file descriptor = ");
  return innermost.empty() ? "HDF5 call failed" : "HDF5 call failed: " + innermost;
}

// The system's errno and the file named in the innermost entry of HDF5's error stack ("...,
// filename = 'x.h5', ..., errno = 28, ..."); 0 and "" when it has none.
std::pair<int, std::string> system_error() {
  std::string innermost = innermost_error();
  const size_t at = innermost.find("errno = ");
  if (at == std::string::npos) return {0, ""};
  const int number = std::atoi(innermost.c_str() + at + 8);
  std::string file;
  for (const char* key : {"filename = '", "name = '"}) {
    const size_t from = innermost.find(key);
    if (from == std::string::npos) continue;
    const size_t begin = from + std::strlen(key), end = innermost.find('\'', begin);
    if (end != std::string::npos) file = innermost.substr(begin, end - begin);
    break;
  }
  return {number, file};
}

[[noreturn]] void call_failed(const char* file, int line, const char* call) {
  const auto [number, name] = system_error();
  if (number > 0) throw WriteFailed("'" + name + "': " + system_reason(number), name, number);
  fatal(file, line, call, failure_text());
}

// HDF5 prints its own error stack unless told not to; we report failures ourselves.
// File locking is off because it fails on some parallel file systems (one file per rank
// never needs it).
struct Quiet {
  Quiet() {
    setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
};
void quiet() { static Quiet q; }

// A file whose close failed (its last write refused: a full disk) stays open inside HDF5, whose
// clean-up at exit would then crash closing it; every file llmhpc opens is closed before then,
// so the process leaves without that clean-up. Before any HDF5 call.
const bool g_no_cleanup_at_exit = H5dont_atexit() >= 0;

Handle string_type() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5_CHECK(H5Tset_size(t, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(t, H5T_CSET_UTF8));
  return Handle(t, H5Tclose);
}

Handle scalar_space() { return Handle(H5Screate(H5S_SCALAR), H5Sclose); }

// Empty dims mean a scalar.
Handle simple_space(const std::vector<int64_t>& dims) {
  if (dims.empty()) return scalar_space();
  std::vector<hsize_t> d(dims.begin(), dims.end());
  return Handle(H5Screate_simple(int(d.size()), d.data(), nullptr), H5Sclose);
}

void write_attr_raw(hid_t obj, const std::string& name, hid_t type, const void* value) {
  if (H5Aexists(obj, name.c_str()) > 0) H5_CHECK(H5Adelete(obj, name.c_str()));
  Handle space = scalar_space();
  Handle attr(H5Acreate2(obj, name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5_CHECK(attr.id());
  H5_CHECK(H5Awrite(attr.id(), type, value));
}

Handle open_attr(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) <= 0) throw UsageError("missing HDF5 attribute '" + name + "'");
  return Handle(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
}

void write_numeric(hid_t loc, const std::string& name, const std::vector<int64_t>& dims, hid_t mem_type,
                   hid_t file_type, const void* data) {
  quiet();
  if (exists(loc, name)) remove(loc, name);
  Handle space = simple_space(dims);
  Handle ds(H5Dcreate2(loc, name.c_str(), file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  H5_CHECK(ds.id());
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  if (n > 0) H5_CHECK(H5Dwrite(ds.id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

Handle open_dataset(hid_t loc, const std::string& name) {
  quiet();
  if (!exists(loc, name)) throw UsageError("missing HDF5 dataset '" + name + "'");
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  H5_CHECK(ds.id());
  return ds;
}

template <class T>
std::vector<T> read_numeric(hid_t loc, const std::string& name, hid_t mem_type) {
  Handle ds = open_dataset(loc, name);
  int64_t n = 1;
  for (int64_t d : dataset_dims(loc, name)) n *= d;
  std::vector<T> out(n);
  if (n > 0 && H5Dread(ds.id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw UsageError("HDF5 dataset '" + name + "' cannot be read as numbers");
  return out;
}

// Length 0, unlimited, chunked by `chunk` elements, no filters.
void create_appendable_raw(hid_t loc, const std::string& name, hid_t file_type, int64_t chunk) {
  quiet();
  LLMHPC_CHECK(chunk > 0, "a chunk of '" + name + "' must hold at least one element");
  if (exists(loc, name)) remove(loc, name);
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk_dims = hsize_t(chunk);
  Handle space(H5Screate_simple(1, &zero, &unlimited), H5Sclose);
  H5_CHECK(space.id());
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5_CHECK(dcpl.id());
  H5_CHECK(H5Pset_chunk(dcpl.id(), 1, &chunk_dims));
  Handle ds(H5Dcreate2(loc, name.c_str(), file_type, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT), H5Dclose);
  H5_CHECK(ds.id());
}

int64_t append_raw(hid_t loc, const std::string& name, hid_t mem_type, const void* data, int64_t n) {
  LLMHPC_CHECK(n >= 0, "a negative number of elements to append to '" + name + "'");
  Handle ds = open_dataset(loc, name);
  Handle old_space(H5Dget_space(ds.id()), H5Sclose);
  H5_CHECK(old_space.id());
  LLMHPC_CHECK(H5Sget_simple_extent_ndims(old_space.id()) == 1, "'" + name + "' is not a 1-D dataset");
  hsize_t start = 0;
  H5_CHECK(H5Sget_simple_extent_dims(old_space.id(), &start, nullptr));
  if (n == 0) return int64_t(start);
  const hsize_t count = hsize_t(n), end = start + count;
  H5_CHECK(H5Dset_extent(ds.id(), &end));
  Handle file_space(H5Dget_space(ds.id()), H5Sclose);
  H5_CHECK(file_space.id());
  H5_CHECK(H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  Handle mem_space(H5Screate_simple(1, &count, nullptr), H5Sclose);
  H5_CHECK(mem_space.id());
  H5_CHECK(H5Dwrite(ds.id(), mem_type, mem_space.id(), file_space.id(), H5P_DEFAULT, data));
  return int64_t(end);
}

}  // namespace

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    locked_ = o.locked_;
    o.id_ = -1;
    o.locked_ = false;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && close_) close_(id_);
  id_ = -1;
  if (locked_) library_lock().unlock();
  locked_ = false;
}

std::recursive_timed_mutex& library_lock() {
  static std::recursive_timed_mutex* lock =
      new std::recursive_timed_mutex();  // never destroyed: the watchdog may outlive static destructors
  return *lock;
}

std::string library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5_CHECK(H5get_libversion(&major, &minor, &release));
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

Handle open_file(const std::string& path, Mode mode) {
  std::unique_lock<std::recursive_timed_mutex> lock(library_lock());  // the file's Handle keeps it
  quiet();
  hid_t id = -1;
  if (mode == Mode::Create) {
    id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (id < 0) {
      const int number = system_error().first;
      if (number == ENOSPC || number == EDQUOT || number == EFBIG)  // not the path's fault: the file system's
        throw WriteFailed("'" + path + "': " + system_reason(number), path, number);
      throw UsageError("cannot create '" + path + "': " + failure_text());
    }
  } else {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) throw UsageError("'" + path + "' does not exist");
    if (H5Fis_hdf5(path.c_str()) <= 0) throw UsageError("'" + path + "' is not an HDF5 file");
    id = H5Fopen(path.c_str(), mode == Mode::Append ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0)  // HDF5 checks the file's length against what its superblock says it holds
      throw UsageError("cannot open '" + path + "': an HDF5 file, but truncated or damaged (" +
                       std::to_string(int64_t(st.st_size)) + " bytes; a copy cut short or an interrupted write?)");
  }
  lock.release();
  return Handle(id, H5Fclose, /*locked=*/true);
}

void flush(const Handle& file) { H5_CHECK(H5Fflush(file.id(), H5F_SCOPE_GLOBAL)); }

bool exists(hid_t loc, const std::string& path) {
  quiet();
  // Check each prefix: H5Lexists fails on a path whose parent is missing.
  size_t pos = 0;
  while (true) {
    size_t slash = path.find('/', pos + 1);
    std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && prefix != "/" && H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash;
  }
}

Handle require_group(hid_t loc, const std::string& path) {
  quiet();
  if (exists(loc, path)) return open_group(loc, path);
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5_CHECK(H5Pset_create_intermediate_group(lcpl.id(), 1));
  Handle g(H5Gcreate2(loc, path.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  H5_CHECK(g.id());
  return g;
}

Handle open_group(hid_t loc, const std::string& path) {
  quiet();
  if (!exists(loc, path)) throw UsageError("missing HDF5 group '" + path + "'");
  Handle g(H5Gopen2(loc, path.c_str(), H5P_DEFAULT), H5Gclose);
  H5_CHECK(g.id());
  return g;
}

void remove(hid_t loc, const std::string& path) { H5_CHECK(H5Ldelete(loc, path.c_str(), H5P_DEFAULT)); }

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  Handle t = string_type();
  const char* p = value.c_str();
  write_attr_raw(obj, name, t.id(), &p);
}
void write_attr(hid_t obj, const std::string& name, int64_t value) {
  write_attr_raw(obj, name, H5T_NATIVE_INT64, &value);
}
void write_attr(hid_t obj, const std::string& name, double value) {
  write_attr_raw(obj, name, H5T_NATIVE_DOUBLE, &value);
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

std::string read_attr_string(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  Handle ft(H5Aget_type(a.id()), H5Tclose);
  if (H5Tget_class(ft.id()) != H5T_STRING) throw UsageError("HDF5 attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(ft.id()) > 0) {
    Handle t = string_type();
    char* p = nullptr;
    H5_CHECK(H5Aread(a.id(), t.id(), &p));
    std::string s = p ? p : "";
    Handle space(H5Aget_space(a.id()), H5Sclose);
    H5Dvlen_reclaim(t.id(), space.id(), H5P_DEFAULT, &p);
    return s;
  }
  size_t n = H5Tget_size(ft.id());
  std::string s(n, '\0');
  Handle mt(H5Tcopy(ft.id()), H5Tclose);
  H5_CHECK(H5Aread(a.id(), mt.id(), s.data()));
  return s.substr(0, s.find('\0'));
}

int64_t read_attr_int(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  int64_t v = 0;
  if (H5Aread(a.id(), H5T_NATIVE_INT64, &v) < 0) throw UsageError("HDF5 attribute '" + name + "' is not an integer");
  return v;
}

double read_attr_double(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  double v = 0;
  if (H5Aread(a.id(), H5T_NATIVE_DOUBLE, &v) < 0) throw UsageError("HDF5 attribute '" + name + "' is not a number");
  return v;
}

void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims, const float* data) {
  write_numeric(loc, name, dims, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, data);
}
void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims, const double* data) {
  write_numeric(loc, name, dims, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, data);
}
void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims, const int64_t* data) {
  write_numeric(loc, name, dims, H5T_NATIVE_INT64, H5T_STD_I64LE, data);
}

void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& values) {
  quiet();
  if (exists(loc, name)) remove(loc, name);
  Handle t = string_type();
  Handle space = simple_space({int64_t(values.size())});
  Handle ds(H5Dcreate2(loc, name.c_str(), t.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  H5_CHECK(ds.id());
  std::vector<const char*> ptrs;
  for (const std::string& s : values) ptrs.push_back(s.c_str());
  if (!ptrs.empty()) H5_CHECK(H5Dwrite(ds.id(), t.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()));
}

template <class T>
void create_appendable(hid_t loc, const std::string& name, int64_t chunk) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, int64_t> || std::is_same_v<T, std::string>);
  if constexpr (std::is_same_v<T, std::string>) {
    Handle t = string_type();
    create_appendable_raw(loc, name, t.id(), chunk);
  } else {
    create_appendable_raw(loc, name, std::is_same_v<T, double> ? H5T_IEEE_F64LE : H5T_STD_I64LE, chunk);
  }
}
template void create_appendable<double>(hid_t, const std::string&, int64_t);
template void create_appendable<int64_t>(hid_t, const std::string&, int64_t);
template void create_appendable<std::string>(hid_t, const std::string&, int64_t);

int64_t append(hid_t loc, const std::string& name, const double* data, int64_t n) {
  return append_raw(loc, name, H5T_NATIVE_DOUBLE, data, n);
}
int64_t append(hid_t loc, const std::string& name, const int64_t* data, int64_t n) {
  return append_raw(loc, name, H5T_NATIVE_INT64, data, n);
}
int64_t append(hid_t loc, const std::string& name, const char* const* strings, int64_t n) {
  Handle t = string_type();
  return append_raw(loc, name, t.id(), strings, n);
}

std::vector<int64_t> dataset_dims(hid_t loc, const std::string& name) {
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) throw UsageError("missing HDF5 dataset '" + name + "'");
  Handle space(H5Dget_space(ds.id()), H5Sclose);
  int nd = H5Sget_simple_extent_ndims(space.id());
  H5_CHECK(nd);
  std::vector<hsize_t> d(nd);
  H5Sget_simple_extent_dims(space.id(), d.data(), nullptr);
  return std::vector<int64_t>(d.begin(), d.end());
}

std::vector<float> read_floats(hid_t loc, const std::string& name) {
  return read_numeric<float>(loc, name, H5T_NATIVE_FLOAT);
}
std::vector<double> read_doubles(hid_t loc, const std::string& name) {
  return read_numeric<double>(loc, name, H5T_NATIVE_DOUBLE);
}
std::vector<int64_t> read_ints(hid_t loc, const std::string& name) {
  return read_numeric<int64_t>(loc, name, H5T_NATIVE_INT64);
}

std::vector<std::string> read_strings(hid_t loc, const std::string& name) {
  Handle ds = open_dataset(loc, name);
  Handle space(H5Dget_space(ds.id()), H5Sclose);
  H5_CHECK(space.id());
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  H5_CHECK(n);
  Handle t = string_type();
  std::vector<char*> ptrs(n, nullptr);
  if (n > 0 && H5Dread(ds.id(), t.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0)
    throw UsageError("HDF5 dataset '" + name + "' cannot be read as variable-length strings");
  std::vector<std::string> out;
  out.reserve(n);
  for (const char* p : ptrs) out.emplace_back(p ? p : "");
  if (n > 0) H5_CHECK(H5Dvlen_reclaim(t.id(), space.id(), H5P_DEFAULT, ptrs.data()));
  return out;
}

std::vector<std::string> list_children(hid_t loc) {
  std::vector<std::string> names;
  H5_CHECK(H5Literate(
      loc, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->push_back(name);
        return 0;
      },
      &names));
  return names;
}

std::string work_name(const std::string& path) {
  return path + ".tmp." + host_name() + "." + std::to_string(::getpid());
}

void remove_stale_work_files(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const std::string prefix = file.filename().string() + ".tmp." + host_name() + ".";
  std::error_code ec;
  for (const fs::directory_entry& e :
       fs::directory_iterator(file.parent_path().empty() ? "." : file.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);  // its writer is gone
  }
}

void replace_file(const std::string& work, const std::string& path) {
  const int fd = ::open(work.c_str(), O_RDONLY);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced || std::rename(work.c_str(), path.c_str()) != 0) {
    const int number = errno;
    throw WriteFailed("'" + work + "' (the new version of '" + path + "'): " + system_reason(number), work, number);
  }
}

}  // namespace llmhpc::h5
