#pragma once
// One registry of op cases (STYLE item 8, after ggml's test-backend-ops): for every unary
// and binary op, how to build it with kiln, an independent float64 reference written from
// the math (never kiln's own table), the input domain, the dtypes the op accepts, the
// result dtype rule and a tolerance class; and for every differentiable op, its gradient
// case (grad_cases(), at the end: inputs, edges and the conventions at kinks). The checkers build inputs, run the
// op through whatever executor is current, and return "" on success or a description of
// the first mismatch, so the reference, JIT and CUDA executors and any test framework can
// reuse them unchanged.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/kiln.h"

namespace kiln::test {

/// Values an input may take. Integer dtypes use the integers of [lo, hi] within the type's
/// range; `integral` restricts floats to integers too (comparisons then see equal pairs).
struct Domain {
  double lo = -10, hi = 10;
  bool nonzero = true;     ///< Excludes 0 (and, for floats, |x| < min_abs).
  bool integral = false;   ///< Float inputs are integer-valued.
  bool specials = false;   ///< Float inputs also include NaN, +inf and -inf.
  double min_abs = 0.125;  ///< Smallest magnitude of a non-zero float input.
};

/// Result dtype rule, written from PyTorch's documentation rather than kiln's table.
enum class ResultKind { Same, Bool, Floating };
/// Tolerance class of an op.
enum class Precision { Exact, Simple, Transcendental };

struct Tol {
  double rel, abs;
};

/// Per-dtype tolerance of a result; integers and bools are exact.
inline Tol tolerance(DType dtype, Precision p) {
  if (!is_floating(dtype) || p == Precision::Exact) return {0, 0};
  bool tr = p == Precision::Transcendental;
  switch (dtype) {
    case DType::Float32: return tr ? Tol{1e-5, 1e-5} : Tol{2e-6, 1e-6};
    case DType::Float64: return tr ? Tol{1e-10, 1e-12} : Tol{1e-12, 1e-13};
    case DType::Float16: return {1e-3, 1e-3};
    case DType::BFloat16: return {8e-3, 8e-3};
    default: return {0, 0};
  }
}

/// The dtypes the registry runs over.
inline const std::vector<DType>& registry_dtypes() {
  static const std::vector<DType> all = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                         DType::Int32,   DType::Int64,   DType::Int8,    DType::UInt8,
                                         DType::Bool};
  return all;
}
inline std::vector<DType> floats() { return {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}; }
inline std::vector<DType> ints() { return {DType::Int32, DType::Int64, DType::Int8, DType::UInt8}; }
inline std::vector<DType> join(std::vector<DType> a, const std::vector<DType>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
inline std::vector<DType> numeric() { return join(floats(), ints()); }
inline std::vector<DType> any_dtype() { return join(numeric(), {DType::Bool}); }
inline std::vector<DType> ints_and_bool() { return join(ints(), {DType::Bool}); }

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> build;
  /// float64 reference on the exact input values.
  std::function<double(double)> ref;
  /// Integer semantics for integer/bool operands (optional: else ref() on exact small ints).
  std::function<int64_t(int64_t)> ref_int;
  Domain domain;
  std::vector<DType> dtypes;
  ResultKind result;
  Precision precision;
};

struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> build;
  std::function<double(double, double)> ref;
  std::function<int64_t(int64_t, int64_t)> ref_int;
  Domain domain_a, domain_b;
  std::vector<DType> dtypes;
  ResultKind result;
  Precision precision;
};

// --- references written from the math ---

/// Round half to even, from floor and the parity of the candidate.
inline double round_half_even(double x) {
  if (!std::isfinite(x)) return x;
  double r = std::floor(x + 0.5);
  if (r - x == 0.5 && std::fmod(r, 2.0) != 0.0) r -= 1.0;
  return r == 0.0 ? std::copysign(0.0, x) : r;
}
/// Python's a // b and a % b: floor of the true quotient, remainder with the divisor's sign.
inline double py_floordiv(double a, double b) { return std::floor(a / b); }
inline double py_mod(double a, double b) { return a - b * std::floor(a / b); }
inline double nan_aware_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a > b ? a : b;
}
inline double nan_aware_min(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? a : b;
}
inline double sign_of(double a) {
  if (std::isnan(a)) return a;
  return a > 0 ? 1.0 : a < 0 ? -1.0 : 0.0;
}
inline double truthy(double a) { return a != 0.0 ? 1.0 : 0.0; }

/// An int64 reduced to `dtype` the way storing it wraps (two's complement) or tests (bool).
inline int64_t wrap_to(DType dtype, int64_t v) {
  switch (dtype) {
    case DType::Bool: return v != 0;
    case DType::Int8: return static_cast<int8_t>(v);
    case DType::UInt8: return static_cast<uint8_t>(v);
    case DType::Int16: return static_cast<int16_t>(v);
    case DType::Int32: return static_cast<int32_t>(v);
    default: return v;
  }
}

/// The range of an integer dtype as doubles.
inline void int_range(DType dtype, double& lo, double& hi) {
  switch (dtype) {
    case DType::Bool: lo = 0, hi = 1; return;
    case DType::Int8: lo = -128, hi = 127; return;
    case DType::UInt8: lo = 0, hi = 255; return;
    case DType::Int16: lo = -32768, hi = 32767; return;
    case DType::Int32: lo = -2147483648.0, hi = 2147483647.0; return;
    default: lo = -9.0e15, hi = 9.0e15; return;
  }
}

/// Input values for the registry: kept as the exact stored values (after rounding to the
/// dtype) so that references see what kiln sees.
struct HostTensor {
  Shape shape;
  DType dtype = DType::Float32;
  std::vector<double> values;
};

/// `v` rounded to what `dtype` stores (floats round to nearest even; ints are exact here).
inline double stored_value(DType dtype, double v) {
  switch (dtype) {
    case DType::Float32: return static_cast<double>(static_cast<float>(v));
    case DType::Float16: return static_cast<float>(Half(static_cast<float>(v)));
    case DType::BFloat16: return static_cast<float>(BFloat16(static_cast<float>(v)));
    case DType::Bool: return v != 0 ? 1.0 : 0.0;
    default: return v;
  }
}

/// One value of `domain` for `dtype`.
inline double draw(const Domain& d, DType dtype, std::mt19937_64& rng, size_t i) {
  // Bools are always random: where a zero is out of the domain (1/x, log x), the reference's
  // IEEE answer for 0 (inf, -inf, nan) is still what a float computation of it gives.
  if (dtype == DType::Bool) return static_cast<double>(rng() & 1u);
  if (is_floating(dtype) && d.specials && i % 5 == 4) {
    static const double sp[3] = {std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity()};
    return sp[(i / 5) % 3];
  }
  if (!is_floating(dtype) || d.integral) {
    double lo = std::ceil(d.lo), hi = std::floor(d.hi);
    if (!is_floating(dtype)) {
      double tlo, thi;
      int_range(dtype, tlo, thi);
      lo = std::max(lo, tlo), hi = std::min(hi, thi);
    }
    std::uniform_int_distribution<int64_t> u(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
    for (;;) {
      int64_t v = u(rng);
      if (!d.nonzero || v != 0) return static_cast<double>(v);
    }
  }
  std::uniform_real_distribution<double> u(d.lo, d.hi);
  for (;;) {
    double v = stored_value(dtype, u(rng));
    if (!d.nonzero || std::fabs(v) >= d.min_abs) return v;
  }
}

inline HostTensor random_host(const Domain& d, DType dtype, const Shape& shape, std::mt19937_64& rng) {
  HostTensor h{shape, dtype, {}};
  h.values.resize(static_cast<size_t>(kiln::numel(shape)));
  for (size_t i = 0; i < h.values.size(); ++i) h.values[i] = draw(d, dtype, rng, i);
  return h;
}

/// A constant tensor holding exactly `h.values` (converted here, not through kiln's cast).
inline Tensor make_tensor(const HostTensor& h) {
  size_t n = h.values.size();
  auto fill = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v[i] = T(static_cast<float>(h.values[i]));
      else v[i] = static_cast<T>(h.values[i]);
    }
    std::vector<unsigned char> bytes(n * sizeof(T) + 1);
    if (n) std::memcpy(bytes.data(), v.data(), n * sizeof(T));
    return from_data(bytes.data(), h.shape, h.dtype);
  };
  switch (h.dtype) {
    case DType::Bool: {
      std::vector<unsigned char> b(n + 1);
      for (size_t i = 0; i < n; ++i) b[i] = h.values[i] != 0;
      return from_data(b.data(), h.shape, DType::Bool);
    }
    case DType::Int8: return fill(int8_t{});
    case DType::UInt8: return fill(uint8_t{});
    case DType::Int16: return fill(int16_t{});
    case DType::Int32: return fill(int32_t{});
    case DType::Int64: return fill(int64_t{});
    case DType::Float16: return fill(Half{});
    case DType::BFloat16: return fill(BFloat16{});
    case DType::Float32: return fill(float{});
    case DType::Float64: break;
  }
  return fill(double{});
}

/// numpy broadcasting, written independently of kiln's broadcast_shapes.
inline Shape broadcast_ref(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    out[i] = da == 1 ? db : da;
  }
  return out;
}
/// Flat index into `in` (right-aligned, size-1 dims broadcast) of output coordinate `c`.
inline size_t broadcast_index(const Shape& in, const Shape& out, const std::vector<int64_t>& c) {
  size_t flat = 0;
  size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) flat = flat * in[d] + (in[d] == 1 ? 0 : c[lead + d]);
  return flat;
}

inline std::string shape_text(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os.str() + "]";
}

inline DType expected_result(ResultKind k, DType operand) {
  if (k == ResultKind::Bool) return DType::Bool;
  if (k == ResultKind::Floating && !is_floating(operand)) return DType::Float32;
  return operand;
}

/// Compares `actual` to `expected` within `tol`; NaN matches NaN, infinities match exactly.
inline bool close(double actual, double expected, Tol tol) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) && std::isnan(actual);
  if (std::isinf(expected) || std::isinf(actual)) return actual == expected;
  return std::fabs(actual - expected) <= tol.abs + tol.rel * std::fabs(expected);
}

