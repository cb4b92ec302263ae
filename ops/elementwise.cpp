// Elementwise ops: one table row per op (operand rule, result rule, reference semantics in
// double and in int64, C expression for the printers), and the builder that applies
// broadcasting and PyTorch promotion before creating the node.
#include "elementwise.h"

#include <cmath>
#include <limits>

#include "autocast.h"
#include "autograd.h"
#include "bit_mask.h"
#include "reduce_ops.h"
#include "reindex.h"
#include "sources.h"
#include "transfer.h"

namespace kiln {
namespace {

using A = ElementwiseDef::Accepts;
using R = ElementwiseDef::Result;

// Integer arithmetic wraps like the stored two's complement types; going through uint64
// keeps the reference free of signed-overflow UB.
int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

int64_t int_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;  // numpy's answer; a kernel cannot raise per element
  if (b == -1) return wrap_sub(0, a);
  return floordiv_i64(a, b);
}
int64_t int_mod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  return floormod_i64(a, b);
}
int64_t int_pow(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e % 2 == 0 ? 1 : -1) : 0;
  uint64_t result = 1, b = static_cast<uint64_t>(base);
  while (e > 0) {
    if (e & 1) result *= b;
    b *= b;
    e >>= 1;
  }
  return static_cast<int64_t>(result);
}

// Python's float floor division: exact where floor(a / b) would round wrongly.
double float_floordiv(double a, double b) {
  if (b == 0.0) return a / b;
  double m = std::fmod(a, b);
  double div = (a - m) / b;
  if (m != 0.0 && ((b < 0) != (m < 0))) div -= 1.0;
  if (div == 0.0) return std::copysign(0.0, a / b);
  double fl = std::floor(div);
  if (div - fl > 0.5) fl += 1.0;
  return fl;
}
double float_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0.0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
double nan_max(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b);
}
double nan_min(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? NAN : (a < b ? a : b);
}
double float_sign(double a) { return std::isnan(a) ? a : static_cast<double>((a > 0) - (a < 0)); }

#define F1(body) [](double a, double, double) -> double { return body; }
#define F2(body) [](double a, double b, double) -> double { return body; }
#define I1(body) [](int64_t a, int64_t, int64_t) -> int64_t { return body; }
#define I2(body) [](int64_t a, int64_t b, int64_t) -> int64_t { return body; }

