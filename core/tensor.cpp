#include "tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>

namespace kiln {

// The shared state of a handle: the node it currently names. It holds the node's handle
// count, so copies of a Tensor count once.
struct Tensor::Impl {
  explicit Impl(NodePtr n) : node(std::move(n)) { acquire_handle(node.get()); }
  ~Impl() { release_handle(node.get()); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  void reset(NodePtr n) {
    acquire_handle(n.get());
    release_handle(node.get());
    node = std::move(n);
  }
  NodePtr node;
};

Tensor::Tensor(NodePtr node) {
  if (node) impl_ = std::make_shared<Impl>(std::move(node));
}

const NodePtr& Tensor::node() const {
  static const NodePtr kNone;
  return impl_ ? impl_->node : kNone;
}

const Node& Tensor::checked(const char* what) const {
  if (!impl_) throw ValueError(std::string("[") + what + "] the tensor is undefined");
  return *impl_->node;
}

bool Tensor::requires_grad() const { return impl_ && impl_->node->requires_grad; }

const Tensor& Tensor::requires_grad_(bool on) const {
  Node& n = const_cast<Node&>(checked("requires_grad_"));
  if (on && !is_floating(n.dtype)) {
    throw DTypeError("[requires_grad_] only floating tensors can require gradients, got " +
                     std::string(dtype_name(n.dtype)) + shape_str(n.shape));
  }
  if (!on && n.requires_grad && !n.grad_leaf) {
    throw ValueError("[requires_grad_] " + shape_str(n.shape) +
                     " is computed from tensors that require grad; use detach() instead");
  }
  n.requires_grad = on;
  n.grad_leaf = on;
  return *this;
}

bool Tensor::is_leaf() const {
  const Node& n = checked("is_leaf");
  return !n.requires_grad || n.grad_leaf;
}

Tensor Tensor::grad() const {
  const Node& n = checked("grad");
  return n.grad ? Tensor(n.grad) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  Node& n = const_cast<Node&>(checked("set_grad"));
  if (grad.defined() && (grad.shape() != n.shape || grad.dtype() != n.dtype)) {
    throw ShapeError("[set_grad] gradient " + std::string(dtype_name(grad.dtype())) +
                     shape_str(grad.shape()) + " does not match the tensor " +
                     std::string(dtype_name(n.dtype)) + shape_str(n.shape));
  }
  set_node_grad(n, grad.node());
}

namespace {

// A fresh node with the same value and no gradient flow: it shares the buffer once there is
// one, and otherwise carries the same computation (CSE merges the two if both run).
NodePtr detached_copy(const Node& n) {
  bool evaluated = n.is_evaluated();
  NodePtr copy = n.with(evaluated ? OpCode::Constant : n.op,
                        evaluated ? std::vector<NodePtr>{} : n.inputs, n.device);
  copy->buffer = n.buffer;
  return copy;
}

}  // namespace

Tensor Tensor::detach() const {
  // Always a new node: returning this handle for a tensor without gradient flow would let
  // `x.detach().requires_grad_()` mark x itself (PyTorch's detach never aliases the flags).
  return Tensor(detached_copy(checked("detach")));
}

void Tensor::rebind(const Tensor& value, const char* what, bool check_meta, bool keep_history) {
  Node& old = const_cast<Node&>(checked(what));
  if (!value.defined()) throw ValueError(std::string("[") + what + "] the new value is undefined");
  const Node& v = *value.node();
  if (check_meta && (v.shape != old.shape || v.dtype != old.dtype)) {
    throw ShapeError(std::string("[") + what + "] the new value " +
                     std::string(dtype_name(v.dtype)) + shape_str(v.shape) +
                     " does not match the tensor " + std::string(dtype_name(old.dtype)) +
                     shape_str(old.shape) + "; use set_data() to change shape or dtype");
  }
  if (check_meta && v.device != old.device) {
    throw DeviceError(std::string("[") + what + "] the new value is on " + v.device.str() +
                      " but the tensor is on " + old.device.str());
  }
  // A node with gradient history, or one about to become a leaf, is copied: marking the
  // value's own node would make the caller's tensor a leaf too.
  bool leaf = old.grad_leaf && is_floating(v.dtype);
  if (keep_history && !leaf) {
    // index_put_ on a computed value: the new value keeps its history, as torch's in-place
    // ops on non-leaves do.
    old.replaced = true;
    impl_->reset(value.node());
    return;
  }
  NodePtr next = v.requires_grad || leaf ? detached_copy(v) : value.node();
  next->requires_grad = leaf;
  next->grad_leaf = leaf;
  if (leaf && old.grad && old.grad->shape == next->shape && old.grad->dtype == next->dtype) {
    set_node_grad(*next, old.grad);
  }
  old.replaced = true;
  impl_->reset(std::move(next));
}

void Tensor::assign(const Tensor& value) { rebind(value, "assign", true); }
void Tensor::set_data(const Tensor& value) { rebind(value, "set_data", false); }

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
  return node()->buffer->host_data();
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