namespace detail_harness {

// Expected values of one output element from the reference; `ints` when the operands are
// integer/bool and the result is not promoted to floating (then integer semantics apply).
template <typename Ref, typename RefInt, typename... V>
double expect_value(const Ref& ref, const RefInt& ref_int, bool ints, DType out, V... v) {
  if (ints) {
    int64_t r = ref_int ? ref_int(static_cast<int64_t>(v)...) : static_cast<int64_t>(ref(v...));
    return static_cast<double>(wrap_to(out, r));
  }
  double r = ref(v...);
  if (out == DType::Bool) return r != 0.0 ? 1.0 : 0.0;
  return r;
}

inline std::string compare_all(const std::string& what, const Tensor& y, DType want_dtype, const Shape& want_shape,
                               const std::vector<double>& want, Tol tol,
                               const std::function<std::string(size_t)>& inputs_at) {
  if (y.dtype() != want_dtype) {
    return what + ": dtype " + std::string(dtype_name(y.dtype())) + ", expected " + std::string(dtype_name(want_dtype));
  }
  if (y.shape() != want_shape) return what + ": shape " + shape_text(y.shape()) + ", expected " + shape_text(want_shape);
  std::vector<double> got = y.to_vector<double>();
  if (got.size() != want.size()) return what + ": wrong element count";
  for (size_t i = 0; i < got.size(); ++i) {
    if (!close(got[i], want[i], tol)) {
      std::ostringstream os;
      os.precision(17);
      os << what << ": element " << i << " of " << got.size() << " with input(s) " << inputs_at(i) << " gives "
         << got[i] << ", expected " << want[i] << " (rel " << tol.rel << ", abs " << tol.abs << ")";
      return os.str();
    }
  }
  return "";
}

}  // namespace detail_harness

/// Runs `c` on a random input of `dtype` and `shape`; "" when every element matches.
inline std::string check_unary(const UnaryCase& c, DType dtype, const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostTensor a = random_host(c.domain, dtype, shape, rng);
  DType out = expected_result(c.result, dtype);
  bool ints = !is_floating(dtype) && c.result != ResultKind::Floating;
  std::vector<double> want(a.values.size());
  for (size_t i = 0; i < want.size(); ++i) {
    want[i] = detail_harness::expect_value(c.ref, c.ref_int, ints, out, a.values[i]);
  }
  std::string what = c.name + "(" + std::string(dtype_name(dtype)) + shape_text(shape) + ")";
  try {
    Tensor y = c.build(make_tensor(a));
    return detail_harness::compare_all(what, y, out, shape, want, tolerance(out, c.precision), [&](size_t i) {
      std::ostringstream os;
      os.precision(17);
      os << a.values[i];
      return os.str();
    });
  } catch (const std::exception& e) {
    return what + ": threw " + e.what();
  }
}

/// Runs `c` on random inputs of `dtype` with shapes `sa` and `sb` (broadcast together). With
/// `scalar_side` 1 or 2, that operand is a C++ number (a weak scalar) instead of a tensor.
inline std::string check_binary(const BinaryCase& c, DType dtype, const Shape& sa, const Shape& sb, uint64_t seed,
                                int scalar_side = 0) {
  std::mt19937_64 rng(seed);
  HostTensor a = random_host(c.domain_a, dtype, scalar_side == 1 ? Shape{} : sa, rng);
  HostTensor b = random_host(c.domain_b, dtype, scalar_side == 2 ? Shape{} : sb, rng);
  auto as_scalar = [&](HostTensor& h, const Domain& d) {
    // A scalar stands for a Python number: pick one that every dtype stores exactly.
    double v = h.values[0];
    if (is_floating(dtype)) {
      v = std::round(v * 4) / 4;
      if (!std::isfinite(v) || (d.nonzero && std::fabs(v) < std::max(d.min_abs, 0.25)) || v < d.lo || v > d.hi) {
        v = d.lo > 0 ? std::ceil(d.lo * 4) / 4 : d.hi < 0 ? std::floor(d.hi * 4) / 4 : 1.0;
      }
      h.values[0] = v;
      return scalar_tensor(Scalar(v));
    }
    if (dtype == DType::Bool) return scalar_tensor(Scalar(v != 0));
    return scalar_tensor(Scalar(static_cast<int64_t>(v)));
  };
  Shape shape = broadcast_ref(a.shape, b.shape);
  DType out = expected_result(c.result, dtype);
  bool ints = !is_floating(dtype) && c.result != ResultKind::Floating;
  std::string what = c.name + "(" + (scalar_side == 1 ? "scalar" : std::string(dtype_name(dtype)) + shape_text(sa)) +
                     ", " + (scalar_side == 2 ? "scalar" : std::string(dtype_name(dtype)) + shape_text(sb)) + ")";
  try {
    Tensor ta = scalar_side == 1 ? as_scalar(a, c.domain_a) : make_tensor(a);
    Tensor tb = scalar_side == 2 ? as_scalar(b, c.domain_b) : make_tensor(b);
    std::vector<double> want(static_cast<size_t>(kiln::numel(shape)));
    std::vector<size_t> ia(want.size()), ib(want.size());
    std::vector<int64_t> coord(shape.size(), 0);
    for (size_t i = 0; i < want.size(); ++i) {
      ia[i] = broadcast_index(a.shape, shape, coord);
      ib[i] = broadcast_index(b.shape, shape, coord);
      want[i] = detail_harness::expect_value(c.ref, c.ref_int, ints, out, a.values[ia[i]], b.values[ib[i]]);
      for (size_t d = shape.size(); d-- > 0;) {
        if (++coord[d] < shape[d]) break;
        coord[d] = 0;
      }
    }
    Tensor y = c.build(ta, tb);
    return detail_harness::compare_all(what, y, out, shape, want, tolerance(out, c.precision), [&](size_t i) {
      std::ostringstream os;
      os.precision(17);
      os << a.values[ia[i]] << ", " << b.values[ib[i]];
      return os.str();
    });
  } catch (const std::exception& e) {
    return what + ": threw " + e.what();
  }
}

// --- the registry ---

inline const std::vector<UnaryCase>& unary_cases() {
  using P = Precision;
  using K = ResultKind;
  auto dom = [](double lo, double hi, bool nonzero = true) {
    Domain d;
    d.lo = lo, d.hi = hi, d.nonzero = nonzero;
    return d;
  };
  Domain with_specials = dom(-100, 100);
  with_specials.specials = true;
  Domain positive = dom(0.125, 10);
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double a) { return -a; },
       [](int64_t a) { return -a; }, with_specials, numeric(), K::Same, P::Exact},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double a) { return std::fabs(a); },
       [](int64_t a) { return a < 0 ? -a : a; }, with_specials, any_dtype(), K::Same, P::Exact},
      {"sign", [](const Tensor& x) { return sign(x); }, sign_of, nullptr, with_specials, any_dtype(), K::Same,
       P::Exact},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double a) { return std::exp(a); }, nullptr, dom(-4, 4),
       any_dtype(), K::Floating, P::Transcendental},
      {"exp2", [](const Tensor& x) { return exp2(x); }, [](double a) { return std::pow(2.0, a); }, nullptr,
       dom(-6, 6), any_dtype(), K::Floating, P::Transcendental},
      {"log", [](const Tensor& x) { return log(x); }, [](double a) { return std::log(a); }, nullptr, positive,
       any_dtype(), K::Floating, P::Transcendental},
      {"log2", [](const Tensor& x) { return log2(x); }, [](double a) { return std::log(a) / std::log(2.0); },
       nullptr, positive, any_dtype(), K::Floating, P::Transcendental},
      {"log1p", [](const Tensor& x) { return log1p(x); }, [](double a) { return std::log1p(a); }, nullptr,
       dom(-0.875, 6), any_dtype(), K::Floating, P::Transcendental},
      {"expm1", [](const Tensor& x) { return expm1(x); }, [](double a) { return std::expm1(a); }, nullptr,
       dom(-4, 4), any_dtype(), K::Floating, P::Transcendental},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double a) { return std::sqrt(a); }, nullptr, positive,
       any_dtype(), K::Floating, P::Transcendental},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double a) { return 1.0 / std::sqrt(a); }, nullptr,
       positive, any_dtype(), K::Floating, P::Transcendental},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, [](double a) { return 1.0 / a; }, nullptr,
       dom(-8, 8), any_dtype(), K::Floating, P::Simple},
      {"sin", [](const Tensor& x) { return sin(x); }, [](double a) { return std::sin(a); }, nullptr, dom(-3, 3),
       any_dtype(), K::Floating, P::Transcendental},
      {"cos", [](const Tensor& x) { return cos(x); }, [](double a) { return std::cos(a); }, nullptr, dom(-3, 3),
       any_dtype(), K::Floating, P::Transcendental},
      {"tan", [](const Tensor& x) { return tan(x); }, [](double a) { return std::tan(a); }, nullptr,
       dom(-1.25, 1.25), any_dtype(), K::Floating, P::Transcendental},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double a) { return std::tanh(a); }, nullptr, dom(-3, 3),
       any_dtype(), K::Floating, P::Transcendental},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double a) { return 0.5 * (1.0 + std::tanh(a / 2)); },
       nullptr, dom(-6, 6), any_dtype(), K::Floating, P::Transcendental},
      {"erf", [](const Tensor& x) { return erf(x); }, [](double a) { return std::erf(a); }, nullptr, dom(-2.5, 2.5),
       any_dtype(), K::Floating, P::Transcendental},
      {"floor", [](const Tensor& x) { return floor(x); }, [](double a) { return std::floor(a); }, nullptr,
       with_specials, numeric(), K::Same, P::Exact},
      {"ceil", [](const Tensor& x) { return ceil(x); }, [](double a) { return std::ceil(a); }, nullptr,
       with_specials, numeric(), K::Same, P::Exact},
      {"round", [](const Tensor& x) { return round(x); }, round_half_even, nullptr, with_specials, numeric(),
       K::Same, P::Exact},
      {"trunc", [](const Tensor& x) { return trunc(x); }, [](double a) { return std::trunc(a); }, nullptr,
       with_specials, numeric(), K::Same, P::Exact},
      {"logical_not", [](const Tensor& x) { return logical_not(x); }, [](double a) { return a == 0.0 ? 1.0 : 0.0; },
       nullptr, [] {
         Domain d;
         d.lo = -1, d.hi = 1, d.nonzero = false, d.integral = true, d.specials = true;
         return d;
       }(),
       any_dtype(), K::Bool, P::Exact},
      {"bitwise_not", [](const Tensor& x) { return bitwise_not(x); }, nullptr, [](int64_t a) { return ~a; },
       dom(-100, 100, false), ints(), K::Same, P::Exact},
      // On bool, ~ is logical not (the integer complement of true would read back as true).
      {"bitwise_not(bool)", [](const Tensor& x) { return bitwise_not(x); }, nullptr,
       [](int64_t a) -> int64_t { return a == 0; }, dom(0, 1, false), {DType::Bool}, K::Same, P::Exact},
      {"isnan", [](const Tensor& x) { return isnan(x); }, [](double a) { return std::isnan(a) ? 1.0 : 0.0; },
       nullptr, with_specials, any_dtype(), K::Bool, P::Exact},
      {"isinf", [](const Tensor& x) { return isinf(x); }, [](double a) { return std::isinf(a) ? 1.0 : 0.0; },
       nullptr, with_specials, any_dtype(), K::Bool, P::Exact},
      {"square", [](const Tensor& x) { return square(x); }, [](double a) { return a * a; }, nullptr, dom(-11, 11),
       any_dtype(), K::Same, P::Simple},
      {"relu", [](const Tensor& x) { return relu(x); },
       [](double a) { return std::isnan(a) ? a : a > 0 ? a : 0.0; }, nullptr, with_specials, any_dtype(), K::Same,
       P::Exact},
  };
  return cases;
}