// clang-format off
const ElementwiseDef kDefs[] = {
  {OpCode::Neg,        A::NotBool,       R::SameAsOperands, F1(-a),                 I1(wrap_sub(0, a)),          "(-a)"},
  {OpCode::Abs,        A::Any,           R::SameAsOperands, F1(std::fabs(a)),       I1(a < 0 ? wrap_sub(0, a) : a), "abs(a)"},
  {OpCode::Sign,       A::Any,           R::SameAsOperands, F1(float_sign(a)),      I1((a > 0) - (a < 0)),       "sign(a)"},
  {OpCode::Exp,        A::Any,           R::Floating,       F1(std::exp(a)),        nullptr,                     "exp(a)"},
  {OpCode::Exp2,       A::Any,           R::Floating,       F1(std::exp2(a)),       nullptr,                     "exp2(a)"},
  {OpCode::Log,        A::Any,           R::Floating,       F1(std::log(a)),        nullptr,                     "log(a)"},
  {OpCode::Log2,       A::Any,           R::Floating,       F1(std::log2(a)),       nullptr,                     "log2(a)"},
  {OpCode::Log1p,      A::Any,           R::Floating,       F1(std::log1p(a)),      nullptr,                     "log1p(a)"},
  {OpCode::Expm1,      A::Any,           R::Floating,       F1(std::expm1(a)),      nullptr,                     "expm1(a)"},
  {OpCode::Sqrt,       A::Any,           R::Floating,       F1(std::sqrt(a)),       nullptr,                     "sqrt(a)"},
  {OpCode::Rsqrt,      A::Any,           R::Floating,       F1(1.0 / std::sqrt(a)), nullptr,                     "(1 / sqrt(a))"},
  {OpCode::Reciprocal, A::Any,           R::Floating,       F1(1.0 / a),            nullptr,                     "(1 / a)"},
  {OpCode::Sin,        A::Any,           R::Floating,       F1(std::sin(a)),        nullptr,                     "sin(a)"},
  {OpCode::Cos,        A::Any,           R::Floating,       F1(std::cos(a)),        nullptr,                     "cos(a)"},
  {OpCode::Tan,        A::Any,           R::Floating,       F1(std::tan(a)),        nullptr,                     "tan(a)"},
  {OpCode::Tanh,       A::Any,           R::Floating,       F1(std::tanh(a)),       nullptr,                     "tanh(a)"},
  {OpCode::Sigmoid,    A::Any,           R::Floating,       F1(1.0 / (1.0 + std::exp(-a))), nullptr,             "(1 / (1 + exp(-a)))"},
  {OpCode::Erf,        A::Any,           R::Floating,       F1(std::erf(a)),        nullptr,                     "erf(a)"},
  {OpCode::Floor,      A::NotBool,       R::SameAsOperands, F1(std::floor(a)),      I1(a),                       "floor(a)"},
  {OpCode::Ceil,       A::NotBool,       R::SameAsOperands, F1(std::ceil(a)),       I1(a),                       "ceil(a)"},
  {OpCode::Round,      A::NotBool,       R::SameAsOperands, F1(std::nearbyint(a)),  I1(a),                       "nearbyint(a)"},
  {OpCode::Trunc,      A::NotBool,       R::SameAsOperands, F1(std::trunc(a)),      I1(a),                       "trunc(a)"},
  {OpCode::LogicalNot, A::Any,           R::Bool,           F1(a == 0.0),           I1(a == 0),                  "(a == 0)"},
  {OpCode::BitwiseNot, A::IntegerOrBool, R::SameAsOperands, nullptr,                I1(~a),                      "(~a)"},
  {OpCode::Add,        A::Any,           R::SameAsOperands, F2(a + b),              I2(wrap_add(a, b)),          "(a + b)"},
  {OpCode::Sub,        A::NotBool,       R::SameAsOperands, F2(a - b),              I2(wrap_sub(a, b)),          "(a - b)"},
  {OpCode::Mul,        A::Any,           R::SameAsOperands, F2(a * b),              I2(wrap_mul(a, b)),          "(a * b)"},
  {OpCode::Div,        A::Any,           R::Floating,       F2(a / b),              nullptr,                     "(a / b)"},
  {OpCode::FloorDiv,   A::NotBool,       R::SameAsOperands, F2(float_floordiv(a, b)), I2(int_floordiv(a, b)),    "floor_div(a, b)"},
  {OpCode::Mod,        A::NotBool,       R::SameAsOperands, F2(float_mod(a, b)),    I2(int_mod(a, b)),           "floor_mod(a, b)"},
  {OpCode::Pow,        A::NotBool,       R::SameAsOperands, F2(std::pow(a, b)),     I2(int_pow(a, b)),           "pow(a, b)"},
  {OpCode::Maximum,    A::Any,           R::SameAsOperands, F2(nan_max(a, b)),      I2(a > b ? a : b),           "nan_max(a, b)"},
  {OpCode::Minimum,    A::Any,           R::SameAsOperands, F2(nan_min(a, b)),      I2(a < b ? a : b),           "nan_min(a, b)"},
  {OpCode::Eq,         A::Any,           R::Bool,           F2(a == b),             I2(a == b),                  "(a == b)"},
  {OpCode::Ne,         A::Any,           R::Bool,           F2(a != b),             I2(a != b),                  "(a != b)"},
  {OpCode::Lt,         A::Any,           R::Bool,           F2(a < b),              I2(a < b),                   "(a < b)"},
  {OpCode::Le,         A::Any,           R::Bool,           F2(a <= b),             I2(a <= b),                  "(a <= b)"},
  {OpCode::Gt,         A::Any,           R::Bool,           F2(a > b),              I2(a > b),                   "(a > b)"},
  {OpCode::Ge,         A::Any,           R::Bool,           F2(a >= b),             I2(a >= b),                  "(a >= b)"},
  {OpCode::LogicalAnd, A::Any,           R::Bool,           F2(a != 0.0 && b != 0.0), I2(a != 0 && b != 0),      "(a != 0 && b != 0)"},
  {OpCode::LogicalOr,  A::Any,           R::Bool,           F2(a != 0.0 || b != 0.0), I2(a != 0 || b != 0),      "(a != 0 || b != 0)"},
  {OpCode::LogicalXor, A::Any,           R::Bool,           F2((a != 0.0) != (b != 0.0)), I2((a != 0) != (b != 0)), "((a != 0) != (b != 0))"},
  {OpCode::BitwiseAnd, A::IntegerOrBool, R::SameAsOperands, nullptr,                I2(a & b),                   "(a & b)"},
  {OpCode::BitwiseOr,  A::IntegerOrBool, R::SameAsOperands, nullptr,                I2(a | b),                   "(a | b)"},
  {OpCode::BitwiseXor, A::IntegerOrBool, R::SameAsOperands, nullptr,                I2(a ^ b),                   "(a ^ b)"},
  {OpCode::Where,      A::Any,           R::SameAsOperands,
       [](double c, double a, double b) -> double { return c != 0.0 ? a : b; },
       [](int64_t c, int64_t a, int64_t b) -> int64_t { return c != 0 ? a : b; },     "(a ? b : c)"},
};
// clang-format on

