#include "normalization.h"

#include "../../ops/shape_ops.h"
#include "../../ops/sources.h"
#include "detail.h"
#include "functional.h"

namespace kiln::nn {

using detail::describe;

BatchNorm::BatchNorm(std::string name, int64_t features, double eps_, double momentum_,
                     bool affine_, bool track, int min_rank, int max_rank)
    : UnaryModule(std::move(name)),
      num_features(features),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track),
      min_rank_(min_rank),
      max_rank_(max_rank) {
  detail::require_positive(features, this->name(), "num_features");
  if (!(eps > 0))
    throw ValueError("[" + this->name() + "] eps must be > 0, got " + detail::num(eps));
  if (!(momentum >= 0 && momentum <= 1)) {
    throw ValueError("[" + this->name() + "] momentum must be in [0, 1], got " +
                     detail::num(momentum));
  }
  if (affine) {
    weight = register_parameter("weight", ones({features}));
    bias = register_parameter("bias", zeros({features}));
  }
  if (track) {
    running_mean = register_buffer("running_mean", zeros({features}));
    running_var = register_buffer("running_var", ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::Int64));
  }
}

namespace {

bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

}  // namespace

Tensor BatchNorm::forward(const Tensor& x_in) {
  detail::require_defined(x_in, name(), "input");
  const DType stats = affine                ? weight.dtype()
                      : track_running_stats ? running_mean.dtype()
                                            : x_in.dtype();
  const bool widened = is_half(x_in.dtype()) && stats == DType::Float32;
  const Tensor x = widened ? cast(x_in, DType::Float32) : x_in;
  if (x.ndim() < min_rank_ || x.ndim() > max_rank_ || x.size(1) != num_features) {
    std::string want = min_rank_ == max_rank_
                           ? "[N, " + std::to_string(num_features) + ", H, W]"
                           : "[N, " + std::to_string(num_features) + "] or [N, " +
                                 std::to_string(num_features) + ", L]";
    throw ShapeError("[" + name() + "] expected input " + want + " (num_features " +
                     std::to_string(num_features) + "), got " + describe(x));
  }
  if (!is_floating(x.dtype())) {
    throw DTypeError("[" + name() + "] expected a floating-point input, got " + describe(x));
  }
  if (affine) detail::require_layer_input(x, name(), weight.dtype());
  if (track_running_stats) detail::require_layer_input(x, name(), running_mean.dtype());
  if (is_training() && track_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.assign(num_batches_tracked + 1);
  }
  // Without running statistics (untracked) even eval mode normalises by the batch; in
  // training the functional updates the running statistics through assign().
  Tensor y = F::batch_norm(x, running_mean, running_var, weight, bias,
                           is_training() || !track_running_stats, momentum, eps);
  return widened ? cast(y, x_in.dtype()) : y;
}

std::string BatchNorm::extra_repr() const {
  return std::to_string(num_features) + ", eps=" + detail::num(eps) +
         ", momentum=" + detail::num(momentum) + ", affine=" + (affine ? "true" : "false") +
         ", track_running_stats=" + (track_running_stats ? "true" : "false");
}

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine, bool with_bias)
    : UnaryModule("LayerNorm"),
      normalized_shape(std::move(shape)),
      eps(eps_),
      elementwise_affine(affine) {
  if (normalized_shape.empty()) throw ValueError("[LayerNorm] normalized_shape must not be empty");
  for (int64_t s : normalized_shape)
    detail::require_positive(s, name(), "every normalized_shape size");
  if (!(eps > 0)) throw ValueError("[LayerNorm] eps must be > 0, got " + detail::num(eps));
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    if (with_bias) bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x_in) {
  detail::require_defined(x_in, name(), "input");
  const bool widened =
      weight.defined() && is_half(x_in.dtype()) && weight.dtype() == DType::Float32;
  const Tensor x = widened ? cast(x_in, DType::Float32) : x_in;
  const auto k = static_cast<int64_t>(normalized_shape.size());
  bool fits = x.ndim() >= k;
  for (int64_t d = 0; fits && d < k; ++d) fits = x.shape()[x.ndim() - k + d] == normalized_shape[d];
  if (!fits) {
    throw ShapeError("[LayerNorm] expected input with trailing dimensions " +
                     shape_str(normalized_shape) + " (normalized_shape), got " + describe(x));
  }
  if (!is_floating(x.dtype())) {
    throw DTypeError("[LayerNorm] expected a floating-point input, got " + describe(x));
  }
  if (weight.defined()) detail::require_layer_input(x, name(), weight.dtype());
  Tensor y = F::layer_norm(x, normalized_shape, weight, bias, eps);
  return widened ? cast(y, x_in.dtype()) : y;
}