inline const std::vector<BinaryCase>& binary_cases() {
  using P = Precision;
  using K = ResultKind;
  auto dom = [](double lo, double hi, bool nonzero = true, bool specials = false, bool integral = false) {
    Domain d;
    d.lo = lo, d.hi = hi, d.nonzero = nonzero, d.specials = specials, d.integral = integral;
    return d;
  };
  // Comparisons see many equal pairs on small integer values (and NaN/inf for floats).
  Domain cmp = dom(-3, 3, true, true, true);
  // Logical ops need zeros to mean anything, so this domain keeps them.
  Domain logic = dom(-2, 2, false, true, true);
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; },
       nullptr, dom(-100, 100, true, true), dom(-100, 100, true, true), any_dtype(), K::Same, P::Simple},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; },
       nullptr, dom(-100, 100), dom(-100, 100), numeric(), K::Same, P::Simple},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; },
       nullptr, dom(-20, 20, true, true), dom(-20, 20), any_dtype(), K::Same, P::Simple},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; },
       nullptr, dom(-10, 10), dom(-10, 10), any_dtype(), K::Floating, P::Simple},
      {"floor_div", [](const Tensor& a, const Tensor& b) { return floor_div(a, b); }, py_floordiv, nullptr,
       dom(-20, 20), dom(-6, 6), numeric(), K::Same, P::Exact},
      {"mod", [](const Tensor& a, const Tensor& b) { return a % b; }, py_mod, nullptr, dom(-20, 20), dom(-6, 6),
       numeric(), K::Same, P::Simple},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double a, double b) { return std::pow(a, b); },
       // Integers: a^b by repeated multiplication; for b < 0 the true value 1/a^|b| truncated
       // toward zero (1, +-1 for a = -1, else 0; 0^-n has no value and counts as 0 like x//0).
       [](int64_t a, int64_t b) -> int64_t {
         if (b < 0) return a == 1 ? 1 : a == -1 ? (b % 2 == 0 ? 1 : -1) : 0;
         int64_t r = 1;
         for (int64_t k = 0; k < b; ++k) r *= a;
         return r;
       },
       dom(0.5, 3), dom(-2, 2, false), numeric(), K::Same, P::Transcendental},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, nan_aware_max, nullptr,
       dom(-10, 10, true, true), dom(-10, 10, true, true), any_dtype(), K::Same, P::Exact},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, nan_aware_min, nullptr,
       dom(-10, 10, true, true), dom(-10, 10, true, true), any_dtype(), K::Same, P::Exact},
      {"eq", [](const Tensor& a, const Tensor& b) { return a == b; }, [](double a, double b) { return double(a == b); },
       nullptr, cmp, cmp, any_dtype(), K::Bool, P::Exact},
      {"ne", [](const Tensor& a, const Tensor& b) { return a != b; }, [](double a, double b) { return double(a != b); },
       nullptr, cmp, cmp, any_dtype(), K::Bool, P::Exact},
      {"lt", [](const Tensor& a, const Tensor& b) { return a < b; }, [](double a, double b) { return double(a < b); },
       nullptr, cmp, cmp, any_dtype(), K::Bool, P::Exact},
      {"le", [](const Tensor& a, const Tensor& b) { return a <= b; }, [](double a, double b) { return double(a <= b); },
       nullptr, cmp, cmp, any_dtype(), K::Bool, P::Exact},
      {"gt", [](const Tensor& a, const Tensor& b) { return a > b; }, [](double a, double b) { return double(a > b); },
       nullptr, cmp, cmp, any_dtype(), K::Bool, P::Exact},
      {"ge", [](const Tensor& a, const Tensor& b) { return a >= b; }, [](double a, double b) { return double(a >= b); },
       nullptr, cmp, cmp, any_dtype(), K::Bool, P::Exact},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); },
       [](double a, double b) { return truthy(a) * truthy(b); }, nullptr, logic, logic, any_dtype(), K::Bool, P::Exact},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); },
       [](double a, double b) { return std::max(truthy(a), truthy(b)); }, nullptr, logic, logic, any_dtype(), K::Bool,
       P::Exact},
      {"logical_xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); },
       [](double a, double b) { return double(truthy(a) != truthy(b)); }, nullptr, logic, logic, any_dtype(), K::Bool,
       P::Exact},
      {"bitwise_and", [](const Tensor& a, const Tensor& b) { return a & b; }, nullptr,
       [](int64_t a, int64_t b) { return a & b; }, dom(-100, 100, false), dom(-100, 100, false), ints_and_bool(),
       K::Same, P::Exact},
      {"bitwise_or", [](const Tensor& a, const Tensor& b) { return a | b; }, nullptr,
       [](int64_t a, int64_t b) { return a | b; }, dom(-100, 100, false), dom(-100, 100, false), ints_and_bool(),
       K::Same, P::Exact},
      {"bitwise_xor", [](const Tensor& a, const Tensor& b) { return a ^ b; }, nullptr,
       [](int64_t a, int64_t b) { return a ^ b; }, dom(-100, 100, false), dom(-100, 100, false), ints_and_bool(),
       K::Same, P::Exact},
  };
  return cases;
}

/// Shapes of ranks 0-5 for unary cases, including an empty one.
inline const std::vector<Shape>& unary_shapes() {
  static const std::vector<Shape> s = {{}, {7}, {3, 4}, {0, 3}, {2, 3, 4}, {2, 1, 3, 2}, {2, 2, 1, 3, 2}};
  return s;
}
/// Operand shape pairs of ranks 0-5: equal, broadcasting both ways, rank-0, zero-size.
inline const std::vector<std::pair<Shape, Shape>>& binary_shapes() {
  static const std::vector<std::pair<Shape, Shape>> s = {
      {{}, {}},         {{5}, {5}},          {{4}, {}},           {{}, {2, 3}},
      {{3, 1}, {1, 4}}, {{2, 1, 3}, {3}},    {{0, 3}, {1, 3}},    {{2, 3, 4}, {2, 3, 4}},
      {{2, 1, 3, 1}, {1, 4, 1, 2}},          {{2, 1, 2, 1, 3}, {3, 2, 1, 3}},
  };
  return s;
}

// --- gradient cases ---
//
// The same registry carries the gradient checks (tests/test_gradcheck.cpp): every
// differentiable public op, with the inputs it is checked on. The elementwise ops come from
// the cases above; the rest are listed in grad_cases(). A case's scalar objective is
// sum(f(x) * w) for fixed random weights w (so no symmetry hides an error), its analytic
// gradient is compared in float64 with central differences, and its edges (zeros, ties,
// size-1 axes, infinities) are checked either the same way, where the op is differentiable
// there, or against the convention kiln follows at a kink, written out by hand.

/// Values of a gradient input: uniform in [lo, hi] with |x| >= min_abs (away from a kink).
inline Domain grad_domain(double lo, double hi, double min_abs = 0) {
  Domain d;
  d.lo = lo, d.hi = hi, d.nonzero = min_abs > 0, d.integral = false, d.specials = false;
  d.min_abs = min_abs;
  return d;
}

/// One input of a gradient case: a float64 leaf of `shape` with values from `domain`.
struct GradInput {
  Shape shape;
  Domain domain = grad_domain(-2, 2);
};

/// Inputs at an edge of an op's domain. Without `expected` the op is differentiable there
/// and the check is against central differences, with fixed random weights (outputs that
/// are not finite there carry weight 0). With `expected` the point is a kink or a
/// singularity, the weights are all 1 and `expected` holds d sum(f) / d input for each
/// input: PyTorch's convention, derived by hand (NaN matches NaN, infinities exactly).
struct GradEdge {
  std::string what;
  std::vector<std::vector<double>> values;
  std::vector<std::vector<double>> expected = {};
};

struct GradCase {
  std::string name;  ///< unique: "prod/axis"
  std::string op;    ///< the public function it differentiates: "prod"
  std::vector<GradInput> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<GradEdge> edges = {};
  /// False where random inputs have no finite value to differentiate (a zero divisor):
  /// only the edges are checked.
  bool random = true;
  double eps = 1e-6;  ///< central-difference step
  double tol = 1e-6;  ///< |analytic - numeric| <= tol * (1 + |numeric|)
};

/// Runs the enclosing scope on executor `name` ("reference", "jit"), restoring the previous one.
struct ExecutorScope {
  std::string saved = current_executor();
  explicit ExecutorScope(const char* name) { set_executor(name); }
  ~ExecutorScope() { set_executor(saved.c_str()); }
  ExecutorScope(const ExecutorScope&) = delete;
  ExecutorScope& operator=(const ExecutorScope&) = delete;
};

/// Differences checked per input: every element up to this many, else an even sample.
constexpr size_t kGradSamples = 32;

namespace detail_grad {

using Values = std::vector<std::vector<double>>;

inline std::vector<Tensor> leaves(const GradCase& c, const Values& v, bool track) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < v.size(); ++i) {
    Tensor t = from_vector(v[i], c.inputs[i].shape);
    if (track) t.requires_grad_();
    xs.push_back(t);
  }
  return xs;
}

