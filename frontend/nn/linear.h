#pragma once
// Linear, Embedding and the parameter-free layers (activations, dropout, reshaping).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "functional.h"
#include "module.h"

namespace kiln::nn {

/// y = x W^T + b over the last dimension of x; weight [out, in], bias [out]. Weight and bias
/// start as U(-1/sqrt(in), 1/sqrt(in)), as PyTorch.
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  /// x [..., in_features] -> [..., out_features].
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t in_features, out_features;
  Tensor weight, bias;  ///< bias is undefined when constructed with bias = false
};

/// A lookup table: integer indices of any shape -> their rows of weight [num, dim]. The
/// weight starts as N(0, 1) with the padding_idx row (if any) zero; that row receives no
/// gradient.
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  /// indices (integer, any shape) -> indices.shape + [embedding_dim].
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;

  const int64_t num_embeddings, embedding_dim;
  const std::optional<int64_t> padding_idx;  ///< normalised to [0, num_embeddings)
  Tensor weight;
};

/// Zeroes elements with probability p and scales the rest by 1/(1-p) in training mode; the
/// identity in eval mode.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const double p;
};

class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

/// GELU, exact (erf) or with PyTorch's tanh approximation.
class GELU : public UnaryModule {
 public:
  explicit GELU(F::GeluApproximation approximate = F::GeluApproximation::None);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const F::GeluApproximation approximate;
};

class SiLU : public UnaryModule {
 public:
  SiLU() : UnaryModule("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public UnaryModule {
 public:
  Tanh() : UnaryModule("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public UnaryModule {
 public:
  Sigmoid() : UnaryModule("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};

class LeakyReLU : public UnaryModule {
 public:
  explicit LeakyReLU(double negative_slope = 0.01);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const double negative_slope;
};

/// softmax along `dim`.
class Softmax : public UnaryModule {
 public:
  explicit Softmax(int64_t dim);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const int64_t dim;
};

/// Returns its input.
class Identity : public UnaryModule {
 public:
  Identity() : UnaryModule("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

/// Merges dimensions start_dim..end_dim (default: all but the batch dimension).
class Flatten : public UnaryModule {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const int64_t start_dim, end_dim;
};

/// Wraps a function of one tensor as a module (for Sequential).
class Functional : public UnaryModule {
 public:
  explicit Functional(std::function<Tensor(const Tensor&)> fn, std::string name = "Functional");
  Tensor forward(const Tensor& x) override { return fn_(x); }

 private:
  std::function<Tensor(const Tensor&)> fn_;
};

}  // namespace kiln::nn
