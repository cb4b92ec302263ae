// Layer operations as compositions of kiln's meta-ops. Layouts are chosen so that the
// heavy contractions are products whose operands are read by plain coordinates (what the
// library GEMM recognises), and so that reductions run over trailing dimensions, which the
// CPU backend turns into vectorised inner loops.
#include "functional.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../../ops/autocast.h"
#include "../../ops/reindex.h"
#include "../../ops/shape_ops.h"
#include "../../ops/sources.h"
#include "detail.h"
#include "flash_attention.h"

namespace kiln::nn {

std::string Size2::str() const {
  return h == w ? std::to_string(h) : "(" + std::to_string(h) + ", " + std::to_string(w) + ")";
}

ConvPadding::ConvPadding(const char* how) {
  const std::string s = how ? how : "";
  if (s == "same") {
    same = true;
  } else if (s != "valid") {
    throw ValueError("[conv] padding must be sizes, \"same\" or \"valid\", got \"" + s + "\"");
  }
}

std::string ConvPadding::str() const { return same ? "'same'" : size.str(); }

std::pair<int64_t, int64_t> ConvPadding::along(int64_t explicit_pad, int64_t k,
                                               int64_t dilation) const {
  if (!same) return {explicit_pad, explicit_pad};
  const int64_t total = dilation * (k - 1);
  return {total / 2, total - total / 2};
}

namespace functional {
namespace {

using detail::describe;
using detail::require_attention_operands;
using detail::require_defined;
using detail::require_floating;
using detail::require_same_dtype;

IndexExpr var(int d) { return IndexExpr::var(d); }
IndexExpr cst(int64_t v) { return IndexExpr::constant(v); }

void check_positive(const char* op, const char* what, Size2 s) {
  if (s.h < 1 || s.w < 1) {
    throw ValueError(std::string("[") + op + "] " + what + " must be >= 1, got " + s.str());
  }
}

void check_non_negative(const char* op, const char* what, Size2 s) {
  if (s.h < 0 || s.w < 0) {
    throw ValueError(std::string("[") + op + "] " + what + " must be >= 0, got " + s.str());
  }
}

// A 3-D input is one unbatched image; it is given a batch of 1 and the result loses it again.
Tensor batched_image(const Tensor& x, const char* op) {
  require_defined(x, op, "input");
  if (x.ndim() != 3 && x.ndim() != 4) {
    throw ShapeError(std::string("[") + op +
                     "] expected a 4-D input [N, C, H, W] or 3-D [C, H, W], got " + describe(x));
  }
  return x.ndim() == 3 ? unsqueeze(x, 0) : x;
}

Tensor restore_batch(const Tensor& y, const Tensor& x) { return x.ndim() == 3 ? squeeze(y, 0) : y; }

// Output length of a sliding window (PyTorch's pooling_output_shape for ceil mode).
int64_t window_count(const char* op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d,
                     bool ceil_mode) {
  int64_t span = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (span < 0 ? -1 : (ceil_mode ? (span + s - 1) / s : span / s)) + 1;
  // A last window that would start in the right padding is dropped.
  if (ceil_mode && out > 0 && (out - 1) * s >= in + p) --out;
  if (out < 1) {
    throw ShapeError(std::string("[") + op + "] input size " + std::to_string(in) +
                     " with padding " + std::to_string(p) + " is too small for a kernel of " +
                     std::to_string(k) + " with dilation " + std::to_string(d) +
                     "; the output would be empty");
  }
  return out;
}

}  // namespace

Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  require_floating(x, "gelu", "input");
  if (approximate == GeluApproximation::Tanh) {
    constexpr double kSqrt2OverPi = 0.79788456080286535588;
    Tensor inner = (x + x * x * x * 0.044715) * kSqrt2OverPi;
    return x * 0.5 * (tanh(inner) + 1.0);
  }
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  return x * 0.5 * (erf(x * kInvSqrt2) + 1.0);
}

Tensor silu(const Tensor& x) {
  require_floating(x, "silu", "input");
  return x * sigmoid(x);
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  require_floating(x, "leaky_relu", "input");
  return where(x > 0, x, x * negative_slope);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  require_defined(x, "dropout", "input");
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ValueError("[dropout] probability must be in [0, 1], got " + detail::num(p));
  }
  if (!training || p == 0.0) return x;
  require_floating(x, "dropout", "input");
  Tensor keep = bernoulli(x.shape(), 1.0 - p, gen);
  // p == 1 keeps nothing; the scale would be infinite, and is never used.
  return where(keep, p == 1.0 ? x : x * (1.0 / (1.0 - p)), 0.0);
}