std::string LayerNorm::extra_repr() const {
  return shape_str(normalized_shape) + ", eps=" + detail::num(eps) +
         ", elementwise_affine=" + (elementwise_affine ? "true" : "false");
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine_)
    : UnaryModule("GroupNorm"),
      num_groups(groups),
      num_channels(channels),
      eps(eps_),
      affine(affine_) {
  detail::require_positive(groups, name(), "num_groups");
  detail::require_positive(channels, name(), "num_channels");
  if (channels % groups != 0) {
    throw ValueError("[GroupNorm] num_channels " + std::to_string(channels) +
                     " must be divisible by num_groups " + std::to_string(groups));
  }
  if (!(eps > 0)) throw ValueError("[GroupNorm] eps must be > 0, got " + detail::num(eps));
  if (affine) {
    weight = register_parameter("weight", ones({channels}));
    bias = register_parameter("bias", zeros({channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& x_in) {
  detail::require_defined(x_in, name(), "input");
  const bool widened = affine && is_half(x_in.dtype()) && weight.dtype() == DType::Float32;
  const Tensor x = widened ? cast(x_in, DType::Float32) : x_in;
  if (x.ndim() < 2 || x.size(1) != num_channels) {
    throw ShapeError("[GroupNorm] expected input [N, " + std::to_string(num_channels) +
                     ", *] (num_channels " + std::to_string(num_channels) + "), got " +
                     describe(x));
  }
  if (!is_floating(x.dtype())) {
    throw DTypeError("[GroupNorm] expected a floating-point input, got " + describe(x));
  }
  if (affine) detail::require_layer_input(x, name(), weight.dtype());
  Tensor y = F::group_norm(x, num_groups, weight, bias, eps);
  return widened ? cast(y, x_in.dtype()) : y;
}

std::string GroupNorm::extra_repr() const {
  return std::to_string(num_groups) + ", " + std::to_string(num_channels) +
         ", eps=" + detail::num(eps) + ", affine=" + (affine ? "true" : "false");
}

InstanceNorm2d::InstanceNorm2d(int64_t features, double eps_, double momentum_, bool affine_,
                               bool track)
    : UnaryModule("InstanceNorm2d"),
      num_features(features),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track) {
  detail::require_positive(features, name(), "num_features");
  if (!(eps > 0)) throw ValueError("[InstanceNorm2d] eps must be > 0, got " + detail::num(eps));
  if (!(momentum >= 0 && momentum <= 1)) {
    throw ValueError("[InstanceNorm2d] momentum must be in [0, 1], got " + detail::num(momentum));
  }
  if (affine) {
    weight = register_parameter("weight", ones({features}));
    bias = register_parameter("bias", zeros({features}));
  }
  if (track) {
    running_mean = register_buffer("running_mean", zeros({features}));
    running_var = register_buffer("running_var", ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::Int64));
  }
}

Tensor InstanceNorm2d::forward(const Tensor& x_in) {
  detail::require_defined(x_in, name(), "input");
  const DType stats = affine                ? weight.dtype()
                      : track_running_stats ? running_mean.dtype()
                                            : x_in.dtype();
  const bool widened = is_half(x_in.dtype()) && stats == DType::Float32;
  Tensor x = widened ? cast(x_in, DType::Float32) : x_in;
  if (x.ndim() != 3 && x.ndim() != 4) {
    throw ShapeError("[InstanceNorm2d] expected a 4-D input [N, C, H, W] or 3-D [C, H, W], got " +
                     describe(x));
  }
  // PyTorch only warns about a channel count other than num_features when nothing is per
  // channel; with parameters or statistics of [num_features] it must match.
  if ((affine || track_running_stats) && x.size(-3) != num_features) {
    throw ShapeError("[InstanceNorm2d] expected input with " + std::to_string(num_features) +
                     " channels (num_features) in dimension " + std::to_string(x.ndim() - 3) +
                     ", got " + describe(x));
  }
  if (!is_floating(x.dtype())) {
    throw DTypeError("[InstanceNorm2d] expected a floating-point input, got " + describe(x));
  }
  if (affine) detail::require_layer_input(x, name(), weight.dtype());
  if (track_running_stats) detail::require_layer_input(x, name(), running_mean.dtype());
  const bool unbatched = x.ndim() == 3;
  if (unbatched) x = unsqueeze(x, 0);
  // num_batches_tracked stays as it is: PyTorch's instance norms register it (so state
  // dicts match) but never count with it.
  const bool use_input_stats = is_training() || !track_running_stats;
  // In training the functional updates the running statistics (when tracked) through
  // assign(); in eval mode with tracking it normalises by them.
  Tensor y =
      F::instance_norm(x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps);
  if (unbatched) y = squeeze(y, 0);
  return widened ? cast(y, x_in.dtype()) : y;
}

std::string InstanceNorm2d::extra_repr() const {
  return std::to_string(num_features) + ", eps=" + detail::num(eps) +
         ", momentum=" + detail::num(momentum) + ", affine=" + (affine ? "true" : "false") +
         ", track_running_stats=" + (track_running_stats ? "true" : "false");
}

}  // namespace kiln::nn
