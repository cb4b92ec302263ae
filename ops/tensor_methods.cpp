// Tensor's methods in libtorch's spelling (core/tensor.h). Each forwards to the free function
// that defines the op, so an op's rule, reference and gradient stay in one place; the
// compound assignments rebind the variable they are applied to.
#include <string>

#include "ops.h"

namespace kiln {

namespace {

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

// PyTorch's can_cast for in-place results: never to a lower category (float to integer,
// anything but bool to bool).
int category(DType d) { return d == DType::Bool ? 0 : is_floating(d) ? 2 : 1; }

// x op= y: the result must keep x's shape, and its dtype must cast back to x's.
void rebind_compound(Tensor& x, Tensor result, const char* op) {
  if (result.shape() != x.shape()) {
    throw ShapeError(std::string("[") + op + "] the result has shape " + shape_str(result.shape()) +
                     " but the tensor being updated is " + describe(x) +
                     "; expected the other operand to broadcast to the tensor's shape");
  }
  if (result.dtype() != x.dtype()) {
    if (category(result.dtype()) > category(x.dtype())) {
      throw DTypeError(
          std::string("[") + op + "] the result type " + std::string(dtype_name(result.dtype())) +
          " cannot be cast back to the tensor's " + std::string(dtype_name(x.dtype())) +
          " (as torch's in-place ops); write x = x op y to change the dtype");
    }
    result = cast(result, x.dtype());
  }
  // A parameter (a leaf that requires grad): rebinding the handle would part it from the
  // module and optimizer that hold copies of it, so it is updated in place under
  // NoGradGuard, as torch's `with torch.no_grad(): w *= 0.5`, and refused otherwise, as
  // torch refuses in-place ops on such leaves.
  if (x.requires_grad() && x.is_leaf()) {
    if (grad_mode_enabled()) {
      throw ValueError(std::string("[") + op + "] " + describe(x) +
                       " is a leaf that requires grad and cannot be updated in place while "
                       "gradients are recorded; update it inside a NoGradGuard, as "
                       "torch.no_grad()");
    }
    x.assign(result);
    return;
  }
  x = std::move(result);
}

}  // namespace

Tensor Tensor::to(DType dtype) const { return cast(*this, dtype); }
Tensor Tensor::to(Device device, DType dtype) const { return cast(to(device), dtype); }

Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::sum(*this, dims, keepdim);
}
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::mean(*this, dims, keepdim);
}
Tensor Tensor::prod(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::prod(*this, dims, keepdim);
}
Tensor Tensor::max() const { return kiln::max(*this, std::vector<int64_t>{}); }
Tensor Tensor::min() const { return kiln::min(*this, std::vector<int64_t>{}); }
ValuesIndices Tensor::max(int64_t dim, bool keepdim) const {
  return kiln::max(*this, dim, keepdim);
}
ValuesIndices Tensor::min(int64_t dim, bool keepdim) const {
  return kiln::min(*this, dim, keepdim);
}
Tensor Tensor::argmax() const { return kiln::argmax(*this); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return kiln::argmax(*this, dim, keepdim); }

Tensor Tensor::exp() const { return kiln::exp(*this); }
Tensor Tensor::log() const { return kiln::log(*this); }
Tensor Tensor::abs() const { return kiln::abs(*this); }
Tensor Tensor::sqrt() const { return kiln::sqrt(*this); }
Tensor Tensor::relu() const { return kiln::relu(*this); }
Tensor Tensor::sigmoid() const { return kiln::sigmoid(*this); }
Tensor Tensor::tanh() const { return kiln::tanh(*this); }
Tensor Tensor::neg() const { return kiln::neg(*this); }
Tensor Tensor::square() const { return kiln::square(*this); }
Tensor Tensor::pow(const Tensor& exponent) const { return kiln::pow(*this, exponent); }
Tensor Tensor::pow(const Scalar& exponent) const { return kiln::pow(*this, exponent); }
Tensor Tensor::matmul(const Tensor& other) const { return kiln::matmul(*this, other); }

Tensor Tensor::t() const {
  const Node& n = checked("t");
  if (n.shape.size() > 2) {
    throw ShapeError("[t] expects a tensor with at most 2 dimensions, got shape " +
                     shape_str(n.shape) + "; use transpose(dim0, dim1) for higher ranks");
  }
  return n.shape.size() < 2 ? *this : kiln::transpose(*this, 0, 1);
}
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  return kiln::transpose(*this, dim0, dim1);
}
Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  return kiln::permute(*this, dims);
}
Tensor Tensor::view(const Shape& shape) const { return kiln::reshape(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return kiln::reshape(*this, shape); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  return kiln::flatten(*this, start_dim, end_dim);
}
Tensor Tensor::unsqueeze(int64_t dim) const { return kiln::unsqueeze(*this, dim); }
Tensor Tensor::squeeze() const { return kiln::squeeze(*this); }
Tensor Tensor::squeeze(int64_t dim) const { return kiln::squeeze(*this, dim); }

Tensor Tensor::clone() const {
  const Node& n = checked("clone");
  // Without gradient flow a detached copy (sharing an evaluated buffer) is the same value;
  // with it, an identity reindex is a new node that the gradient passes through unchanged.
  if (!n.requires_grad) return detach();
  std::vector<IndexExpr> map;
  for (size_t d = 0; d < n.shape.size(); ++d) map.push_back(IndexExpr::var(static_cast<int>(d)));
  return reindex(*this, n.shape, std::move(map), 0, {}, false, "clone");
}

#define KILN_COMPOUND(sym, fn)                                           \
  Tensor& Tensor::operator sym##=(const Tensor& other) {                 \
    rebind_compound(*this, kiln::fn(*this, other), "operator" #sym "="); \
    return *this;                                                        \
  }                                                                      \
  Tensor& Tensor::operator sym##=(const Scalar& other) {                 \
    rebind_compound(*this, kiln::fn(*this, other), "operator" #sym "="); \
    return *this;                                                        \
  }
KILN_COMPOUND(+, add)
KILN_COMPOUND(-, sub)
KILN_COMPOUND(*, mul)
KILN_COMPOUND(/, div)
#undef KILN_COMPOUND

}  // namespace kiln
