// The CUDA backend's Profiler (kernels/profiler.h): CUPTI's activity API, with libcupti opened
// at run time, so a host without it still runs (the mode falls back to phase events).
//
// Purpose: every kernel, memcpy and memset of a window with its GPU start and end, stream,
// grid and block, attributed to the innermost phase open when the host launched it.
//
// How:
//  - Kinds CONCURRENT_KERNEL (the plain KERNEL kind serialises kernels), MEMCPY and MEMSET,
//    enabled for the window only: disabled and flushed at its end, so CUPTI traces nothing
//    outside profiling windows.
//  - Phases: a kernel record carries the correlation id of the API call that launched it. For
//    the calls that start device work (names beginning cudaLaunch, cudaMemcpy, cudaMemset,
//    cudaGraphLaunch and their cu* twins), a CUPTI callback at the call's entry, on the
//    launching thread, notes (correlation id -> innermost open range). Measured on an H100
//    (small bf16 train step, docs/results/profile.md): recording every API call with activity
//    kinds RUNTIME and DRIVER, which CUPTI's external correlation records need, cost +30% of
//    the step (each launch comes with error checks, event records and cuBLAS's driver queries),
//    against +5% for kernel records alone; the callback adds a lookup per launch.
//  - CUDA graphs (--cuda-graph): a replay's records hold the correlation id of its
//    cudaGraphLaunch (noted like any launch: the range it ran in, its step) and the id of
//    their graph node. While the graph is recorded (Profiler::record_graph), CUPTI's resource
//    callbacks for created and cloned (instantiated) nodes note (node id -> recorded range);
//    a record with a node id is delivered to the copy of that range under its launch's range.
//  - Buffers: CUPTI asks for them (kBufferBytes each) and hands them back full, from its own
//    thread, or from the final flush. Records are delivered as they are read, so memory stays
//    bounded by the buffers in flight. A record whose launch was not noted waits in `pending_`;
//    one still waiting at the end of the window was launched outside every range (or by a call
//    not in the list). Noted launches are forgotten once far behind the newest delivered
//    activity.
//  - Records lost for lack of buffer space (and kernels CUPTI could not time) count as dropped.
//  - Another profiler (an injected tool such as Nsight Systems, or any CUPTI subscriber) keeps
//    CUPTI: llmhpc then registers nothing and falls back to phase events (open_cupti). llmhpc
//    subscribes to CUPTI's callbacks for its windows only.
// Built without CUPTI's headers (LLMHPC_NO_CUPTI, CMakeLists.txt), only a factory that declines.
#if defined(LLMHPC_NO_CUPTI)
#include "kernels/cuda/cuda_backend.h"

namespace llmhpc {
std::unique_ptr<Profiler> make_cupti_profiler(Ops&, std::string& why_not) {
  why_not = "this llmhpc was built without CUPTI's headers";
  return nullptr;
}
}  // namespace llmhpc
#else
#include <cublasLt.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <thread>
#include <unordered_map>

#include "kernels/cuda/cuda_backend.h"
#include "src/core/cuda/check.h"
#include "src/core/units.h"

namespace llmhpc {
namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;  // some 40k kernel records
// Correlation ids more than this far behind the newest delivered activity are forgotten: far
// more launches than the device's queue holds.
constexpr uint32_t kCorrelationSlack = 1u << 16;

// The libcupti functions used, looked up by name.
struct Cupti {
  decltype(&cuptiGetVersion) GetVersion;
  decltype(&cuptiGetResultString) GetResultString;
  decltype(&cuptiActivityRegisterCallbacks) RegisterCallbacks;
  decltype(&cuptiActivityEnable) Enable;
  decltype(&cuptiActivityDisable) Disable;
  decltype(&cuptiActivityFlushAll) FlushAll;
  decltype(&cuptiActivityGetNextRecord) GetNextRecord;
  decltype(&cuptiActivityGetNumDroppedRecords) GetNumDroppedRecords;
  decltype(&cuptiGetTimestamp) GetTimestamp;
  decltype(&cuptiSubscribe) Subscribe;
  decltype(&cuptiUnsubscribe) Unsubscribe;
  decltype(&cuptiEnableCallback) EnableCallback;
  decltype(&cuptiGetCallbackName) GetCallbackName;
  decltype(&cuptiGetGraphNodeId) GetGraphNodeId;
  // The calls that start device work, whose entry a window's callback notes.
  std::vector<CUpti_CallbackId> runtime_launches, driver_launches;

