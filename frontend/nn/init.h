#pragma once
// Parameter initialisation as in torch.nn.init. The functions without a trailing underscore
// create a new tensor; the ones with it assign a fresh value to an existing tensor (every
// copy of its handle sees it) and return it. Random values come from the default
// generator, so kiln::manual_seed makes initialisation reproducible.
#include <cstdint>
#include <utility>

#include "../../core/tensor.h"

namespace kiln::nn::init {

/// How kaiming_* scale: by the fan-in (preserves forward variance) or the fan-out.
enum class FanMode { FanIn, FanOut };
/// The nonlinearity kaiming_* and calculate_gain compute a gain for.
enum class Nonlinearity { Linear, Sigmoid, Tanh, ReLU, LeakyReLU };

/// (fan_in, fan_out) of a weight of `shape` ([out, in, *kernel]); rank < 2 raises ValueError.
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Shape& shape);
/// The recommended gain for `nonlinearity` (`param` is LeakyReLU's negative slope).
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

/// Values drawn from U(low, high).
Tensor uniform(const Shape& shape, double low = 0.0, double high = 1.0,
               DType dtype = DType::Float32);
/// Values drawn from N(mean, std^2).
Tensor normal(const Shape& shape, double mean = 0.0, double std = 1.0,
              DType dtype = DType::Float32);
/// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (Glorot).
Tensor xavier_uniform(const Shape& shape, double gain = 1.0, DType dtype = DType::Float32);
/// N(0, s^2) with s = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal(const Shape& shape, double gain = 1.0, DType dtype = DType::Float32);
/// U(-b, b) with b = gain * sqrt(3 / fan); gain from `nonlinearity` and slope `a` (He).
/// With a = sqrt(5) this is PyTorch's default Linear/Conv weight init, b = 1/sqrt(fan_in).
Tensor kaiming_uniform(const Shape& shape, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyReLU,
                       DType dtype = DType::Float32);
/// N(0, s^2) with s = gain / sqrt(fan).
Tensor kaiming_normal(const Shape& shape, double a = 0.0, FanMode mode = FanMode::FanIn,
                      Nonlinearity nonlinearity = Nonlinearity::LeakyReLU,
                      DType dtype = DType::Float32);

/// In-place forms: assign a new value of t's shape and dtype to t and return t.
Tensor uniform_(Tensor t, double low = 0.0, double high = 1.0);
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0);
Tensor constant_(Tensor t, double value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
Tensor xavier_uniform_(Tensor t, double gain = 1.0);
Tensor xavier_normal_(Tensor t, double gain = 1.0);
Tensor kaiming_uniform_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
Tensor kaiming_normal_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);

}  // namespace kiln::nn::init
