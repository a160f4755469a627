// Verifiable data for the collectives, nccl-tests' idea (its src/verifiable/): inputs are small
// integers, exact in every dtype, so every result is known exactly and each rank computes its
// own expected result without another rank's data. The one verification scheme of the comm
// benchmark's --check and of the collective tests.
//
// Element i of rank r's input is ((7 i + 13 r) mod p) - range, p = 2 range + 1. For
// reductions range <= max(1, 127 / nranks), so every partial sum stays within 256 and is
// exact even in bf16 (8 significant bits) for up to 256 ranks; data that is only moved has
// range 125. p is a prime other than 7 and 13 (range is lowered until it is: 125, 63, 41,
// 30 for 1-4 ranks), so the pattern takes all p values before it repeats and ranks below p
// start at different places in it: data of the wrong rank (a broadcast's root, an all-gather
// chunk) or shifted by fewer than p elements is found, and so is a reduce-scatter chunk of
// another rank unless the count is a multiple of p.
// Outputs start as a sentinel no result ever is, so an element left untouched is found too.
// The period keeps building inputs and checking 1 GB results cheap (no division per
// element, no array of expected values).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/collectives.h"
#include "comm/communicator.h"

namespace llmhpc {

// How a backend averages floats: the exact sum divided once (mpi), or every input multiplied
// by 1/n before the sum (nccl), which is exact only when n is a power of two.
enum class AverageRounding { Once, PerInput };
AverageRounding average_rounding(const Communicator& comm);

// One rank's buffers of an operation before the call, as host images in the layout of
// make_call (in place: everything in `recv`; an empty image is not uploaded), and what the
// result must be.
struct Verifiable {
  Operation op;
  int rank = 0, nranks = 1;
  std::vector<char> send, recv;
  size_t result_offset = 0, result_count = 0;  // where this rank's result lies in recv (elements)
  double tolerance = 0;  // from the exact result: 0 but for a PerInput average on n not a power of two
};

Verifiable make_verifiable(const Operation& op, int rank, int nranks, AverageRounding rounding);

// The elements of a result that are not what they must be; the first of them for messages.
struct Mismatch {
  int64_t count = 0;
  size_t first = 0;  // its index in this rank's result
  double got = 0, expected = 0;
};

// Compares the result in `recv` (the host image of the whole recv buffer after the call, at
// least as long as v.recv) with what it must be.
Mismatch count_wrong(const Verifiable& v, const std::vector<char>& recv);

}  // namespace llmhpc