#undef F1
#undef F2
#undef I1
#undef I2

std::string names_of(const std::vector<Tensor>& inputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    s +=
        (i ? ", " : "") + std::string(dtype_name(inputs[i].dtype())) + shape_str(inputs[i].shape());
  }
  return s;
}

// Brings an operand to the op's dtype and shape. A weak scalar or other unevaluated fill
// is rebuilt directly at the target dtype and shape instead of being cast and broadcast.
Tensor conform(const Tensor& x, DType dtype, const Shape& shape, const char* origin) {
  const Node& n = *x.node();
  // Only a weak scalar carries its raw value; any other fill has already been converted to
  // its own dtype (full(2.7, int32) is 2), so it goes through cast like other tensors.
  // A fill that gradients flow to (ones(...).requires_grad_()) must stay the same node.
  if (n.op == OpCode::Full && !n.is_evaluated() && !n.requires_grad &&
      (n.weak_scalar || n.dtype == dtype)) {
    return full(shape, n.scalar, dtype, n.device);
  }
  Tensor t = x.dtype() == dtype ? x : cast(x, dtype);
  return t.shape() == shape ? t : broadcast_to(t, shape, origin);
}

}  // namespace

const ElementwiseDef& elementwise_def(OpCode op) {
  static const auto* table = [] {
    auto* t = new const ElementwiseDef*[256]();
    for (const ElementwiseDef& d : kDefs) t[static_cast<int>(d.op)] = &d;
    return t;
  }();
  const ElementwiseDef* d = table[static_cast<int>(op)];
  if (d == nullptr)
    throw ValueError("[elementwise] " + std::string(op_name(op)) +
                     " is not an elementwise op with a table row");
  return *d;
}

Tensor scalar_tensor(const Scalar& value) {
  Tensor t = full({}, value, value.category_dtype());
  t.node()->weak_scalar = true;
  return t;
}

Tensor elementwise(OpCode op, const std::vector<Tensor>& inputs, const char* origin) {
  const ElementwiseDef& def = elementwise_def(op);
  const char* name = origin ? origin : op_name(op).data();
  if (inputs.size() != static_cast<size_t>(op_arity(op))) {
    throw ValueError("[" + std::string(name) + "] expects " + std::to_string(op_arity(op)) +
                     " input(s), got " + std::to_string(inputs.size()));
  }
  for (const Tensor& t : inputs) {
    if (!t.defined()) throw ValueError("[" + std::string(name) + "] an input tensor is undefined");
  }
  std::vector<Tensor> aligned = inputs;
  std::vector<Tensor*> refs;
  for (Tensor& t : aligned) refs.push_back(&t);
  Device device = detail::align_devices(name, refs);
  // `where` promotes its two value operands; its condition must be bool.
  size_t first = op == OpCode::Where ? 1 : 0;
  if (op == OpCode::Where && aligned[0].dtype() != DType::Bool) {
    throw DTypeError("[" + std::string(name) + "] condition must be bool, got " +
                     std::string(dtype_name(aligned[0].dtype())) + shape_str(aligned[0].shape()));
  }
  ResultType rt;
  for (size_t i = first; i < aligned.size(); ++i) {
    const Node& n = *aligned[i].node();
    if (n.weak_scalar)
      rt.add_scalar(n.dtype);
    else
      rt.add_tensor(n.dtype, static_cast<int>(n.shape.size()));
  }
  DType operand = rt.result();
  if (def.accepts == A::IntegerOrBool && is_floating(operand)) {
    throw DTypeError("[" + std::string(name) + "] expects integer or bool tensors, got " +
                     names_of(inputs));
  }
  if (def.accepts == A::NotBool && operand == DType::Bool) {
    throw DTypeError("[" + std::string(name) + "] is not defined for bool tensors (got " +
                     names_of(inputs) + "); cast to an integer or float dtype first");
  }
  if (def.result == R::Floating && !is_floating(operand)) operand = DType::Float32;
  DType out = def.result == R::Bool ? DType::Bool : operand;

  Shape shape = aligned[0].shape();
  for (size_t i = 1; i < aligned.size(); ++i)
    shape = broadcast_shapes(name, shape, aligned[i].shape());
  check_sizes(name, shape, itemsize(out));

  std::vector<NodePtr> nodes;
  for (size_t i = 0; i < aligned.size(); ++i) {
    DType want = i < first ? DType::Bool : operand;
    nodes.push_back(conform(aligned[i], want, shape, name).node());
  }
  auto node = std::make_shared<Node>(op, std::move(nodes), shape, out, device);
  node->origin = origin;
  return Tensor(std::move(node));
}