inline std::vector<double> outputs(const GradCase& c, const Values& v) {
  NoGradGuard no_grad;
  Tensor y = c.fn(leaves(c, v, false));
  if (y.dtype() != DType::Float64) throw std::runtime_error("the case's output is not float64");
  return y.to_vector<double>();
}

// sum(y * w) over the weighted outputs only, so an infinite output of weight 0 is no NaN.
inline double objective(const std::vector<double>& y, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i)
    if (w[i] != 0) s += w[i] * y[i];
  return s;
}

inline std::string num(double v) {
  std::ostringstream os;
  os.precision(12);
  os << v;
  return os.str();
}

}  // namespace detail_grad

/// d sum(f(v) * w) / d input, per input, on the current executor; an input the output
/// does not depend on through differentiable ops (piecewise constant ones) gets zeros.
inline std::vector<std::vector<double>> analytic_gradient(const GradCase& c,
                                                          const std::vector<std::vector<double>>& v,
                                                          const std::vector<double>& w) {
  std::vector<Tensor> xs = detail_grad::leaves(c, v, true);
  Tensor y = c.fn(xs);
  std::vector<std::vector<double>> out;
  if (!y.requires_grad()) {
    for (const auto& vi : v) out.emplace_back(vi.size(), 0.0);
    return out;
  }
  std::vector<Tensor> g = grad(y, xs, from_vector(w, y.shape()), /*allow_unused=*/true);
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(g[i].defined() ? g[i].to_vector<double>()
                                 : std::vector<double>(v[i].size(), 0.0));
  return out;
}

/// Compares the analytic gradient at `v` with central differences; "" when they agree.
/// Runs on the reference executor (exact float64 arithmetic, no compilation).
inline std::string check_against_differences(const GradCase& c,
                                             const std::vector<std::vector<double>>& v,
                                             std::vector<double> w, const std::string& what) {
  ExecutorScope reference("reference");
  std::vector<double> y0 = detail_grad::outputs(c, v);
  if (w.size() != y0.size()) return c.name + " " + what + ": weights do not match the output";
  for (size_t i = 0; i < y0.size(); ++i)
    if (!std::isfinite(y0[i])) w[i] = 0;
  std::vector<std::vector<double>> analytic = analytic_gradient(c, v, w);
  for (size_t i = 0; i < v.size(); ++i) {
    const size_t n = v[i].size(), step = std::max<size_t>(1, (n + kGradSamples - 1) / kGradSamples);
    for (size_t k = 0; k < n; k += step) {
      auto at = [&](double delta) {
        auto moved = v;
        moved[i][k] += delta;
        return detail_grad::objective(detail_grad::outputs(c, moved), w);
      };
      const double numeric = (at(c.eps) - at(-c.eps)) / (2 * c.eps);
      const double a = analytic[i][k];
      if (!(std::fabs(numeric - a) <= c.tol * (1 + std::fabs(numeric)))) {
        return c.name + " " + what + ": input " + std::to_string(i) + " element " +
               std::to_string(k) + " (value " + detail_grad::num(v[i][k]) + ") analytic " +
               detail_grad::num(a) + ", numeric " + detail_grad::num(numeric) + " (tol " +
               detail_grad::num(c.tol) + ")";
      }
    }
  }
  return "";
}

/// Random inputs of case `c` (seeded) and their random output weights.
inline std::pair<std::vector<std::vector<double>>, std::vector<double>> grad_inputs(
    const GradCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<double>> v;
  for (const GradInput& in : c.inputs)
    v.push_back(random_host(in.domain, DType::Float64, in.shape, rng).values);
  std::vector<double> y;
  {
    ExecutorScope reference("reference");
    y = detail_grad::outputs(c, v);
  }
  std::vector<double> w =
      random_host(grad_domain(-1, 1, 0.1), DType::Float64, {static_cast<int64_t>(y.size())}, rng)
          .values;
  return {v, w};
}

/// Checks one edge of `c`: against differences, or against its expected gradient.
inline std::string check_edge(const GradCase& c, const GradEdge& e) {
  const std::string what = "at " + e.what;
  try {
    if (e.values.size() != c.inputs.size()) return c.name + " " + what + ": wrong number of inputs";
    for (size_t i = 0; i < e.values.size(); ++i)
      if (static_cast<int64_t>(e.values[i].size()) != kiln::numel(c.inputs[i].shape))
        return c.name + " " + what + ": input " + std::to_string(i) + " has the wrong size";
    ExecutorScope reference("reference");
    std::vector<double> y = detail_grad::outputs(c, e.values);
    if (e.expected.empty()) {
      std::mt19937_64 rng(0x9e3779b9);
      std::vector<double> w = random_host(grad_domain(-1, 1, 0.1), DType::Float64,
                                          {static_cast<int64_t>(y.size())}, rng)
                                  .values;
      return check_against_differences(c, e.values, w, what);
    }
    std::vector<std::vector<double>> g =
        analytic_gradient(c, e.values, std::vector<double>(y.size(), 1.0));
    for (size_t i = 0; i < g.size(); ++i) {
      if (e.expected[i].size() != g[i].size())
        return c.name + " " + what + ": expected has the wrong size";
      for (size_t k = 0; k < g[i].size(); ++k) {
        if (!close(g[i][k], e.expected[i][k], {1e-12, 1e-12})) {
          return c.name + " " + what + ": input " + std::to_string(i) + " element " +
                 std::to_string(k) + " gradient " + detail_grad::num(g[i][k]) + ", expected " +
                 detail_grad::num(e.expected[i][k]);
        }
      }
    }
    return "";
  } catch (const std::exception& ex) {
    return c.name + " " + what + ": threw " + ex.what();
  }
}

/// Checks `c` on random inputs drawn with `seed`; "" when the gradient matches.
inline std::string check_random(const GradCase& c, uint64_t seed) {
  try {
    auto [v, w] = grad_inputs(c, seed);
    return check_against_differences(c, v, w, "seed " + std::to_string(seed));
  } catch (const std::exception& ex) {
    return c.name + ": threw " + ex.what();
  }
}

