// Reductions as reindex_reduce over a mask of reduced axes, and the composites on top.
// Every node gets the user-level op as its origin so dumps and kernel names read "softmax",
// not "reindex_reduce".
#include "reduce_ops.h"

#include <cmath>
#include <string_view>

#include "autocast.h"
#include "autograd.h"
#include "elementwise.h"
#include "reindex.h"
#include "sources.h"

namespace kiln {
namespace {

std::string dtype_text(const Tensor& x) {
  return std::string(dtype_name(x.dtype())) + " tensor of shape " + shape_str(x.shape());
}

std::string axes_str(const std::vector<int64_t>& axes) {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + std::to_string(axes[i]);
  return s + "]";
}

void check_defined(const Tensor& x, const char* op) {
  if (!x.defined()) throw ValueError("[" + std::string(op) + "] the input tensor is undefined");
}

// Which dimensions of `x` are reduced. A rank-0 tensor accepts axis 0 / -1 (as PyTorch
// does) and reduces nothing, so its mask is empty.
std::vector<bool> reduced_mask(const Tensor& x, const std::vector<int64_t>& axes, const char* op) {
  check_defined(x, op);
  const Shape& shape = x.shape();
  std::vector<bool> mask(shape.size(), axes.empty());
  std::vector<bool> seen(std::max<size_t>(shape.size(), 1), false);
  for (int64_t a : axes) {
    int d = normalize_axis(op, a, shape);
    if (seen[d]) {
      throw ShapeError("[" + std::string(op) + "] axis " + std::to_string(d) +
                       " appears more than once in axes " + axes_str(axes) +
                       " for a tensor of shape " + shape_str(shape) + "; expected distinct axes");
    }
    seen[d] = true;
    if (!shape.empty()) mask[d] = true;
  }
  return mask;
}

int64_t reduced_count(const Shape& shape, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mask[d]) n *= shape[d];
  }
  return n;
}

// max/min have no identity a user could want, so an empty reduction is an error (as torch).
void check_nonempty(const Tensor& x, const std::vector<bool>& mask, const char* op) {
  const Shape& shape = x.shape();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mask[d] && shape[d] == 0) {
      throw ValueError("[" + std::string(op) + "] cannot reduce over a zero-size dimension: axis " +
                       std::to_string(d) + " of shape " + shape_str(shape) +
                       " has size 0; expected a non-empty reduced dimension");
    }
  }
}

// Every reduction is one reindex_reduce: output coordinates are the kept input coordinates,
// with reduced dims either dropped or pinned to 0 (keepdim).
Tensor reduce_masked(const Tensor& x, ReduceOp op, const std::vector<bool>& mask, bool keepdim,
                     const char* origin) {
  const Shape& in = x.shape();
  Shape out;
  std::vector<IndexExpr> map;
  for (size_t d = 0; d < in.size(); ++d) {
    if (!mask[d]) {
      out.push_back(in[d]);
      map.push_back(IndexExpr::var(static_cast<int>(d)));
    } else if (keepdim) {
      out.push_back(1);
      map.push_back(IndexExpr::constant(0));
    }
  }
  return reindex_reduce(x, op, out, std::move(map), {}, false, origin);
}

// Drops the size-1 reduced dims of a keepdim result.
Tensor squeeze_mask(const Tensor& t, const std::vector<bool>& mask, const char* origin) {
  Shape out;
  std::vector<IndexExpr> map;
  for (size_t d = 0; d < mask.size(); ++d) {
    if (mask[d]) {
      map.push_back(IndexExpr::constant(0));
    } else {
      map.push_back(IndexExpr::var(static_cast<int>(out.size())));
      out.push_back(t.shape()[d]);
    }
  }
  return reindex(t, out, std::move(map), 0, {}, false, origin);
}

