#pragma once
// Batch and layer normalisation with PyTorch's parameters, buffers and train/eval behaviour.
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

}  // namespace kiln::nn
