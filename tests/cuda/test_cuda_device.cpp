// The CUDA Device: identity, copies, event timing, out-of-memory as a recoverable error
// (through the memory limit and through cudaMalloc itself), and paged memory whose pages go
// back to the driver and come again.
#include <cuda_runtime.h>

#include <map>
#include <numeric>

#include "src/core/cuda/event_timer.h"
#include "src/core/device_monitor.h"
#include "tests/cuda/cuda_test_util.h"

namespace llmhpc::test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible"

constexpr int64_t MiB = int64_t(1) << 20;

TEST(CudaDevice, ReportsTheGpuAndCopiesRoundTrip) {
  SKIP_WITHOUT_GPU();
  Backend b = make_gpu_backend();
  Device& dev = *b.device;
  EXPECT_EQ(dev.kind(), DeviceKind::Cuda);
  EXPECT_EQ(dev.ordinal(), 0);
  EXPECT_FALSE(dev.name().empty());
  EXPECT_EQ(dev.name().find("cpu"), std::string::npos) << dev.name();
  EXPECT_NE(dev.native_stream(), nullptr);
  EXPECT_GT(dev.memory_capacity(), size_t(1) << 30);

  const int64_t n = 100003;
  std::vector<float> host(n), back(n, -1.f);
  for (int64_t i = 0; i < n; ++i) host[i] = float(i) * 0.5f - 7.f;
  Buffer a(dev.allocator(), DType::F32, {n}, "test.a"), c(dev.allocator(), DType::F32, {n}, "test.c");
  dev.copy_to_device(a.tensor().data, host.data(), n * 4);
  dev.copy_on_device(c.tensor().data, a.tensor().data, n * 4);
  dev.copy_to_host(back.data(), c.tensor().data, n * 4);
  EXPECT_EQ(back, host);
  dev.fill_zero(c.tensor().data, n * 4);
  dev.copy_to_host(back.data(), c.tensor().data, n * 4);
  EXPECT_EQ(back, std::vector<float>(n, 0.f));
  EXPECT_GE(dev.allocator().live_bytes(), 2 * n * 4);
}

// The root attributes a GPU run records: versions, the GPU as CUDA names it, and, where the
// driver's NVML is there (it is on every GPU host), the SM clock and the power limit.
TEST(CudaDevice, EnvironmentNamesTheGpuItsClocksAndVersions) {
  SKIP_WITHOUT_GPU();
  Backend b = make_gpu_backend();
  const Attrs attrs = b.device->environment();
  std::map<std::string, AttrValue> env(attrs.begin(), attrs.end());
  for (const char* key :
       {"cuda_runtime_version", "cuda_driver_version", "gpu_name", "gpu_pci_bus_id", "gpu_sm_count", "gpu_memory_bytes",
        "gpu_max_sm_clock_mhz", "nvidia_driver_version", "gpu_sm_clock_mhz", "gpu_power_limit_w"})
    EXPECT_TRUE(env.count(key)) << key;
  EXPECT_EQ(std::get<std::string>(env["gpu_name"]), b.device->name());
  EXPECT_GT(std::get<int64_t>(env["gpu_sm_count"]), 0);
  EXPECT_GT(std::get<int64_t>(env["gpu_sm_clock_mhz"]), 100);
  EXPECT_LE(std::get<int64_t>(env["gpu_sm_clock_mhz"]), std::get<int64_t>(env["gpu_max_sm_clock_mhz"]) + 100);
  EXPECT_GT(std::get<double>(env["gpu_power_limit_w"]), 50.0);
}