// What conv2d and conv_transpose2d check and cast alike: autocast's lower precision (bias
// included), the input batched to [N, C, H, W], the weight's dtype, the window's sizes.
struct ConvOperands {
  Tensor x, weight, bias;
};
ConvOperands conv_operands(const char* op, const Tensor& input, const Tensor& weight_in,
                           const Tensor& bias_in, Size2 stride, Size2 padding, Size2 dilation,
                           int64_t groups) {
  ConvOperands c{batched_image(amp::lower_precision(input), op), amp::lower_precision(weight_in),
                 amp::lower_precision(bias_in)};
  require_defined(c.weight, op, "weight");
  require_floating(c.x, op, "input");
  require_same_dtype(c.x, c.weight, op, "weight");
  check_positive(op, "stride", stride);
  check_positive(op, "dilation", dilation);
  check_non_negative(op, "padding", padding);
  if (groups < 1)
    throw ValueError("[" + std::string(op) + "] groups must be >= 1, got " +
                     std::to_string(groups));
  return c;
}

Tensor conv2d(const Tensor& input, const Tensor& weight_in, const Tensor& bias_in, Size2 stride,
              ConvPadding padding, Size2 dilation, int64_t groups) {
  const char* op = "conv2d";
  auto [x, weight, bias] =
      conv_operands(op, input, weight_in, bias_in, stride, padding.size, dilation, groups);
  if (padding.same && stride != Size2(1)) {
    throw ValueError("[conv2d] padding 'same' needs stride 1 (as in PyTorch), got stride " +
                     stride.str());
  }
  if (weight.ndim() != 4) {
    throw ShapeError(
        "[conv2d] expected a 4-D weight [out_channels, in_channels/groups, kh, kw], got " +
        describe(weight));
  }
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t o = weight.size(0), cg = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  if (o % groups != 0) {
    throw ValueError("[conv2d] out_channels " + std::to_string(o) + " is not divisible by groups " +
                     std::to_string(groups));
  }
  if (cg * groups != c) {
    throw ShapeError("[conv2d] expected input with " + std::to_string(cg * groups) +
                     " channels (weight " + describe(weight) + ", groups " +
                     std::to_string(groups) + "), got " + describe(input));
  }
  if (bias.defined()) {
    require_same_dtype(x, bias, op, "bias");
    if (bias.shape() != Shape{o}) {
      throw ShapeError("[conv2d] expected a bias of shape [" + std::to_string(o) + "], got " +
                       describe(bias));
    }
  }
  // "same" pads (total / 2) before and the rest after: the windows start total / 2 early
  // and there are as many as input positions; the gather reads zeros past either edge.
  const Size2 before(padding.along(padding.size.h, kh, dilation.h).first,
                     padding.along(padding.size.w, kw, dilation.w).first);
  const int64_t oh =
      padding.same ? h : window_count(op, h, kh, stride.h, padding.size.h, dilation.h, false);
  const int64_t ow =
      padding.same ? w : window_count(op, w, kw, stride.w, padding.size.w, dilation.w, false);
  const int64_t og = o / groups;
  // im2col: the patches as [G, N, OH, OW, C/G, kh, kw], whose map is affine (no division
  // by a run-time size per element: the flat [M, K] map needed four, and its gather ran at
  // integer-division speed, 99% of a forward's generated time), stored once. The product
  // is built over [G, N, OH, OW, Og, C/G, kh, kw] and summed over the last three: the
  // library GEMM reads the patches as the [M, K] matrix they are in memory (N, OH, OW and
  // C/G, kh, kw flatten) and the weight as [Og, K], one call per group. The product is
  // stored NHWC ([N, OH, OW, O], group g's channels at g*Og), so that the result is one
  // plain tensor for any number of groups and NCHW is a permute of it, whose gradient is a
  // map the backward products read directly (jit/library_conv.h runs all three products of
  // this composition on oneDNN's convolution where it can). Half inputs are multiplied in
  // float32 and rounded once, as matmul does.
  const DType compute =
      x.dtype() == DType::Float16 || x.dtype() == DType::BFloat16 ? DType::Float32 : x.dtype();
  Tensor patches =
      detail::stored(reindex(x, {groups, n, oh, ow, cg, kh, kw},
                             {var(1), var(0) * cst(cg) + var(4),
                              var(2) * cst(stride.h) - cst(before.h) + var(5) * cst(dilation.h),
                              var(3) * cst(stride.w) - cst(before.w) + var(6) * cst(dilation.w)},
                             0, {}, false, op));
  const Shape domain{groups, n, oh, ow, og, cg, kh, kw};
  Tensor pa = reindex(cast(patches, compute), domain,
                      {var(0), var(1), var(2), var(3), var(5), var(6), var(7)}, 0, {}, false, op);
  Tensor wb = reindex(cast(weight, compute), domain,
                      {var(0) * cst(og) + var(4), var(5), var(6), var(7)}, 0, {}, false, op);
  Tensor nhwc = reindex_reduce(mul(pa, wb), ReduceOp::Sum, {n, oh, ow, o},
                               {var(1), var(2), var(3), var(0) * cst(og) + var(4)}, {}, false, op);
  Tensor y = cast(reindex(nhwc, {n, o, oh, ow}, {var(0), var(2), var(3), var(1)}, 0, {}, false, op),
                  x.dtype());
  if (bias.defined()) y = y + reshape(bias, {o, 1, 1});
  return restore_batch(y, input);
}

