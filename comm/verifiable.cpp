// Verifiable inputs and the check of a result (comm/verifiable.h).
#include "comm/verifiable.h"

#include <algorithm>
#include <cmath>

#include "src/core/check.h"

namespace llmhpc {
namespace {

constexpr double kSentinel = -1024;  // what untouched output holds: no result is ever this

// The largest range within the limit whose period 2 range + 1 is a prime other than 7 and
// 13: the steps 7 (elements) and 13 (ranks) then run through every value before repeating.
int value_range(Collective c, int nranks) {
  auto good_period = [](int p) {
    if (p == 7 || p == 13) return false;
    for (int d = 2; d * d <= p; ++d)
      if (p % d == 0) return false;
    return true;
  };
  int range = is_reduction(c) ? std::max(1, 127 / nranks) : 127;
  while (!good_period(2 * range + 1)) --range;  // ends at 1 at the latest (period 3)
  return range;
}

// Walks one rank's inputs from element 0 on.
class Pattern {
 public:
  Pattern(int rank, int range)
      : range_(range), period_(size_t(2 * range + 1)), step_(7 % period_), k_((size_t(rank) % period_) * 13 % period_) {
  }
  double next() {
    const double v = double(int64_t(k_)) - range_;
    k_ += step_;
    if (k_ >= period_) k_ -= period_;
    return v;
  }

 private:
  int range_;
  size_t period_, step_, k_;
};

// The average of a sum of inputs as the backends compute it: one division, rounded once
// (bf16: in fp32, then rounded to bf16).
double average(double sum, DType t, int nranks) {
  if (t == DType::F64) return sum / nranks;
  const float avg = float(sum) / float(nranks);
  return t == DType::BF16 ? round_to_bf16(avg) : avg;
}

// A PerInput average rounds n products and n sums of magnitude <= range: allow that much.
double average_tolerance(DType t, int nranks, int range) {
  if ((nranks & (nranks - 1)) == 0) return 0;  // 1/n is exact: so is every product
  const double eps = std::ldexp(1.0, t == DType::BF16 ? -7 : t == DType::F32 ? -23 : -52);
  return nranks * eps * range;
}

}  // namespace

AverageRounding average_rounding(const Communicator& comm) {
  return comm.backend_name() == "nccl" ? AverageRounding::PerInput : AverageRounding::Once;
}

Verifiable make_verifiable(const Operation& op, int rank, int nranks, AverageRounding rounding) {
  const DType t = op.dtype;
  const size_t es = dtype_size(t), count = op.count, total = largest_buffer_elements(op.collective, count, nranks);
  const bool in_place = op.placement == Placement::InPlace;
  const int range = value_range(op.collective, nranks);
  auto fill = [&](std::vector<char>& image, size_t n, size_t at) {
    Pattern pattern(rank, range);
    for (size_t i = 0; i < n; ++i) store_from_double(image.data(), at + i, t, pattern.next());
  };
  auto input = [&](std::vector<char>& image, size_t n) {
    image.resize(n * es);
    fill(image, n, 0);
  };
  auto sentinel = [&](std::vector<char>& image, size_t n) {
    image.resize(n * es);
    for (size_t i = 0; i < n; ++i) store_from_double(image.data(), i, t, kSentinel);
  };
  Verifiable v;
  v.op = op;
  v.rank = rank;
  v.nranks = nranks;
  v.result_count = op.collective == Collective::ReduceScatter ? count : total;
  switch (op.collective) {
    case Collective::AllReduce:
    case Collective::ReduceScatter:
      input(in_place ? v.recv : v.send, total);
      if (!in_place) sentinel(v.recv, v.result_count);
      v.result_offset = op.collective == Collective::ReduceScatter && in_place ? size_t(rank) * count : 0;
      if (op.op == ReduceOp::Average && rounding == AverageRounding::PerInput)
        v.tolerance = average_tolerance(t, nranks, range);
      break;
    case Collective::AllGather:
      sentinel(v.recv, total);
      if (in_place) fill(v.recv, count, size_t(rank) * count);
      else input(v.send, count);
      break;
    case Collective::Broadcast:
      // Every rank has an input of its own, so a result from the wrong root is found.
      if (in_place && rank == op.root) {
        input(v.recv, total);
      } else {
        if (!in_place) input(v.send, total);
        sentinel(v.recv, total);
      }
      break;
  }
  return v;
}

Mismatch count_wrong(const Verifiable& v, const std::vector<char>& recv) {
  const Operation& op = v.op;
  LLMHPC_CHECK(recv.size() >= v.recv.size(), "count_wrong: the result image is shorter than the buffer's");
  const int range = value_range(op.collective, v.nranks);
  Mismatch m;
  size_t i = 0;  // index in the result
  auto compare = [&](double expected) {
    const double got = load_as_double(recv.data(), v.result_offset + i, op.dtype);
    if (!(std::fabs(got - expected) <= v.tolerance) && m.count++ == 0) {
      m.first = i;
      m.got = got;
      m.expected = expected;
    }
    ++i;
  };
  if (is_reduction(op.collective)) {
    // The reduced value of element e depends on e mod period only: one table of it.
    const size_t period = size_t(2 * range + 1);
    std::vector<double> reduced(period, 0.0);
    for (int r = 0; r < v.nranks; ++r) {
      Pattern pattern(r, range);
      for (double& x : reduced) x += pattern.next();
    }
    if (op.op == ReduceOp::Average)
      for (double& x : reduced) x = average(x, op.dtype, v.nranks);
    // Reduce-scatter: this rank's result is its chunk of the reduced input.
    size_t j = op.collective == Collective::ReduceScatter ? (size_t(v.rank) * op.count) % period : 0;
    while (i < v.result_count) {
      compare(reduced[j]);
      if (++j == period) j = 0;
    }
  } else if (op.collective == Collective::AllGather) {
    for (int r = 0; r < v.nranks; ++r) {
      Pattern pattern(r, range);
      for (size_t k = 0; k < op.count; ++k) compare(pattern.next());
    }
  } else {
    Pattern pattern(op.root, range);
    while (i < v.result_count) compare(pattern.next());
  }
  return m;
}

}  // namespace llmhpc
