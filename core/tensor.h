#pragma once
// The user-facing handle to a lazy value. Building ops returns Tensors without running
// anything; reading a value (item, to_vector, data, printing) evaluates what is pending.
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <vector>

#include "error.h"
#include "node.h"

namespace kiln {

/// A reference-counted handle to a graph node. Copies share the handle, as libtorch
/// tensors share their storage: assign() on one copy is seen by all of them, while `=`
/// rebinds just the variable it is applied to.
class Tensor {
 public:
  /// An undefined tensor; most operations on it throw ValueError.
  Tensor() = default;
  /// Wraps a node (ops/ builds nodes; users normally never call this).
  explicit Tensor(NodePtr node);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  /// Number of dimensions.
  int ndim() const { return static_cast<int>(shape().size()); }
  /// Size of `axis` (negative counts from the end).
  int64_t size(int64_t axis) const;
  int64_t numel() const { return kiln::numel(shape()); }
  DType dtype() const;
  Device device() const;
  /// True once the value is computed (constants always are).
  bool is_evaluated() const { return impl_ && node()->is_evaluated(); }

  /// Computes the value now (and the values of other held tensors it shares work with).
  const Tensor& eval() const;
  /// The single element converted to T; throws ValueError unless numel() == 1.
  template <typename T>
  T item() const;
  /// All elements, row-major, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;
  /// Pointer to the row-major elements; T must be exactly the tensor's dtype.
  template <typename T>
  const T* data() const;
  /// Pointer to the row-major elements after evaluation, in host memory (a CUDA tensor's
  /// value is copied to a host mirror kept with its buffer).
  const void* raw_data() const;
  /// The same value on `device` (a lazy, differentiable copy; this tensor when already
  /// there). Defined in ops/transfer.cpp.
  Tensor to(Device device) const;

  /// PyTorch-style text: values (summarised past 1000 elements), shape and dtype.
  std::string str() const;
  /// The graph node behind the handle.
  const NodePtr& node() const;

  // --- autograd (ops/autograd.h has grad() and the rules) ---
  /// True when gradients flow to or through this tensor.
  bool requires_grad() const;
  /// Marks a floating tensor as a leaf of differentiation (a parameter), or unmarks it.
  const Tensor& requires_grad_(bool on = true) const;
  /// True for tensors that backward() accumulates into (parameters), and for every tensor
  /// that does not require grad, as in PyTorch.
  bool is_leaf() const;
  /// The same value with no gradient history; no data is copied once evaluated.
  Tensor detach() const;
  /// The gradient accumulated by backward() (undefined until then or after zero_grad()).
  Tensor grad() const;
  /// Replaces the accumulated gradient (an undefined tensor clears it).
  void set_grad(const Tensor& grad);
  /// Accumulates d(this)/d(leaf) into every leaf this scalar depends on, lazily; `gradient`
  /// seeds non-scalar outputs. Defined in ops/autograd.cpp.
  void backward(const Tensor& gradient = Tensor()) const;

  // --- updates ---
  /// Makes every copy of this handle refer to `value` (same shape and dtype), keeping the
  /// leaf flag and gradient: optimizers update parameters this way, so no graph grows
  /// across steps. The new value is detached from its history.
  void assign(const Tensor& value);
  /// Like assign() but any shape and dtype may be set (Module::to() casts parameters).
  void set_data(const Tensor& value);

 private:
  struct Impl;
  const Node& checked(const char* what) const;
  void rebind(const Tensor& value, const char* what, bool check_meta);
  std::shared_ptr<Impl> impl_;
};

/// Turns off gradient recording on this thread while alive (torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(set_grad_mode(false)) {}
  ~NoGradGuard() { set_grad_mode(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// Evaluates several tensors together, sharing their common work.
void eval(const std::vector<Tensor>& tensors);
/// Evaluates several tensors together, sharing their common work.
void eval(std::initializer_list<Tensor> tensors);
/// Prints Tensor::str().
std::ostream& operator<<(std::ostream& os, const Tensor& t);

namespace detail {
/// Reads element `i` of a buffer of `dtype` as double / int64 (the two exact carriers).
double load_as_double(const void* data, DType dtype, int64_t i);
int64_t load_as_int64(const void* data, DType dtype, int64_t i);
/// Writes element `i` from a double: rounds to nearest for floats; for integers truncates
/// toward zero, saturating at the type's range, NaN giving 0; bool is `v != 0`.
void store_double(void* data, DType dtype, int64_t i, double v);
/// Writes element `i` from an int64: integers wrap (two's complement), bool is `v != 0`.
void store_int64(void* data, DType dtype, int64_t i, int64_t v);
/// Writes element `i` from a Scalar with the conversions above.
void store_scalar(void* data, DType dtype, int64_t i, const Scalar& v);
}  // namespace detail

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const void* p = raw_data();
  const Node& n = *node();
  std::vector<T> out(static_cast<size_t>(n.numel()));
  bool exact_int = !is_floating(n.dtype);
  for (size_t i = 0; i < out.size(); ++i) {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      out[i] = T(static_cast<float>(detail::load_as_double(p, n.dtype, static_cast<int64_t>(i))));
    } else if (exact_int) {
      out[i] = static_cast<T>(detail::load_as_int64(p, n.dtype, static_cast<int64_t>(i)));
    } else {
      out[i] = static_cast<T>(detail::load_as_double(p, n.dtype, static_cast<int64_t>(i)));
    }
  }
  return out;
}

template <typename T>
T Tensor::item() const {
  const Node& n = checked("item");
  if (n.numel() != 1) {
    throw ValueError("[item] expected a tensor with one element, got shape " + shape_str(n.shape));
  }
  return to_vector<T>()[0];
}

template <typename T>
const T* Tensor::data() const {
  const Node& n = checked("data");
  if (dtype_of<T>() != n.dtype) {
    throw DTypeError(std::string("[data] requested element type ") +
                     std::string(dtype_name(dtype_of<T>())) + " but the tensor's dtype is " +
                     std::string(dtype_name(n.dtype)) + "; use to_vector<T>() to convert");
  }
  return static_cast<const T*>(raw_data());
}

}  // namespace kiln
