#pragma once
// Convolutions (1-D, 2-D, 2-D transposed) and pooling over NCL / NCHW inputs.
#include <cstdint>
#include <optional>
#include <string>

#include "functional.h"
#include "module.h"

namespace kiln::nn {

/// 2-D convolution (cross-correlation). weight [out, in/groups, kh, kw] and bias [out]
/// start as U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in/groups*kh*kw. `padding` takes
/// sizes, "same" or "valid"; `padding_mode` says what the padding holds (PyTorch's order).
class Conv2d : public UnaryModule {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         ConvPadding padding = 0, Size2 dilation = 1, int64_t groups = 1, bool bias = true,
         PaddingMode padding_mode = PaddingMode::Zeros);
  /// x [N, in_channels, H, W] (or [in_channels, H, W]) -> [N, out_channels, H', W'].
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t in_channels, out_channels;
  const Size2 kernel_size, stride;
  const ConvPadding padding;
  const Size2 dilation;
  const int64_t groups;
  const PaddingMode padding_mode;
  Tensor weight, bias;
};

/// 1-D convolution (cross-correlation) over [N, C, L] sequences. weight [out, in/groups, k]
/// and bias [out] start as U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in/groups*k.
/// `padding` takes one size, "same" or "valid"; `padding_mode` as Conv2d's.
class Conv1d : public UnaryModule {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         ConvPadding padding = 0, int64_t dilation = 1, int64_t groups = 1, bool bias = true,
         PaddingMode padding_mode = PaddingMode::Zeros);
  /// x [N, in_channels, L] (or [in_channels, L]) -> [N, out_channels, L'].
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t in_channels, out_channels, kernel_size, stride;
  const ConvPadding padding;
  const int64_t dilation, groups;
  const PaddingMode padding_mode;
  Tensor weight, bias;
};

/// 2-D transposed convolution (the adjoint of Conv2d; "deconvolution"), arguments in
/// PyTorch's order. weight [in, out/groups, kh, kw] and bias [out] start as
/// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with PyTorch's fan_in = out/groups*kh*kw.
class ConvTranspose2d : public UnaryModule {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
                  Size2 padding = 0, Size2 output_padding = 0, int64_t groups = 1, bool bias = true,
                  Size2 dilation = 1);
  /// x [N, in_channels, H, W] (or [in_channels, H, W]) -> [N, out_channels, H', W'] with
  /// H' = (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1.
  Tensor forward(const Tensor& x) override;
  /// The same with the output's spatial size chosen (PyTorch's output_size): H' may be any
  /// size from the formula's with output_padding 0 up to stride - 1 more; it replaces
  /// output_padding. Throws ShapeError naming the allowed range otherwise.
  Tensor forward(const Tensor& x, Size2 output_size);
  std::string extra_repr() const override;

  const int64_t in_channels, out_channels;
  const Size2 kernel_size, stride, padding, output_padding;
  const int64_t groups;
  const Size2 dilation;
  Tensor weight, bias;
};

/// Max over windows; stride defaults to the kernel size.
class MaxPool2d : public UnaryModule {
 public:
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0, Size2 dilation = 1, bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const Size2 kernel_size, stride, padding, dilation;
  const bool ceil_mode;
};

/// Mean over windows; stride defaults to the kernel size.
class AvgPool2d : public UnaryModule {
 public:
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                     Size2 padding = 0, bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const Size2 kernel_size, stride, padding;
  const bool ceil_mode, count_include_pad;
};

/// Mean over adaptive windows giving a fixed output size (global average pooling at 1x1).
class AdaptiveAvgPool2d : public UnaryModule {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Size2 output_size;
};

}  // namespace kiln::nn