// The sensors the sweep's monitor reads (NVML): a clock within the GPU's range, a power draw
// below its limit, a temperature of a working GPU; under load a busy reading (the idle reason
// unset) whose clock is where a busy GPU's is.
TEST(CudaDevice, SensorsReadTheClockPowerAndTemperature) {
  SKIP_WITHOUT_GPU();
  Backend b = make_gpu_backend();
  Device& dev = *b.device;
  const Attrs attrs = dev.environment();
  std::map<std::string, AttrValue> env(attrs.begin(), attrs.end());
  DeviceReading r;
  ASSERT_TRUE(dev.read_sensors(r)) << "NVML is on every GPU host";
  EXPECT_GT(r.sm_clock_mhz, 100);
  EXPECT_LE(r.sm_clock_mhz, double(std::get<int64_t>(env["gpu_max_sm_clock_mhz"]) + 100));
  EXPECT_GT(r.power_w, 5.0);
  EXPECT_LT(r.power_w, std::get<double>(env["gpu_power_limit_w"]) * 1.5);
  EXPECT_GT(r.temperature_c, 5.0);
  EXPECT_LT(r.temperature_c, 110.0);
  // A second of copies keeps the GPU busy while a monitor reads it.
  const int64_t n = 64 * MiB;
  Buffer a(dev.allocator(), DType::F32, {n}, "test.a"), c(dev.allocator(), DType::F32, {n}, "test.c");
  DeviceMonitor monitor([&dev](DeviceReading& out) { return dev.read_sensors(out); }, std::chrono::milliseconds(10));
  monitor.start();
  for (int i = 0; i < 2000; ++i) dev.copy_on_device(c.tensor().data, a.tensor().data, size_t(n) * 4);
  dev.synchronize();
  monitor.stop();
  EXPECT_GE(monitor.samples().time_ms.size(), 10u);
  const ClockSummary busy = monitor.summary();
  EXPECT_GT(busy.busy_samples, 0) << "a GPU copying is not idle";
  EXPECT_GT(busy.min_mhz, 100);
}

TEST(CudaDevice, EventTimerMeasuresDeviceWork) {
  SKIP_WITHOUT_GPU();
  Backend b = make_gpu_backend();
  const int64_t n = 64 * MiB;  // 256 MiB of fp32: tens of microseconds per pass at least
  Buffer x(b.device->allocator(), DType::F32, {n}, "test.x"), y(b.device->allocator(), DType::BF16, {n}, "test.y");
  b.device->fill_zero(x.tensor().data, x.tensor().bytes());
  auto timer = b.device->make_timer(3);
  timer->mark(0);
  timer->mark(1);
  for (int i = 0; i < 10; ++i) b.ops->convert(y, x);
  timer->mark(2);
  const double empty = timer->elapsed_ms(0, 1), work = timer->elapsed_ms(1, 2);
  EXPECT_GE(empty, 0.0);
  EXPECT_GT(work, 0.05) << "10 passes over 384 MiB cannot take under 50 us";
  EXPECT_LT(work, 10000.0);
  EXPECT_GT(work, empty);
}

// A timer on another stream of the GPU shares the compute stream's clock: work ordered after
// a compute-stream mark is measured from that mark by marks on the other stream.
TEST(CudaDevice, TimersOnTwoStreamsShareOneClock) {
  SKIP_WITHOUT_GPU();
  Backend b = make_gpu_backend();
  const int64_t n = 64 * MiB;
  Buffer x(b.device->allocator(), DType::F32, {n}, "test.x"), y(b.device->allocator(), DType::BF16, {n}, "test.y");
  b.device->fill_zero(x.tensor().data, x.tensor().bytes());
  cudaStream_t side = nullptr;
  cudaEvent_t ready = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  auto compute = b.device->make_timer(2);
  auto other = make_event_timer(side, 2);
  compute->mark(0);
  for (int i = 0; i < 10; ++i) b.ops->convert(y, x);  // compute stream: busy
  compute->mark(1);
  ASSERT_EQ(cudaEventRecord(ready, static_cast<cudaStream_t>(b.device->native_stream())), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, ready, 0), cudaSuccess);
  other->mark(0);  // after the compute stream's work
  other->mark(1);
  const double busy = compute->elapsed_ms(0, 1), until_other = other->elapsed_ms(*compute, 0, 0);
  EXPECT_GT(busy, 0.05);
  EXPECT_GE(until_other, busy * 0.999) << "the other stream's mark waited for the compute stream's work";
  EXPECT_GE(other->elapsed_ms(*compute, 1, 1), -1e-3);
  EXPECT_GE(other->elapsed_ms(0, 1), 0.0);
  cudaEventDestroy(ready);
  cudaStreamDestroy(side);
}

