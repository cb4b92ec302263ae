#pragma once
// Stateless layer operations (torch.nn.functional): the nn modules are thin owners of
// parameters around these. Each one is composed from kiln's meta-ops, so it fuses with its
// neighbours and differentiates through autograd. Shapes and dtypes are checked when the
// op is built; messages name the op ("[conv2d] ...").
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/philox.h"
#include "../../core/tensor.h"
#include "../../ops/elementwise.h"
#include "../../ops/linalg.h"
#include "../../ops/reduce_ops.h"

namespace kiln::nn {

/// A pair of sizes (height, width) for 2-D kernels, strides, paddings and dilations; a
/// single number means the same for both, as in PyTorch.
struct Size2 {
  int64_t h = 0, w = 0;
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT(google-explicit-constructor)
  Size2(int64_t height, int64_t width) : h(height), w(width) {}
  friend bool operator==(const Size2&, const Size2&) = default;
  std::string str() const;
};

/// A convolution's padding: explicit sizes (as Size2), "valid" (none) or "same" (the
/// output keeps the input's size; stride must be 1; an odd total pads one more after, as
/// PyTorch does). Any other string throws ValueError.
struct ConvPadding {
  template <std::integral T>
  ConvPadding(T both) : size(static_cast<int64_t>(both)) {}  // NOLINT(google-explicit-constructor)
  ConvPadding(int64_t height, int64_t width) : size(height, width) {}
  ConvPadding(Size2 sizes) : size(sizes) {}  // NOLINT(google-explicit-constructor)
  ConvPadding(const char* how);              // NOLINT(google-explicit-constructor)
  friend bool operator==(const ConvPadding&, const ConvPadding&) = default;
  /// "'same'", or the sizes as Size2::str() prints them ("valid" is 0).
  std::string str() const;
  /// The (before, after) pads of one axis of the kernel `k` with `dilation`.
  std::pair<int64_t, int64_t> along(int64_t explicit_pad, int64_t k, int64_t dilation) const;

  Size2 size = 0;  ///< explicit pads, before and after alike (0 for "same" and "valid")
  bool same = false;
};

/// What a padded element holds (PyTorch's padding_mode / F.pad mode): zeros; the input
/// mirrored about its edge element (reflect); the edge element repeated (replicate); the
/// input wrapped around (circular).
enum class PaddingMode { Zeros, Reflect, Replicate, Circular };

namespace functional {

// The elementwise activations and normalisations kiln already provides, so that
// nn::functional is a complete namespace (F::relu, F::softmax, F::linear).
using kiln::linear;
using kiln::log_softmax;
using kiln::relu;
using kiln::sigmoid;
using kiln::softmax;
using kiln::tanh;

/// How GELU is computed: the exact erf form or PyTorch's tanh approximation.
enum class GeluApproximation { None, Tanh };
/// x * Phi(x) (exact: 0.5 x (1 + erf(x / sqrt 2)); tanh form as torch's approximate="tanh").
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::None);
/// x * sigmoid(x).
Tensor silu(const Tensor& x);
/// max(x, 0) + slope * min(x, 0).
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);

/// Zeroes each element with probability p and scales the rest by 1/(1-p) when `training`;
/// the identity otherwise. The mask comes from the counter-based generator, so recomputing
/// it gives the same bits. p must lie in [0, 1].
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true,
               Generator& gen = default_generator());

/// 2-D cross-correlation of x [N, C, H, W] (or unbatched [C, H, W]) with weight
/// [O, C/groups, kh, kw], plus bias [O]; output [N, O, H', W'] with
/// H' = (H + 2 pad - dilation (kh - 1) - 1) / stride + 1. Zero padding.
/// `padding` may be "same" or "valid" (ConvPadding).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Size2 stride = 1, ConvPadding padding = 0, Size2 dilation = 1, int64_t groups = 1);
/// 1-D cross-correlation of x [N, C, L] (or unbatched [C, L]) with weight [O, C/groups, k],
/// plus bias [O]; output [N, O, L'] with L' = (L + 2 pad - dilation (k - 1) - 1) / stride + 1.
/// conv2d over a unit height, so it shares conv2d's kernels and gradients.
/// `padding` is one size, "same" or "valid".
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              int64_t stride = 1, ConvPadding padding = 0, int64_t dilation = 1,
              int64_t groups = 1);
