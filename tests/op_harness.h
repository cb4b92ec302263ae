#pragma once
// One registry of elementwise op cases (STYLE item 8, after ggml's test-backend-ops): for
// every unary and binary op, how to build it with kiln, an independent float64 reference
// written from the math (never kiln's own table), the input domain, the dtypes the op
// accepts, the result dtype rule and a tolerance class. The checkers build inputs, run the
// op through whatever executor is current, and return "" on success or a description of
// the first mismatch, so the reference, JIT and CUDA executors and any test framework can
// reuse them unchanged.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
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

}  // namespace kiln::test