Tensor conv1d(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in,
              int64_t stride, ConvPadding padding_in, int64_t dilation, int64_t groups) {
  const char* op = "conv1d";
  if (padding_in.size.h != padding_in.size.w) {
    throw ValueError("[conv1d] expected one padding size, got " + padding_in.str());
  }
  const int64_t padding = padding_in.size.w;
  // Autocast's casts first (conv2d's again are no-ops), so the checks see what conv2d will.
  const Tensor input = amp::lower_precision(input_in), weight = amp::lower_precision(weight_in),
               bias = amp::lower_precision(bias_in);
  require_defined(input, op, "input");
  require_defined(weight, op, "weight");
  require_floating(input, op, "input");
  require_same_dtype(input, weight, op, "weight");
  if (input.ndim() != 2 && input.ndim() != 3) {
    throw ShapeError("[conv1d] expected a 3-D input [N, C, L] or 2-D [C, L], got " +
                     describe(input));
  }
  if (weight.ndim() != 3) {
    throw ShapeError("[conv1d] expected a 3-D weight [out_channels, in_channels/groups, k], got " +
                     describe(weight));
  }
  check_positive(op, "stride", stride);
  check_positive(op, "dilation", dilation);
  check_non_negative(op, "padding", padding);
  if (groups < 1) throw ValueError("[conv1d] groups must be >= 1, got " + std::to_string(groups));
  if (padding_in.same && stride != 1) {
    throw ValueError("[conv1d] padding 'same' needs stride 1 (as in PyTorch), got stride " +
                     std::to_string(stride));
  }
  if (weight.size(1) * groups != input.size(-2)) {
    throw ShapeError("[conv1d] expected input with " + std::to_string(weight.size(1) * groups) +
                     " channels (weight " + describe(weight) + ", groups " +
                     std::to_string(groups) + "), got " + describe(input));
  }
  if (weight.size(0) % groups != 0) {
    throw ValueError("[conv1d] out_channels " + std::to_string(weight.size(0)) +
                     " is not divisible by groups " + std::to_string(groups));
  }
  if (bias.defined()) {
    require_same_dtype(input, bias, op, "bias");
    if (bias.shape() != Shape{weight.size(0)}) {
      throw ShapeError("[conv1d] expected a bias of shape [" + std::to_string(weight.size(0)) +
                       "], got " + describe(bias));
    }
  }
  const int64_t span = input.size(-1) + 2 * padding - dilation * (weight.size(2) - 1) - 1;
  if (!padding_in.same && span < 0) {
    throw ShapeError("[conv1d] input " + describe(input) + " with padding " +
                     std::to_string(padding) + " is smaller than the kernel " +
                     std::to_string(weight.size(2)) + " dilated by " + std::to_string(dilation));
  }
  // A unit height: conv2d's kernels and gradients serve both.
  Tensor y = conv2d(unsqueeze(input, -2), unsqueeze(weight, 2), bias, Size2(1, stride),
                    padding_in.same ? ConvPadding("same") : ConvPadding(0, padding),
                    Size2(1, dilation), groups);
  return squeeze(y, -2);
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads,
           PaddingMode mode) {
  const char* op = "pad";
  require_defined(x, op, "input");
  if (static_cast<int64_t>(pads.size()) != x.ndim()) {
    throw ShapeError("[pad] expected one (before, after) pair per axis of " + describe(x) +
                     ", got " + std::to_string(pads.size()));
  }
  if (mode == PaddingMode::Zeros) return kiln::pad(x, pads, 0);
  const char* name = mode == PaddingMode::Reflect     ? "reflect"
                     : mode == PaddingMode::Replicate ? "replicate"
                                                      : "circular";
  // One gather per padded axis, its index computed here: reflect mirrors about the edge
  // element (not repeating it), replicate clamps, circular wraps once.
  Tensor y = x;
  for (int64_t d = 0; d < x.ndim(); ++d) {
    const auto [before, after] = pads[static_cast<size_t>(d)];
    if (before == 0 && after == 0) continue;
    const int64_t n = x.size(d);
    const std::string where = " (" + std::to_string(before) + ", " + std::to_string(after) +
                              ") on axis " + std::to_string(d) + " of " + describe(x);
    if (before < 0 || after < 0)
      throw ValueError(std::string("[pad] ") + name + " padding takes pads >= 0, got" + where);
    if (mode == PaddingMode::Reflect && (before >= n || after >= n)) {
      throw ValueError("[pad] reflect padding must be smaller than the axis it pads, got" + where);
    }
    if (mode == PaddingMode::Circular && (before > n || after > n)) {
      throw ValueError("[pad] circular padding must not exceed the axis it pads, got" + where);
    }
    if (n == 0)
      throw ValueError(std::string("[pad] ") + name + " padding needs a non-empty axis, got" +
                       where);
    std::vector<int64_t> index(static_cast<size_t>(n + before + after));
    for (int64_t j = 0; j < static_cast<int64_t>(index.size()); ++j) {
      int64_t i = j - before;
      if (mode == PaddingMode::Reflect) {
        if (i < 0) i = -i;
        if (i >= n) i = 2 * (n - 1) - i;
      } else if (mode == PaddingMode::Replicate) {
        i = std::clamp<int64_t>(i, 0, n - 1);
      } else {
        i = ((i % n) + n) % n;
      }
      index[static_cast<size_t>(j)] = i;
    }
    const int64_t count = static_cast<int64_t>(index.size());
    y = index_select(y, d, from_vector(index, {count}));
  }
  return y;
}