  std::string error(CUptiResult rc) const {
    const char* text = nullptr;
    return GetResultString && GetResultString(rc, &text) == CUPTI_SUCCESS && text
               ? text
               : "CUPTI error " + std::to_string(int(rc));
  }
};

// The kinds a window enables, in order (disabled in reverse).
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

// The calls of a domain whose names begin with one of `prefixes` (ids differ between versions).
std::vector<CUpti_CallbackId> calls_named(const Cupti& api, CUpti_CallbackDomain domain, uint32_t count,
                                          std::initializer_list<const char*> prefixes) {
  std::vector<CUpti_CallbackId> ids;
  for (uint32_t cbid = 1; cbid < count; ++cbid) {
    const char* name = nullptr;
    if (api.GetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) continue;
    for (const char* prefix : prefixes)
      if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) {
        ids.push_back(cbid);
        break;
      }
  }
  return ids;
}

class CuptiProfiler;
// CUPTI's buffer callbacks take no user pointer: the library, once open, and the profiler
// whose window is open, if any.
const Cupti* g_api = nullptr;
std::atomic<CuptiProfiler*> g_window{nullptr};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));  // CUPTI wants 8-byte alignment
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t size, size_t valid);

// The library, opened and checked once per process: LLMHPC_CUPTI_LIBRARY if set, else the
// toolkit's soname through the loader's path, else beside the cuBLASLt llmhpc loaded (a
// toolkit's lib64/ or its extras/CUPTI/lib64/; the CUDA runtime may be linked statically), else the copy llmhpc was built with. nullptr
// with `why` when it cannot be used.
const Cupti* open_cupti(std::string& why) {
  static Cupti api{};
  static std::string error;
  static const bool ok = [&] {
    const std::string soname = "libcupti.so." + std::to_string(CUPTI_API_VERSION / 10000);
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("LLMHPC_CUPTI_LIBRARY")) candidates.push_back(env);
    candidates.push_back(soname);
    Dl_info cublas{};
    if (dladdr(reinterpret_cast<void*>(&cublasLtGetVersion), &cublas) && cublas.dli_fname) {
      const std::string lib = cublas.dli_fname, dir = lib.substr(0, lib.rfind('/') + 1);
      candidates.push_back(dir + soname);
      candidates.push_back(dir + "../extras/CUPTI/lib64/" + soname);
      candidates.push_back(dir + "../../../extras/CUPTI/lib64/" + soname);  // from targets/<arch>/lib
    }
    candidates.push_back(LLMHPC_CUPTI_BUILD_PATH);
    void* lib = nullptr;
    for (const std::string& path : candidates)
      if ((lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) {
      const char* e = dlerror();
      error = "cannot open libcupti (tried " + join(candidates, ", ") +
              "; set LLMHPC_CUPTI_LIBRARY to its path): " + (e ? e : "?");
      return false;
    }
    bool found = true;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && found) error = std::string("libcupti lacks ") + name, found = false;
    };
    load(api.GetVersion, "cuptiGetVersion");
    load(api.GetResultString, "cuptiGetResultString");
    load(api.RegisterCallbacks, "cuptiActivityRegisterCallbacks");
    load(api.Enable, "cuptiActivityEnable");
    load(api.Disable, "cuptiActivityDisable");
    load(api.FlushAll, "cuptiActivityFlushAll");
    load(api.GetNextRecord, "cuptiActivityGetNextRecord");
    load(api.GetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords");
    load(api.GetTimestamp, "cuptiGetTimestamp");
    load(api.Subscribe, "cuptiSubscribe");
    load(api.Unsubscribe, "cuptiUnsubscribe");
    load(api.EnableCallback, "cuptiEnableCallback");
    load(api.GetCallbackName, "cuptiGetCallbackName");
    load(api.GetGraphNodeId, "cuptiGetGraphNodeId");
    if (!found) return false;
    // The records are read as the structs of the headers llmhpc was built with (Kernel10,
    // Memcpy6, Memset4): same major version only.
    uint32_t version = 0;
    CUptiResult rc = api.GetVersion(&version);
    if (rc != CUPTI_SUCCESS || version / 10000 != CUPTI_API_VERSION / 10000) {
      error = "libcupti API version " + std::to_string(version) + " is not the " +
              std::to_string(CUPTI_API_VERSION / 10000) + ".x llmhpc was built with";
      return false;
    }
    // Another profiler (Nsight Systems, a PyTorch profiler) holds CUPTI: its buffer callbacks must
    // stay its own. Such tools are injected through CUDA_INJECTION64_PATH and subscribe to CUPTI's
    // callbacks; a second subscriber is refused, which is the probe (released at once).
    if (const char* tool = std::getenv("CUDA_INJECTION64_PATH"); tool && *tool) {
      error = std::string("another profiler is attached (CUDA_INJECTION64_PATH=") + tool + ")";
      return false;
    }
    CUpti_SubscriberHandle probe = nullptr;
    rc = api.Subscribe(
        &probe, [](void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}, nullptr);
    if (rc != CUPTI_SUCCESS) {
      error = "another profiler holds CUPTI (cuptiSubscribe: " + api.error(rc) + ")";
      return false;
    }
    api.Unsubscribe(probe);
    api.runtime_launches = calls_named(api, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE,
                                       {"cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch"});
    api.driver_launches = calls_named(api, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE,
                                      {"cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch"});
    if (api.runtime_launches.empty() || api.driver_launches.empty()) {
      error = "libcupti names no launching API calls (cuptiGetCallbackName)";
      return false;
    }
    g_api = &api;
    rc = api.RegisterCallbacks(buffer_requested, buffer_completed);
    if (rc != CUPTI_SUCCESS) {
      error = "cuptiActivityRegisterCallbacks: " + api.error(rc);
      return false;
    }
    return true;
  }();
  why = error;
  return ok ? &api : nullptr;
}

