#pragma once
// The user-facing handle to a lazy value. Building ops returns Tensors without running
// anything; reading a value (item, to_vector, data, printing) evaluates what is pending.
#include <concepts>
#include <initializer_list>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "error.h"
#include "node.h"

namespace kiln {

namespace indexing {
class TensorIndex;
}
struct ValuesIndices;

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
  /// The same value as `dtype` (a lazy, differentiable cast; this tensor when already so).
  Tensor to(DType dtype) const;
  /// The same value on `device` as `dtype`.
  Tensor to(Device device, DType dtype) const;

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

  // --- methods beside the free functions (libtorch's spelling) ---
  // Each calls the free function of the same name in ops/ (ops/tensor_methods.cpp), so an
  // op stays defined in one place. Reductions: `dims` empty means every dimension.
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  template <std::integral Dim>
    requires(!std::same_as<Dim, bool>)
  Tensor sum(Dim dim, bool keepdim = false) const {
    return sum(std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
  }
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  template <std::integral Dim>
    requires(!std::same_as<Dim, bool>)
  Tensor mean(Dim dim, bool keepdim = false) const {
    return mean(std::vector<int64_t>{static_cast<int64_t>(dim)}, keepdim);
  }
  Tensor prod(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  /// Largest / smallest element of the whole tensor (rank 0).
  Tensor max() const;
  Tensor min() const;
  /// Largest / smallest values along `dim` with the index of the first of each (torch's
  /// t.max(dim)): `auto [values, indices] = t.max(1);`.
  ValuesIndices max(int64_t dim, bool keepdim = false) const;
  ValuesIndices min(int64_t dim, bool keepdim = false) const;
  Tensor argmax() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor abs() const;
  Tensor sqrt() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor neg() const;
  Tensor square() const;
  Tensor pow(const Tensor& exponent) const;
  Tensor pow(const Scalar& exponent) const;
  Tensor matmul(const Tensor& other) const;
  /// Transpose of a matrix; rank 0 and 1 are returned as they are, rank > 2 raises ShapeError.
  Tensor t() const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  /// Same as reshape(): kiln values never alias, so a view is a lazy copy (writes through
  /// index_put_ on it do not reach this tensor).
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  /// This tensor: kiln values are always dense and row-major.
  Tensor contiguous() const { return *this; }
  /// A new node with the same value and gradient history (d clone / d x = 1); flags set on
  /// the copy (requires_grad_) do not reach this tensor.
  Tensor clone() const;

  // --- indexing (libtorch's C++ spelling; ops/indexing.cpp) ---
  /// t[i]: the slice at position i of dim 0 (negative counts from the end), dim 0 removed;
  /// differentiable. An index out of range raises IndexError.
  Tensor operator[](int64_t index) const;
  /// Python's t[...] with indexing::Slice, None, Ellipsis, integers, bools and one integer
  /// or bool Tensor index (torch.Tensor.index). A bool mask is read now (its result's shape
  /// depends on its values); everything else stays lazy.
  Tensor index(const std::vector<indexing::TensorIndex>& indices) const;
  /// t[...] = value (value broadcast to the indexed shape and cast to t's dtype), through
  /// assign(): every copy of this handle sees the new lazy value, as with assign(). The
  /// gradient history is kept for a non-leaf; a leaf that requires grad raises ValueError
  /// unless gradient recording is off (NoGradGuard), as torch.
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, const Tensor& value);
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, const Scalar& value);

  // --- compound assignment ---
  /// x += y rebinds this variable to the lazy value x + y (cast back to x's dtype; the
  /// broadcast shape must be x's). Unlike PyTorch's in-place ops, other Tensor variables
  /// that shared the old value keep it; gradients flow through as through x + y. A leaf
  /// that requires grad (a parameter) is instead updated in place through assign() under
  /// NoGradGuard, so its module sees the change, and raises ValueError otherwise, as torch.
  Tensor& operator+=(const Tensor& other);
  Tensor& operator+=(const Scalar& other);
  Tensor& operator-=(const Tensor& other);
  Tensor& operator-=(const Scalar& other);
  Tensor& operator*=(const Tensor& other);
  Tensor& operator*=(const Scalar& other);
  Tensor& operator/=(const Tensor& other);
  Tensor& operator/=(const Scalar& other);

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
  void rebind(const Tensor& value, const char* what, bool check_meta, bool keep_history = false);
  std::shared_ptr<Impl> impl_;
};

/// Values and their int64 indices along a dimension (max, min, sort, topk), usable with
/// structured bindings: `auto [values, indices] = max(x, 1);`.
struct ValuesIndices {
  Tensor values;
  Tensor indices;
};

namespace indexing {
/// Python's None: in index() inserts a dimension of size 1; as a Slice bound, "omitted".
inline constexpr std::nullopt_t None = std::nullopt;
/// Python's `...` in index(): as many full slices as the other indices leave dimensions.
struct EllipsisIndexType {
  explicit constexpr EllipsisIndexType() = default;
};
inline constexpr EllipsisIndexType Ellipsis{};
/// Python's start:stop:step; an omitted (None) bound means the whole range; step >= 1.
struct Slice {
  Slice(std::optional<int64_t> start = std::nullopt, std::optional<int64_t> stop = std::nullopt,
        std::optional<int64_t> step = std::nullopt)
      : start(start), stop(stop), step(step) {}
  std::optional<int64_t> start, stop, step;
};
/// One entry of Tensor::index(): None, Ellipsis, an integer, a bool, a Slice or a Tensor.
class TensorIndex {
 public:
  enum class Kind : uint8_t { None, Ellipsis, Integer, Boolean, Slice, Tensor };
  TensorIndex(std::nullopt_t) : kind_(Kind::None) {}
  TensorIndex(EllipsisIndexType) : kind_(Kind::Ellipsis) {}
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  TensorIndex(T i) : kind_(Kind::Integer), integer_(static_cast<int64_t>(i)) {}
  /// true inserts a dimension of size 1, false one of size 0 (as Python's t[True]).
  TensorIndex(bool b) : kind_(Kind::Boolean), integer_(b) {}
  TensorIndex(Slice s) : kind_(Kind::Slice), slice_(s) {}
  TensorIndex(Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}

  Kind kind() const { return kind_; }
  int64_t integer() const { return integer_; }
  bool boolean() const { return integer_ != 0; }
  const Slice& slice() const { return slice_; }
  const Tensor& tensor() const { return tensor_; }

 private:
  Kind kind_;
  int64_t integer_ = 0;
  Slice slice_;
  Tensor tensor_;
};
}  // namespace indexing

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