Tensor conv_transpose2d(const Tensor& input, const Tensor& weight_in, const Tensor& bias_in,
                        Size2 stride, Size2 padding, Size2 output_padding, int64_t groups,
                        Size2 dilation) {
  const char* op = "conv_transpose2d";
  auto [x, weight, bias] =
      conv_operands(op, input, weight_in, bias_in, stride, padding, dilation, groups);
  check_non_negative(op, "output_padding", output_padding);
  if ((output_padding.h >= stride.h && output_padding.h >= dilation.h) ||
      (output_padding.w >= stride.w && output_padding.w >= dilation.w)) {
    throw ValueError("[conv_transpose2d] output_padding " + output_padding.str() +
                     " must be smaller than either stride " + stride.str() + " or dilation " +
                     dilation.str());
  }
  if (weight.ndim() != 4) {
    throw ShapeError(
        "[conv_transpose2d] expected a 4-D weight [in_channels, out_channels/groups, kh, kw], "
        "got " +
        describe(weight));
  }
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t og = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  if (weight.size(0) != c || c % groups != 0) {
    throw ShapeError("[conv_transpose2d] expected input with " + std::to_string(weight.size(0)) +
                     " channels (weight " + describe(weight) + "), divisible by groups " +
                     std::to_string(groups) + ", got " + describe(input));
  }
  const int64_t o = og * groups, cg = c / groups;
  if (bias.defined()) {
    require_same_dtype(x, bias, op, "bias");
    if (bias.shape() != Shape{o}) {
      throw ShapeError("[conv_transpose2d] expected a bias of shape [" + std::to_string(o) +
                       "], got " + describe(bias));
    }
  }
  const int64_t oh =
      (h - 1) * stride.h - 2 * padding.h + dilation.h * (kh - 1) + output_padding.h + 1;
  const int64_t ow =
      (w - 1) * stride.w - 2 * padding.w + dilation.w * (kw - 1) + output_padding.w + 1;
  if (oh < 1 || ow < 1) {
    throw ShapeError("[conv_transpose2d] input " + describe(input) + " with padding " +
                     padding.str() + " gives an empty output [" + std::to_string(oh) + ", " +
                     std::to_string(ow) + "]");
  }
  // The adjoint of conv2d's im2col form: a product gives every input pixel's contribution
  // to each kernel tap, cols [G, N, H, W, Og, kh, kw] = sum over C/G of x * weight (a GEMM
  // per group with K = C/G), and col2im scatters it, adding, to output pixel
  // (h stride - pad + a dilation, w stride - pad + b dilation); taps that land in the
  // padding are dropped. Both are meta-ops with gradients (the scatter's is a gather), so
  // the result differentiates in x, weight and bias. Half inputs multiply in float32, as
  // conv2d.
  const DType compute =
      x.dtype() == DType::Float16 || x.dtype() == DType::BFloat16 ? DType::Float32 : x.dtype();
  const Shape domain{groups, n, h, w, og, kh, kw, cg};
  Tensor xa = reindex(cast(x, compute), domain, {var(1), var(0) * cst(cg) + var(7), var(2), var(3)},
                      0, {}, false, op);
  Tensor wb = reindex(cast(weight, compute), domain,
                      {var(0) * cst(cg) + var(7), var(4), var(5), var(6)}, 0, {}, false, op);
  Tensor cols =
      reindex_reduce(mul(xa, wb), ReduceOp::Sum, {groups, n, h, w, og, kh, kw},
                     {var(0), var(1), var(2), var(3), var(4), var(5), var(6)}, {}, false, op);
  Tensor y = reindex_reduce(cols, ReduceOp::Sum, {n, o, oh, ow},
                            {var(1), var(0) * cst(og) + var(4),
                             var(2) * cst(stride.h) - cst(padding.h) + var(5) * cst(dilation.h),
                             var(3) * cst(stride.w) - cst(padding.w) + var(6) * cst(dilation.w)},
                            {}, false, op);
  y = cast(y, x.dtype());
  if (bias.defined()) y = y + reshape(bias, {o, 1, 1});
  return restore_batch(y, input);
}

