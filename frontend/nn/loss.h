#pragma once
// Loss functions with PyTorch's semantics (reductions, class weights, ignore_index, label
// smoothing), composed from kiln ops so they fuse with the model and differentiate.
// Available as kiln::nn::cross_entropy and as kiln::nn::F::cross_entropy.
#include <cstdint>
#include <string>

#include "../../core/tensor.h"
#include "module.h"

namespace kiln::nn {

/// How per-element losses are combined.
enum class Reduction { None, Mean, Sum };

/// Options of cross_entropy and nll_loss (use designated initializers:
/// `cross_entropy(logits, y, {.label_smoothing = 0.1})`).
struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  /// Targets equal to this contribute nothing and are not counted by the mean.
  int64_t ignore_index = -100;
  /// Mixes the one-hot target with the uniform distribution: (1 - s) * nll + s * mean over
  /// classes of -log p (weighted by the class weights when given), as PyTorch.
  double label_smoothing = 0.0;
  /// Optional class weights [C]; the mean then divides by the summed weights of the targets.
  Tensor weight{};
};

/// Cross entropy between logits [N, C] (or [N, C, d1, ...], or unbatched [C]) and either
/// integer class indices [N] (or [N, d1, ...], or []) or class probabilities with the input's
/// shape. An index outside [0, C) other than ignore_index raises IndexError at evaluation.
Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyOptions& options = {});
/// Negative log likelihood of log-probabilities [N, C] (or [N, C, d...], [C]) at integer
/// targets, with the weight, ignore_index and reduction rules of cross_entropy
/// (label_smoothing must be 0).
Tensor nll_loss(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options = {});
/// (input - target)^2, reduced. Shapes must match exactly (ShapeError otherwise: a [N, 1]
/// vs [N] mix-up would silently broadcast to [N, N]).
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// |input - target|, reduced; shapes must match.
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// Huber-style: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta; shapes must match.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      Reduction reduction = Reduction::Mean, double beta = 1.0);

/// Options of binary_cross_entropy_with_logits.
struct BCEWithLogitsOptions {
  Reduction reduction = Reduction::Mean;
  /// Per-element weight, broadcast to the input.
  Tensor weight{};
  /// Weight of the positive term, broadcast over the last dimension (one per class).
  Tensor pos_weight{};
};

/// -[p y log s(x) + (1 - y) log(1 - s(x))] with s the sigmoid and p the pos_weight, in the
/// stable form (1 - y) x + (1 + (p - 1) y) (log(1 + e^-|x|) + max(-x, 0)). target has the
/// input's shape and dtype (probabilities in [0, 1]).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsOptions& options = {});

/// kl_div's reductions: PyTorch's "batchmean" (the sum divided by the batch size, input's
/// dimension 0) is the one that gives the true KL divergence per sample.
enum class KLDivReduction { None, Mean, Sum, BatchMean };

/// Options of kl_div.
struct KLDivOptions {
  /// Mean averages over every element, as PyTorch's default (which warns to use BatchMean).
  KLDivReduction reduction = KLDivReduction::Mean;
  /// The target holds log-probabilities too.
  bool log_target = false;
};

/// Kullback-Leibler divergence of `target` from the distribution whose log-probabilities are
/// `input` (torch.nn.functional.kl_div): pointwise target * (log target - input), with
/// 0 where target is 0, or exp(target) * (target - input) with log_target. Shapes must match.
Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivOptions& options = {});

/// 0.5 d^2 where |d| < delta, else delta * (|d| - 0.5 delta), with d = input - target
/// (torch.nn.functional.huber_loss); delta > 0, shapes must match.
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                  double delta = 1.0);

/// Options of binary_cross_entropy.
struct BCEOptions {
  Reduction reduction = Reduction::Mean;
  /// Per-element weight, broadcast to the input.
  Tensor weight{};
};

/// -w [y log x + (1 - y) log(1 - x)] for probabilities x in [0, 1] and targets y of x's shape
/// and dtype (torch.nn.functional.binary_cross_entropy). Each log is clamped at -100, as
/// PyTorch does, so x = 0 or 1 gives a finite loss; x outside [0, 1] gives NaN (PyTorch
/// raises at run time; kiln checks values only when they are computed). Prefer
/// binary_cross_entropy_with_logits: it is stable where the sigmoid saturates.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const BCEOptions& options = {});

/// torch.nn.KLDivLoss: kl_div with fixed options.
class KLDivLoss : public Module {
 public:
  explicit KLDivLoss(const KLDivOptions& options = {});
  /// kl_div(input, target, options).
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  KLDivOptions options;
};

/// torch.nn.HuberLoss: huber_loss with a fixed reduction and delta.
class HuberLoss : public Module {
 public:
  explicit HuberLoss(Reduction reduction = Reduction::Mean, double delta = 1.0);
  /// huber_loss(input, target, reduction, delta).
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  Reduction reduction;
  double delta;
};

/// torch.nn.BCELoss: binary_cross_entropy with fixed options (the weight is a buffer, so it
/// follows to() and appears in state_dict() as "weight", as in PyTorch).
class BCELoss : public Module {
 public:
  explicit BCELoss(const BCEOptions& options = {});
  /// binary_cross_entropy(input, target, options).
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  Reduction reduction;

 private:
  Tensor weight_;
};

/// torch.nn.CrossEntropyLoss: cross_entropy with fixed options (the class weight is a buffer
/// named "weight", as in PyTorch).
class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(const CrossEntropyOptions& options = {});
  /// cross_entropy(input, target, options).
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  CrossEntropyOptions options;  ///< options.weight is the registered buffer
};

/// torch.nn.NLLLoss: nll_loss with fixed options (class weight as for CrossEntropyLoss).
class NLLLoss : public Module {
 public:
  explicit NLLLoss(const CrossEntropyOptions& options = {});
  /// nll_loss(input, target, options).
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  CrossEntropyOptions options;
};

/// torch.nn.MSELoss, L1Loss and SmoothL1Loss: the functions with a fixed reduction (and beta).
class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean);
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  Reduction reduction;
};

class L1Loss : public Module {
 public:
  explicit L1Loss(Reduction reduction = Reduction::Mean);
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  Reduction reduction;
};

class SmoothL1Loss : public Module {
 public:
  explicit SmoothL1Loss(Reduction reduction = Reduction::Mean, double beta = 1.0);
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  Reduction reduction;
  double beta;
};

/// torch.nn.BCEWithLogitsLoss: binary_cross_entropy_with_logits with fixed options (weight
/// and pos_weight are buffers of those names, as in PyTorch).
class BCEWithLogitsLoss : public Module {
 public:
  explicit BCEWithLogitsLoss(const BCEWithLogitsOptions& options = {});
  /// binary_cross_entropy_with_logits(input, target, options).
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string extra_repr() const override;
  BCEWithLogitsOptions options;
};

namespace functional {
using nn::binary_cross_entropy;
using nn::binary_cross_entropy_with_logits;
using nn::cross_entropy;
using nn::huber_loss;
using nn::kl_div;
using nn::l1_loss;
using nn::mse_loss;
using nn::nll_loss;
using nn::smooth_l1_loss;
}  // namespace functional

}  // namespace kiln::nn