/// x padded along every axis by pads[d] = (before, after) (pads.size() == ndim, all >= 0)
/// in `mode`, as torch.nn.functional.pad: reflect needs pads smaller than the axis, circular
/// pads no larger than it, replicate a non-empty axis. Differentiable.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, PaddingMode mode);
/// The transpose (adjoint) of conv2d, as torch's conv_transpose2d: x [N, C, H, W] (or
/// [C, H, W]), weight [C, O/groups, kh, kw], bias [O]; output [N, O, H', W'] with
/// H' = (H - 1) stride - 2 pad + dilation (kh - 1) + output_padding + 1. output_padding
/// must be smaller than stride or dilation. Argument order as PyTorch's.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        Size2 stride = 1, Size2 padding = 0, Size2 output_padding = 0,
                        int64_t groups = 1, Size2 dilation = 1);
/// Max over kernel windows of x [N, C, H, W] (or [C, H, W]); padding counts as -inf.
/// `stride` defaults to the kernel size. With `ceil_mode` the output size rounds up.
Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0, Size2 dilation = 1, bool ceil_mode = false);
/// Mean over kernel windows; `count_include_pad` divides by the full window (PyTorch's
/// default) rather than by the number of input elements it covers.
Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0, bool ceil_mode = false, bool count_include_pad = true);
/// Averages x [N, C, H, W] (or [C, H, W]) into an output of `output_size` with PyTorch's
/// adaptive windows (start floor(i H / oh), end ceil((i + 1) H / oh)).
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);

/// Batch normalisation over every dimension but 1 of x [N, C, *]. In training mode it uses
/// the batch statistics and, when running stats are given, updates them in place (through
/// assign) with `momentum` and the unbiased batch variance; in eval mode it uses the
/// running statistics. weight/bias [C] are optional.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  bool training = false, double momentum = 0.1, double eps = 1e-5);
/// Normalises over the trailing dimensions `normalized_shape` (biased variance), then
/// scales by weight and shifts by bias (both optional, of shape normalized_shape).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

/// Normalises x [N, C, *] over each group of C/num_groups channels and every trailing
/// position (biased variance), then applies the per-channel weight and bias [C] (optional).
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
/// Normalises x [N, C, *] (at least one trailing dimension) per sample and channel over the
/// trailing positions, with the instance statistics when `use_input_stats` (then updating
/// running_mean/running_var, when given, with `momentum`, the batch mean of the instance
/// means and of the unbiased instance variances, as PyTorch) or else the running ones.
/// weight and bias [C] are optional.
Tensor instance_norm(const Tensor& x, const Tensor& running_mean = Tensor(),
                     const Tensor& running_var = Tensor(), const Tensor& weight = Tensor(),
                     const Tensor& bias = Tensor(), bool use_input_stats = true,
                     double momentum = 0.1, double eps = 1e-5);

/// Rows of weight [num, dim] at the integer `indices` (any shape): output indices.shape +
/// [dim]. An index outside [0, num) raises IndexError at evaluation. Positions equal to
/// `padding_idx` pass no gradient to the weight.
Tensor embedding(const Tensor& indices, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt);

/// softmax(q k^T * scale + mask) v for q [..., L, E], k [..., S, E], v [..., S, Ev] with
/// equal leading dims. `attn_mask` broadcasts to [..., L, S]: bool (true = may attend, as
/// torch's scaled_dot_product_attention) or floating (added). `is_causal` masks j > i.
/// `scale` defaults to 1/sqrt(E). When `weights` is given it receives the attention
/// probabilities (after dropout). A row with every position masked gives NaN, as PyTorch.
/// Runs by flash_attention (O(L) kept for backward instead of O(L * S)) or by the composed
/// path as sdp_backend() says (flash_attention.h): Auto takes flash under a memory budget,
/// or for CPU training steps whose kept probabilities would reach 256 MiB; never with
/// `weights`, dropout or a mask that needs a gradient; SDPBackendGuard forces one.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt,
                                    Tensor* weights = nullptr);

}  // namespace functional

/// Short alias, as `import torch.nn.functional as F`.
namespace F = functional;

}  // namespace kiln::nn
