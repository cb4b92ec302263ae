#include "init.h"

#include <cmath>

#include "../../ops/elementwise.h"
#include "../../ops/sources.h"
#include "detail.h"

namespace kiln::nn::init {
namespace {

double fan(const Shape& shape, FanMode mode) {
  auto [in, out] = fan_in_and_fan_out(shape);
  int64_t f = mode == FanMode::FanIn ? in : out;
  if (f <= 0) {
    throw ValueError("[init] cannot scale by a fan of 0 for a tensor of shape " + shape_str(shape));
  }
  return static_cast<double>(f);
}

// Initialisation is never part of a gradient graph; the guard also keeps assign() from
// copying a value that would otherwise record history.
Tensor replace(Tensor t, const Tensor& value) {
  NoGradGuard no_grad;
  t.assign(value);
  return t;
}

void check_defined(const Tensor& t, const char* op) {
  if (!t.defined()) throw ValueError(std::string("[init.") + op + "] the tensor is undefined");
}

}  // namespace

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Shape& shape) {
  if (shape.size() < 2) {
    throw ValueError("[init] fan in and fan out need a tensor with at least 2 dimensions, got " +
                     shape_str(shape));
  }
  int64_t receptive = 1;
  for (size_t d = 2; d < shape.size(); ++d) receptive *= shape[d];
  return {shape[1] * receptive, shape[0] * receptive};
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Sigmoid:
      return 1.0;
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::ReLU:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU:
      return std::sqrt(2.0 / (1.0 + param * param));
  }
  return 1.0;
}

Tensor uniform(const Shape& shape, double low, double high, DType dtype) {
  if (!(low <= high)) {
    throw ValueError("[init.uniform] expected low <= high, got low=" + detail::num(low) +
                     " high=" + detail::num(high));
  }
  Tensor u = rand(shape, dtype);
  return cast(u * (high - low) + low, dtype);
}

Tensor normal(const Shape& shape, double mean, double std, DType dtype) {
  if (!(std >= 0)) {
    throw ValueError("[init.normal] expected std >= 0, got " + detail::num(std));
  }
  return cast(randn(shape, dtype) * std + mean, dtype);
}

Tensor xavier_uniform(const Shape& shape, double gain, DType dtype) {
  auto [in, out] = fan_in_and_fan_out(shape);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(in + out));
  return uniform(shape, -bound, bound, dtype);
}

Tensor xavier_normal(const Shape& shape, double gain, DType dtype) {
  auto [in, out] = fan_in_and_fan_out(shape);
  return normal(shape, 0.0, gain * std::sqrt(2.0 / static_cast<double>(in + out)), dtype);
}

Tensor kaiming_uniform(const Shape& shape, double a, FanMode mode, Nonlinearity nonlinearity,
                       DType dtype) {
  double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / fan(shape, mode));
  return uniform(shape, -bound, bound, dtype);
}

Tensor kaiming_normal(const Shape& shape, double a, FanMode mode, Nonlinearity nonlinearity,
                      DType dtype) {
  return normal(shape, 0.0, calculate_gain(nonlinearity, a) / std::sqrt(fan(shape, mode)), dtype);
}

Tensor uniform_(Tensor t, double low, double high) {
  check_defined(t, "uniform_");
  return replace(t, uniform(t.shape(), low, high, t.dtype()));
}
Tensor normal_(Tensor t, double mean, double std) {
  check_defined(t, "normal_");
  return replace(t, normal(t.shape(), mean, std, t.dtype()));
}
Tensor constant_(Tensor t, double value) {
  check_defined(t, "constant_");
  return replace(t, full(t.shape(), value, t.dtype(), t.device()));
}
Tensor zeros_(Tensor t) { return constant_(std::move(t), 0.0); }
Tensor ones_(Tensor t) { return constant_(std::move(t), 1.0); }
Tensor xavier_uniform_(Tensor t, double gain) {
  check_defined(t, "xavier_uniform_");
  return replace(t, xavier_uniform(t.shape(), gain, t.dtype()));
}
Tensor xavier_normal_(Tensor t, double gain) {
  check_defined(t, "xavier_normal_");
  return replace(t, xavier_normal(t.shape(), gain, t.dtype()));
}
Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity) {
  check_defined(t, "kaiming_uniform_");
  return replace(t, kaiming_uniform(t.shape(), a, mode, nonlinearity, t.dtype()));
}
Tensor kaiming_normal_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity) {
  check_defined(t, "kaiming_normal_");
  return replace(t, kaiming_normal(t.shape(), a, mode, nonlinearity, t.dtype()));
}

}  // namespace kiln::nn::init