bool is_half(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

// float16/bfloat16 are storage types: arithmetic runs in float32 and the result is cast
// back, so sums of many halves neither overflow nor lose the low bits of each term.
Tensor compute_type(const Tensor& x) { return is_half(x.dtype()) ? cast(x, DType::Float32) : x; }

void require_floating(const Tensor& x, const char* op) {
  check_defined(x, op);
  if (!is_floating(x.dtype())) {
    // torch's wording for mean, so users searching the message find the same advice.
    std::string why = std::string(op) == "mean" ? "could not infer output dtype: " : "";
    throw DTypeError("[" + std::string(op) + "] " + why + "expected a floating-point input " +
                     "(float16, bfloat16, float32 or float64), got " + dtype_text(x) +
                     "; cast it to a floating dtype first");
  }
}

Tensor binary(OpCode op, const Tensor& a, const Tensor& b, const char* origin) {
  return elementwise(op, {a, b}, origin);
}
Tensor unary(OpCode op, const Tensor& a, const char* origin) {
  return elementwise(op, {a}, origin);
}

// logsumexp's stability shift: the max with infinities replaced by 0, so an all -inf row
// gives log(0) = -inf rather than exp(-inf - -inf) = NaN, and a +inf gives inf (torch's
// answers for both).
Tensor finite_shift(const Tensor& m, const char* origin) {
  Tensor inf = binary(OpCode::Eq, unary(OpCode::Abs, m, origin), scalar_tensor(INFINITY), origin);
  return elementwise(OpCode::Where, {inf, scalar_tensor(0.0), m}, origin);
}

Tensor sum_like(const Tensor& x, ReduceOp op, const std::vector<int64_t>& axes, bool keepdim,
                const char* origin) {
  std::vector<bool> mask = reduced_mask(x, axes, origin);
  Tensor in = is_floating(x.dtype()) ? x : cast(x, DType::Int64);
  return reduce_masked(in, op, mask, keepdim, origin);
}

Tensor extreme(const Tensor& x, ReduceOp op, const std::vector<int64_t>& axes, bool keepdim,
               const char* origin) {
  std::vector<bool> mask = reduced_mask(x, axes, origin);
  check_nonempty(x, mask, origin);
  return reduce_masked(x, op, mask, keepdim, origin);
}

// Mean over `mask` in the compute dtype (keepdim as asked); x must already be floating.
Tensor mean_masked(const Tensor& xc, const std::vector<bool>& mask, bool keepdim,
                   const char* origin) {
  Tensor s = reduce_masked(xc, ReduceOp::Sum, mask, keepdim, origin);
  double n = static_cast<double>(reduced_count(xc.shape(), mask));
  return binary(OpCode::Div, s, scalar_tensor(n), origin);
}

Tensor var_impl(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, int64_t correction,
                const char* origin) {
  require_floating(x, origin);
  std::vector<bool> mask = reduced_mask(x, axes, origin);
  Tensor xc = compute_type(x);
  // torch divides by max(N - correction, 0): a zero divisor gives inf or NaN, not an error.
  int64_t n = reduced_count(x.shape(), mask);
  double divisor = static_cast<double>(std::max<int64_t>(n - correction, 0));
  Tensor mu = mean_masked(xc, mask, true, origin);
  // The mean's part of the gradient is 2/divisor * sum(x - mean) = 0. With a zero divisor
  // that is inf * 0 = NaN and would spoil every element; torch's gradient there is
  // inf * (x - mean) (NaN only where x equals the mean), which detaching the mean gives.
  // A value that is inf or NaN has no second derivative to lose.
  if (divisor == 0.0) mu = mu.detach();
  Tensor centered = binary(OpCode::Sub, xc, mu, origin);
  Tensor sq = binary(OpCode::Mul, centered, centered, origin);
  Tensor s = reduce_masked(sq, ReduceOp::Sum, mask, keepdim, origin);
  return binary(OpCode::Div, s, scalar_tensor(divisor), origin);
}

// First index of the extreme: positions equal to the (keepdim) extreme keep their index,
// the others become `size`, and a min-reduce picks the smallest surviving index.
Tensor arg_extreme(const Tensor& x, int64_t axis, bool keepdim, ReduceOp op, const char* origin) {
  check_defined(x, origin);
  int d = normalize_axis(origin, axis, x.shape());
  if (x.ndim() == 0) return full({}, 0, DType::Int64, x.device());
  std::vector<bool> mask(x.shape().size(), false);
  mask[d] = true;
  check_nonempty(x, mask, origin);
  Tensor m = reduce_masked(x, op, mask, true, origin);
  Tensor hit = binary(OpCode::Eq, x, m, origin);
  if (is_floating(x.dtype())) {
    // A NaN extreme equals nothing; torch reports the first NaN, and when the extreme is
    // NaN the NaNs are exactly the positions to report.
    hit = binary(OpCode::LogicalOr, hit, binary(OpCode::Ne, x, x, origin), origin);
  }
  Tensor pos = index(x.shape(), d, DType::Int64);
  Tensor cand = elementwise(OpCode::Where, {hit, pos, scalar_tensor(x.shape()[d])}, origin);
  return reduce_masked(cand, ReduceOp::Min, mask, keepdim, origin);
}

// The whole tensor as one row-major vector, for the axis-less argmax/argmin.
Tensor flatten_all(const Tensor& x, const char* origin) {
  const Shape& shape = x.shape();
  std::vector<int64_t> strides = contiguous_strides(shape);
  std::vector<IndexExpr> map;
  IndexExpr flat = IndexExpr::var(0);
  for (size_t d = 0; d < shape.size(); ++d) {
    map.push_back(mod(floordiv(flat, IndexExpr::constant(std::max<int64_t>(strides[d], 1))),
                      IndexExpr::constant(std::max<int64_t>(shape[d], 1))));
  }
  return reindex(x, {x.numel()}, std::move(map), 0, {}, false, origin);
}

Tensor arg_extreme_all(const Tensor& x, ReduceOp op, const char* origin) {
  check_defined(x, origin);
  if (x.ndim() == 0) return full({}, 0, DType::Int64, x.device());
  if (x.numel() == 0) {
    throw ValueError("[" + std::string(origin) +
                     "] cannot reduce over a zero-size dimension: " + "the input of shape " +
                     shape_str(x.shape()) + " has no elements; expected a non-empty tensor");
  }
  return arg_extreme(flatten_all(x, origin), 0, false, op, origin);
}

Tensor softmax_impl(const Tensor& x_in, int64_t axis, bool log_space, const char* origin) {
  require_floating(x_in, origin);
  const Tensor x = amp::full_precision(x_in);  // on autocast's float32 list
  int d = normalize_axis(origin, axis, x.shape());
  std::vector<bool> mask(x.shape().size(), false);
  if (x.ndim() > 0) mask[d] = true;
  Tensor xc = compute_type(x);
  // The shift is detached: the result does not depend on it, so its gradient is zero, and a
  // shift without history keeps the max-reduction out of the backward graph.
  // Only a -inf maximum is replaced (an all -inf row then gives 0/0 = NaN, as torch): a +inf
  // maximum stays, so x - max is NaN at the +inf and the whole row is NaN, as torch gives.
  Tensor m = reduce_masked(xc, ReduceOp::Max, mask, true, origin);
  Tensor shift =
      elementwise(OpCode::Where,
                  {binary(OpCode::Eq, m, scalar_tensor(-INFINITY), origin), scalar_tensor(0.0), m},
                  origin)
          .detach();
  Tensor z = binary(OpCode::Sub, xc, shift, origin);
  Tensor e = unary(OpCode::Exp, z, origin);
  Tensor s = reduce_masked(e, ReduceOp::Sum, mask, true, origin);
  Tensor out = log_space ? binary(OpCode::Sub, z, unary(OpCode::Log, s, origin), origin)
                         : binary(OpCode::Div, e, s, origin);
  return cast(out, x.dtype());
}

}  // namespace

