#pragma once
// Loss functions with PyTorch's semantics (reductions, class weights, ignore_index, label
// smoothing), composed from kiln ops so they fuse with the model and differentiate.
// Available as kiln::nn::cross_entropy and as kiln::nn::F::cross_entropy.
#include <cstdint>

#include "../../core/tensor.h"

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

namespace functional {
using nn::binary_cross_entropy_with_logits;
using nn::cross_entropy;
using nn::l1_loss;
using nn::mse_loss;
using nn::nll_loss;
using nn::smooth_l1_loss;
}  // namespace functional

}  // namespace kiln::nn