/// Every gradient case: the differentiable unary and binary cases of the registry above on
/// float64 (zero-derivative ones included: their gradient must be 0), then the reductions,
/// shape, index, matrix, layer and loss ops. Names are unique.
inline const std::vector<GradCase>& grad_cases() {
  using V = std::vector<Tensor>;
  using E = std::vector<GradEdge>;
  constexpr double inf = std::numeric_limits<double>::infinity();
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  auto in = [](Shape s, double lo = -2, double hi = 2, double min_abs = 0) {
    return GradInput{std::move(s), grad_domain(lo, hi, min_abs)};
  };
  auto idx = [](std::vector<int64_t> v, Shape s) { return from_vector<int64_t>(v, std::move(s)); };
  static const std::vector<GradCase> cases = [&] {
    std::vector<GradCase> c;
    // Edges of the elementwise ops, by registry name.
    std::map<std::string, E> unary_edges = {
        {"abs", {{"0 (sign(0) = 0)", {{0, -0.0, 1, -1, 0.5, -2}}, {{0, 0, 1, -1, 1, -1}}}}},
        {"relu", {{"0 and -inf (0 at 0)", {{0, -0.0, 1, -1, -inf, 2}}, {{0, 0, 1, 0, 0, 1}}}}},
        {"exp", {{"-inf", {{-inf, -inf, 0, 1, -1, 2}}}}},
        {"sigmoid", {{"+-inf", {{inf, -inf, 0, 1, -30, 30}}}}},
        {"tanh", {{"+-inf", {{inf, -inf, 0, 1, -20, 20}}}}},
        {"erf", {{"+-inf", {{inf, -inf, 0, 1, -6, 6}}}}},
        {"sqrt",
         {{"0 (inf, as torch)", {{0, 1, 4, 0.25, 0, 16}}, {{inf, 0.5, 0.25, 1, inf, 0.125}}}}},
        {"log", {{"0 (inf, as torch)", {{0, 1, 2, 0.5, 0, 4}}, {{inf, 1, 0.5, 2, inf, 0.25}}}}},
        {"floor", {{"integers (0)", {{1, 2, 0, -1, -2, 3}}, {{0, 0, 0, 0, 0, 0}}}}},
        {"ceil", {{"integers (0)", {{1, 2, 0, -1, -2, 3}}, {{0, 0, 0, 0, 0, 0}}}}},
        {"round", {{"halves (0)", {{0.5, 1.5, -0.5, 2.5, 0, 1}}, {{0, 0, 0, 0, 0, 0}}}}},
        {"trunc", {{"integers (0)", {{1, 2, 0, -1, -2, 3}}, {{0, 0, 0, 0, 0, 0}}}}},
        {"sign", {{"0 (0)", {{0, -0.0, 1, -1, 0, 2}}, {{0, 0, 0, 0, 0, 0}}}}},
    };
    for (const UnaryCase& u : unary_cases()) {
      bool float64 = std::find(u.dtypes.begin(), u.dtypes.end(), DType::Float64) != u.dtypes.end();
      if (!float64 || u.result == ResultKind::Bool) continue;
      Domain d = u.domain;
      d.specials = false;
      d.integral = false;
      auto build = u.build;
      E edges = unary_edges.count(u.name) ? unary_edges[u.name] : E{};
      c.push_back(
          {u.name, u.name, {{{2, 3}, d}}, [build](const V& x) { return build(x[0]); }, edges});
    }
    std::map<std::string, E> binary_edges = {
        // Ties split the gradient (torch.maximum/minimum); a NaN passes it to both sides.
        {"maximum",
         {{"ties and NaN",
           {{1, 2, 3, -1, 0, nan}, {1, 0, 3, -1, 4, 1}},
           {{0.5, 1, 0.5, 0.5, 0, 1}, {0.5, 0, 0.5, 0.5, 1, 1}}}}},
        {"minimum",
         {{"ties and NaN",
           {{1, 2, 3, -1, 0, nan}, {1, 0, 3, -1, 4, 1}},
           {{0.5, 0, 0.5, 0.5, 1, 1}, {0.5, 1, 0.5, 0.5, 0, 1}}}}},
        // 0^b for b > 0 and a^0: differentiable, with torch's 0 for d/db at a = 0.
        {"pow", {{"zero base and zero exponent", {{0, 0, 2, 1, 0.5, 3}, {2, 3, 0, 1, 2, 0.5}}}}},
    };
    for (const BinaryCase& b : binary_cases()) {
      bool float64 = std::find(b.dtypes.begin(), b.dtypes.end(), DType::Float64) != b.dtypes.end();
      if (!float64 || b.result == ResultKind::Bool) continue;
      Domain da = b.domain_a, db = b.domain_b;
      da.specials = db.specials = false;
      da.integral = db.integral = false;
      auto build = b.build;
      auto fn = [build](const V& x) { return build(x[0], x[1]); };
      E edges = binary_edges.count(b.name) ? binary_edges[b.name] : E{};
      c.push_back({b.name, b.name, {{{2, 3}, da}, {{2, 3}, db}}, fn, edges});
      c.push_back({b.name + "/broadcast", b.name, {{{3, 1}, da}, {{1, 4}, db}}, fn});
      c.push_back({b.name + "/scalar", b.name, {{{2, 3}, da}}, [build](const V& x) {
                     return build(x[0], scalar_tensor(Scalar(1.75)));
                   }});
    }

    // --- elementwise composites ---
    c.push_back(
        {"mul/shared operand", "mul", {in({2, 3})}, [](const V& x) { return x[0] * x[0] + x[0]; }});
    c.push_back({"cast",
                 "cast",
                 {in({2, 3})},
                 [](const V& x) { return cast(cast(x[0], DType::Float32), DType::Float64); },
                 {},
                 true,
                 /*eps=*/1e-3,
                 /*tol=*/1e-3});
    // torch.clamp: x keeps the gradient on a bound; a bound gets it only where it wins.
    c.push_back({"clamp/scalars",
                 "clamp",
                 {in({8}, -3, 3)},
                 [](const V& x) { return clamp(x[0], -1.0, 1.0); },
                 {{"the bounds", {{-1, 1, -2, 2, 0, -1, 1, 0.5}}, {{1, 1, 0, 0, 1, 1, 1, 1}}}}});
    c.push_back({"clamp/tensors",
                 "clamp",
                 {in({2, 3}, -3, 3), in({2, 3}, -2, -0.5), in({3}, 0.5, 2)},
                 [](const V& x) { return clamp(x[0], x[1], x[2]); },
                 {{"the bounds",
                   {{-1, 1, -3, 3, 0, 0.5}, {-1, -1, -1, -1, -1, -1}, {1, 1, 0.5}},
                   {{1, 1, 0, 0, 1, 1}, {0, 0, 1, 0, 0, 0}, {1, 0, 0}}}}});
    c.push_back({"clamp/lower only", "clamp", {in({6}, -3, 3)}, [](const V& x) {
                   return clamp(x[0], scalar_tensor(Scalar(0.5)), Tensor());
                 }});
    c.push_back({"where", "where", {in({2, 3}), in({2, 3})}, [](const V& x) {
                   return where(x[0] > x[1], x[0] * x[1], x[1]);
                 }});
    c.push_back({"where/broadcast scalar", "where", {in({2, 3}), in({3})}, [](const V& x) {
                   return where(logical_and(x[0] > -1, x[0] < 1), x[0], x[1] * 2.0);
                 }});
    c.push_back({"where/masked logical", "where", {in({2, 3})}, [](const V& x) {
                   Tensor m = logical_or(logical_xor(x[0] > 0, x[0] > 1), logical_not(x[0] < -1));
                   return where(m, x[0] * 3.0, -x[0]);
                 }});

    // --- reductions ---
    c.push_back({"sum/all", "sum", {in({2, 3, 4})}, [](const V& x) { return sum(x[0]); }});
    c.push_back({"sum/axes keepdim", "sum", {in({2, 3, 4})}, [](const V& x) {
                   return sum(x[0], {0, 2}, true);
                 }});
    c.push_back(
        {"sum/size-1 axis", "sum", {in({2, 1, 3})}, [](const V& x) { return sum(x[0], 1); }});
    c.push_back({"mean/axis", "mean", {in({2, 3, 4})}, [](const V& x) { return mean(x[0], {1}); }});
    c.push_back({"mean/all", "mean", {in({3, 4})}, [](const V& x) { return mean(x[0]); }});
    c.push_back(
        {"mean/size-1 axis", "mean", {in({3, 1})}, [](const V& x) { return mean(x[0], 1, true); }});
    // prod is a polynomial: differentiable at zeros, where d/dx_i is the product of the others.
    c.push_back({"prod/axis",
                 "prod",
                 {in({2, 3}, 0.5, 1.5)},
                 [](const V& x) { return prod(x[0], 1); },
                 {{"one zero, two zeros", {{0, 2, 3, 0, 0, 4}}},
                  {"three zeros, no zero", {{0, 0, 0, 1, -2, 3}}},
                  {"one zero (exact)", {{0, 2, 3, 0, 0, 4}}, {{6, 0, 0, 0, 0, 0}}}}});
    c.push_back({"prod/all",
                 "prod",
                 {in({2, 3}, 0.5, 1.5)},
                 [](const V& x) { return prod(x[0]); },
                 {{"one zero", {{0, 2, 3, 1, -1, 4}}},
                  {"two zeros", {{0, 2, 0, 1, 1, 1}}},
                  {"one zero (exact)", {{2, 0.5, 0, 3, 1, -1}}, {{0, 0, -3, 0, 0, 0}}}}});
    c.push_back({"prod/keepdim first axis",
                 "prod",
                 {in({3, 2}, -1.5, 1.5)},
                 [](const V& x) { return prod(x[0], 0, true); },
                 {{"zeros", {{0, 1, 2, 0, 3, 4}}}}});
    c.push_back({"prod/size-1 axis",
                 "prod",
                 {in({3, 1})},
                 [](const V& x) { return prod(x[0], 1); },
                 {{"zeros", {{0, 2, -1}}, {{1, 1, 1}}}}});
    // max/min are torch.amax/amin: ties share the gradient evenly (a single -inf row too).
    c.push_back({"max/axis", "max", {in({2, 3, 4})}, [](const V& x) { return max(x[0], {2}); }});
    c.push_back({"max/axes keepdim", "max", {in({2, 3, 4})}, [](const V& x) {
                   return max(x[0], {0, 2}, true);
                 }});
    c.push_back(
        {"max/ties",
         "max",
         {in({2, 3})},
         [](const V& x) { return max(x[0], {1}); },
         {{"three- and two-way ties",
           {{1, 1, 1, 2, 5, 5}},
           {{1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0.5, 0.5}}},
          {"-inf", {{-inf, 1, -inf, -inf, -inf, -inf}}, {{0, 1, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}}},
          // A NaN is the maximum: the NaNs share the gradient (torch.max()'s even split).
          {"NaN", {{1, nan, 2, nan, nan, 0}}, {{0, 1, 0, 0.5, 0.5, 0}}}}});
    c.push_back(
        {"max/size-1 axis", "max", {in({3, 1})}, [](const V& x) { return max(x[0], {1}); }});
    // max(x, dim) with indices is torch.max(x, dim): the gradient goes to the reported
    // (first) index only, NaN included.
    c.push_back({"max/dim with indices",
                 "max",
                 {in({2, 3})},
                 [](const V& x) { return max(x[0], 1).values; },
                 {{"ties", {{1, 1, 1, 2, 5, 5}}, {{1, 0, 0, 0, 1, 0}}},
                  {"NaN", {{1, nan, 2, nan, nan, 0}}, {{0, 1, 0, 1, 0, 0}}}}});
    c.push_back({"min/dim with indices keepdim",
                 "min",
                 {in({3, 2})},
                 [](const V& x) { return min(x[0], 0, true).values; },
                 {{"ties", {{1, 4, 1, 4, 2, 4}}, {{1, 1, 0, 0, 0, 0}}}}});
    c.push_back({"sort", "sort", {in({3, 4})}, [](const V& x) { return sort(x[0], 1).values; }});
    c.push_back({"sort/descending first dim", "sort", {in({3, 2})}, [](const V& x) {
                   return sort(x[0], 0, true).values;
                 }});
    c.push_back({"topk",
                 "topk",
                 {in({2, 3})},
                 [](const V& x) { return topk(x[0], 2, 1).values; },
                 {{"ties: the earlier positions", {{1, 1, 1, 2, 5, 5}}, {{1, 1, 0, 0, 1, 1}}}}});
    c.push_back({"topk/smallest", "topk", {in({4, 2})}, [](const V& x) {
                   return topk(x[0], 3, 0, false).values;
                 }});
    c.push_back({"cumsum", "cumsum", {in({3, 4})}, [](const V& x) { return cumsum(x[0], 1); }});
    c.push_back(
        {"cumsum/first dim", "cumsum", {in({3, 2})}, [](const V& x) { return cumsum(x[0], 0); }});
    // cumprod is a polynomial: differentiable at zeros (d/dx_k sums the products that hold it).
    c.push_back({"cumprod",
                 "cumprod",
                 {in({2, 4}, 0.5, 1.5)},
                 [](const V& x) { return cumprod(x[0], 1); },
                 {{"zeros", {{0, 2, 3, 1, 1, 0, 2, 0}}},
                  {"one zero (exact)", {{2, 0, 3, 1, 1, 1, 1, 1}}, {{1, 14, 0, 0, 4, 3, 2, 1}}}}});
    c.push_back({"min/all", "min", {in({2, 3, 4})}, [](const V& x) { return min(x[0]); }});
    c.push_back(
        {"min/ties",
         "min",
         {in({2, 3})},
         [](const V& x) { return min(x[0]); },
         {{"three-way tie", {{1, 1, 2, 3, 1, 4}}, {{1.0 / 3, 1.0 / 3, 0, 0, 1.0 / 3, 0}}}}});
    auto softmax_of = [](std::vector<double> row) {
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (double v : row) m = std::max(m, v);
      for (double& v : row) s += (v = std::exp(v - m));
      for (double& v : row) v /= s;
      return row;
    };
    {
      std::vector<double> p = softmax_of({0, 1, 2});
      c.push_back({"logsumexp/axis",
                   "logsumexp",
                   {in({2, 3, 4})},
                   [](const V& x) { return logsumexp(x[0], {2}); },
                   {}});
      c.push_back(
          {"logsumexp/all", "logsumexp", {in({3, 4})}, [](const V& x) { return logsumexp(x[0]); }});
      // d/dx = exp(x - lse): 0 at -inf; at +inf the value is inf and exp(inf - inf) NaN (torch).
      c.push_back({"logsumexp/infinities",
                   "logsumexp",
                   {in({2, 3})},
                   [](const V& x) { return logsumexp(x[0], 1); },
                   {{"-inf", {{-inf, 0, 1, -inf, -inf, 2}}},
                    {"+inf", {{inf, 0, 1, 0, 1, 2}}, {{nan, 0, 0, p[0], p[1], p[2]}}}}});
    }
    c.push_back({"var/axis", "var", {in({2, 3, 4})}, [](const V& x) { return var(x[0], {2}); }});
    c.push_back({"var/biased keepdim", "var", {in({2, 3, 4})}, [](const V& x) {
                   return var(x[0], {1}, true, 0);
                 }});
    c.push_back({"var/correction 2", "var", {in({2, 3, 4})}, [](const V& x) {
                   return var(x[0], {0, 2}, false, 2);
                 }});
    c.push_back({"var/all",
                 "var",
                 {in({3, 4})},
                 [](const V& x) { return var(x[0]); },
                 {{"equal elements", {{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}}}}});
    c.push_back({"var/size-1 axis biased",
                 "var",
                 {in({3, 1})},
                 [](const V& x) { return var(x[0], 1, false, 0); },
                 {{"any", {{1, -2, 3}}}}});
    // N - correction <= 0: torch divides by 0, and its gradient 2 / 0 * (x - mean) is +-inf,
    // NaN where x is the mean.
    c.push_back({"var/zero divisor",
                 "var",
                 {in({2, 2})},
                 [](const V& x) { return var(x[0], 1, false, 2); },
                 {{"spread and equal rows", {{1, 3, 2, 2}}, {{-inf, inf, nan, nan}}}},
                 false});
    c.push_back({"var/size-1 unbiased",
                 "var",
                 {in({3, 1})},
                 [](const V& x) { return var(x[0], 1); },
                 {{"any", {{1, 0, -2}}, {{nan, nan, nan}}}},
                 false});
    // torch.std's gradient is 0 where the standard deviation is 0, NaN where it is NaN or the
    // divisor is 0 (inf * 0).
    c.push_back(
        {"std/axis", "std", {in({2, 3, 4})}, [](const V& x) { return kiln::std(x[0], {2}); }});
    c.push_back({"std/biased keepdim", "std", {in({2, 3, 4})}, [](const V& x) {
                   return kiln::std(x[0], {1}, true, 0);
                 }});
    c.push_back({"std/equal elements",
                 "std",
                 {in({2, 3})},
                 [](const V& x) { return kiln::std(x[0], 1); },
                 {{"a constant row", {{2, 2, 2, 1, 2, 3}}, {{0, 0, 0, -0.5, 0, 0.5}}}}});
    c.push_back({"std/all equal",
                 "std",
                 {in({2, 2})},
                 [](const V& x) { return kiln::std(x[0]); },
                 {{"a constant tensor", {{-1.5, -1.5, -1.5, -1.5}}, {{0, 0, 0, 0}}}}});
    c.push_back({"std/size-1 axis biased",
                 "std",
                 {in({3, 1})},
                 [](const V& x) { return kiln::std(x[0], 1, false, 0); },
                 {{"any", {{1, -2, 3}}, {{0, 0, 0}}}},
                 false});
    c.push_back({"std/zero divisor",
                 "std",
                 {in({2, 2})},
                 [](const V& x) { return kiln::std(x[0], 1, false, 2); },
                 {{"spread and equal rows", {{1, 3, 2, 2}}, {{nan, nan, nan, nan}}}},
                 false});
    c.push_back({"std/size-1 unbiased",
                 "std",
                 {in({3, 1})},
                 [](const V& x) { return kiln::std(x[0], 1); },
                 {{"any", {{1, 0, -2}}, {{nan, nan, nan}}}},
                 false});
    {
      // softmax: p (g - sum(g p)); a -inf element has p = 0 and gets 0. A row holding +inf,
      // or only -inf, is NaN, gradient included (torch).
      c.push_back({"softmax/last axis",
                   "softmax",
                   {in({2, 3, 4})},
                   [](const V& x) { return softmax(x[0], -1); },
                   {{"-inf mixed with finite", std::vector<std::vector<double>>{[&] {
                       std::vector<double> v(24, 0.5);
                       for (size_t i = 0; i < v.size(); ++i)
                         v[i] = i % 4 == 1 ? -inf : 0.25 * static_cast<double>(i % 7);
                       return v;
                     }()}}}});
      c.push_back({"softmax/middle axis", "softmax", {in({2, 3, 4})}, [](const V& x) {
                     return softmax(x[0], 1);
                   }});
      c.push_back({"softmax/size-1 axis", "softmax", {in({2, 1, 4})}, [](const V& x) {
                     return softmax(x[0], 1) + x[0];
                   }});  // the softmax alone is constant
      c.push_back({"softmax/rank 0", "softmax", {in({})}, [](const V& x) {
                     return softmax(x[0], 0) * x[0];
                   }});
      c.push_back({"softmax/infinite rows",
                   "softmax",
                   {in({3, 3})},
                   [](const V& x) { return softmax(x[0], 1); },
                   {{"+inf and all -inf rows",
                     {{inf, 0, 1, -inf, -inf, -inf, 0, 1, 2}},
                     {{nan, nan, nan, nan, nan, nan, 0, 0, 0}}}}});
      std::vector<double> p = softmax_of({0, 1, 2});
      c.push_back({"log_softmax/axis",
                   "log_softmax",
                   {in({2, 3, 4})},
                   [](const V& x) { return log_softmax(x[0], 1); },
                   {{"-inf mixed with finite", std::vector<std::vector<double>>{[&] {
                       std::vector<double> v(24);
                       for (size_t i = 0; i < v.size(); ++i)
                         v[i] = i % 5 == 2 ? -inf : 0.3 * static_cast<double>(i % 6);
                       return v;
                     }()}}}});
      // d sum(log_softmax) / dx = 1 - n p.
      c.push_back({"log_softmax/infinite rows",
                   "log_softmax",
                   {in({3, 3})},
                   [](const V& x) { return log_softmax(x[0], 1); },
                   {{"+inf and all -inf rows",
                     {{0, inf, 1, -inf, -inf, -inf, 0, 1, 2}},
                     {{nan, nan, nan, nan, nan, nan, 1 - 3 * p[0], 1 - 3 * p[1], 1 - 3 * p[2]}}}}});
    }

    // --- shape and index ops ---
    c.push_back({"broadcast_to", "broadcast_to", {in({3, 1})}, [](const V& x) {
                   return broadcast_to(x[0], {2, 3, 4});
                 }});
    c.push_back({"reshape", "reshape", {in({3, 4})}, [](const V& x) {
                   return reshape(x[0], {2, -1});
                 }});
    c.push_back(
        {"flatten", "flatten", {in({2, 3, 4})}, [](const V& x) { return flatten(x[0], 1); }});
    c.push_back(
        {"squeeze", "squeeze", {in({3, 1, 2})}, [](const V& x) { return squeeze(x[0]) * 2.0; }});
    c.push_back({"squeeze/axis", "squeeze", {in({3, 1, 2})}, [](const V& x) {
                   return squeeze(x[0], 1) * 2.0;
                 }});
    c.push_back({"unsqueeze", "unsqueeze", {in({3, 2})}, [](const V& x) {
                   return unsqueeze(x[0], -1) * 2.0;
                 }});
    c.push_back({"permute", "permute", {in({2, 3, 4})}, [](const V& x) {
                   return permute(x[0], {2, 0, 1});
                 }});
    c.push_back(
        {"transpose", "transpose", {in({3, 4})}, [](const V& x) { return transpose(x[0], 0, 1); }});
    c.push_back(
        {"slice/step", "slice", {in({3, 5})}, [](const V& x) { return slice(x[0], 1, -4, 5, 2); }});
    c.push_back({"flip", "flip", {in({3, 4})}, [](const V& x) { return flip(x[0], {0, 1}); }});
    c.push_back({"pad/value and crop", "pad", {in({3, 4})}, [](const V& x) {
                   return pad(x[0], {{1, 0}, {2, -1}}, 0.5);
                 }});
    c.push_back({"concat", "concat", {in({3, 4}), in({3, 2}), in({3, 0})}, [](const V& x) {
                   return concat({x[0], x[1], x[2], x[1]}, 1);
                 }});
    c.push_back({"cat", "cat", {in({2, 3}), in({1, 3})}, [](const V& x) {
                   return cat({x[0], x[1]}, 0);
                 }});
    c.push_back({"stack", "stack", {in({3, 4}), in({3, 4})}, [](const V& x) {
                   return stack({x[0], x[1] * 2.0}, 1);
                 }});
    c.push_back({"split/sizes", "split", {in({3, 4})}, [](const V& x) {
                   auto parts = split(x[0], std::vector<int64_t>{1, 3}, 1);
                   return parts[0] * parts[1];
                 }});
    c.push_back({"split/size", "split", {in({5, 2})}, [](const V& x) {
                   auto parts = split(x[0], 2, 0);
                   return concat({parts[2] * 3.0, parts[0], parts[1] * parts[1]}, 0);
                 }});
    c.push_back({"chunk", "chunk", {in({3, 4})}, [](const V& x) {
                   auto parts = chunk(x[0], 2, 1);
                   return parts[0] - parts[1] * 3.0;
                 }});
    c.push_back({"gather/repeated indices", "gather", {in({3, 4})}, [idx](const V& x) {
                   return gather(x[0], 1, idx({0, 3, 3, 1, 2, 0}, {3, 2}));
                 }});
    c.push_back({"index_select/repeated indices", "index_select", {in({3, 4})}, [idx](const V& x) {
                   return index_select(x[0], 0, idx({2, 0, 2}, {3}));
                 }});
    c.push_back({"scatter_add", "scatter_add", {in({3, 4}), in({3, 2})}, [idx](const V& x) {
                   return scatter_add(x[0], 1, idx({0, 0, 3, 1, 2, 2}, {3, 2}), x[1]);
                 }});
    c.push_back({"tril", "tril", {in({4, 4})}, [](const V& x) { return tril(x[0], 1); }});
    c.push_back({"triu", "triu", {in({2, 3, 4})}, [](const V& x) { return triu(x[0], -1); }});
    c.push_back({"reindex", "reindex", {in({3, 4})}, [](const V& x) {
                   // Out-of-range reads take the fill and pass nothing back.
                   return reindex(x[0], {4, 3},
                                  {IndexExpr::var(0) - IndexExpr::constant(1),
                                   IndexExpr::var(1) + IndexExpr::var(0)},
                                  0.25);
                 }});
    c.push_back({"reindex_reduce", "reindex_reduce", {in({3, 4})}, [](const V& x) {
                   return reindex_reduce(x[0], ReduceOp::Sum, {2},
                                         {mod(IndexExpr::var(1), IndexExpr::constant(2))});
                 }});

    // --- matrix products ---
    c.push_back({"matmul/2-D", "matmul", {in({3, 4}), in({4, 2})}, [](const V& x) {
                   return matmul(x[0], x[1]);
                 }});
    c.push_back(
        {"matmul/batched broadcast", "matmul", {in({2, 1, 3, 4}), in({3, 4, 2})}, [](const V& x) {
           return matmul(x[0], x[1]);
         }});
    c.push_back({"matmul/vector", "matmul", {in({4}), in({4, 3})}, [](const V& x) {
                   return matmul(x[0], x[1]);
                 }});
    c.push_back({"matmul/dot", "matmul", {in({5}), in({5})}, [](const V& x) {
                   return matmul(x[0], x[1]);
                 }});
    c.push_back({"matmul/size-1 dims", "matmul", {in({1, 4}), in({4, 1})}, [](const V& x) {
                   return matmul(x[0], x[1]);
                 }});
    c.push_back({"linear", "linear", {in({2, 4}), in({3, 4}), in({3})}, [](const V& x) {
                   return linear(x[0], x[1], x[2]);
                 }});
    c.push_back(
        {"outer", "outer", {in({3}), in({2})}, [](const V& x) { return outer(x[0], x[1]); }});
    c.push_back({"mlp chain", "matmul", {in({2, 3}), in({3, 4}), in({4, 2})}, [](const V& x) {
                   return log_softmax(matmul(tanh(matmul(x[0], x[1])), x[2]), 1);
                 }});

    // --- layers (torch.nn.functional) ---
    namespace F = nn::functional;
    c.push_back({"gelu", "gelu", {in({2, 3}, -3, 3)}, [](const V& x) { return F::gelu(x[0]); }});
    c.push_back({"gelu/tanh", "gelu", {in({2, 3}, -3, 3)}, [](const V& x) {
                   return F::gelu(x[0], F::GeluApproximation::Tanh);
                 }});
    c.push_back({"silu", "silu", {in({2, 3}, -4, 4)}, [](const V& x) { return F::silu(x[0]); }});
    c.push_back(
        {"leaky_relu",
         "leaky_relu",
         {in({2, 3}, -2, 2, 0.1)},
         [](const V& x) { return F::leaky_relu(x[0], 0.1); },
         {{"0 (the slope, as torch)", {{0, 1, -1, -0.0, 2, -2}}, {{0.1, 1, 0.1, 0.1, 1, 0.1}}}}});
    c.push_back({"dropout", "dropout", {in({4, 5})}, [](const V& x) {
                   Generator gen(17);  // the same mask at every evaluation
                   return F::dropout(x[0], 0.4, true, gen);
                 }});
    c.push_back({"conv2d/padding and bias",
                 "conv2d",
                 {in({1, 2, 4, 4}), in({3, 2, 2, 2}), in({3})},
                 [](const V& x) { return F::conv2d(x[0], x[1], x[2], 1, 1); }});
    c.push_back({"conv2d/stride dilation groups",
                 "conv2d",
                 {in({2, 2, 5, 5}), in({2, 1, 2, 2})},
                 [](const V& x) { return F::conv2d(x[0], x[1], Tensor(), 2, 0, 2, 2); }});
    c.push_back(
        {"conv2d/unbatched 1x1", "conv2d", {in({2, 3, 3}), in({2, 2, 1, 1})}, [](const V& x) {
           return F::conv2d(x[0], x[1]);
         }});
    c.push_back({"conv1d/stride padding dilation bias",
                 "conv1d",
                 {in({2, 2, 7}), in({3, 2, 2}), in({3})},
                 [](const V& x) { return F::conv1d(x[0], x[1], x[2], 2, 1, 2); }});
    c.push_back({"conv1d/groups unbatched", "conv1d", {in({4, 5}), in({2, 2, 3})},
                 [](const V& x) { return F::conv1d(x[0], x[1], Tensor(), 1, 0, 1, 2); }});
    c.push_back({"conv2d/same with an even kernel",
                 "conv2d",
                 {in({1, 2, 4, 5}), in({2, 2, 2, 3}), in({2})},
                 [](const V& x) { return F::conv2d(x[0], x[1], x[2], 1, "same", {2, 1}); }});
    c.push_back({"conv1d/same", "conv1d", {in({2, 2, 6}), in({3, 2, 4})},
                 [](const V& x) { return F::conv1d(x[0], x[1], Tensor(), 1, "same"); }});
    c.push_back({"pad/reflect replicate circular", "pad", {in({2, 3, 4})}, [](const V& x) {
                   const Tensor r = F::pad(x[0], {{0, 0}, {2, 1}, {1, 3}}, nn::PaddingMode::Reflect);
                   const Tensor e = F::pad(r, {{1, 0}, {0, 0}, {2, 2}}, nn::PaddingMode::Replicate);
                   return F::pad(e, {{0, 0}, {3, 1}, {0, 1}}, nn::PaddingMode::Circular);
                 }});
    c.push_back({"conv_transpose2d/stride padding output_padding bias",
                 "conv_transpose2d",
                 {in({1, 2, 3, 3}), in({2, 3, 2, 2}), in({3})},
                 [](const V& x) { return F::conv_transpose2d(x[0], x[1], x[2], 2, 1, 1); }});
    c.push_back({"conv_transpose2d/groups dilation",
                 "conv_transpose2d",
                 {in({2, 4, 2, 3}), in({4, 1, 2, 2})},
                 [](const V& x) {
                   return F::conv_transpose2d(x[0], x[1], Tensor(), 1, 0, 0, 2, 2);
                 }});
    // kiln's max_pool2d shares a window's gradient among tied maxima (its max is torch.amax);
    // torch's max_pool2d gives it all to the first maximum.
    c.push_back({"max_pool2d",
                 "max_pool2d",
                 {in({1, 2, 4, 5})},
                 [](const V& x) { return F::max_pool2d(x[0], 2, 1, 1); },
                 {}});
    c.push_back({"max_pool2d/ties",
                 "max_pool2d",
                 {in({1, 1, 2, 2})},
                 [](const V& x) { return F::max_pool2d(x[0], 2); },
                 {{"a constant window (shared)", {{1, 1, 1, 1}}, {{0.25, 0.25, 0.25, 0.25}}}}});
    c.push_back({"avg_pool2d/exclude pad ceil", "avg_pool2d", {in({1, 2, 5, 5})}, [](const V& x) {
                   return F::avg_pool2d(x[0], 3, 2, 1, true, false);
                 }});
    c.push_back({"avg_pool2d/include pad", "avg_pool2d", {in({2, 1, 4, 4})}, [](const V& x) {
                   return F::avg_pool2d(x[0], 2, 1, 1);
                 }});
    c.push_back(
        {"adaptive_avg_pool2d/uneven", "adaptive_avg_pool2d", {in({1, 2, 5, 6})}, [](const V& x) {
           return F::adaptive_avg_pool2d(x[0], {3, 4});
         }});
    c.push_back(
        {"adaptive_avg_pool2d/global", "adaptive_avg_pool2d", {in({2, 2, 3, 3})}, [](const V& x) {
           return F::adaptive_avg_pool2d(x[0], 1);
         }});
    c.push_back(
        {"batch_norm/training",
         "batch_norm",
         {in({4, 3, 2}), in({3}), in({3})},
         [](const V& x) { return F::batch_norm(x[0], Tensor(), Tensor(), x[1], x[2], true); },
         {{"a constant channel",
           {{1, 1, 0.5, -1,   3,   0.25, 1, 1, 0.7, 2, -3, 0.1,
             1, 1, 0.2, -0.5, 0.6, 0.3,  1, 1, -1,  2, 1,  0},
            {1, 2, 0.5},
            {0, 1, -1}}}}});
    c.push_back(
        {"batch_norm/eval", "batch_norm", {in({3, 2, 2}), in({2}), in({2})}, [](const V& x) {
           Tensor rm = from_vector<double>({0.5, -0.25}), rv = from_vector<double>({2.0, 0.5});
           return F::batch_norm(x[0], rm, rv, x[1], x[2], false);
         }});
    c.push_back({"layer_norm/last axis",
                 "layer_norm",
                 {in({2, 3, 4}), in({4}), in({4})},
                 [](const V& x) { return F::layer_norm(x[0], {4}, x[1], x[2]); },
                 {{"a constant row",
                   {{2, 2, 2, 2, 0, 1, 2, 3, -1, 0, 1, 0, 3, 3, 3, 3, 1, 2, 1, 2, 0, 0, 0, 1},
                    {1, 0.5, -1, 2},
                    {0, 0.1, 0.2, 0.3}}}}});
    c.push_back({"layer_norm/two axes", "layer_norm", {in({2, 3, 4})}, [](const V& x) {
                   return F::layer_norm(x[0], {3, 4});
                 }});
    c.push_back({"layer_norm/size-1 axis", "layer_norm", {in({3, 1}), in({1}), in({1})},
                 [](const V& x) { return F::layer_norm(x[0], {1}, x[1], x[2]); }});
    c.push_back({"group_norm/affine",
                 "group_norm",
                 {in({2, 4, 3}), in({4}), in({4})},
                 [](const V& x) { return F::group_norm(x[0], 2, x[1], x[2]); }});
    c.push_back({"group_norm/one group per channel", "group_norm", {in({1, 3, 2, 2})},
                 [](const V& x) { return F::group_norm(x[0], 3); }});
    c.push_back({"instance_norm/affine",
                 "instance_norm",
                 {in({2, 3, 2, 2}), in({3}), in({3})},
                 [](const V& x) {
                   return F::instance_norm(x[0], Tensor(), Tensor(), x[1], x[2]);
                 }});
    c.push_back({"instance_norm/running statistics in eval",
                 "instance_norm",
                 {in({2, 2, 3})},
                 [](const V& x) {
                   Tensor rm = from_vector<double>({0.5, -0.25}),
                          rv = from_vector<double>({2.0, 0.5});
                   return F::instance_norm(x[0], rm, rv, Tensor(), Tensor(), false);
                 }});
    c.push_back({"embedding", "embedding", {in({5, 3})}, [idx](const V& x) {
                   return F::embedding(idx({1, 3, 1, 0, 4, 1}, {2, 3}), x[0]);
                 }});
    // padding_idx rows pass nothing back (torch): d sum / d weight counts the other indices.
    c.push_back({"embedding/padding_idx",
                 "embedding",
                 {in({4, 2})},
                 [idx](const V& x) {
                   return F::embedding(idx({1, 3, 1, 0, 3}, {5}), x[0], 1);
                 },
                 {{"the padding row", {{1, 2, 3, 4, 5, 6, 7, 8}}, {{1, 1, 0, 0, 0, 0, 2, 2}}}},
                 false});
    c.push_back({"scaled_dot_product_attention/bool mask",
                 "scaled_dot_product_attention",
                 {in({2, 3, 4}), in({2, 5, 4}), in({2, 5, 2})},
                 [](const V& x) {
                   std::vector<uint8_t> m = {1, 1, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1};
                   Tensor mask = cast(from_vector(m, {3, 5}), DType::Bool);
                   return F::scaled_dot_product_attention(x[0], x[1], x[2], mask);
                 }});
    c.push_back({"scaled_dot_product_attention/causal float mask",
                 "scaled_dot_product_attention",
                 {in({1, 2, 3, 2}), in({1, 2, 3, 2}), in({1, 2, 3, 2}), in({3, 3})},
                 [](const V& x) {
                   return F::scaled_dot_product_attention(x[0], x[1], x[2], x[3], 0.0, true, 0.7);
                 }});

    // The flash kernels (flash_attention.h), float64 end to end: every tile path (causal
    // blocks skipped, a bool mask shared by the batch) against differences.
    c.push_back({"flash_attention/bool mask",
                 "flash_attention",
                 {in({2, 3, 4}), in({2, 5, 4}), in({2, 5, 2})},
                 [](const V& x) {
                   std::vector<uint8_t> m = {1, 1, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1};
                   Tensor mask = cast(from_vector(m, {3, 5}), DType::Bool);
                   return F::flash_attention(x[0], x[1], x[2], mask);
                 }});
    c.push_back({"flash_attention/causal float mask",
                 "flash_attention",
                 {in({1, 2, 3, 2}), in({1, 2, 4, 2}), in({1, 2, 4, 3})},
                 [](const V& x) {
                   Tensor mask = from_vector<double>({0.1, -0.2, 0.3, 0.0, 0.5, -1.0, 0.25, 2.0,
                                                      -0.5, 0.75, 0.0, 1.0},
                                                     {3, 4});
                   return F::flash_attention(x[0], x[1], x[2], mask, true, 0.7);
                 }});

    // --- losses ---
    // A masked (-inf) logit of another class has probability 0 and gradient 0.
    c.push_back({"cross_entropy/indices", "cross_entropy", {in({3, 4})},
                 [idx](const V& x) { return nn::cross_entropy(x[0], idx({0, 3, 1}, {3})); },
                 {{"-inf logits", {{0.5, -inf, 1, 2, -inf, 0, 1, 3, 1, 2, -inf, 0}}}}});
    c.push_back({"cross_entropy/weights smoothing ignore",
                 "cross_entropy",
                 {in({4, 3})},
                 [idx](const V& x) {
                   nn::CrossEntropyOptions o;
                   o.weight = from_vector<double>({0.5, 2.0, 1.0});
                   o.label_smoothing = 0.2;
                   o.ignore_index = 2;
                   return nn::cross_entropy(x[0], idx({0, 2, 1, 1}, {4}), o);
                 }});
    c.push_back({"cross_entropy/probabilities spatial",
                 "cross_entropy",
                 {in({2, 3, 2}), in({2, 3, 2}, 0, 1)},
                 [](const V& x) {
                   nn::CrossEntropyOptions o;
                   o.reduction = nn::Reduction::Sum;
                   return nn::cross_entropy(x[0], x[1], o);
                 }});
    c.push_back({"nll_loss", "nll_loss", {in({3, 4})}, [idx](const V& x) {
                   nn::CrossEntropyOptions o;
                   o.reduction = nn::Reduction::None;
                   return nn::nll_loss(log_softmax(x[0], 1), idx({2, 0, 3}, {3}), o);
                 }});
    c.push_back({"mse_loss", "mse_loss", {in({2, 3}), in({2, 3})}, [](const V& x) {
                   return nn::mse_loss(x[0], x[1]);
                 }});
    // l1's kink at input == target gives 0, as torch's sign.
    c.push_back({"l1_loss",
                 "l1_loss",
                 {in({2, 3}, -2, 2), in({2, 3}, 3, 4)},
                 [](const V& x) { return nn::l1_loss(x[0], x[1], nn::Reduction::Sum); },
                 {{"input == target (0)",
                   {{1, 2, 3, 4, 5, 6}, {1, 0, 3, 5, 5, 6}},
                   {{0, 1, 0, -1, 0, 0}, {0, -1, 0, 1, 0, 0}}}}});
    c.push_back(
        {"smooth_l1_loss",
         "smooth_l1_loss",
         {in({2, 3}), in({2, 3})},
         [](const V& x) { return nn::smooth_l1_loss(x[0], x[1], nn::Reduction::Mean, 0.5); },
         {{"|d| = 0 and beta", {{0, 1, 2, 0.5, -1, 3}, {0, 0.5, 2, 0, -0.5, 1}}}}});
    // At a zero logit the derivative is sigmoid(0) - target = 0.5 - target.
    c.push_back({"binary_cross_entropy_with_logits",
                 "binary_cross_entropy_with_logits",
                 {in({2, 3}, -4, 4), in({2, 3}, 0, 1)},
                 [](const V& x) { return nn::binary_cross_entropy_with_logits(x[0], x[1]); },
                 {{"zero logits", {{0, 0, 0, 1, -1, 0}, {0, 1, 0.5, 0.25, 1, 0.75}}}}});
    c.push_back({"binary_cross_entropy_with_logits/weights",
                 "binary_cross_entropy_with_logits",
                 {in({2, 3}, -4, 4), in({2, 3}, 0, 1), in({2, 3}, 0.5, 2), in({3}, 0.5, 3)},
                 [](const V& x) {
                   nn::BCEWithLogitsOptions o;
                   o.weight = x[2];
                   o.pos_weight = x[3];
                   o.reduction = nn::Reduction::Sum;
                   return nn::binary_cross_entropy_with_logits(x[0], x[1], o);
                 },
                 {{"zero logits",
                   {{0, 0, 0, 1, -1, 0},
                    {0, 1, 0.5, 0.25, 1, 0.75},
                    {1, 2, 0.5, 1, 1, 1},
                    {2, 0.5, 1.5}}}}});
    // kl_div differentiates in both arguments; a zero target (0 log 0) is kept out of the
    // domain: torch's xlogy gives its target gradient as 0/0 there.
    c.push_back(
        {"kl_div/batchmean", "kl_div", {in({3, 4}, -3, -0.1), in({3, 4}, 0.05, 1)}, [](const V& x) {
           return nn::kl_div(x[0], x[1], {.reduction = nn::KLDivReduction::BatchMean});
         }});
    c.push_back({"kl_div/log_target none",
                 "kl_div",
                 {in({2, 3}, -3, 0), in({2, 3}, -3, 0)},
                 [](const V& x) {
                   return nn::kl_div(x[0], x[1],
                                     {.reduction = nn::KLDivReduction::None, .log_target = true});
                 }});
    // At |d| == delta both pieces have slope delta: differentiable there.
    c.push_back({"huber_loss",
                 "huber_loss",
                 {in({2, 3}), in({2, 3})},
                 [](const V& x) { return nn::huber_loss(x[0], x[1], nn::Reduction::Sum, 0.7); },
                 {{"|d| = 0 and delta", {{0, 1.7, -0.3, 2, 1, -1}, {0, 1, 0.4, 0, 1.5, 0}}}}});
    // Probabilities inside (0, 1): at exactly 0 or 1 the clamped log's gradient (0) is not
    // torch's (x - y) / max(x (1 - x), 1e-12).
    c.push_back(
        {"binary_cross_entropy/weights",
         "binary_cross_entropy",
         {in({2, 3}, 0.05, 0.95), in({2, 3}, 0, 1), in({3}, 0.5, 2)},
         [](const V& x) { return nn::binary_cross_entropy(x[0], x[1], {.weight = x[2]}); }});
    return c;
  }();
  return cases;
}