namespace {

// Windows of x [N, C, H, W] laid out as [N, C, OH, OW, kh, kw] (out-of-range reads give fill).
Tensor windows(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation,
               int64_t oh, int64_t ow, const Scalar& fill, const char* op) {
  return reindex(
      x, {x.size(0), x.size(1), oh, ow, kernel.h, kernel.w},
      {var(0), var(1), var(2) * cst(stride.h) - cst(padding.h) + var(4) * cst(dilation.h),
       var(3) * cst(stride.w) - cst(padding.w) + var(5) * cst(dilation.w)},
      fill, {}, false, op);
}

void check_pool_args(const char* op, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation) {
  check_positive(op, "kernel_size", kernel);
  check_positive(op, "stride", stride);
  check_positive(op, "dilation", dilation);
  check_non_negative(op, "padding", padding);
  if (2 * padding.h > kernel.h || 2 * padding.w > kernel.w) {
    throw ValueError(std::string("[") + op + "] padding " + padding.str() +
                     " must be at most half of the kernel size " + kernel.str());
  }
}

}  // namespace

Tensor max_pool2d(const Tensor& input, Size2 kernel, std::optional<Size2> stride_opt, Size2 padding,
                  Size2 dilation, bool ceil_mode) {
  const char* op = "max_pool2d";
  Tensor x = batched_image(input, op);
  Size2 stride = stride_opt.value_or(kernel);
  check_pool_args(op, kernel, stride, padding, dilation);
  if (x.dtype() == DType::Bool)
    throw DTypeError("[max_pool2d] is not defined for bool input " + describe(x));
  const int64_t oh =
      window_count(op, x.size(2), kernel.h, stride.h, padding.h, dilation.h, ceil_mode);
  const int64_t ow =
      window_count(op, x.size(3), kernel.w, stride.w, padding.w, dilation.w, ceil_mode);
  Scalar lowest =
      is_floating(x.dtype()) ? Scalar(-INFINITY) : Scalar(std::numeric_limits<int64_t>::min());
  Tensor win = windows(x, kernel, stride, padding, dilation, oh, ow, lowest, op);
  return restore_batch(max(win, {4, 5}), input);
}

Tensor avg_pool2d(const Tensor& input, Size2 kernel, std::optional<Size2> stride_opt, Size2 padding,
                  bool ceil_mode, bool count_include_pad) {
  const char* op = "avg_pool2d";
  Tensor x = batched_image(input, op);
  Size2 stride = stride_opt.value_or(kernel);
  check_pool_args(op, kernel, stride, padding, 1);
  require_floating(x, op, "input");
  const int64_t h = x.size(2), w = x.size(3);
  const int64_t oh = window_count(op, h, kernel.h, stride.h, padding.h, 1, ceil_mode);
  const int64_t ow = window_count(op, w, kernel.w, stride.w, padding.w, 1, ceil_mode);
  Tensor sums = sum(windows(x, kernel, stride, padding, 1, oh, ow, 0, op), {4, 5});
  // The divisor of each window depends only on sizes: count on the host, as PyTorch does
  // (clipped to the padded input, and to the input itself without count_include_pad).
  auto counts = [&](int64_t in, int64_t out, int64_t k, int64_t s, int64_t p) {
    std::vector<double> c(static_cast<size_t>(out));
    for (int64_t i = 0; i < out; ++i) {
      int64_t start = i * s - p, end = std::min(start + k, in + p);
      if (!count_include_pad) start = std::max<int64_t>(start, 0), end = std::min(end, in);
      c[static_cast<size_t>(i)] = static_cast<double>(end - start);
    }
    return c;
  };
  std::vector<double> ch = counts(h, oh, kernel.h, stride.h, padding.h);
  std::vector<double> cw = counts(w, ow, kernel.w, stride.w, padding.w);
  bool uniform = true;
  for (double v : ch) uniform = uniform && v == static_cast<double>(kernel.h);
  for (double v : cw) uniform = uniform && v == static_cast<double>(kernel.w);
  if (uniform) return restore_batch(sums * (1.0 / static_cast<double>(kernel.h * kernel.w)), input);
  std::vector<double> area(static_cast<size_t>(oh * ow));
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; ++j) area[static_cast<size_t>(i * ow + j)] = ch[i] * cw[j];
  return restore_batch(sums / cast(from_vector(area, {oh, ow}, x.device()), x.dtype()), input);
}

Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size) {
  const char* op = "adaptive_avg_pool2d";
  Tensor x = batched_image(input, op);
  check_positive(op, "output_size", output_size);
  require_floating(x, op, "input");
  const int64_t h = x.size(2), w = x.size(3);
  if (output_size.h == 1 && output_size.w == 1) return restore_batch(mean(x, {2, 3}, true), input);
  if (h % output_size.h == 0 && w % output_size.w == 0) {
    Size2 k(h / output_size.h, w / output_size.w);
    return avg_pool2d(input, k, k);
  }
  // Windows [floor(i*H/oh), ceil((i+1)*H/oh)) have at most `span` elements; positions past a
  // window's end are masked out and each window divided by its own size.
  auto plan = [](int64_t in, int64_t out, int64_t* span, std::vector<double>* size) {
    *span = 0;
    for (int64_t i = 0; i < out; ++i) {
      int64_t start = i * in / out, end = ((i + 1) * in + out - 1) / out;
      *span = std::max(*span, end - start);
      size->push_back(static_cast<double>(end - start));
    }
  };
  int64_t sh = 0, sw = 0;
  std::vector<double> size_h, size_w;
  plan(h, output_size.h, &sh, &size_h);
  plan(w, output_size.w, &sw, &size_w);
  const int64_t oh = output_size.h, ow = output_size.w;
  Shape domain{x.size(0), x.size(1), oh, ow, sh, sw};
  Tensor win = reindex(x, domain,
                       {var(0), var(1), floordiv(var(2) * cst(h), cst(oh)) + var(4),
                        floordiv(var(3) * cst(w), cst(ow)) + var(5)},
                       0, {}, false, op);
  std::vector<uint8_t> inside(static_cast<size_t>(oh * ow * sh * sw));
  std::vector<double> area(static_cast<size_t>(oh * ow));
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; ++j) {
      area[static_cast<size_t>(i * ow + j)] = size_h[i] * size_w[j];
      for (int64_t a = 0; a < sh; ++a)
        for (int64_t b = 0; b < sw; ++b)
          inside[static_cast<size_t>(((i * ow + j) * sh + a) * sw + b)] =
              a < size_h[i] && b < size_w[j];
    }
  Tensor mask = cast(from_vector(inside, {oh, ow, sh, sw}, x.device()), DType::Bool);
  Tensor sums = sum(where(mask, win, 0.0), {4, 5});
  return restore_batch(sums / cast(from_vector(area, {oh, ow}, x.device()), x.dtype()), input);
}