// Sums, products, means, variances and logsumexp are on autocast's float32 list.
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return sum_like(amp::full_precision(x), ReduceOp::Sum, axes, keepdim, "sum");
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return sum_like(amp::full_precision(x), ReduceOp::Prod, axes, keepdim, "prod");
}

Tensor mean(const Tensor& x_in, const std::vector<int64_t>& axes, bool keepdim) {
  require_floating(x_in, "mean");
  const Tensor x = amp::full_precision(x_in);
  std::vector<bool> mask = reduced_mask(x, axes, "mean");
  return cast(mean_masked(compute_type(x), mask, keepdim, "mean"), x.dtype());
}

Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return extreme(x, ReduceOp::Max, axes, keepdim, "max");
}

Tensor min(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return extreme(x, ReduceOp::Min, axes, keepdim, "min");
}

Tensor all(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  std::vector<bool> mask = reduced_mask(x, axes, "all");
  return reduce_masked(cast(x, DType::Bool), ReduceOp::And, mask, keepdim, "all");
}

Tensor any(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  std::vector<bool> mask = reduced_mask(x, axes, "any");
  return reduce_masked(cast(x, DType::Bool), ReduceOp::Or, mask, keepdim, "any");
}

Tensor logsumexp(const Tensor& x_in, const std::vector<int64_t>& axes, bool keepdim) {
  const char* op = "logsumexp";
  const Tensor x = amp::full_precision(x_in);
  std::vector<bool> mask = reduced_mask(x, axes, op);
  DType out_dtype = is_floating(x.dtype()) ? x.dtype() : DType::Float32;
  Tensor xc = is_floating(x.dtype()) ? compute_type(x) : cast(x, DType::Float32);
  // An empty reduction has max -inf, which the shift maps to 0, giving log(0) = -inf.
  // Detached like softmax's: log(sum(exp(x - s))) + s has gradient softmax(x) for any s.
  Tensor shift = finite_shift(reduce_masked(xc, ReduceOp::Max, mask, true, op), op).detach();
  Tensor e = unary(OpCode::Exp, binary(OpCode::Sub, xc, shift, op), op);
  Tensor lse =
      binary(OpCode::Add, unary(OpCode::Log, reduce_masked(e, ReduceOp::Sum, mask, true, op), op),
             shift, op);
  if (!keepdim) lse = squeeze_mask(lse, mask, op);
  return cast(lse, out_dtype);
}

