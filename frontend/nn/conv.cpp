#include "conv.h"

#include <cmath>

#include "detail.h"
#include "init.h"

namespace kiln::nn {

using detail::describe;
using detail::require_positive;

namespace {

void require_image(const Tensor& x, const std::string& layer) {
  detail::require_defined(x, layer, "input");
  if (x.ndim() != 3 && x.ndim() != 4) {
    throw ShapeError("[" + layer + "] expected a 4-D input [N, C, H, W] or 3-D [C, H, W], got " +
                     describe(x));
  }
}

void require_size(Size2 s, const std::string& layer, const char* what, int64_t least) {
  if (s.h < least || s.w < least) {
    throw ValueError("[" + layer + "] " + what + " must be >= " + std::to_string(least) + ", got " +
                     s.str());
  }
}

// The convolutions' shared channel and group checks.
void require_channels(const std::string& layer, int64_t in, int64_t out, int64_t g) {
  require_positive(in, layer, "in_channels");
  require_positive(out, layer, "out_channels");
  require_positive(g, layer, "groups");
  if (in % g != 0) {
    throw ValueError("[" + layer + "] in_channels " + std::to_string(in) +
                     " is not divisible by groups " + std::to_string(g));
  }
  if (out % g != 0) {
    throw ValueError("[" + layer + "] out_channels " + std::to_string(out) +
                     " is not divisible by groups " + std::to_string(g));
  }
}

void require_in_channels(const Tensor& x, const std::string& layer, int64_t want, int rank) {
  if (x.size(-rank) != want) {
    throw ShapeError("[" + layer + "] expected input with " + std::to_string(want) +
                     " channels (in_channels) in dimension " + std::to_string(x.ndim() - rank) +
                     ", got " + describe(x));
  }
}

const char* mode_name(PaddingMode mode) {
  switch (mode) {
    case PaddingMode::Zeros:
      return "zeros";
    case PaddingMode::Reflect:
      return "reflect";
    case PaddingMode::Replicate:
      return "replicate";
    case PaddingMode::Circular:
      return "circular";
  }
  return "?";
}

// PyTorch's rule: "same" pads as the output keeps the input's size, which a stride would
// break.
void require_same_at_stride_one(const ConvPadding& p, bool unit_stride, const std::string& layer) {
  if (p.same && !unit_stride)
    throw ValueError("[" + layer + "] padding 'same' needs stride 1 (as in PyTorch)");
}

// ", padding=..., padding_mode=..." for extra_repr where they are not the defaults.
std::string padding_repr(const ConvPadding& p, PaddingMode mode) {
  std::string s;
  if (p != ConvPadding(0)) s += ", padding=" + p.str();
  if (mode != PaddingMode::Zeros) s += std::string(", padding_mode='") + mode_name(mode) + "'";
  return s;
}

}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, Size2 k, Size2 s, ConvPadding p, Size2 d, int64_t g,
               bool with_bias, PaddingMode mode)
    : UnaryModule("Conv2d"),
      in_channels(in),
      out_channels(out),
      kernel_size(k),
      stride(s),
      padding(p),
      dilation(d),
      groups(g),
      padding_mode(mode) {
  require_channels(name(), in, out, g);
  require_size(k, name(), "kernel_size", 1);
  require_size(s, name(), "stride", 1);
  require_size(d, name(), "dilation", 1);
  require_size(p.size, name(), "padding", 0);
  require_same_at_stride_one(p, s == Size2(1), name());
  const int64_t fan_in = in / g * k.h * k.w;
  double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight = register_parameter("weight", init::uniform({out, in / g, k.h, k.w}, -bound, bound));
  if (with_bias) bias = register_parameter("bias", init::uniform({out}, -bound, bound));
}