/// Public ops with no gradient to check, and why; every other function that ops/ and
/// frontend/nn/{functional,loss}.h declare must have a case in grad_cases().
inline const std::map<std::string, std::string>& grad_exempt_ops() {
  static const std::map<std::string, std::string> m = {
      {"isnan", "bool result"},
      {"isclose", "bool result"},
      {"multinomial", "integer samples"},
      {"isinf", "bool result"},
      {"logical_not", "bool result"},
      {"logical_and", "bool result"},
      {"logical_or", "bool result"},
      {"logical_xor", "bool result"},
      {"eq", "bool result"},
      {"ne", "bool result"},
      {"lt", "bool result"},
      {"le", "bool result"},
      {"gt", "bool result"},
      {"ge", "bool result"},
      {"bitwise_not", "integers only"},
      {"bitwise_and", "integers only"},
      {"bitwise_or", "integers only"},
      {"bitwise_xor", "integers only"},
      {"all", "bool result"},
      {"any", "bool result"},
      {"argmax", "integer result"},
      {"argmin", "integer result"},
      {"one_hot", "integer result"},
      {"elementwise", "the builder every elementwise case goes through"},
      {"scalar_tensor", "a constant"},
      {"to", "a copy between devices: needs a second device (tests/test_cuda_runtime.cpp)"},
      {"custom",
       "a user kernel (CustomKernel): differentiable only through the gradient its "
       "author gives, which tests/test_custom_op.cpp checks against differences"},
  };
  return m;
}
}  // namespace kiln::test