Tensor batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight_in, const Tensor& bias_in, bool training, double momentum,
                  double eps) {
  const char* op = "batch_norm";
  // Norms are on autocast's float32 list.
  const Tensor x = amp::full_precision(x_in), weight = amp::full_precision(weight_in),
               bias = amp::full_precision(bias_in);
  require_defined(x, op, "input");
  require_floating(x, op, "input");
  if (x.ndim() < 2)
    throw ShapeError("[batch_norm] expected an input [N, C, *], got " + describe(x));
  const int64_t c = x.size(1);
  for (const Tensor* t : {&running_mean, &running_var, &weight, &bias}) {
    if (!t->defined()) continue;
    require_same_dtype(x, *t, op, "parameter");
    if (t->shape() != Shape{c}) {
      throw ShapeError("[batch_norm] expected statistics and affine parameters of shape [" +
                       std::to_string(c) + "] for input " + describe(x) + ", got " + describe(*t));
    }
  }
  // [C] vectors broadcast against x as [C, 1, ..., 1].
  Shape per_channel(static_cast<size_t>(x.ndim() - 1), 1);
  per_channel[0] = c;
  auto channel = [&](const Tensor& v) { return reshape(v, per_channel); };
  Tensor mean_c, var_c;
  if (training) {
    const int64_t count = x.numel() / std::max<int64_t>(c, 1);
    if (count <= 1) {
      throw ValueError(
          "[batch_norm] expected more than 1 value per channel when training, got input " +
          describe(x));
    }
    // Statistics over [C, everything else] so the reduction runs over a trailing block.
    std::vector<int64_t> perm{1, 0};
    for (int d = 2; d < x.ndim(); ++d) perm.push_back(d);
    Tensor xc = flatten(permute(x, perm), 1);
    mean_c = mean(xc, 1);
    Tensor centred = xc - unsqueeze(mean_c, 1);
    var_c = mean(centred * centred, 1);
    if (running_mean.defined() && running_var.defined()) {
      NoGradGuard no_grad;
      double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      Tensor rm = running_mean, rv = running_var;
      rm.assign(running_mean * (1.0 - momentum) + mean_c.detach() * momentum);
      rv.assign(running_var * (1.0 - momentum) + var_c.detach() * (momentum * unbias));
    }
  } else {
    if (!running_mean.defined() || !running_var.defined()) {
      throw ValueError("[batch_norm] evaluation mode needs running_mean and running_var");
    }
    mean_c = running_mean;
    var_c = running_var;
  }
  Tensor scale = rsqrt(var_c + eps);
  if (weight.defined()) scale = scale * weight;
  Tensor y = (x - channel(mean_c)) * channel(scale);
  if (bias.defined()) y = y + channel(bias);
  return y;
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in,
                  const Tensor& bias_in, double eps) {
  const char* op = "layer_norm";
  // Norms are on autocast's float32 list.
  const Tensor x = amp::full_precision(x_in), weight = amp::full_precision(weight_in),
               bias = amp::full_precision(bias_in);
  require_defined(x, op, "input");
  require_floating(x, op, "input");
  const auto k = static_cast<int64_t>(normalized_shape.size());
  bool fits = k >= 1 && x.ndim() >= k;
  for (int64_t d = 0; fits && d < k; ++d) fits = x.shape()[x.ndim() - k + d] == normalized_shape[d];
  if (!fits) {
    throw ShapeError("[layer_norm] expected input with trailing dimensions " +
                     shape_str(normalized_shape) + " (normalized_shape), got " + describe(x));
  }
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    require_same_dtype(x, *t, op, "parameter");
    if (t->shape() != normalized_shape) {
      throw ShapeError("[layer_norm] expected weight and bias of shape " +
                       shape_str(normalized_shape) + ", got " + describe(*t));
    }
  }
  std::vector<int64_t> axes;
  for (int64_t d = x.ndim() - k; d < x.ndim(); ++d) axes.push_back(d);
  Tensor mu = mean(x, axes, true);
  Tensor centred = x - mu;
  Tensor y = centred * rsqrt(mean(centred * centred, axes, true) + eps);
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