Tensor Conv2d::forward(const Tensor& x) {
  require_image(x, name());
  detail::require_layer_input(x, name(), weight.dtype());
  require_in_channels(x, name(), in_channels, 3);
  const int64_t h = x.size(-2), w = x.size(-1);
  const auto [top, bottom] = padding.along(padding.size.h, kernel_size.h, dilation.h);
  const auto [left, right] = padding.along(padding.size.w, kernel_size.w, dilation.w);
  if (h + top + bottom < dilation.h * (kernel_size.h - 1) + 1 ||
      w + left + right < dilation.w * (kernel_size.w - 1) + 1) {
    throw ShapeError("[Conv2d] input " + describe(x) + " with padding " + padding.str() +
                     " is smaller than the (dilated) kernel " + kernel_size.str());
  }
  if (padding_mode == PaddingMode::Zeros)
    return F::conv2d(x, weight, bias, stride, padding, dilation, groups);
  // Other modes pad the input first, then convolve without padding, as PyTorch does.
  std::vector<std::pair<int64_t, int64_t>> pads(static_cast<size_t>(x.ndim()), {0, 0});
  pads[pads.size() - 2] = {top, bottom};
  pads[pads.size() - 1] = {left, right};
  return F::conv2d(F::pad(x, pads, padding_mode), weight, bias, stride, 0, dilation, groups);
}

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", stride=" + stride.str();
  s += padding_repr(padding, padding_mode);
  if (dilation != Size2(1)) s += ", dilation=" + dilation.str();
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
}

Conv1d::Conv1d(int64_t in, int64_t out, int64_t k, int64_t s, ConvPadding p, int64_t d, int64_t g,
               bool with_bias, PaddingMode mode)
    : UnaryModule("Conv1d"),
      in_channels(in),
      out_channels(out),
      kernel_size(k),
      stride(s),
      padding(p),
      dilation(d),
      groups(g),
      padding_mode(mode) {
  require_channels(name(), in, out, g);
  require_positive(k, name(), "kernel_size");
  require_positive(s, name(), "stride");
  require_positive(d, name(), "dilation");
  if (p.size.h != p.size.w) throw ValueError("[Conv1d] expected one padding size, got " + p.str());
  if (p.size.w < 0) throw ValueError("[Conv1d] padding must be >= 0, got " + p.str());
  require_same_at_stride_one(p, s == 1, name());
  const double bound = 1.0 / std::sqrt(static_cast<double>(in / g * k));
  weight = register_parameter("weight", init::uniform({out, in / g, k}, -bound, bound));
  if (with_bias) bias = register_parameter("bias", init::uniform({out}, -bound, bound));
}

Tensor Conv1d::forward(const Tensor& x) {
  detail::require_defined(x, name(), "input");
  if (x.ndim() != 2 && x.ndim() != 3) {
    throw ShapeError("[Conv1d] expected a 3-D input [N, C, L] or 2-D [C, L], got " + describe(x));
  }
  detail::require_layer_input(x, name(), weight.dtype());
  require_in_channels(x, name(), in_channels, 2);
  const auto [left, right] = padding.along(padding.size.w, kernel_size, dilation);
  if (x.size(-1) + left + right < dilation * (kernel_size - 1) + 1) {
    throw ShapeError("[Conv1d] input " + describe(x) + " with padding " + padding.str() +
                     " is smaller than the (dilated) kernel " + std::to_string(kernel_size));
  }
  if (padding_mode == PaddingMode::Zeros)
    return F::conv1d(x, weight, bias, stride, padding, dilation, groups);
  std::vector<std::pair<int64_t, int64_t>> pads(static_cast<size_t>(x.ndim()), {0, 0});
  pads.back() = {left, right};
  return F::conv1d(F::pad(x, pads, padding_mode), weight, bias, stride, 0, dilation, groups);
}

