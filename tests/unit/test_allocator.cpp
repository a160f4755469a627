// The tracing allocator's live bytes by category: each allocation counts once, towards the
// first category with a prefix of its tag, the rest is "other", and the categories add up
// to the live total as allocations come and go. Paged host memory gives back whole pages
// (protected: touching one faults) and takes them again, zeroed, and the counts follow.
#include <gtest/gtest.h>

#include <cstring>

#include "src/core/allocator.h"

namespace llmhpc {
namespace {

TEST(TracingAllocator, LiveBytesByTagCategory) {
  HostAllocator host(size_t(1) << 30);
  TracingAllocator tracer(host);
  const std::vector<TagCategory> categories = {
      {"params", {"params"}}, {"activations", {"activations.", "batch."}}, {"everything", {""}}};
  Buffer p(tracer, DType::F32, {100}, "params"), lowp(tracer, DType::BF16, {100}, "params.bf16"),
      act(tracer, DType::F32, {10}, "activations.layers.0.resid"), tokens(tracer, DType::I32, {5}, "batch.tokens");
  MemoryBreakdown m = tracer.live_by_category(categories);
  EXPECT_EQ(m.of("params"), 600);
  EXPECT_EQ(m.of("activations"), 60);
  EXPECT_EQ(m.of("everything"), 0) << "an allocation counts towards the first category that matches";
  EXPECT_EQ(m.of("other"), 0);
  EXPECT_EQ(m.of("no such category"), 0);
  EXPECT_EQ(m.total, tracer.live_bytes());
  EXPECT_FALSE(tracer.shares_memory()) << "host memory: nothing another rank could map";

  Buffer ws(tracer, DType::F32, {8}, "cublas.workspace");
  lowp.release();
  m = tracer.live_by_category({{"params", {"params"}}});
  EXPECT_EQ(m.of("params"), 400);
  EXPECT_EQ(m.of("other"), 60 + 32) << "what no prefix matches";
  ASSERT_EQ(m.bytes.size(), 2u);
  EXPECT_EQ(m.bytes.back().first, "other");
  EXPECT_EQ(m.total, tracer.live_bytes());
}

TEST(PagedHostMemory, GivesBackWholePagesAndTakesThemAgain) {
  HostAllocator host(size_t(1) << 30);
  TracingAllocator tracer(host);
  const size_t page = tracer.page_bytes();
  ASSERT_GT(page, 0u);
  Buffer b(tracer, DType::F32, {int64_t(6 * page / 4)}, "params", MemoryKind::Paged);
  char* p = static_cast<char*>(b.tensor().data);
  std::memset(p, 7, 6 * page);
  EXPECT_EQ(tracer.live_bytes(), int64_t(6 * page));
  tracer.set_recording(true);
  EXPECT_EQ(tracer.release_pages(p, page / 2, 3 * page), 2 * page) << "pages 1 and 2: wholly inside";
  ASSERT_EQ(tracer.events().size(), 1u);
  EXPECT_TRUE(tracer.events()[0].pages) << "pages, not a free: the allocation stays";
  EXPECT_EQ(tracer.events()[0].delta, -int64_t(2 * page));
  EXPECT_EQ(tracer.events()[0].live_after, int64_t(4 * page));
  EXPECT_EQ(tracer.release_pages(p, page, page), 0u) << "given back already";
  EXPECT_EQ(tracer.live_bytes(), int64_t(4 * page));
  EXPECT_EQ(tracer.live_by_category({{"params", {"params"}}}).of("params"), int64_t(4 * page));
  EXPECT_EQ(p[0], 7);
  EXPECT_EQ(p[3 * page], 7) << "the pages kept keep their contents";
  EXPECT_DEATH(p[page + 1] = 1, "") << "a page given back faults";
  EXPECT_EQ(tracer.restore_pages(p, page + 10, 1), page) << "the page the range touches";
  EXPECT_EQ(p[page + 1], 0) << "taken again, zeroed";
  EXPECT_EQ(tracer.restore_pages(p, 0, 6 * page), page);
  EXPECT_EQ(tracer.live_bytes(), int64_t(6 * page));
  b.release();
  EXPECT_EQ(tracer.live_bytes(), 0);
}

TEST(PagedHostMemory, PagesInsideAndTouched) {
  EXPECT_EQ(pages_inside(0, 4096, 4096), (std::pair<size_t, size_t>{0, 1}));
  EXPECT_EQ(pages_inside(1, 4096, 4096), (std::pair<size_t, size_t>{1, 1})) << "no whole page";
  EXPECT_EQ(pages_inside(100, 10000, 4096), (std::pair<size_t, size_t>{1, 2}));
  EXPECT_EQ(pages_touched(100, 10000, 4096), (std::pair<size_t, size_t>{0, 3}));
  EXPECT_EQ(pages_touched(4096, 0, 4096), (std::pair<size_t, size_t>{1, 1})) << "nothing";
}

}  // namespace
}  // namespace llmhpc