namespace {

// Normalises x over the trailing axes from `first` on (biased variance, as the norms use).
Tensor normalise_trailing(const Tensor& x, int first, double eps) {
  std::vector<int64_t> axes;
  for (int d = first; d < x.ndim(); ++d) axes.push_back(d);
  Tensor centred = x - mean(x, axes, true);
  return centred * rsqrt(mean(centred * centred, axes, true) + eps);
}

// [C] as [C, 1, ..., 1] against x [N, C, *].
Tensor per_channel(const Tensor& v, const Tensor& x) {
  Shape s(static_cast<size_t>(x.ndim() - 1), 1);
  s[0] = v.size(0);
  return reshape(v, s);
}

// Checks optional [C] tensors (affine parameters, statistics) against x [N, C, *].
void require_channel_vectors(const char* op, const Tensor& x,
                             std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    require_same_dtype(x, *t, op, "parameter");
    if (t->shape() != Shape{x.size(1)}) {
      throw ShapeError(
          std::string("[") + op + "] expected affine parameters and statistics of shape [" +
          std::to_string(x.size(1)) + "] for input " + describe(x) + ", got " + describe(*t));
    }
  }
}

}  // namespace

Tensor group_norm(const Tensor& x_in, int64_t num_groups, const Tensor& weight_in,
                  const Tensor& bias_in, double eps) {
  const char* op = "group_norm";
  // Norms are on autocast's float32 list.
  const Tensor x = amp::full_precision(x_in), weight = amp::full_precision(weight_in),
               bias = amp::full_precision(bias_in);
  require_floating(x, op, "input");
  if (x.ndim() < 2)
    throw ShapeError("[group_norm] expected an input [N, C, *], got " + describe(x));
  if (num_groups < 1 || x.size(1) % num_groups != 0) {
    throw ValueError("[group_norm] expected the channels of input " + describe(x) +
                     " to be divisible by num_groups " + std::to_string(num_groups) +
                     " (num_groups >= 1)");
  }
  require_channel_vectors(op, x, {&weight, &bias});
  // [N, G, C/G, *]: each group's channels and positions are one trailing block.
  Shape grouped = x.shape();
  grouped[1] = x.size(1) / num_groups;
  grouped.insert(grouped.begin() + 1, num_groups);
  Tensor y = reshape(normalise_trailing(reshape(x, grouped), 2, eps), x.shape());
  if (weight.defined()) y = y * per_channel(weight, x);
  if (bias.defined()) y = y + per_channel(bias, x);
  return y;
}

