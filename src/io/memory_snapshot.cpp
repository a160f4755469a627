#include "src/io/memory_snapshot.h"

#include <cmath>
#include <cstdio>
#include <map>

#include "src/core/check.h"
#include "src/io/h5.h"

namespace llmhpc {
namespace {

PyObject frames(const std::string& tag, const std::string& category, const std::string& phase) {
  PyObject list = PyObject::list();
  PyObject& f = list.append(PyObject::dict());
  f.set("filename", PyObject::str(category));
  f.set("line", PyObject::integer(0));
  f.set("name", PyObject::str(tag));
  PyObject& p = list.append(PyObject::dict());
  p.set("filename", PyObject::str("phase"));
  p.set("line", PyObject::integer(0));
  p.set("name", PyObject::str(phase));
  return list;
}

PyObject event(const char* action, uint64_t addr, int64_t size, int64_t time_us, const PyObject& where) {
  PyObject e = PyObject::dict();
  e.set("action", PyObject::str(action));
  e.set("addr", PyObject::integer(int64_t(addr)));
  e.set("size", PyObject::integer(size));
  e.set("stream", PyObject::integer(0));
  e.set("time_us", PyObject::integer(time_us));
  e.set("frames", where);
  return e;
}

}  // namespace

PyObject memory_snapshot(const std::vector<LiveAllocation>& at_start, const std::vector<AllocEvent>& events,
                         const std::vector<TagCategory>& categories, double start_ms) {
  struct Block {
    int64_t bytes;
    PyObject where;
  };
  std::map<uint64_t, Block> live;  // by address: the blocks at the end
  for (const LiveAllocation& a : at_start)
    live[a.address] = {a.bytes, frames(a.tag, tag_category(a.tag, categories), "before the trace")};
  PyObject trace = PyObject::list();
  for (const AllocEvent& e : events) {
    const int64_t t = int64_t(std::llround((e.time_ms - start_ms) * 1000.0));
    const int64_t size = e.delta >= 0 ? e.delta : -e.delta;
    const PyObject where = frames(e.tag, tag_category(e.tag, categories), e.phase);
    if (e.pages) {  // a paged block's pages: as PyTorch's expandable segments record them
      trace.append(event(e.delta < 0 ? "segment_unmap" : "segment_map", e.address, size, t, where));
      live[e.address].bytes += e.delta;
    } else if (e.delta >= 0) {
      trace.append(event("segment_alloc", e.address, size, t, where));
      trace.append(event("alloc", e.address, size, t, where));
      live[e.address] = {size, where};
    } else {
      for (const char* action : {"free_requested", "free_completed", "segment_free"})
        trace.append(event(action, e.address, size, t, where));
      live.erase(e.address);
    }
  }
  PyObject segments = PyObject::list();
  for (const auto& [address, b] : live) {
    PyObject& seg = segments.append(PyObject::dict());
    seg.set("device", PyObject::integer(0));
    seg.set("address", PyObject::integer(int64_t(address)));
    for (const char* key : {"total_size", "allocated_size", "active_size", "requested_size"})
      seg.set(key, PyObject::integer(b.bytes));
    seg.set("stream", PyObject::integer(0));
    seg.set("segment_type", PyObject::str("large"));
    seg.set("is_expandable", PyObject::boolean(false));
    seg.set("frames", b.where);
    PyObject& block = seg.set("blocks", PyObject::list()).append(PyObject::dict());
    block.set("address", PyObject::integer(int64_t(address)));
    block.set("size", PyObject::integer(b.bytes));
    block.set("requested_size", PyObject::integer(b.bytes));
    block.set("state", PyObject::str("active_allocated"));
    block.set("frames", b.where);
  }
  PyObject snapshot = PyObject::dict();
  snapshot.set("segments", std::move(segments));
  snapshot.set("device_traces", PyObject::list()).append(std::move(trace));
  return snapshot;
}

void write_snapshot_file(const std::string& path, const PyObject& snapshot) {
  const std::string bytes = pickle(snapshot);
  const std::string tmp = h5::work_name(path);  // this process's own, as a checkpoint's
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw UsageError("cannot write the memory snapshot '" + path + "' (cannot create " + tmp + ")");
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw UsageError("cannot write the memory snapshot '" + path + "'");
  }
}

}  // namespace llmhpc