std::string Conv1d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + std::to_string(kernel_size) +
                  ", stride=" + std::to_string(stride);
  s += padding_repr(padding, padding_mode);
  if (dilation != 1) s += ", dilation=" + std::to_string(dilation);
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Size2 k, Size2 s, Size2 p, Size2 op,
                                 int64_t g, bool with_bias, Size2 d)
    : UnaryModule("ConvTranspose2d"),
      in_channels(in),
      out_channels(out),
      kernel_size(k),
      stride(s),
      padding(p),
      output_padding(op),
      groups(g),
      dilation(d) {
  require_channels(name(), in, out, g);
  require_size(k, name(), "kernel_size", 1);
  require_size(s, name(), "stride", 1);
  require_size(d, name(), "dilation", 1);
  require_size(p, name(), "padding", 0);
  require_size(op, name(), "output_padding", 0);
  if ((op.h >= s.h && op.h >= d.h) || (op.w >= s.w && op.w >= d.w)) {
    throw ValueError("[ConvTranspose2d] output_padding " + op.str() +
                     " must be smaller than either stride " + s.str() + " or dilation " + d.str());
  }
  // PyTorch's fan_in for a transposed weight [in, out/g, kh, kw] is its dimension 1 times
  // the kernel area.
  const double bound = 1.0 / std::sqrt(static_cast<double>(out / g * k.h * k.w));
  weight = register_parameter("weight", init::uniform({in, out / g, k.h, k.w}, -bound, bound));
  if (with_bias) bias = register_parameter("bias", init::uniform({out}, -bound, bound));
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  require_image(x, name());
  detail::require_layer_input(x, name(), weight.dtype());
  require_in_channels(x, name(), in_channels, 3);
  return F::conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation);
}

Tensor ConvTranspose2d::forward(const Tensor& x, Size2 output_size) {
  require_image(x, name());
  detail::require_layer_input(x, name(), weight.dtype());
  require_in_channels(x, name(), in_channels, 3);
  // PyTorch's _output_padding: the smallest size the formula gives, plus up to stride - 1.
  auto extra = [&](int64_t in, int64_t want, int64_t s, int64_t p, int64_t d, int64_t k) {
    const int64_t least = (in - 1) * s - 2 * p + d * (k - 1) + 1;
    if (want < least || want > least + s - 1) {
      throw ShapeError("[ConvTranspose2d] output_size " + output_size.str() + " for input " +
                       describe(x) + ": each size must lie in [" + std::to_string(least) + ", " +
                       std::to_string(least + s - 1) + "] here, got " + std::to_string(want));
    }
    return want - least;
  };
  const Size2 op(extra(x.size(-2), output_size.h, stride.h, padding.h, dilation.h, kernel_size.h),
                 extra(x.size(-1), output_size.w, stride.w, padding.w, dilation.w, kernel_size.w));
  return F::conv_transpose2d(x, weight, bias, stride, padding, op, groups, dilation);
}

std::string ConvTranspose2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + kernel_size.str() + ", stride=" + stride.str();
  if (padding != Size2(0)) s += ", padding=" + padding.str();
  if (output_padding != Size2(0)) s += ", output_padding=" + output_padding.str();
  if (dilation != Size2(1)) s += ", dilation=" + dilation.str();
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=false";
  return s;
}

MaxPool2d::MaxPool2d(Size2 k, std::optional<Size2> s, Size2 p, Size2 d, bool ceil)
    : UnaryModule("MaxPool2d"),
      kernel_size(k),
      stride(s.value_or(k)),
      padding(p),
      dilation(d),
      ceil_mode(ceil) {
  require_size(k, name(), "kernel_size", 1);
  require_size(stride, name(), "stride", 1);
  require_size(d, name(), "dilation", 1);
  require_size(p, name(), "padding", 0);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  require_image(x, name());
  return F::max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() +
         ", padding=" + padding.str();
}

AvgPool2d::AvgPool2d(Size2 k, std::optional<Size2> s, Size2 p, bool ceil, bool include_pad)
    : UnaryModule("AvgPool2d"),
      kernel_size(k),
      stride(s.value_or(k)),
      padding(p),
      ceil_mode(ceil),
      count_include_pad(include_pad) {
  require_size(k, name(), "kernel_size", 1);
  require_size(stride, name(), "stride", 1);
  require_size(p, name(), "padding", 0);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  require_image(x, name());
  return F::avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad);
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + kernel_size.str() + ", stride=" + stride.str() +
         ", padding=" + padding.str();
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 out)
    : UnaryModule("AdaptiveAvgPool2d"), output_size(out) {
  require_size(out, name(), "output_size", 1);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  require_image(x, name());
  return F::adaptive_avg_pool2d(x, output_size);
}

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + output_size.str(); }

}  // namespace kiln::nn