Tensor cast(const Tensor& x, DType dtype) {
  if (!x.defined()) throw ValueError("[cast] the tensor is undefined");
  if (x.dtype() == dtype) return x;
  check_sizes("cast", x.shape(), itemsize(dtype));
  auto node = std::make_shared<Node>(OpCode::Cast, std::vector<NodePtr>{x.node()}, x.shape(), dtype,
                                     x.device());
  return Tensor(std::move(node));
}

#define KILN_UNARY(fn, code) \
  Tensor fn(const Tensor& x) { return elementwise(OpCode::code, {x}); }
// On autocast's float32 list: half inputs are widened inside an autocast scope.
#define KILN_UNARY_FP32(fn, code) \
  Tensor fn(const Tensor& x) { return elementwise(OpCode::code, {amp::full_precision(x)}); }
KILN_UNARY(neg, Neg)
KILN_UNARY(abs, Abs)
KILN_UNARY(sign, Sign)
KILN_UNARY_FP32(exp, Exp)
KILN_UNARY_FP32(exp2, Exp2)
KILN_UNARY_FP32(log, Log)
KILN_UNARY_FP32(log2, Log2)
KILN_UNARY_FP32(log1p, Log1p)
KILN_UNARY_FP32(expm1, Expm1)
KILN_UNARY(sqrt, Sqrt)
KILN_UNARY_FP32(rsqrt, Rsqrt)
KILN_UNARY_FP32(reciprocal, Reciprocal)
KILN_UNARY(sin, Sin)
KILN_UNARY(cos, Cos)
KILN_UNARY_FP32(tan, Tan)
KILN_UNARY(tanh, Tanh)
KILN_UNARY(sigmoid, Sigmoid)
KILN_UNARY(erf, Erf)
KILN_UNARY(floor, Floor)
KILN_UNARY(ceil, Ceil)
KILN_UNARY(round, Round)
KILN_UNARY(trunc, Trunc)
KILN_UNARY(logical_not, LogicalNot)
#undef KILN_UNARY
#undef KILN_UNARY_FP32

Tensor bitwise_not(const Tensor& x) {
  // On bool, ~ is logical: the integer complement of true (-2) would read back as true.
  if (x.defined() && x.dtype() == DType::Bool)
    return elementwise(OpCode::LogicalNot, {x}, "bitwise_not");
  return elementwise(OpCode::BitwiseNot, {x});
}

Tensor pow(const Tensor& a, const Tensor& b) {
  return elementwise(OpCode::Pow, {amp::full_precision(a), amp::full_precision(b)});
}

#define KILN_BINARY(fn, code) \
  Tensor fn(const Tensor& a, const Tensor& b) { return elementwise(OpCode::code, {a, b}); }
KILN_BINARY(add, Add)
KILN_BINARY(sub, Sub)
KILN_BINARY(mul, Mul)
KILN_BINARY(div, Div)
KILN_BINARY(floor_div, FloorDiv)
KILN_BINARY(mod, Mod)
KILN_BINARY(maximum, Maximum)
KILN_BINARY(minimum, Minimum)
KILN_BINARY(eq, Eq)
KILN_BINARY(ne, Ne)
KILN_BINARY(lt, Lt)
KILN_BINARY(le, Le)
KILN_BINARY(gt, Gt)
KILN_BINARY(ge, Ge)
KILN_BINARY(logical_and, LogicalAnd)
KILN_BINARY(logical_or, LogicalOr)
KILN_BINARY(logical_xor, LogicalXor)
KILN_BINARY(bitwise_and, BitwiseAnd)
KILN_BINARY(bitwise_or, BitwiseOr)
KILN_BINARY(bitwise_xor, BitwiseXor)
#undef KILN_BINARY

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return elementwise(OpCode::Where, {cond, a, b});
}

