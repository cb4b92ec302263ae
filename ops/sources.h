#pragma once
// Tensors that come from nothing: fills, ranges, host data and counter-based random numbers.
#include <vector>

#include "../core/philox.h"
#include "../core/tensor.h"

namespace kiln {

/// A tensor of `shape` filled with `value` (converted to `dtype`).
/// Factories without a device argument use default_device().
Tensor full(const Shape& shape, const Scalar& value, DType dtype = DType::Float32,
            Device device = default_device());
Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = default_device());
Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = default_device());
/// Same shape, dtype and device as `like`.
Tensor full_like(const Tensor& like, const Scalar& value);
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
/// The meta-op `index` (iota): the value at each position is its coordinate along `axis`.
Tensor index(const Shape& shape, int64_t axis, DType dtype = DType::Int64,
             Device device = default_device());
/// start, start+step, ... up to (excluding) stop. int64 unless any bound is a float
/// (then float32), or `dtype` if given; step must be non-zero.
Tensor arange(const Scalar& start, const Scalar& stop, const Scalar& step = 1);
Tensor arange(const Scalar& start, const Scalar& stop, const Scalar& step, DType dtype);
/// 0, 1, ..., stop-1 as int64.
Tensor arange(int64_t stop);

/// The n x m identity matrix (m = n when -1): ones on the diagonal (torch.eye).
Tensor eye(int64_t n, int64_t m = -1, DType dtype = DType::Float32,
           Device device = default_device());
/// `steps` values from start to end inclusive, evenly spaced (torch.linspace; computed in
/// float64 as torch does, from both ends, then converted to `dtype`).
Tensor linspace(double start, double end, int64_t steps, DType dtype = DType::Float32,
                Device device = default_device());

/// A constant tensor holding a copy of `data` (row-major; size must equal numel(shape)),
/// stored on `device`.
Tensor from_data(const void* data, const Shape& shape, DType dtype,
                 Device device = default_device());
/// A constant tensor from a vector of T with the given shape (default: 1-D).
template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape shape = {-1},
                   Device device = default_device()) {
  if (shape.size() == 1 && shape[0] == -1) shape[0] = static_cast<int64_t>(values.size());
  check_sizes("from_vector", shape);
  if (static_cast<int64_t>(values.size()) != numel(shape)) {
    throw ValueError("[from_vector] got " + std::to_string(values.size()) + " values for shape " +
                     shape_str(shape) + ", which needs " + std::to_string(numel(shape)));
  }
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return from_data(bytes.data(), shape, DType::Bool, device);
  } else {
    return from_data(values.data(), shape, dtype_of<T>(), device);
  }
}
/// A rank-0 constant tensor (a strong operand, unlike a bare C++ number).
template <typename T>
Tensor tensor(T value, Device device = default_device()) {
  return from_vector(std::vector<T>{value}, Shape{}, device);
}

/// Uniform values in [0, 1). Each value is a pure function of (seed, offset, element index);
/// creating the tensor advances the generator's offset by numel.
Tensor rand(const Shape& shape, DType dtype = DType::Float32, Generator& gen = default_generator(),
            Device device = default_device());
/// Standard normal values (Box-Muller), reproducible like rand().
Tensor randn(const Shape& shape, DType dtype = DType::Float32, Generator& gen = default_generator(),
             Device device = default_device());
/// Uniform integers in [low, high) as int64.
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen = default_generator(),
               Device device = default_device());
/// true with probability p (a bool tensor), reproducible like rand().
Tensor bernoulli(const Shape& shape, double p, Generator& gen = default_generator(),
                 Device device = default_device());

}  // namespace kiln
