#pragma once
// Elementwise ops: unary, binary (numpy broadcasting, PyTorch type promotion, C++ scalars
// as weak operands), where, cast. Each op's rule and reference semantics live in
// elementwise.cpp, one table row per op.
#include "../core/tensor.h"

namespace kiln {

/// Reference semantics of one elementwise op, the row of its definition table. The
/// reference evaluator calls `f64` for floating operands and `i64` for integer/bool ones;
/// the JIT printers read `expr`, a C expression over operands a, b, c in the compute type.
struct ElementwiseDef {
  OpCode op;
  /// Operand dtypes the op accepts.
  enum class Accepts : uint8_t { Any, IntegerOrBool, NotBool } accepts;
  /// Result dtype: the (promoted) operand dtype, bool, or at least float32.
  enum class Result : uint8_t { SameAsOperands, Bool, Floating } result;
  double (*f64)(double a, double b, double c);
  int64_t (*i64)(int64_t a, int64_t b, int64_t c);
  const char* expr;
};

/// The definition of elementwise op `op` (Cast excluded: it is defined by its dtype pair).
const ElementwiseDef& elementwise_def(OpCode op);

// --- unary ---
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
/// -1, 0 or 1 by the sign of x (NaN stays NaN).
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor exp2(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log2(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tan(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
/// Rounds half to even, as torch.round.
Tensor round(const Tensor& x);
Tensor trunc(const Tensor& x);
Tensor logical_not(const Tensor& x);
/// Bitwise complement of integers; logical not of bool. Floats raise DTypeError.
Tensor bitwise_not(const Tensor& x);
/// Converts to `dtype` (floats to integers truncate toward zero and saturate; NaN gives 0).
Tensor cast(const Tensor& x, DType dtype);
/// x != x.
Tensor isnan(const Tensor& x);
/// |x| == inf.
Tensor isinf(const Tensor& x);
/// x * x.
Tensor square(const Tensor& x);
/// max(x, 0).
Tensor relu(const Tensor& x);

// --- binary (either side may be a C++ scalar) ---
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
/// True division: integers give float32.
Tensor div(const Tensor& a, const Tensor& b);
/// Floor division (rounds toward -inf); integer division by zero gives 0, as numpy.
Tensor floor_div(const Tensor& a, const Tensor& b);
/// Remainder with the divisor's sign (Python %, torch.remainder); integer x % 0 gives 0.
Tensor mod(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
/// Elementwise max/min; NaN propagates.
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
/// cond ? a : b with broadcasting; cond must be bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// Limits x to [lo, hi] (either bound may be omitted by passing an undefined Tensor).
Tensor clamp(const Tensor& x, const Tensor& lo, const Tensor& hi);

/// torch.isclose: a == b, or |a - b| <= atol + rtol * |b| for finite differences, or both
/// NaN when `equal_nan`; a and b must share a dtype (DTypeError otherwise), shapes broadcast.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
               bool equal_nan = false);
/// torch.allclose: every element isclose (evaluates now).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false);

/// Builds elementwise op `op` with broadcasting and promotion; scalars are weak operands.
Tensor elementwise(OpCode op, const std::vector<Tensor>& inputs, const char* origin = nullptr);

/// A C++ number as a weak operand (a rank-0 constant that promotes like a Python scalar).
Tensor scalar_tensor(const Scalar& value);

#define KILN_BINARY_SCALAR_OVERLOADS(fn)                                        \
  inline Tensor fn(const Tensor& a, const Scalar& b) { return fn(a, scalar_tensor(b)); } \
  inline Tensor fn(const Scalar& a, const Tensor& b) { return fn(scalar_tensor(a), b); }
KILN_BINARY_SCALAR_OVERLOADS(add)
KILN_BINARY_SCALAR_OVERLOADS(sub)
KILN_BINARY_SCALAR_OVERLOADS(mul)
KILN_BINARY_SCALAR_OVERLOADS(div)
KILN_BINARY_SCALAR_OVERLOADS(floor_div)
KILN_BINARY_SCALAR_OVERLOADS(mod)
KILN_BINARY_SCALAR_OVERLOADS(pow)
KILN_BINARY_SCALAR_OVERLOADS(maximum)
KILN_BINARY_SCALAR_OVERLOADS(minimum)
KILN_BINARY_SCALAR_OVERLOADS(eq)
KILN_BINARY_SCALAR_OVERLOADS(ne)
KILN_BINARY_SCALAR_OVERLOADS(lt)
KILN_BINARY_SCALAR_OVERLOADS(le)
KILN_BINARY_SCALAR_OVERLOADS(gt)
KILN_BINARY_SCALAR_OVERLOADS(ge)
KILN_BINARY_SCALAR_OVERLOADS(bitwise_and)
KILN_BINARY_SCALAR_OVERLOADS(bitwise_or)
KILN_BINARY_SCALAR_OVERLOADS(bitwise_xor)
#undef KILN_BINARY_SCALAR_OVERLOADS
inline Tensor where(const Tensor& c, const Scalar& a, const Tensor& b) { return where(c, scalar_tensor(a), b); }
inline Tensor where(const Tensor& c, const Tensor& a, const Scalar& b) { return where(c, a, scalar_tensor(b)); }
inline Tensor where(const Tensor& c, const Scalar& a, const Scalar& b) {
  return where(c, scalar_tensor(a), scalar_tensor(b));
}
inline Tensor clamp(const Tensor& x, const Scalar& lo, const Scalar& hi) {
  return clamp(x, scalar_tensor(lo), scalar_tensor(hi));
}

// --- operators ---
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator!(const Tensor& x) { return logical_not(x); }
inline Tensor operator~(const Tensor& x) { return bitwise_not(x); }
#define KILN_OPERATOR(sym, fn)                                                            \
  inline Tensor operator sym(const Tensor& a, const Tensor& b) { return fn(a, b); }       \
  inline Tensor operator sym(const Tensor& a, const Scalar& b) { return fn(a, b); }       \
  inline Tensor operator sym(const Scalar& a, const Tensor& b) { return fn(a, b); }
KILN_OPERATOR(+, add)
KILN_OPERATOR(-, sub)
KILN_OPERATOR(*, mul)
KILN_OPERATOR(/, div)
KILN_OPERATOR(%, mod)
KILN_OPERATOR(==, eq)
KILN_OPERATOR(!=, ne)
KILN_OPERATOR(<, lt)
KILN_OPERATOR(<=, le)
KILN_OPERATOR(>, gt)
KILN_OPERATOR(>=, ge)
KILN_OPERATOR(&, bitwise_and)
KILN_OPERATOR(|, bitwise_or)
KILN_OPERATOR(^, bitwise_xor)
#undef KILN_OPERATOR
inline Tensor operator&&(const Tensor& a, const Tensor& b) { return logical_and(a, b); }
inline Tensor operator||(const Tensor& a, const Tensor& b) { return logical_or(a, b); }

}  // namespace kiln