Tensor isnan(const Tensor& x) {
  if (!x.defined()) throw ValueError("[isnan] the tensor is undefined");
  if (!is_floating(x.dtype())) return full(x.shape(), false, DType::Bool, x.device());
  return elementwise(OpCode::Ne, {x, x}, "isnan");
}

Tensor isinf(const Tensor& x) {
  if (!x.defined()) throw ValueError("[isinf] the tensor is undefined");
  if (!is_floating(x.dtype())) return full(x.shape(), false, DType::Bool, x.device());
  return elementwise(OpCode::Eq, {abs(x), scalar_tensor(INFINITY)}, "isinf");
}

Tensor square(const Tensor& x) { return elementwise(OpCode::Mul, {x, x}, "square"); }

Tensor relu(const Tensor& x) {
  if (!x.defined()) throw ValueError("[relu] the tensor is undefined");
  return elementwise(OpCode::Maximum,
                     {x, scalar_tensor(x.dtype() == DType::Bool ? Scalar(false) : Scalar(0))},
                     "relu");
}

Tensor clamp(const Tensor& x, const Tensor& lo, const Tensor& hi) {
  Tensor y = x;
  if (lo.defined()) y = elementwise(OpCode::Maximum, {y, lo}, "clamp");
  if (hi.defined()) y = elementwise(OpCode::Minimum, {y, hi}, "clamp");
  return y;
}

