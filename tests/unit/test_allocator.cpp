// The tracing allocator's live bytes by category: each allocation counts once, towards the
// first category with a prefix of its tag, the rest is "other", and the categories add up
// to the live total as allocations come and go.
#include <gtest/gtest.h>

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

  Buffer ws(tracer, DType::F32, {8}, "cublas.workspace");
  lowp.release();
  m = tracer.live_by_category({{"params", {"params"}}});
  EXPECT_EQ(m.of("params"), 400);
  EXPECT_EQ(m.of("other"), 60 + 32) << "what no prefix matches";
  ASSERT_EQ(m.bytes.size(), 2u);
  EXPECT_EQ(m.bytes.back().first, "other");
  EXPECT_EQ(m.total, tracer.live_bytes());
}

}  // namespace
}  // namespace llmhpc
