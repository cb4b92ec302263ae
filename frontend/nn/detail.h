#pragma once
// Argument checks shared by the nn layers and functional ops (not part of the public API).
#include <string>

#include "../../core/tensor.h"
#include "../../ops/autocast.h"
#include "../../ops/elementwise.h"

namespace kiln::nn::detail {

/// A double as a user would write it ("1.5", not "1.500000").
inline std::string num(double v) { return Scalar(v).str(); }

/// "float32[2, 3]".
inline std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

/// Throws ValueError "[op] the <what> tensor is undefined".
inline void require_defined(const Tensor& t, const std::string& op, const char* what) {
  if (!t.defined()) throw ValueError("[" + op + "] the " + what + " tensor is undefined");
}

/// Throws DTypeError unless t is floating.
inline void require_floating(const Tensor& t, const std::string& op, const char* what) {
  require_defined(t, op, what);
  if (!is_floating(t.dtype())) {
    throw DTypeError("[" + op + "] expected a floating-point " + what + ", got " + describe(t));
  }
}

/// Throws DTypeError unless `other` has x's dtype (kiln layers do not mix precisions).
inline void require_same_dtype(const Tensor& x, const Tensor& other, const std::string& op,
                               const char* what) {
  require_defined(other, op, what);
  if (other.dtype() != x.dtype()) {
    throw DTypeError("[" + op + "] expected " + what + " of dtype " +
                     std::string(dtype_name(x.dtype())) + " (the input's), got " + describe(other) +
                     " with input " + describe(x));
  }
}

/// Throws DTypeError/ShapeError unless q [..., L, E], k [..., S, E] and v [..., S, Ev] are
/// floating tensors of one dtype with equal leading dimensions (attention's operands).
inline void require_attention_operands(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const std::string& op) {
  require_floating(q, op, "query");
  require_same_dtype(q, k, op, "key");
  require_same_dtype(q, v, op, "value");
  bool ok = q.ndim() >= 2 && k.ndim() == q.ndim() && v.ndim() == q.ndim();
  for (int d = 0; ok && d < q.ndim() - 2; ++d)
    ok = q.shape()[d] == k.shape()[d] && q.shape()[d] == v.shape()[d];
  ok = ok && q.size(-1) == k.size(-1) && k.size(-2) == v.size(-2);
  if (!ok) {
    throw ShapeError("[" + op +
                     "] expected query [..., L, E], key [..., S, E] and value [..., S, Ev] with "
                     "equal leading dimensions, got " +
                     describe(q) + ", " + describe(k) + " and " + describe(v));
  }
}

/// A layer's input must be a defined floating tensor of its parameters' dtype; inside an
/// autocast scope, a float32 or half input of float32 or half parameters (the layer's ops
/// bring both to the dtype their autocast list gives).
inline void require_layer_input(const Tensor& x, const std::string& layer, DType param_dtype) {
  require_defined(x, layer, "input");
  auto mixed = [](DType t) {
    return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16;
  };
  if (amp::autocast_state(x.device()).enabled && mixed(x.dtype()) && mixed(param_dtype)) return;
  if (x.dtype() != param_dtype) {
    throw DTypeError("[" + layer + "] expected input of dtype " +
                     std::string(dtype_name(param_dtype)) + " (the parameters' dtype), got " +
                     describe(x));
  }
}

/// Throws ValueError "[layer] <what> must be >= 1, got v" for non-positive sizes.
inline void require_positive(int64_t v, const std::string& layer, const char* what) {
  if (v < 1) {
    throw ValueError("[" + layer + "] " + what + " must be >= 1, got " + std::to_string(v));
  }
}

/// x as a stored value read by plain coordinates. The library GEMM reads operands through
/// affine maps (permutes, slices, reshapes) but not through padded windows, and the
/// simplifier would otherwise fold an im2col reindex into the product's operand map. x + 0.0
/// is one the simplifier keeps (it only drops x + -0.0); it is exact except that -0.0
/// becomes +0.0, which no product can observe. Uses on plain reshapes predate the affine
/// matcher and may no longer be needed.
inline Tensor stored(const Tensor& x) { return x + 0.0; }

}  // namespace kiln::nn::detail