namespace detail {

// Gradient rules of the elementwise ops, next to their table. Operands already have the
// op's dtype and shape (broadcasts and casts are nodes of their own), so every rule is
// elementwise too. Ops with zero derivative almost everywhere (sign, floor, round, mod's
// comparisons, integer results) pass nothing back, which sums as zero.
std::vector<Tensor> elementwise_vjp(const Node& n, const std::vector<Tensor>& in, const Tensor& out,
                                    const Tensor& g, bool out_inlined) {
  constexpr double kLn2 = 0.69314718055994530942;
  constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
  const Tensor& a = in[0];
  std::vector<Tensor> d(in.size());
  switch (n.op) {
    case OpCode::Cast:
      if (is_floating(a.dtype())) d[0] = cast(g, a.dtype());
      break;
    case OpCode::Neg:
      d[0] = -g;
      break;
    case OpCode::Abs:
      d[0] = g * sign(a);
      break;
    case OpCode::Exp:
      d[0] = g * out;
      break;
    case OpCode::Exp2:
      d[0] = g * out * kLn2;
      break;
    case OpCode::Log:
      d[0] = g / a;
      break;
    case OpCode::Log2:
      d[0] = g / (a * kLn2);
      break;
    case OpCode::Log1p:
      d[0] = g / (a + 1);
      break;
    case OpCode::Expm1:
      d[0] = g * (out + 1);
      break;
    case OpCode::Sqrt:
      if (n.origin != nullptr && std::string_view(n.origin) == "std") {
        // std's square root (ops/reduce_ops.cpp): where the deviation is 0, 0.5 / out is inf
        // and the variance's zero derivative turns it into NaN; torch.std's gradient there is
        // 0. The divisor is made 1 there too, so a second derivative meets no 0/0 either.
        Tensor zero = out == 0;
        d[0] = where(zero, 0, g * 0.5 / where(zero, 1, out));
        break;
      }
      d[0] = g * 0.5 / out;
      break;
    case OpCode::Rsqrt:
      d[0] = g * -0.5 * out * out * out;
      break;
    case OpCode::Reciprocal:
      d[0] = -g * out * out;
      break;
    case OpCode::Sin:
      d[0] = g * cos(a);
      break;
    case OpCode::Cos:
      d[0] = -g * sin(a);
      break;
    case OpCode::Tan:
      d[0] = g * (out * out + 1);
      break;
    case OpCode::Tanh:
      d[0] = g * (1 - out * out);
      break;
    case OpCode::Sigmoid:
      d[0] = g * out * (1 - out);
      break;
    case OpCode::Erf:
      d[0] = g * kTwoOverSqrtPi * exp(-(a * a));
      break;
    case OpCode::Add:
      d[0] = g, d[1] = g;
      break;
    case OpCode::Sub:
      d[0] = g, d[1] = -g;
      break;
    case OpCode::Mul:
      d[0] = g * in[1], d[1] = g * a;
      break;
    case OpCode::Div:
      d[0] = g / in[1], d[1] = -g * out / in[1];
      break;
    case OpCode::Mod:
      d[0] = g, d[1] = -g * floor_div(a, in[1]);
      break;
    case OpCode::Pow: {
      const Tensor& b = in[1];
      d[0] = where(b == 0, 0, g * b * pow(a, b - 1));
      // a^b grows with b only for a > 0; PyTorch's convention gives 0 at a == 0, b >= 0.
      d[1] = where(logical_and(a == 0, b >= 0), 0, g * out * log(a));
      break;
    }
    case OpCode::Maximum:
    case OpCode::Minimum: {
      const Tensor& b = in[1];
      if (n.origin != nullptr && std::string_view(n.origin) == "relu") {
        // relu'(0) = 0, as PyTorch. Read from the output (out > 0 exactly where x > 0, NaN
        // included) so that the backward pass keeps the relu's result, which the next layer
        // keeps anyway, and not its input as well. Where nothing keeps the output (its
        // readers compute it inline: relu then dropout, the Transformer's feed-forward), its
        // sign is kept as one bit per element instead of the input as 4 bytes.
        Tensor positive = out > 0;
        if (out_inlined) positive = unpack_bits(pack_bits(positive), out.shape());
        d[0] = where(positive, g, 0);
        break;
      }
      Tensor a_wins = n.op == OpCode::Maximum ? a > b : a < b;
      Tensor b_wins = n.op == OpCode::Maximum ? a < b : a > b;
      if (n.origin != nullptr && std::string_view(n.origin) == "clamp") {
        // clamp(x, lo, hi) is minimum(maximum(x, lo), hi) with x's side first: as
        // torch.clamp, x keeps the gradient where it equals a bound, a bound gets it only
        // where it strictly wins, and a NaN passes nothing back.
        d[0] = where(n.op == OpCode::Maximum ? a >= b : a <= b, g, 0);
        d[1] = where(b_wins, g, 0);
        break;
      }
      // Ties split the gradient, as torch.maximum; a NaN (neither wins nor ties) passes it to
      // both sides, as torch's masked rule does.
      Tensor tie = a == b;
      Tensor half = g * 0.5;
      d[0] = where(b_wins, 0, where(tie, half, g));
      d[1] = where(a_wins, 0, where(tie, half, g));
      break;
    }
    case OpCode::Where:
      d[1] = where(a, g, 0);
      d[2] = where(a, 0, g);
      break;
    default:
      break;  // piecewise constant or not floating: no gradient
  }
  return d;
}

}  // namespace detail

Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  if (!a.defined() || !b.defined()) throw ValueError("[isclose] a tensor is undefined");
  if (a.dtype() != b.dtype()) {
    throw DTypeError("[isclose] expected both tensors to have the same dtype, got " +
                     std::string(dtype_name(a.dtype())) + shape_str(a.shape()) + " and " +
                     std::string(dtype_name(b.dtype())) + shape_str(b.shape()));
  }
  if (rtol < 0 || atol < 0) {
    throw ValueError("[isclose] expected non-negative tolerances, got rtol=" + Scalar(rtol).str() +
                     " atol=" + Scalar(atol).str());
  }
  // torch.isclose: equal (infinities included), or a finite difference within tolerance,
  // measured in float64 here so integer inputs compare exactly.
  Tensor close = eq(a, b);
  if (equal_nan) close = logical_or(close, logical_and(isnan(a), isnan(b)));
  if (a.dtype() == DType::Bool) return close;
  Tensor ad = cast(a, DType::Float64), bd = cast(b, DType::Float64);
  Tensor error = abs(sub(ad, bd));
  Tensor allowed = add(scalar_tensor(atol), mul(scalar_tensor(rtol), abs(bd)));
  Tensor finite = logical_not(logical_or(isnan(error), isinf(error)));
  Tensor within = le(error, allowed);
  if (!is_floating(a.dtype())) {
    // float64 holds integers exactly only up to 2^53: the difference is also taken in int64
    // (exact unless it overflows, when the float64 one is far beyond any tolerance).
    Tensor exact = abs(sub(cast(a, DType::Int64), cast(b, DType::Int64)));
    within = logical_and(within, le(cast(exact, DType::Float64), allowed));
  }
  return logical_or(close, logical_and(finite, within));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return all(isclose(a, b, rtol, atol, equal_nan)).item<bool>();
}

}  // namespace kiln