Tensor instance_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& weight_in, const Tensor& bias_in, bool use_input_stats,
                     double momentum, double eps) {
  const char* op = "instance_norm";
  // Norms are on autocast's float32 list.
  const Tensor x = amp::full_precision(x_in), weight = amp::full_precision(weight_in),
               bias = amp::full_precision(bias_in);
  require_floating(x, op, "input");
  if (x.ndim() < 3) {
    throw ShapeError(
        "[instance_norm] expected an input [N, C, *] with at least one position "
        "dimension, got " +
        describe(x));
  }
  require_channel_vectors(op, x, {&weight, &bias, &running_mean, &running_var});
  const int64_t positions = x.numel() / std::max<int64_t>(x.size(0) * x.size(1), 1);
  Tensor y;
  if (use_input_stats) {
    if (positions <= 1) {
      throw ValueError(
          "[instance_norm] expected more than 1 position per channel when using "
          "input statistics, got input " +
          describe(x));
    }
    std::vector<int64_t> axes;
    for (int d = 2; d < x.ndim(); ++d) axes.push_back(d);
    Tensor mu = mean(x, axes, true);
    Tensor centred = x - mu;
    Tensor var_b = mean(centred * centred, axes, true);
    y = centred * rsqrt(var_b + eps);
    if (running_mean.defined() && running_var.defined()) {
      // PyTorch runs batch_norm over [1, N*C, *] with the statistics repeated N times and
      // averages the N updated copies: the update uses the batch mean of the instance means
      // and of the unbiased instance variances.
      NoGradGuard no_grad;
      const double unbias = static_cast<double>(positions) / static_cast<double>(positions - 1);
      Tensor mean_c = mean(flatten(mu.detach(), 1), {0});
      Tensor var_c = mean(flatten(var_b.detach(), 1), {0});
      Tensor rm = running_mean, rv = running_var;
      rm.assign(running_mean * (1.0 - momentum) + mean_c * momentum);
      rv.assign(running_var * (1.0 - momentum) + var_c * (momentum * unbias));
    }
  } else {
    if (!running_mean.defined() || !running_var.defined()) {
      throw ValueError(
          "[instance_norm] without input statistics it needs running_mean and "
          "running_var");
    }
    y = (x - per_channel(running_mean, x)) * per_channel(rsqrt(running_var + eps), x);
  }
  if (weight.defined()) y = y * per_channel(weight, x);
  if (bias.defined()) y = y + per_channel(bias, x);
  return y;
}

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  const char* op = "embedding";
  require_defined(indices, op, "indices");
  require_defined(weight, op, "weight");
  if (!is_integer(indices.dtype())) {
    throw DTypeError("[embedding] expected integer indices, got " + describe(indices));
  }
  if (weight.ndim() != 2) {
    throw ShapeError("[embedding] expected a weight [num_embeddings, embedding_dim], got " +
                     describe(weight));
  }
  const int64_t num = weight.size(0), dim = weight.size(1);
  const int r = indices.ndim();
  Shape out = indices.shape();
  out.push_back(dim);
  std::vector<IndexExpr> at;
  for (int d = 0; d < r; ++d) at.push_back(var(d));
  std::vector<IndexExpr> map{IndexExpr::load(1, at), var(r)};
  Tensor rows = reindex(weight, out, map, 0, {indices}, true, op);
  if (!padding_idx) return rows;
  int64_t pad = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
  if (pad < 0 || pad >= num) {
    throw ValueError("[embedding] padding_idx " + std::to_string(*padding_idx) +
                     " is out of range for " + std::to_string(num) + " embeddings");
  }
  // The padding row is read from a detached weight, so no gradient reaches it.
  Tensor frozen = reindex(weight.detach(), out, map, 0, {indices}, true, op);
  return where(unsqueeze(indices == pad, -1), frozen, rows);
}

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Tensor* weights) {
  const char* op = "scaled_dot_product_attention";
  // On autocast's lower-precision list: the products run in half, the softmax in float32.
  const Tensor q = amp::lower_precision(q_in), k = amp::lower_precision(k_in),
               v = amp::lower_precision(v_in);
  require_defined(q, op, "query");
  require_defined(k, op, "key");
  require_defined(v, op, "value");
  require_attention_operands(q, k, v, op);
  const int64_t l = q.size(-2), s = k.size(-2);
  if (attn_mask.defined()) {
    Shape want(q.shape().begin(), q.shape().end() - 2);
    want.push_back(l);
    want.push_back(s);
    broadcast_shapes(op, attn_mask.shape(), want);
    if (attn_mask.dtype() != DType::Bool) require_same_dtype(q, attn_mask, op, "attn_mask");
  }
  // The flash kernels serve every call but those that need the probabilities themselves
  // (weights, dropout) or a gradient for the mask.
  const SDPBackend backend = sdp_backend();
  if (backend != SDPBackend::Math) {
    const char* why = nullptr;
    if (weights) why = "the attention weights were asked for";
    if (dropout_p > 0.0) why = "dropout_p > 0";
    if (attn_mask.defined() && attn_mask.requires_grad() && grad_mode_enabled())
      why = "attn_mask requires a gradient";
    if (attn_mask.defined() && attn_mask.ndim() > q.ndim())
      why = "attn_mask has more dimensions than query (the output takes them)";
    if (backend == SDPBackend::Flash && why) {
      throw ValueError(std::string("[scaled_dot_product_attention] SDPBackend::Flash cannot serve "
                                   "this call: ") +
                       why + "; use SDPBackend::Auto or Math");
    }
    if (!why && (backend == SDPBackend::Flash || flash_attention_preferred(q, k, v)))
      return flash_attention(q, k, v, attn_mask, is_causal, scale);
  }
  double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  Tensor scores = matmul(q * sc, transpose(k, -2, -1));
  if (attn_mask.defined())
    scores =
        attn_mask.dtype() == DType::Bool ? where(attn_mask, scores, -INFINITY) : scores + attn_mask;
  if (is_causal) scores = where(index({l, s}, 1) <= index({l, s}, 0), scores, -INFINITY);
  Tensor p = dropout(softmax(scores, -1), dropout_p, dropout_p > 0.0);
  if (weights) *weights = p;
  return matmul(p, v);
}

}  // namespace functional
}  // namespace kiln::nn
