#pragma once
// Batch, layer, group and instance normalisation with PyTorch's parameters, buffers and
// train/eval behaviour.
#include <cstdint>
#include <string>

#include "module.h"

namespace kiln::nn {

/// Shared by BatchNorm1d and BatchNorm2d: normalises each channel (dimension 1) over every
/// other dimension. Training uses the batch statistics (biased variance) and updates the
/// running ones with `momentum` (running_var from the unbiased variance); eval mode uses
/// the running statistics. Buffers: running_mean (zeros), running_var (ones),
/// num_batches_tracked (int64 scalar); parameters weight (ones) and bias (zeros).
class BatchNorm : public UnaryModule {
 public:
  /// A float16/bfloat16 input of float32 statistics is normalised in float32 and returned
  /// in its own dtype (a half model keeps its norms in float32, Module::to).
  Tensor forward(const Tensor& x) override;
  bool stays_float32() const override { return true; }
  std::string extra_repr() const override;

  const int64_t num_features;
  const double eps, momentum;
  const bool affine, track_running_stats;
  Tensor weight, bias;                                    ///< undefined unless affine
  Tensor running_mean, running_var, num_batches_tracked;  ///< undefined unless tracking

 protected:
  BatchNorm(std::string name, int64_t num_features, double eps, double momentum, bool affine,
            bool track_running_stats, int min_rank, int max_rank);

 private:
  const int min_rank_, max_rank_;
};

/// Batch normalisation of [N, C] or [N, C, L] inputs.
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm("BatchNorm1d", num_features, eps, momentum, affine, track_running_stats, 2, 3) {}
};

/// Batch normalisation of [N, C, H, W] inputs.
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm("BatchNorm2d", num_features, eps, momentum, affine, track_running_stats, 4, 4) {}
};

/// Normalises over the trailing `normalized_shape` dimensions (biased variance), then applies
/// weight (ones) and bias (zeros) of that shape when elementwise_affine.
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  /// LayerNorm over a last dimension of size `normalized_dim` with the default settings
  /// (one argument only, so that LayerNorm({2, 3}) stays unambiguous).
  explicit LayerNorm(int64_t normalized_dim) : LayerNorm(Shape{normalized_dim}) {}
  /// A float16/bfloat16 input of float32 parameters is normalised in float32 and returned in
  /// its own dtype (a half model keeps its norms in float32, Module::to).
  Tensor forward(const Tensor& x) override;
  bool stays_float32() const override { return true; }
  std::string extra_repr() const override;

  const Shape normalized_shape;
  const double eps;
  const bool elementwise_affine;
  Tensor weight, bias;
};

/// Normalises [N, C, *] inputs over groups of C/num_groups channels and every position
/// (biased variance), then applies per-channel weight (ones) and bias (zeros) [C] when
/// affine. The same in training and eval mode (no running statistics).
class GroupNorm : public UnaryModule {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  /// A float16/bfloat16 input of float32 parameters is normalised in float32 and returned in
  /// its own dtype, as LayerNorm.
  Tensor forward(const Tensor& x) override;
  bool stays_float32() const override { return true; }
  std::string extra_repr() const override;

  const int64_t num_groups, num_channels;
  const double eps;
  const bool affine;
  Tensor weight, bias;  ///< undefined unless affine
};

/// Normalises each sample's channels of [N, C, H, W] (or unbatched [C, H, W]) over H and W
/// (biased variance), as torch's InstanceNorm2d: no affine parameters and no running
/// statistics by default. With affine, weight (ones) and bias (zeros) [C]. With
/// track_running_stats, buffers running_mean (zeros) and running_var (ones) are updated in
/// training with `momentum` (the batch mean of the instance statistics, unbiased variance)
/// and used in eval mode; num_batches_tracked is saved but, as PyTorch's, never counts.
/// Without tracking, eval mode normalises by the instance statistics too. As PyTorch, the
/// channel count must equal num_features only when affine or tracking.
class InstanceNorm2d : public UnaryModule {
 public:
  explicit InstanceNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false);
  Tensor forward(const Tensor& x) override;
  bool stays_float32() const override { return true; }
  std::string extra_repr() const override;

  const int64_t num_features;
  const double eps, momentum;
  const bool affine, track_running_stats;
  Tensor weight, bias;                                    ///< undefined unless affine
  Tensor running_mean, running_var, num_batches_tracked;  ///< undefined unless tracking
};

}  // namespace kiln::nn