#define CUPTI_CHECK(api, call) \
  LLMHPC_CHECK_CALL(call, CUptiResult, llmhpc_rc_ == CUPTI_SUCCESS, (api).error(llmhpc_rc_))

// Disables the first `count` kinds of kKinds, in reverse.
void disable_kinds(const Cupti& api, size_t count = std::size(kKinds)) {
  while (count-- > 0) CUPTI_CHECK(api, api.Disable(kKinds[count]));
}

// Enables every kind of kKinds; on a failure disables those it enabled and says why.
std::string enable_kinds(const Cupti& api) {
  for (size_t k = 0; k < std::size(kKinds); ++k) {
    const CUptiResult rc = api.Enable(kKinds[k]);
    if (rc == CUPTI_SUCCESS) continue;
    disable_kinds(api, k);
    return "CUPTI cannot trace (" + api.error(rc) +
           "; no GPU driver, or another profiler such as Nsight Systems holds CUPTI)";
  }
  return "";
}


// The name Nsight Systems gives a copy.
const char* memcpy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[CUDA memcpy Host-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[CUDA memcpy Device-to-Host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[CUDA memcpy Device-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "[CUDA memcpy Host-to-Host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[CUDA memcpy Peer-to-Peer]";
    default: return "[CUDA memcpy]";
  }
}

std::string demangle(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && plain ? plain : name;
  std::free(plain);
  return result;
}

class CuptiProfiler final : public Profiler {
 public:
  CuptiProfiler(const Cupti& api, Ops& ops) : Profiler(DeviceSpans::FromActivities), api_(api), ops_(ops) {}
  ~CuptiProfiler() override { stop(); }
  std::string method() const override { return "cupti"; }
  bool traces_activities() const override { return true; }
  Ops& ops() override { return ops_; }

  void lost(size_t records) { add_dropped(int64_t(records)); }

  // A call that starts device work is entered; on the launching thread.
  void launching(uint32_t correlation) {
    // Phases are the model thread's: a launch from any other thread is outside them.
    const int64_t range = std::this_thread::get_id() == phase_thread_ ? current_range() : -1;
    std::lock_guard<std::mutex> lock(launches_mutex_);
    launches_.emplace_back(correlation, range);
  }

  // Every record of a buffer CUPTI handed back; any thread.
  void consume(uint8_t* buffer, size_t valid) {
    std::lock_guard<std::mutex> lock(mutex_);
    note_launches();
    CUpti_Activity* record = nullptr;
    while (api_.GetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) take(record);
    if (newest_ > kCorrelationSlack)
      correlation_.erase(correlation_.begin(), correlation_.lower_bound(newest_ - kCorrelationSlack));
  }

 protected:
  void begin_window() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      correlation_.clear();
      pending_.clear();
      newest_ = 0;
    }
    launches_.clear();
    phase_thread_ = std::this_thread::get_id();  // start() is called on the model's thread
    CuptiProfiler* none = nullptr;
    LLMHPC_CHECK(g_window.compare_exchange_strong(none, this), "two CUPTI profiling windows at once");
    std::string error = subscribe();
    if (error.empty()) error = enable_kinds(api_);
    if (!error.empty()) {
      unsubscribe();
      g_window = nullptr;
      throw UsageError(error + "; run with {no_cupti}");
    }
  }

  void end_window() override {
    CUDA_CHECK(cudaDeviceSynchronize());  // every activity complete before the flush
    disable_kinds(api_);
    CUPTI_CHECK(api_, api_.FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    unsubscribe();
    std::lock_guard<std::mutex> lock(mutex_);
    note_launches();
    for (auto& [correlation, waiting] : pending_)  // never paired: launched outside every range
      for (auto& [a, recorded] : waiting) deliver(a, recorded);
    pending_.clear();
    correlation_.clear();
    g_window = nullptr;
  }

  void begin_recording() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      node_ranges_.clear();
    }
    phase_thread_ = std::this_thread::get_id();
    const std::string error = subscribe();
    if (!error.empty()) throw UsageError(error + "; run with {no_cupti}");
  }
  void end_recording() override { unsubscribe(); }
  int64_t now_ns() override {
    uint64_t t = 0;
    CUPTI_CHECK(api_, api_.GetTimestamp(&t));
    return int64_t(t);
  }

 private:
  // Subscribes to CUPTI's callbacks (one subscriber per process: refused when another tool
  // holds CUPTI) and enables the launching calls'; "" or why not.
  std::string subscribe() {
    const CUptiResult rc = api_.Subscribe(&subscriber_, on_api_call, this);
    if (rc != CUPTI_SUCCESS) {
      subscriber_ = nullptr;
      return "another profiler holds CUPTI (cuptiSubscribe: " + api_.error(rc) + ")";
    }
    for (CUpti_CallbackId cbid : api_.runtime_launches)
      CUPTI_CHECK(api_, api_.EnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API, cbid));
    for (CUpti_CallbackId cbid : api_.driver_launches)
      CUPTI_CHECK(api_, api_.EnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API, cbid));
    for (CUpti_CallbackId cbid : {CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED})
      CUPTI_CHECK(api_, api_.EnableCallback(1, subscriber_, CUPTI_CB_DOMAIN_RESOURCE, cbid));
    return "";
  }
  void unsubscribe() {
    if (subscriber_) CUPTI_CHECK(api_, api_.Unsubscribe(subscriber_));
    subscriber_ = nullptr;
  }

  static void CUPTIAPI on_api_call(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
    auto* p = static_cast<CuptiProfiler*>(self);
    if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
      const auto* graph =
          static_cast<const CUpti_GraphData*>(static_cast<const CUpti_ResourceData*>(data)->resourceDescriptor);
      if (graph && cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED) p->node_created(graph->node);
      if (graph && cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) p->node_cloned(graph->originalNode, graph->node);
      return;
    }
    const auto* call = static_cast<const CUpti_CallbackData*>(data);
    if (call->callbackSite == CUPTI_API_ENTER) p->launching(call->correlationId);
  }

  // A graph node was recorded (stream capture) in the innermost open range of the recording,
  // or copied from one (instantiation); on the recording thread.
  void node_created(CUgraphNode node) {
    uint64_t id = 0;
    if (std::this_thread::get_id() != phase_thread_ || api_.GetGraphNodeId(node, &id) != CUPTI_SUCCESS) return;
    std::lock_guard<std::mutex> lock(mutex_);
    node_ranges_[id] = current_range();
  }
  void node_cloned(CUgraphNode original, CUgraphNode copy) {
    uint64_t from = 0, to = 0;
    if (api_.GetGraphNodeId(original, &from) != CUPTI_SUCCESS || api_.GetGraphNodeId(copy, &to) != CUPTI_SUCCESS)
      return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = node_ranges_.find(from); it != node_ranges_.end()) node_ranges_[to] = it->second;
  }

  // Moves the launches noted since the last call into correlation_, delivering the records
  // that waited for them; under mutex_.
  void note_launches() {
    std::vector<std::pair<uint32_t, int64_t>> noted;
    {
      std::lock_guard<std::mutex> lock(launches_mutex_);
      noted.swap(launches_);
    }
    for (const auto& [correlation, range] : noted) {
      correlation_[correlation] = range;
      auto waiting = pending_.find(correlation);
      if (waiting == pending_.end()) continue;
      for (auto& [w, recorded] : waiting->second) {
        w.range = range;
        deliver(w, recorded);
      }
      pending_.erase(waiting);
    }
  }

  // One record; under mutex_.
  void take(const CUpti_Activity* record) {
    Activity a;
    uint32_t correlation = 0;
    uint64_t node = 0;  // a graph replay's node, 0 for a launch of its own
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        if (k->start == 0 || k->end == 0) {  // CUPTI could not time it (no device memory for timestamps)
          add_dropped(1);
          return;
        }
        a.kind = ActivityKind::Kernel;
        a.name = kernel_name(k->name);
        a.start_ns = int64_t(k->start);
        a.end_ns = int64_t(k->end);
        a.stream = k->streamId;
        a.grid[0] = k->gridX, a.grid[1] = k->gridY, a.grid[2] = k->gridZ;
        a.block[0] = k->blockX, a.block[1] = k->blockY, a.block[2] = k->blockZ;
        correlation = k->correlationId;
        node = k->graphNodeId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        correlation = copy(*m, ActivityKind::Memcpy, memcpy_name(m->copyKind), a);
        node = m->graphNodeId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        correlation = copy(*m, ActivityKind::Memset, "[CUDA memset]", a);
        node = m->graphNodeId;
        break;
      }
      default: return;
    }
    a.correlation = correlation;
    newest_ = std::max(newest_, correlation);
    int64_t recorded = -1;
    if (node != 0)
      if (auto it = node_ranges_.find(node); it != node_ranges_.end()) recorded = it->second;
    auto known = correlation_.find(correlation);
    if (known == correlation_.end()) {
      pending_[correlation].push_back({a, recorded});
      return;
    }
    a.range = known->second;
    deliver(a, recorded);
  }

  // A memcpy or memset record (their structs share these fields) into `a`; its correlation id.
  template <class Record>
  uint32_t copy(const Record& m, ActivityKind kind, const char* name, Activity& a) {
    a.kind = kind;
    a.name = intern_name(name, kind);
    a.start_ns = int64_t(m.start);
    a.end_ns = int64_t(m.end);
    a.stream = m.streamId;
    a.bytes = int64_t(m.bytes);
    return m.correlationId;
  }

  int32_t kernel_name(const char* name) {
    auto [it, added] = names_by_pointer_.try_emplace(name, 0);  // CUPTI shares one pointer per kernel
    if (added) it->second = intern_name(demangle(name), ActivityKind::Kernel);
    return it->second;
  }

  const Cupti& api_;
  Ops& ops_;
  std::mutex mutex_;                         // the maps below; taken before the base's
  std::map<uint32_t, int64_t> correlation_;  // API correlation id -> range, of noted launches
  std::unordered_map<uint32_t, std::vector<std::pair<Activity, int64_t>>> pending_;  // with their recorded range
  std::unordered_map<uint64_t, int64_t> node_ranges_;  // graph node id -> range of Profiler::record_graph
  std::unordered_map<const char*, int32_t> names_by_pointer_;
  uint32_t newest_ = 0;                          // the newest correlation id of a delivered or pending activity
  CUpti_SubscriberHandle subscriber_ = nullptr;  // during a window
  std::thread::id phase_thread_;                 // the thread whose ranges are phases
  // Launches noted by the callback, not yet moved into correlation_: a lock of its own, so a
  // launch never waits for a buffer being read.
  std::mutex launches_mutex_;
  std::vector<std::pair<uint32_t, int64_t>> launches_;
};

// A buffer outside every window (CUPTI's exit flush) is only freed.
void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  if (CuptiProfiler* p = g_window.load()) {
    if (valid > 0) p->consume(buffer, valid);
    size_t dropped = 0;
    if (g_api->GetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS) p->lost(dropped);
  }
  std::free(buffer);
}

}  // namespace

// CUPTI is usable when its kinds can be enabled (not under a tool that holds it): enabled and
// disabled again at once, so the fallback is chosen before any window.
std::unique_ptr<Profiler> make_cupti_profiler(Ops& ops, std::string& why_not) {
  const Cupti* api = open_cupti(why_not);
  if (!api) return nullptr;
  why_not = enable_kinds(*api);
  if (!why_not.empty()) return nullptr;
  disable_kinds(*api);
  CUPTI_CHECK(*api, api->FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  return std::make_unique<CuptiProfiler>(*api, ops);
}

}  // namespace llmhpc
#endif  // LLMHPC_NO_CUPTI