// 256 MiB limit: the cuBLAS workspace holds 32 MiB, so exactly three 64 MiB buffers fit.
// Their freed blocks stay cached; a larger request must release them and succeed.
TEST(CudaDevice, MemoryLimitGivesRecoverableOutOfMemory) {
  SKIP_WITHOUT_GPU();
  const size_t limit = 256 * MiB;
  Backend b = make_gpu_backend(limit);
  EXPECT_EQ(b.device->memory_capacity(), limit);
  Allocator& a = b.device->allocator();
  std::vector<Buffer> held;
  EXPECT_THROW(
      {
        for (int i = 0; i < 10; ++i) held.emplace_back(a, DType::F32, Shape{16 * MiB}, "test.fill");
      },
      OutOfMemory);
  EXPECT_EQ(held.size(), 3u);
  held.clear();
  Buffer big(a, DType::F32, {40 * MiB}, "test.big");      // 160 MiB: fits only once the cache is released
  Buffer lo(a, DType::BF16, {16 * MiB}, "test.lo");       // 32 MiB: 224 MiB held in all
  b.ops->convert(lo, big.tensor().slice(0, {16 * MiB}));  // the device still works after the OOM
  b.device->synchronize();
}

// Past what the GPU has (but under the limit), cudaMalloc itself fails; its error must be
// cleared, or the next kernel's launch check would report it as fatal.
TEST(CudaDevice, DriverOutOfMemoryIsRecoverable) {
  SKIP_WITHOUT_GPU();
  Backend b = make_gpu_backend();
  Allocator& a = b.device->allocator();
  const int64_t too_much = int64_t(b.device->memory_capacity()) - 64 * MiB;  // the context already uses more
  EXPECT_THROW(Buffer(a, DType::F32, {too_much / 4}, "test.too_much"), OutOfMemory);
  const int64_t n = 4099;
  Buffer x(a, DType::F32, {n}, "test.x"), y(a, DType::BF16, {n}, "test.y");
  std::vector<float> host(n, 1.5f);
  b.device->copy_to_device(x.tensor().data, host.data(), n * 4);
  b.ops->convert(y, x);
  EXPECT_EQ(read_tensor(*b.device, y), std::vector<double>(n, 1.5));
}

TEST(CudaDevice, PagedMemoryGivesPagesBackAndTakesThemAgain) {
  SKIP_WITHOUT_GPU();
  Backend b = make_gpu_backend();
  Device& dev = *b.device;
  TracingAllocator& a = dev.allocator();
  const size_t page = a.page_bytes();
  ASSERT_GT(page, 0u) << "the driver's virtual memory management";
  const size_t bytes = 8 * page;
  const int64_t before = a.live_bytes();
  void* p = a.allocate_paged(bytes, "test.paged");
  EXPECT_EQ(a.live_bytes() - before, int64_t(bytes));
  std::vector<float> host(bytes / sizeof(float)), back(host.size());
  std::iota(host.begin(), host.end(), 0.0f);
  dev.copy_to_device(p, host.data(), bytes);
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  EXPECT_EQ(a.release_pages(p, 2 * page - 100, 3 * page + 200), 3 * page) << "pages 2, 3 and 4: whole pages inside";
  EXPECT_EQ(a.release_pages(p, page, 4 * page), page) << "page 1; 2 to 4 already given back";
  EXPECT_EQ(a.live_bytes() - before, int64_t(4 * page));
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after, free_before + 4 * page) << "the driver has the pages back";
  const size_t floats_per_page = page / sizeof(float);
  for (size_t k : {size_t(0), size_t(5), size_t(7)}) {  // the pages kept keep their contents
    dev.copy_to_host(back.data() + k * floats_per_page, static_cast<char*>(p) + k * page, page);
    for (size_t i = k * floats_per_page; i < (k + 1) * floats_per_page; i += 997) ASSERT_EQ(back[i], host[i]) << i;
  }
  EXPECT_EQ(a.restore_pages(p, page + 8, 1), page) << "the page the range touches";
  EXPECT_EQ(a.restore_pages(p, 0, bytes), 3 * page) << "the rest given back";
  EXPECT_EQ(a.live_bytes() - before, int64_t(bytes));
  dev.copy_to_device(p, host.data(), bytes);  // every page writable and readable again
  dev.copy_to_host(back.data(), p, bytes);
  EXPECT_EQ(back, host);
  a.deallocate(p);
  EXPECT_EQ(a.live_bytes(), before);
}

}  // namespace
}  // namespace llmhpc::test
