// Tensor: a non-owning view of device or host memory (pointer, shape, dtype).
// Memory is owned by Buffer (allocator.h); ops take Tensors by value.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "src/core/check.h"
#include "src/core/dtype.h"

namespace llmhpc {

constexpr int kMaxDims = 4;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    LLMHPC_CHECK(d.size() <= kMaxDims, "too many dimensions");
    for (int64_t v : d) dims[ndim++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + ")";
  }
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;

  Tensor() = default;
  Tensor(void* d, DType t, Shape s) : data(d), dtype(t), shape(s) {}

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.ndim + i : i]; }

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  // A contiguous slice of `count` elements starting at element `offset`, with a new shape.
  Tensor slice(int64_t offset, Shape s) const {
    LLMHPC_CHECK(offset >= 0 && offset + s.numel() <= numel(), "slice out of range");
    return Tensor(static_cast<char*>(data) + offset * dtype_size(dtype), dtype, s);
  }
  Tensor reshape(Shape s) const {
    LLMHPC_CHECK(s.numel() == numel(), "reshape " + shape.str() + " -> " + s.str());
    return Tensor(data, dtype, s);
  }
};

}  // namespace llmhpc
