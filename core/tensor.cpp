#include "tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>

namespace kiln {

Tensor::Tensor(NodePtr node) : node_(std::move(node)) {
  if (node_) acquire_handle(node_.get());
}
Tensor::Tensor(const Tensor& other) : Tensor(other.node_) {}
Tensor::Tensor(Tensor&& other) noexcept : node_(std::move(other.node_)) {}
Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}
Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    if (node_) release_handle(node_.get());
    node_ = std::move(other.node_);
  }
  return *this;
}
Tensor::~Tensor() {
  if (node_) release_handle(node_.get());
}

const Node& Tensor::checked(const char* what) const {
  if (!node_) throw ValueError(std::string("[") + what + "] the tensor is undefined");
  return *node_;
}

const Shape& Tensor::shape() const { return checked("shape").shape; }
DType Tensor::dtype() const { return checked("dtype").dtype; }
Device Tensor::device() const { return checked("device").device; }

int64_t Tensor::size(int64_t axis) const {
  const Shape& s = shape();
  if (s.empty()) throw ShapeError("[size] a rank-0 tensor has no dimensions");
  return s[normalize_axis("size", axis, s)];
}

const Tensor& Tensor::eval() const {
  Node& n = const_cast<Node&>(checked("eval"));
  if (!n.is_evaluated()) evaluate_nodes({&n});
  return *this;
}

const void* Tensor::raw_data() const {
  eval();
  return node_->buffer->data();
}

void eval(const std::vector<Tensor>& tensors) {
  std::vector<Node*> nodes;
  for (const Tensor& t : tensors) {
    if (!t.defined()) throw ValueError("[eval] cannot evaluate an undefined tensor");
    nodes.push_back(t.node().get());
  }
  evaluate_nodes(nodes);
}

void eval(std::initializer_list<Tensor> tensors) { eval(std::vector<Tensor>(tensors)); }

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

namespace detail {
namespace {

// double -> float rounding to odd: converting that float to a 16-bit float then rounds
// exactly as a direct double -> half conversion would (no double rounding).
float round_to_odd_float(double v) {
  float f = static_cast<float>(v);
  if (!std::isfinite(f) || static_cast<double>(f) == v) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits |= 1u;
  std::memcpy(&f, &bits, sizeof bits);
  return f;
}

}  // namespace

double load_as_double(const void* data, DType dtype, int64_t i) {
  return visit_dtype(dtype, [&](auto tag) -> double {
    using T = decltype(tag);
    const T v = static_cast<const T*>(data)[i];
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      return static_cast<float>(v);
    } else {
      return static_cast<double>(v);
    }
  });
}

int64_t load_as_int64(const void* data, DType dtype, int64_t i) {
  return visit_dtype(dtype, [&](auto tag) -> int64_t {
    using T = decltype(tag);
    const T v = static_cast<const T*>(data)[i];
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      return Scalar(static_cast<float>(v)).to_int64();
    } else if constexpr (std::is_floating_point_v<T>) {
      return Scalar(v).to_int64();
    } else {
      return static_cast<int64_t>(v);
    }
  });
}

void store_double(void* data, DType dtype, int64_t i, double v) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(data);
    if constexpr (std::is_same_v<T, bool>) {
      p[i] = v != 0.0;
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      p[i] = T(round_to_odd_float(v));
    } else if constexpr (std::is_floating_point_v<T>) {
      p[i] = static_cast<T>(v);
    } else {
      double lo = static_cast<double>(std::numeric_limits<T>::min());
      double hi = static_cast<double>(std::numeric_limits<T>::max());
      if (std::isnan(v)) {
        p[i] = 0;
      } else if (v <= lo) {
        p[i] = std::numeric_limits<T>::min();
      } else if (v >= hi) {
        p[i] = std::numeric_limits<T>::max();
      } else {
        p[i] = static_cast<T>(v);
      }
    }
  });
}

void store_int64(void* data, DType dtype, int64_t i, int64_t v) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(data);
    if constexpr (std::is_same_v<T, bool>) {
      p[i] = v != 0;
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      p[i] = T(round_to_odd_float(static_cast<double>(v)));
    } else {
      p[i] = static_cast<T>(v);  // modulo 2^n since C++20
    }
  });
}

void store_scalar(void* data, DType dtype, int64_t i, const Scalar& v) {
  if (v.kind() == Scalar::Kind::Float) {
    store_double(data, dtype, i, v.to_double());
  } else {
    store_int64(data, dtype, i, v.to_int64());
  }
}

}  // namespace detail
}  // namespace kiln
