// Tensor::str(): PyTorch's printing rules (torch/_tensor_str.py), so that output can be
// compared with torch's by eye. Deliberate differences: the suffix always names the shape
// and dtype; nan/inf count towards the common width so columns stay aligned.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string_view>

#include "tensor.h"

namespace kiln {
namespace {

// torch's defaults (torch.set_printoptions).
constexpr int64_t kSummarizeThreshold = 1000;
constexpr int64_t kEdgeItems = 3;
constexpr int kLineWidth = 80;
constexpr const char* kPrefix = "tensor(";

// Positions along one dimension that are printed: all of them, or the edges when
// summarising (torch summarises every dimension longer than 2 * edgeitems).
std::vector<int64_t> shown_positions(int64_t size, bool summarize) {
  std::vector<int64_t> out;
  if (summarize && size > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i) out.push_back(i);
    for (int64_t i = size - kEdgeItems; i < size; ++i) out.push_back(i);
  } else {
    for (int64_t i = 0; i < size; ++i) out.push_back(i);
  }
  return out;
}

bool is_elided(int64_t size, bool summarize) { return summarize && size > 2 * kEdgeItems; }

std::string printf_double(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Chooses one notation for all printed elements, as torch's _Formatter does, from the
// elements that are actually shown (not the elided middle).
class ElementFormatter {
 public:
  ElementFormatter(const void* data, DType dtype, const std::vector<int64_t>& shown)
      : data_(data), dtype_(dtype) {
    if (is_floating(dtype)) choose_float_mode(shown);
    for (int64_t i : shown) width_ = std::max(width_, static_cast<int>(unpadded(i).size()));
  }

  int width() const { return width_; }

  std::string operator()(int64_t i) const {
    std::string s = unpadded(i);
    if (static_cast<int>(s.size()) < width_) s.insert(0, width_ - s.size(), ' ');
    return s;
  }

 private:
  enum class FloatMode { Integral, Fixed, Scientific };

  void choose_float_mode(const std::vector<int64_t>& shown) {
    double lo = INFINITY, hi = 0;
    bool integral = true;
    for (int64_t i : shown) {
      double v = detail::load_as_double(data_, dtype_, i);
      if (!std::isfinite(v) || v == 0) continue;
      lo = std::min(lo, std::abs(v));
      hi = std::max(hi, std::abs(v));
      if (v != std::ceil(v)) integral = false;
    }
    // No finite non-zero value: torch keeps integral mode, so zeros print as "0.".
    if (hi == 0) return;
    // torch compares with strict '>' against 1e8 and the 1000x range.
    bool wide = hi / lo > 1000.0 || hi > 1.0e8;
    if (integral) {
      mode_ = wide ? FloatMode::Scientific : FloatMode::Integral;
    } else {
      mode_ = (wide || lo < 1.0e-4) ? FloatMode::Scientific : FloatMode::Fixed;
    }
  }

  std::string unpadded(int64_t i) const {
    if (dtype_ == DType::Bool) return detail::load_as_int64(data_, dtype_, i) ? "True" : "False";
    if (!is_floating(dtype_)) return std::to_string(detail::load_as_int64(data_, dtype_, i));
    double v = detail::load_as_double(data_, dtype_, i);
    // printf writes "-nan" for negative NaNs; Python (and torch) always print "nan".
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    switch (mode_) {
      case FloatMode::Integral:
        return printf_double("%.0f", v) + ".";
      case FloatMode::Fixed:
        return printf_double("%.4f", v);
      case FloatMode::Scientific:
        break;
    }
    return printf_double("%.4e", v);
  }

  const void* data_;
  DType dtype_;
  FloatMode mode_ = FloatMode::Integral;
  int width_ = 1;
};

// Renders nested brackets exactly as torch's _tensor_str_with_formatter: vectors wrap at
// the line width, and slices of a rank-r block are separated by r-1 newlines so that
// rank >= 3 blocks get blank lines between them.
class TensorPrinter {
 public:
  TensorPrinter(const Shape& shape, bool summarize, const ElementFormatter& fmt)
      : shape_(shape), strides_(contiguous_strides(shape)), summarize_(summarize), fmt_(fmt) {}

  void print(std::string& out, size_t dim, int64_t offset, int indent) const {
    if (dim + 1 == shape_.size()) return print_vector(out, offset, indent);
    const int64_t size = shape_[dim];
    const std::vector<int64_t> shown = shown_positions(size, summarize_);
    const std::string sep =
        "," + std::string(shape_.size() - dim - 1, '\n') + std::string(indent + 1, ' ');
    out += '[';
    for (size_t k = 0; k < shown.size(); ++k) {
      if (k > 0) out += sep;
      if (k == static_cast<size_t>(kEdgeItems) && is_elided(size, summarize_)) out += "..." + sep;
      print(out, dim + 1, offset + shown[k] * strides_[dim], indent + 1);
    }
    out += ']';
  }

 private:
  void print_vector(std::string& out, int64_t offset, int indent) const {
    const int64_t size = shape_.back();
    std::vector<std::string> items;
    for (int64_t i : shown_positions(size, summarize_)) {
      if (i == size - kEdgeItems && is_elided(size, summarize_)) items.push_back(" ...");
      items.push_back(fmt_(offset + i));
    }
    // Each element takes its width plus ", ".
    const int per_line = std::max(1, (kLineWidth - indent) / (fmt_.width() + 2));
    out += '[';
    for (size_t k = 0; k < items.size(); ++k) {
      if (k > 0) out += k % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
      out += items[k];
    }
    out += ']';
  }

  const Shape& shape_;
  std::vector<int64_t> strides_;
  bool summarize_;
  const ElementFormatter& fmt_;
};

// Flat indices of every printed element, in order, for the formatter's width pass.
void collect_shown(const Shape& shape, const std::vector<int64_t>& strides, bool summarize,
                   size_t dim, int64_t offset, std::vector<int64_t>& out) {
  if (dim == shape.size()) {
    out.push_back(offset);
    return;
  }
  for (int64_t i : shown_positions(shape[dim], summarize))
    collect_shown(shape, strides, summarize, dim + 1, offset + i * strides[dim], out);
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  const Node& n = *node();
  std::string out = kPrefix;
  if (n.numel() == 0) {
    out += "[]";
  } else {
    const void* data = raw_data();
    const bool summarize = n.numel() > kSummarizeThreshold;
    std::vector<int64_t> shown;
    collect_shown(n.shape, contiguous_strides(n.shape), summarize, 0, 0, shown);
    ElementFormatter fmt(data, n.dtype, shown);
    if (n.shape.empty()) {
      out += fmt(0);
    } else {
      TensorPrinter(n.shape, summarize, fmt)
          .print(out, 0, 0, static_cast<int>(std::string_view(kPrefix).size()));
    }
  }
  out += ", shape=" + shape_str(n.shape) + ", dtype=" + std::string(dtype_name(n.dtype));
  if (n.device != Device::cpu()) out += ", device=" + n.device.str();
  out += ')';
  return out;
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }
std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }
std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << shape_str(shape); }

}  // namespace kiln
