#include "shape.h"

#include <cstdint>

#include "error.h"

namespace kiln {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw ShapeError("[" + std::string(op) + "] shapes " + shape_str(a) + " and " +
                       shape_str(b) + " cannot be broadcast together: dimension " +
                       std::to_string(i) + " (from the right: " + std::to_string(rank - i) +
                       ") is " + std::to_string(da) + " vs " + std::to_string(db) +
                       "; sizes must be equal or 1");
    }
    out[i] = da == 1 ? db : da;
  }
  check_sizes(op, out);
  return out;
}

static int normalize(std::string_view op, int64_t axis, int64_t bound, const Shape& shape) {
  if (axis < -bound || axis >= bound) {
    throw ShapeError("[" + std::string(op) + "] axis " + std::to_string(axis) +
                     " is out of range for a tensor of shape " + shape_str(shape) +
                     "; expected an axis in [" + std::to_string(-bound) + ", " +
                     std::to_string(bound - 1) + "]");
  }
  return static_cast<int>(axis < 0 ? axis + bound : axis);
}

int normalize_axis(std::string_view op, int64_t axis, const Shape& shape) {
  // A rank-0 tensor accepts axis 0 / -1 like PyTorch, so reductions over "all" work.
  int64_t bound = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
  return normalize(op, axis, bound, shape);
}

int normalize_insert_axis(std::string_view op, int64_t axis, const Shape& shape) {
  return normalize(op, axis, static_cast<int64_t>(shape.size()) + 1, shape);
}

void check_sizes(std::string_view op, const Shape& shape, size_t itemsize) {
  for (int64_t s : shape) {
    if (s < 0) {
      throw ValueError("[" + std::string(op) + "] negative size in shape " + shape_str(shape) +
                       "; sizes must be >= 0");
    }
  }
  // One zero size makes the tensor empty whatever the others are, like numpy.
  for (int64_t s : shape)
    if (s == 0) return;
  int64_t n = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n)) {
      throw ValueError("[" + std::string(op) + "] shape " + shape_str(shape) +
                       " has more elements than int64 can count (at most " +
                       std::to_string(INT64_MAX) + "); expected a product of sizes that fits");
    }
  }
  int64_t bytes = 0;
  if (itemsize > 1 && __builtin_mul_overflow(n, static_cast<int64_t>(itemsize), &bytes)) {
    throw ValueError("[" + std::string(op) + "] shape " + shape_str(shape) + " has " +
                     std::to_string(n) + " elements of " + std::to_string(itemsize) +
                     " bytes, more bytes than int64 can count (at most " +
                     std::to_string(INT64_MAX) + ")");
  }
}

int64_t checked_numel(std::string_view op, const Shape& shape) {
  check_sizes(op, shape);
  return numel(shape);
}

int64_t checked_nbytes(std::string_view op, const Shape& shape, size_t itemsize) {
  check_sizes(op, shape, itemsize);
  return numel(shape) * static_cast<int64_t>(itemsize);
}

}  // namespace kiln
