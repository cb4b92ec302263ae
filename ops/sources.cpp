#include "sources.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "elementwise.h"
#include "transfer.h"

namespace kiln {
namespace {

NodePtr make_source(OpCode op, const Shape& shape, DType dtype, Device device, const char* name) {
  check_sizes(name, shape, itemsize(dtype));
  check_device_available(name, device);
  return std::make_shared<Node>(op, std::vector<NodePtr>{}, shape, dtype, device);
}

Tensor random_source(OpCode op, const Shape& shape, DType dtype, Generator& gen, Device device,
                     const char* name) {
  if (!is_floating(dtype)) {
    throw DTypeError(std::string("[") + name + "] expects a floating dtype, got " +
                     std::string(dtype_name(dtype)));
  }
  NodePtr node = make_source(op, shape, dtype, device, name);
  // The counter is reserved when the tensor is created, so evaluating (or recomputing) it
  // later can never depend on what else was drawn in between; seed and offset are read
  // under one lock, so a reseed on another thread cannot split them.
  const Generator::Draw d = gen.draw(static_cast<uint64_t>(numel(shape)));
  node->seed = d.seed;
  node->offset = d.offset;
  return Tensor(std::move(node));
}

}  // namespace

Tensor full(const Shape& shape, const Scalar& value, DType dtype, Device device) {
  NodePtr node = make_source(OpCode::Full, shape, dtype, device, "full");
  node->scalar = value;
  return Tensor(std::move(node));
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1, dtype, device);
}
Tensor full_like(const Tensor& like, const Scalar& value) {
  return full(like.shape(), value, like.dtype(), like.device());
}
Tensor zeros_like(const Tensor& like) { return full_like(like, 0); }
Tensor ones_like(const Tensor& like) { return full_like(like, 1); }

Tensor index(const Shape& shape, int64_t axis, DType dtype, Device device) {
  int a = normalize_axis("index", axis, shape);
  if (shape.empty()) throw ShapeError("[index] needs a shape of rank >= 1, got []");
  NodePtr node = make_source(OpCode::Iota, shape, dtype, device, "index");
  node->axis = a;
  return Tensor(std::move(node));
}

Tensor arange(const Scalar& start, const Scalar& stop, const Scalar& step, DType dtype) {
  double s0 = start.to_double(), s1 = stop.to_double(), st = step.to_double();
  if (st == 0.0 || std::isnan(st))
    throw ValueError("[arange] step must be non-zero, got " + step.str());
  if (!std::isfinite(s0) || !std::isfinite(s1)) {
    throw ValueError("[arange] bounds must be finite, got start=" + start.str() +
                     " stop=" + stop.str());
  }
  // The count in a type that cannot overflow, checked before it becomes a shape: a double
  // such as 1e30 converted to int64 would be undefined behaviour.
  auto too_many = [&](const std::string& count) {
    return ValueError("[arange] start=" + start.str() + " stop=" + stop.str() +
                      " step=" + step.str() + " gives " + count +
                      " elements, more than a tensor can hold (at most " +
                      std::to_string(INT64_MAX) + ")");
  };
  int64_t n;
  if (start.kind() != Scalar::Kind::Float && stop.kind() != Scalar::Kind::Float &&
      step.kind() != Scalar::Kind::Float) {
    // Exact for int64 bounds beyond 2^53, where doubles would miscount.
    __int128 span = static_cast<__int128>(stop.to_int64()) - start.to_int64();
    __int128 s = step.to_int64();
    __int128 q = span / s;
    if (span % s != 0 && ((span < 0) == (s < 0))) ++q;
    if (q > static_cast<__int128>(INT64_MAX))
      throw too_many(std::to_string(static_cast<unsigned long long>(q)));
    n = q > 0 ? static_cast<int64_t>(q) : 0;
  } else {
    double count = std::ceil((s1 - s0) / st);
    if (!(count < 9.2e18)) throw too_many(Scalar(count).str());
    n = count > 0 ? static_cast<int64_t>(count) : 0;
  }
  check_sizes("arange", {n}, itemsize(DType::Float64));  // the float64/int64 ramp below
  Tensor i = index({n}, 0, is_floating(dtype) ? DType::Float64 : DType::Int64);
  Tensor v = is_floating(dtype)
                 ? add(mul(i, scalar_tensor(st)), scalar_tensor(s0))
                 : add(mul(i, scalar_tensor(step.to_int64())), scalar_tensor(start.to_int64()));
  return cast(v, dtype);
}