Tensor var(const Tensor& x_in, const std::vector<int64_t>& axes, bool keepdim, int64_t correction) {
  const Tensor x = amp::full_precision(x_in);
  Tensor v = var_impl(x, axes, keepdim, correction, "var");
  return cast(v, x.dtype());
}

Tensor std(const Tensor& x_in, const std::vector<int64_t>& axes, bool keepdim, int64_t correction) {
  const Tensor x = amp::full_precision(x_in);
  Tensor v = var_impl(x, axes, keepdim, correction, "std");
  return cast(unary(OpCode::Sqrt, v, "std"), x.dtype());
}

Tensor argmax(const Tensor& x, int64_t axis, bool keepdim) {
  return arg_extreme(x, axis, keepdim, ReduceOp::Max, "argmax");
}

Tensor argmax(const Tensor& x) { return arg_extreme_all(x, ReduceOp::Max, "argmax"); }

Tensor argmin(const Tensor& x, int64_t axis, bool keepdim) {
  return arg_extreme(x, axis, keepdim, ReduceOp::Min, "argmin");
}

Tensor argmin(const Tensor& x) { return arg_extreme_all(x, ReduceOp::Min, "argmin"); }

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_impl(x, axis, false, "softmax"); }

namespace detail {

namespace {

// softmax_impl builds out = e / broadcast(sum(e)) with e = exp(z). The summed axes of such
// an output: where the sum, before it was broadcast back, has extent 1. False when `n` is
// not a softmax's output.
bool softmax_axes(const Node& n, std::vector<int64_t>* axes) {
  auto is_softmax = [](const Node& m) {
    return m.origin != nullptr && std::string_view(m.origin) == "softmax";
  };
  if (n.op != OpCode::Div || !is_softmax(n) || n.inputs.size() != 2) return false;
  const Node& e = *n.inputs[0];
  if (e.op != OpCode::Exp || !is_softmax(e) || e.inputs.size() != 1) return false;
  const Node* sum = n.inputs[1].get();
  if (sum->op == OpCode::Reindex && !sum->inputs.empty()) sum = sum->inputs[0].get();
  if (sum->shape.size() != n.shape.size()) return false;
  axes->clear();
  for (size_t d = 0; d < n.shape.size(); ++d)
    if (sum->shape[d] == 1 && n.shape[d] != 1) axes->push_back(static_cast<int64_t>(d));
  return true;
}

}  // namespace

Node* softmax_input(const Node& n) {
  std::vector<int64_t> axes;
  return softmax_axes(n, &axes) ? n.inputs[0]->inputs[0].get() : nullptr;
}

Tensor softmax_vjp(const Node& n, const Tensor& g) {
  // Differentiating exp, sum and divide one by one reads e (or z, to rebuild it) in the
  // backward pass, so a step would keep the scores as well as the probabilities;
  // p * (g - sum(g * p)) needs p alone.
  std::vector<int64_t> axes;
  if (!softmax_axes(n, &axes)) return Tensor();
  Tensor p(const_cast<Node&>(n).shared_from_this());
  Tensor gp = mul(g, p);
  // No axis of extent > 1: the softmax is 1 everywhere and the gradient 0 (g * p - g * p).
  Tensor total = axes.empty() ? gp : sum_like(gp, ReduceOp::Sum, axes, true, "softmax backward");
  return sub(gp, mul(p, total));
}

}  // namespace detail

Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_impl(x, axis, true, "log_softmax");
}

}  // namespace kiln
