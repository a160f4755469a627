// RAII over the HDF5 C API: File, Group and the attribute and dataset helpers the
// recorder and the checkpoint need. Every call is checked; a failing HDF5 call is fatal
// except opening files, which throws UsageError (a bad path is the user's to fix), and a read
// or write the system refused (a full disk, a quota, a file size limit), which throws
// WriteFailed naming the file and the reason ("'x.h5.tmp': no space left on device").
// Datasets are written whole (contiguous), or, for records that grow while they run,
// created empty and appended to (chunked, unlimited).
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace llmhpc::h5 {

// HDF5 as distributions build it is not thread-safe, and one thread besides the main one
// writes: the watchdog, keeping its hang report in the rank file on the way out. So every
// open file holds this lock until it is closed (recursive: a thread may open several), and
// the recorder holds it over each whole write; the watchdog waits for it briefly, then gives up.
std::recursive_timed_mutex& library_lock();

// An owned hid_t, closed with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  // `locked`: the handle holds library_lock() (taken by its opener) and gives it back when closed.
  Handle(hid_t id, herr_t (*close)(hid_t), bool locked = false) : id_(id), close_(close), locked_(locked) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_), locked_(o.locked_) {
    o.id_ = -1;
    o.locked_ = false;
  }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
  bool locked_ = false;
};

enum class Mode { Create, Append, Read };

// "1.10.8": the HDF5 library this binary runs with.
std::string library_version();

// Opens or creates a file. Throws UsageError naming `path` when it cannot.
Handle open_file(const std::string& path, Mode mode);
void flush(const Handle& file);
// Makes the closed file `work` the file `path` in one step: fsync, then rename (atomic within
// a directory), so `path` is always either its old or its new complete version. Throws
// WriteFailed naming both when it cannot.
void replace_file(const std::string& work, const std::string& path);
// The name a file `path` is written under before replace_file: `path`.tmp.<host>.<pid>, this
// process's own, so that two runs writing one path (a shared --save) never write one work file:
// each leaves `path` whole, the last rename's.
std::string work_name(const std::string& path);
// Removes the work files of `path` that processes of this host left when killed while writing
// (their pid no longer exists): each is a whole checkpoint's size, and nothing else removes them.
void remove_stale_work_files(const std::string& path);

bool exists(hid_t loc, const std::string& path);
// Opens the group at `path` (slash-separated), creating missing parents.
Handle require_group(hid_t loc, const std::string& path);
Handle open_group(hid_t loc, const std::string& path);
void remove(hid_t loc, const std::string& path);

void write_attr(hid_t obj, const std::string& name, const std::string& value);
void write_attr(hid_t obj, const std::string& name, int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);
bool has_attr(hid_t obj, const std::string& name);
std::string read_attr_string(hid_t obj, const std::string& name);
int64_t read_attr_int(hid_t obj, const std::string& name);
double read_attr_double(hid_t obj, const std::string& name);

// Datasets: row-major with `dims`; element type from the vector.
void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims, const float* data);
void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims, const double* data);
void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims, const int64_t* data);
void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& values);

// Appendable 1-D datasets: created with length 0, no upper bound and chunks of `chunk`
// elements (no filters: docs/hdf5-schema.md says why); T is double, int64_t or std::string
// (variable-length UTF-8). append() extends the dataset by `n` elements, writes them at its
// end and returns the new length. Strings are NUL-terminated C strings.
template <class T>
void create_appendable(hid_t loc, const std::string& name, int64_t chunk);
int64_t append(hid_t loc, const std::string& name, const double* data, int64_t n);
int64_t append(hid_t loc, const std::string& name, const int64_t* data, int64_t n);
int64_t append(hid_t loc, const std::string& name, const char* const* strings, int64_t n);
std::vector<int64_t> dataset_dims(hid_t loc, const std::string& name);
// Reads any numeric dataset converted to float / double / int64 (HDF5 converts).
std::vector<float> read_floats(hid_t loc, const std::string& name);
std::vector<double> read_doubles(hid_t loc, const std::string& name);
std::vector<int64_t> read_ints(hid_t loc, const std::string& name);
std::vector<std::string> read_strings(hid_t loc, const std::string& name);
std::vector<std::string> list_children(hid_t loc);

}  // namespace llmhpc::h5