Tensor arange(const Scalar& start, const Scalar& stop, const Scalar& step) {
  bool any_float = start.kind() == Scalar::Kind::Float || stop.kind() == Scalar::Kind::Float ||
                   step.kind() == Scalar::Kind::Float;
  return arange(start, stop, step, any_float ? DType::Float32 : DType::Int64);
}

Tensor arange(int64_t stop) { return arange(0, stop, 1, DType::Int64); }

Tensor eye(int64_t n, int64_t m, DType dtype, Device device) {
  if (n < 0) throw ValueError("[eye] expected n >= 0, got " + std::to_string(n));
  if (m < -1) {
    throw ValueError("[eye] expected m >= 0 (or -1, the default, for m = n), got " +
                     std::to_string(m));
  }
  if (m == -1) m = n;
  check_sizes("eye", {n, m}, itemsize(dtype));
  if (n == 0 || m == 0) return zeros({n, m}, dtype, device);
  Tensor diagonal =
      eq(index({n, m}, 0, DType::Int64, device), index({n, m}, 1, DType::Int64, device));
  return cast(diagonal, dtype);
}

Tensor linspace(double start, double end, int64_t steps, DType dtype, Device device) {
  if (steps < 0) throw ValueError("[linspace] expected steps >= 0, got " + std::to_string(steps));
  if (steps == 0) return zeros({0}, dtype, device);
  if (steps == 1) return full({1}, start, dtype, device);
  // As torch's kernel: the first half counts up from start, the second half down from end,
  // so both ends are exact.
  double step = (end - start) / static_cast<double>(steps - 1);
  Tensor i = index({steps}, 0, DType::Float64, device);
  Tensor up = add(mul(i, scalar_tensor(step)), scalar_tensor(start));
  Tensor down = sub(scalar_tensor(end), mul(sub(scalar_tensor(static_cast<double>(steps - 1)), i),
                                            scalar_tensor(step)));
  Tensor v = where(lt(i, scalar_tensor(static_cast<double>(steps / 2))), up, down);
  return cast(v, dtype);
}

Tensor from_data(const void* data, const Shape& shape, DType dtype, Device device) {
  NodePtr node = make_source(OpCode::Constant, shape, dtype, device, "from_data");
  if (data == nullptr && node->nbytes() > 0) {
    throw ValueError("[from_data] data is a null pointer for a " + std::string(dtype_name(dtype)) +
                     shape_str(shape) + " tensor; expected " + std::to_string(node->nbytes()) +
                     " readable bytes");
  }
  auto host = std::make_shared<Buffer>(node->nbytes(), Device::cpu());
  if (node->nbytes() > 0) std::memcpy(host->data(), data, node->nbytes());
  node->buffer = device.is_cuda() ? detail::copy_buffer(*host, device) : std::move(host);
  return Tensor(std::move(node));
}

Tensor rand(const Shape& shape, DType dtype, Generator& gen, Device device) {
  return random_source(OpCode::RandUniform, shape, dtype, gen, device, "rand");
}
Tensor randn(const Shape& shape, DType dtype, Generator& gen, Device device) {
  return random_source(OpCode::RandNormal, shape, dtype, gen, device, "randn");
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen, Device device) {
  if (high <= low) {
    throw ValueError("[randint] expects low < high, got low=" + std::to_string(low) +
                     " high=" + std::to_string(high));
  }
  // float64 uniforms carry 53 bits, enough for any range a tensor can index.
  Tensor u = rand(shape, DType::Float64, gen, device);
  Tensor v = floor(mul(u, scalar_tensor(static_cast<double>(high - low))));
  return add(cast(v, DType::Int64), scalar_tensor(low));
}

Tensor bernoulli(const Shape& shape, double p, Generator& gen, Device device) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ValueError("[bernoulli] probability must be in [0, 1], got " + Scalar(p).str());
  }
  return lt(rand(shape, DType::Float32, gen, device), scalar_tensor(p));
}

}  // namespace kiln
