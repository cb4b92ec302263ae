#pragma once
// A seeded random graph generator for differential tests: build_random_graph(seed) builds
// the same lazy graph every time it is called with the same seed (structure from a
// std::mt19937_64, data from kiln::Generator objects and host vectors it creates itself,
// never the global default generator), so one copy can be evaluated by the reference
// evaluator and another by the executor under test.
//
// A graph is 3-25 user-level ops over 1-4 inputs of mixed dtypes, ranks 0-4 and sizes 0-7,
// mixing broadcasting elementwise ops (scalars on either side), casts, shape composites
// (permute, strided slice, flip, pad, reshape, broadcast_to, concat, gather, index_select),
// reductions (sum/mean/prod/max/min/argmax/argmin/softmax/log_softmax/logsumexp/var/any/
// all), matmul, where, clamp and the raw meta-ops reindex / reindex_reduce with random
// affine maps (out-of-range coordinates give the fill / are skipped). Earlier nodes are
// reused by later ops (shared subexpressions); only the chosen outputs keep handles, so
// an executor is free to fuse everything else.
//
// Numerics. Two correct executors may round differently (fusion keeps float16 values in
// float32, float32 libm vs float64 reference, reassociated sums), so every value carries
//   mag: a bound on |value| (finite values), and
//   err: a first-order bound on how far two correct evaluations may differ: each op adds
//        its input errors times its Lipschitz constant plus a few units of roundoff of its
//        own dtype times its magnitude; sums over n terms add roundoff * sqrt(n) * n * mag
//        (the reassociation term).
// err == 0 means "exact": every correct executor must produce the same bits (integers,
// bools, float inputs from host data or rand(), and what exact ops make of them: neg, abs,
// floor, max, where, reindexing, ...). Ops whose result jumps on a tiny input change
// (floor, round, comparisons, argmax, float->int casts, floor_div, mod, logical ops) are
// only applied to exact operands, so a 1-ulp difference can never flip a discrete result.
// Domains are kept safe by construction: log/sqrt/rsqrt/reciprocal/pow see abs(x)+1,
// division is by abs(y)+1 or a non-zero scalar, exp sees tanh(x) once |x| may exceed 4,
// integer magnitudes stay inside their dtype (no wrap-around), float magnitudes stay far
// from overflow. Values that may be NaN or inf (mean/var/logsumexp over nothing, max over
// targets nobody writes) are allowed as outputs but never fed to further ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/kiln.h"

namespace kiln::test {

/// One generated graph: the tensors to evaluate together and, per output, the error bound
/// (absolute) that two correct executors may differ by on top of the per-dtype tolerance.
struct RandomGraph {
  uint64_t seed = 0;
  std::vector<Tensor> outputs;
  std::vector<double> output_err;
  /// One line per op taken, "v7 = sum(v3, axes=[1], keepdim=1) -> float32[2, 1]".
  std::vector<std::string> log;
  /// User-level ops built (composites count once), inputs not included.
  int ops = 0;
  /// Steps that threw a kiln::Error while building (skipped), with the messages.
  int build_errors = 0;
  std::vector<std::string> error_messages;
  /// Steps whose result was dropped for being too large (not an error).
  int rejected = 0;
};

struct RandomGraphOptions {
  int min_ops = 3, max_ops = 25;
  int max_inputs = 4;
  int64_t max_numel = 2000;     ///< Largest tensor kept (outputs and intermediates).
  int64_t max_input_numel = 400;
};

namespace detail_graph {

/// Unit roundoff of a dtype (0 for integers and bool).
inline double unit_roundoff(DType d) {
  switch (d) {
    case DType::Float64: return 0x1p-53;
    case DType::Float32: return 0x1p-24;
    case DType::Float16: return 0x1p-11;
    case DType::BFloat16: return 0x1p-8;
    default: return 0;
  }
}
/// Roundoff of the compute type: half floats compute in float32 inside composites.
inline double compute_roundoff(DType d) {
  return (d == DType::Float16 || d == DType::BFloat16) ? unit_roundoff(DType::Float32) : unit_roundoff(d);
}
/// Largest magnitude a value of `d` may reach here (far from overflow, no integer wrap).
inline double mag_cap(DType d) {
  switch (d) {
    case DType::Bool: return 1;
    case DType::Int8: return 127;
    case DType::UInt8: return 255;
    case DType::Int16: return 32767;
    case DType::Int32: return 2147483647.0;
    case DType::Int64: return 0x1p62;
    case DType::Float16: return 1.0e4;
    default: return 1.0e6;
  }
}
/// Integers that `d` represents exactly.
inline double exact_int_limit(DType d) {
  switch (d) {
    case DType::Float16: return 2048;
    case DType::BFloat16: return 256;
    case DType::Float32: return 0x1p24;
    case DType::Float64: return 0x1p53;
    default: return 0x1p62;
  }
}

inline std::string shape_txt(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os.str() + "]";
}
inline std::string vec_txt(const std::vector<int64_t>& v) { return shape_txt(v); }

/// numpy broadcasting compatibility.
inline bool broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}
inline Shape broadcast_result(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i + a.size() >= r ? a[i + a.size() - r] : 1;
    int64_t y = i + b.size() >= r ? b[i + b.size() - r] : 1;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

/// A value in the pool: the tensor and its numeric bounds (see the file comment).
struct Val {
  Tensor t;
  double mag = 0;
  double err = 0;
  bool special = false;  ///< may hold NaN/inf: an output only, never an operand
  bool leaf = false;
  std::string name;
  bool exact() const { return err == 0 && !special; }
  DType dtype() const { return t.dtype(); }
  const Shape& shape() const { return t.shape(); }
};

class GraphBuilder {
 public:
  GraphBuilder(uint64_t seed, const RandomGraphOptions& opt, RandomGraph& g)
      : rng_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull), gen_(seed ^ 0xC0FFEEull), opt_(opt), g_(g) {}

  void build() {
    int n_inputs = 1 + static_cast<int>(uni(static_cast<uint64_t>(opt_.max_inputs)));
    make_base_shape();
    for (int i = 0; i < n_inputs; ++i) add_input();
    int target = opt_.min_ops + static_cast<int>(uni(static_cast<uint64_t>(opt_.max_ops - opt_.min_ops + 1)));
    for (int attempt = 0; g_.ops < target && attempt < 6 * target + 20; ++attempt) step();
    choose_outputs();
  }

 private:
  // --- randomness ---
  uint64_t uni(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(uni(static_cast<uint64_t>(hi - lo + 1))); }
  bool coin(double p) { return static_cast<double>(rng_() >> 11) * 0x1p-53 < p; }
  template <typename T>
  const T& pick_of(const std::vector<T>& v) { return v[uni(v.size())]; }

  // --- the pool ---
  std::vector<Val> pool_;
  Shape base_;

  /// Index of an operand satisfying `pred`: recent values are favoured (deep graphs),
  /// older ones are reused too (shared subexpressions). -1 if none.
  template <typename Pred>
  int pick(Pred pred) {
    std::vector<int> c;
    for (int i = 0; i < static_cast<int>(pool_.size()); ++i)
      if (!pool_[i].special && pred(pool_[i])) c.push_back(i);
    if (c.empty()) return -1;
    if (coin(0.55)) return c[c.size() - 1 - uni(std::min<size_t>(c.size(), 3))];
    return c[uni(c.size())];
  }
  int pick_any() { return pick([](const Val&) { return true; }); }

  std::string next_name() { return "v" + std::to_string(pool_.size()); }

  /// Adds a result with its bounds; drops it (rejected) when too large or too inexact.
  void push(Tensor t, double mag, double err, const std::string& what, bool special = false) {
    ++g_.ops;
    if (t.numel() > opt_.max_numel) {
      ++g_.rejected;
      return;
    }
    DType d = t.dtype();
    if (!is_floating(d)) err = 0;
    if (d == DType::Bool) mag = std::min(mag, 1.0);
    if (!std::isfinite(mag) || mag > mag_cap(d)) {
      // A float near overflow may be finite in one executor and inf in another: drop it.
      // Integers past their range wrap identically everywhere: keep them, as outputs only.
      if (is_floating(d) && !special) {
        ++g_.rejected;
        return;
      }
      special = true;
    }
    // A bound this loose would make the comparison meaningless downstream.
    if (err > std::max(0.05, 16 * unit_roundoff(d)) * std::max(mag, 1.0)) special = true;
    Val v{std::move(t), mag, err, special, false, next_name()};
    g_.log.push_back(v.name + " = " + what + " -> " + std::string(dtype_name(d)) + shape_txt(v.shape()) +
                     (special ? " (terminal)" : "") + (v.exact() ? " exact" : ""));
    pool_.push_back(std::move(v));
  }
  /// Roundoff slack of `k` units of `d`'s roundoff at magnitude `m`.
  static double rnd(DType d, double m, double k = 4) { return k * unit_roundoff(d) * m; }
  /// The rounding of operand `v` when promotion converts it to a less precise `out` (a
  /// float32 rank-0 tensor meeting a bfloat16 tensor): such a value is no longer exact.
  static double conv(const Val& v, DType out) {
    if (!is_floating(out)) return 0;
    if (!is_floating(v.dtype())) return v.mag > exact_int_limit(out) ? rnd(out, v.mag, 2) : 0;
    return unit_roundoff(out) > unit_roundoff(v.dtype()) ? rnd(out, v.mag, 2) : 0;
  }

  // --- inputs ---
  void make_base_shape() {
    int rank = static_cast<int>(range(0, 4));
    base_.clear();
    for (int i = 0; i < rank; ++i) base_.push_back(coin(0.05) ? 0 : range(1, 7));
    while (numel(base_) > opt_.max_input_numel) {
      for (auto& s : base_) s = std::max<int64_t>(1, s / 2);
    }
  }

  Shape input_shape() {
    size_t keep = uni(base_.size() + 1);
    if (coin(0.5)) keep = base_.size();
    Shape s(base_.end() - static_cast<long>(keep), base_.end());
    for (auto& d : s)
      if (coin(0.25)) d = 1;
    return s;
  }

  DType random_dtype() {
    static const std::vector<DType> all = {DType::Float32, DType::Float32, DType::Float32, DType::Float64,
                                           DType::Float16, DType::BFloat16, DType::Int32,  DType::Int64,
                                           DType::Int8,    DType::Bool};
    return pick_of(all);
  }

  void add_input() {
    Shape s = input_shape();
    DType d = random_dtype();
    size_t n = static_cast<size_t>(numel(s));
    Val v;
    v.leaf = true;
    v.name = next_name();
    std::string how;
    if (is_floating(d)) {
      int kind = static_cast<int>(uni(10));
      if (kind < 3) {
        v.t = randn(s, d, gen_);
        // Box-Muller stays below 8.6; libm differences may move the stored value by an ulp.
        v.mag = 9;
        v.err = rnd(d, 9, 2) + rnd(DType::Float32, 9, 8);
        how = "randn";
      } else if (kind < 5) {
        v.t = rand(s, d, gen_);
        v.mag = 1;
        how = "rand";
      } else {
        // Multiples of 1/8 in [-4, 4]: exact in every float dtype; the first is non-zero.
        std::vector<double> vals(n);
        for (size_t i = 0; i < n; ++i) {
          int64_t k = range(-32, 32);
          if (i == 0 && k == 0) k = 5;
          vals[i] = static_cast<double>(k) / 8.0;
        }
        v.t = host_tensor(vals, s, d);
        v.mag = 4;
        how = "from_vector";
      }
    } else if (d == DType::Bool) {
      if (coin(0.5)) {
        v.t = bernoulli(s, 0.5, gen_);
        how = "bernoulli";
      } else {
        std::vector<double> vals(n);
        for (size_t i = 0; i < n; ++i) vals[i] = (i == 0 || coin(0.5)) ? 1 : 0;
        v.t = host_tensor(vals, s, d);
        how = "from_vector";
      }
      v.mag = 1;
    } else {
      if (coin(0.4)) {
        Tensor r = randint(-9, 10, s, gen_);
        v.t = d == DType::Int64 ? r : cast(r, d);
        how = "randint";
      } else {
        std::vector<double> vals(n);
        for (size_t i = 0; i < n; ++i) {
          int64_t k = range(-9, 9);
          if (i == 0 && k == 0) k = 3;
          vals[i] = static_cast<double>(k);
        }
        v.t = host_tensor(vals, s, d);
        how = "from_vector";
      }
      v.mag = 9;
    }
    g_.log.push_back(v.name + " = input " + how + " -> " + std::string(dtype_name(d)) + shape_txt(s) +
                     (v.exact() ? " exact" : ""));
    pool_.push_back(std::move(v));
  }

  static Tensor host_tensor(const std::vector<double>& vals, const Shape& s, DType d) {
    return visit_dtype(d, [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> v(vals.size());
      for (size_t i = 0; i < vals.size(); ++i) {
        if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v[i] = T(static_cast<float>(vals[i]));
        else v[i] = static_cast<T>(vals[i]);
      }
      return from_vector(v, s);
    });
  }

  // --- one step ---
  void step() {
    int k = static_cast<int>(uni(100));
    try {
      if (k < 20) unary();
      else if (k < 42) binary();
      else if (k < 48) do_cast();
      else if (k < 64) shape_op();
      else if (k < 78) reduction();
      else if (k < 82) do_matmul();
      else if (k < 87) do_where();
      else if (k < 89) do_clamp();
      else if (k < 95) raw_reindex();
      else raw_reindex_reduce();
    } catch (const Error& e) {
      ++g_.build_errors;
      g_.error_messages.push_back(e.what());
    }
  }

  /// A scalar operand for dtype `d`'s category: multiples of 1/4, small ints, bools.
  Scalar scalar_for(DType d, bool nonzero = false) {
    if (is_floating(d)) {
      int64_t k = range(-16, 16);
      if (nonzero && k == 0) k = 4;
      return Scalar(static_cast<double>(k) / 4.0);
    }
    if (d == DType::Bool) return Scalar(nonzero ? true : coin(0.5));
    int64_t k = range(-5, 5);
    if (nonzero && k == 0) k = 2;
    return Scalar(k);
  }
  static double mag_of(const Scalar& s) { return std::fabs(s.to_double()); }

  /// tanh(x) when |x| may exceed `limit` (keeps exp and sin arguments small).
  Val bounded(const Val& x, double limit) {
    if (x.mag <= limit) return x;
    Tensor t = tanh(x.t);
    return Val{t, 1, x.err + rnd(t.dtype(), 1, 8), false, false, "tanh(" + x.name + ")"};
  }
  /// abs(x) + 1 with its bounds (the safe argument of log, sqrt, reciprocal, pow, divisors).
  Val abs_plus_one(const Val& x) {
    Tensor a = x.t.dtype() == DType::Bool ? cast(x.t, DType::Int32) : abs(x.t);
    Tensor t = add(a, 1);
    return Val{t, x.mag + 1, x.err + rnd(t.dtype(), x.mag + 1), false, false, "(abs(" + x.name + ")+1)"};
  }

  void unary() {
    int i = pick_any();
    if (i < 0) return;
    Val x = pool_[i];
    DType d = x.dtype();
    bool fl = is_floating(d), bo = d == DType::Bool;
    double M = x.mag, E = x.err;
    int op = static_cast<int>(uni(23));
    auto tr = [&](Tensor t, double mag, double L, double e_in, const std::string& what) {
      push(t, mag, L * e_in + rnd(t.dtype(), mag, 8), what);
    };
    switch (op) {
      case 0:
        if (bo) return;
        return push(neg(x.t), M, E, "neg(" + x.name + ")");
      case 1: return push(abs(x.t), M, E, "abs(" + x.name + ")");
      case 2: return push(relu(x.t), M, E, "relu(" + x.name + ")");
      case 3: {
        if (M > 100) return;
        Tensor t = square(x.t);
        return push(t, M * M, 2 * M * E + rnd(t.dtype(), M * M), "square(" + x.name + ")");
      }
      case 4: case 5: case 6: {
        Val y = bounded(x, 4);
        Tensor t = op == 4 ? exp(y.t) : op == 5 ? expm1(y.t) : exp2(y.t);
        double m = op == 6 ? std::exp2(y.mag) : std::exp(y.mag);
        return tr(t, m, m, y.err, std::string(op == 4 ? "exp" : op == 5 ? "expm1" : "exp2") + "(" + y.name + ")");
      }
      case 7: case 8: case 9: {
        Val y = abs_plus_one(x);
        Tensor t = op == 7 ? log(y.t) : op == 8 ? log2(y.t) : log1p(y.t);
        return tr(t, std::log2(y.mag + 1) + 1, 1.45, y.err,
                  std::string(op == 7 ? "log" : op == 8 ? "log2" : "log1p") + y.name);
      }
      case 10: case 11: case 12: {
        Val y = abs_plus_one(x);
        Tensor t = op == 10 ? sqrt(y.t) : op == 11 ? rsqrt(y.t) : reciprocal(y.t);
        double m = op == 10 ? std::sqrt(y.mag) : 1;
        return tr(t, m, 1, y.err, std::string(op == 10 ? "sqrt" : op == 11 ? "rsqrt" : "reciprocal") + y.name);
      }
      case 13: case 14: {
        Val y = bounded(x, 20);
        return tr(op == 13 ? sin(y.t) : cos(y.t), 1, 1, y.err, std::string(op == 13 ? "sin(" : "cos(") + y.name + ")");
      }
      case 15: {
        Val y = bounded(x, 1);
        return tr(tan(y.t), 1.6, 3.5, y.err, "tan(" + y.name + ")");
      }
      case 16: return tr(tanh(x.t), std::min(M, 1.0), 1, E, "tanh(" + x.name + ")");
      case 17: return tr(sigmoid(x.t), 1, 0.25, E, "sigmoid(" + x.name + ")");
      case 18: return tr(erf(x.t), 1, 1.13, E, "erf(" + x.name + ")");
      case 19: {
        if (!x.exact() || bo) return;
        static const char* names[] = {"floor", "ceil", "round", "trunc"};
        int w = static_cast<int>(uni(4));
        Tensor t = w == 0 ? floor(x.t) : w == 1 ? ceil(x.t) : w == 2 ? round(x.t) : trunc(x.t);
        return push(t, M + 1, 0, std::string(names[w]) + "(" + x.name + ")");
      }
      case 20:
        if (!x.exact()) return;
        return push(sign(x.t), 1, 0, "sign(" + x.name + ")");
      case 21:
        if (!x.exact()) return;
        if (fl || coin(0.5)) return push(logical_not(x.t), 1, 0, "logical_not(" + x.name + ")");
        return push(bitwise_not(x.t), M + 1, 0, "bitwise_not(" + x.name + ")");
      default:
        return push(coin(0.5) ? isnan(x.t) : isinf(x.t), 1, 0, "isnan/isinf(" + x.name + ")");
    }
  }

  /// A second operand broadcast-compatible with `a` (-1: none; the caller uses a scalar).
  int partner(const Val& a) {
    return pick([&](const Val& b) { return broadcastable(a.shape(), b.shape()); });
  }

  void binary() {
    int i = pick_any();
    if (i < 0) return;
    Val a = pool_[i];
    // Scalar operands: a weak C++ number (either side) or, sometimes, a rank-0 tensor.
    int j = coin(0.25) ? -1 : partner(a);
    Val b;
    bool scalar = j < 0;
    if (scalar) {
      Scalar s = scalar_for(coin(0.8) ? a.dtype() : random_dtype());
      b = Val{coin(0.3) ? host_tensor({s.to_double()}, {}, s.kind() == Scalar::Kind::Float ? DType::Float32
                                                           : s.kind() == Scalar::Kind::Int ? DType::Int64
                                                                                           : DType::Bool)
                        : scalar_tensor(s),
              mag_of(s), 0, false, true, s.str()};
    } else {
      b = pool_[j];
    }
    bool swap = coin(0.5);
    const Val& l = swap ? b : a;
    const Val& r = swap ? a : b;
    bool any_float = is_floating(a.dtype()) || is_floating(b.dtype());
    bool any_bool = a.dtype() == DType::Bool || b.dtype() == DType::Bool;
    bool exact = a.exact() && b.exact();
    // Operand dtype after promotion: an operand converted to a less precise dtype rounds.
    DType od = add(l.t, r.t).dtype();
    double Ea = l.err + conv(l, od), Eb = r.err + conv(r, od);
    double Ma = l.mag, Mb = r.mag;
    exact = exact && Ea == 0 && Eb == 0;
    std::string args = "(" + l.name + ", " + r.name + ")";
    int op = static_cast<int>(uni(13));
    switch (op) {
      case 0: {
        Tensor t = add(l.t, r.t);
        return push(t, Ma + Mb, Ea + Eb + rnd(t.dtype(), Ma + Mb), "add" + args);
      }
      case 1: {
        if (any_bool) return;
        Tensor t = sub(l.t, r.t);
        return push(t, Ma + Mb, Ea + Eb + rnd(t.dtype(), Ma + Mb), "sub" + args);
      }
      case 2: {
        Tensor t = mul(l.t, r.t);
        return push(t, Ma * Mb, Ea * Mb + Eb * Ma + Ea * Eb + rnd(t.dtype(), Ma * Mb), "mul" + args);
      }
      case 3: {
        // l / (abs(r) + 1), or l / non-zero scalar.
        if (coin(0.3)) {
          static const std::vector<double> divs = {2, -4, 0.5, 3, -1.5};
          double s = pick_of(divs);
          Tensor t = div(a.t, s);
          return push(t, a.mag / std::fabs(s), a.err / std::fabs(s) + rnd(t.dtype(), a.mag / std::fabs(s)),
                      "div(" + a.name + ", " + Scalar(s).str() + ")");
        }
        Val den = abs_plus_one(r);
        Tensor t = div(l.t, den.t);
        return push(t, Ma, Ea + (den.err + Eb) * Ma + rnd(t.dtype(), Ma), "div(" + l.name + ", " + den.name + ")");
      }
      case 4: case 5: {
        // floor_div / mod: integers by abs(int)+1 or a non-zero int scalar; floats (exact
        // only) by a power of two so that the quotient is exact.
        if (!a.exact()) return;
        bool is_mod = op == 5;
        if (is_floating(a.dtype())) {
          static const std::vector<double> divs = {2, 0.5, 4, -2};
          double s = pick_of(divs);
          Tensor t = is_mod ? mod(a.t, s) : floor_div(a.t, s);
          return push(t, is_mod ? std::fabs(s) : a.mag / std::fabs(s) + 1, 0,
                      std::string(is_mod ? "mod(" : "floor_div(") + a.name + ", " + Scalar(s).str() + ")");
        }
        if (a.dtype() == DType::Bool) return;
        if (!scalar && b.exact() && !is_floating(b.dtype()) && b.dtype() != DType::Bool) {
          Val den = abs_plus_one(b);
          Tensor t = is_mod ? mod(a.t, den.t) : floor_div(a.t, den.t);
          return push(t, is_mod ? den.mag : a.mag + 1, 0,
                      std::string(is_mod ? "mod(" : "floor_div(") + a.name + ", " + den.name + ")");
        }
        static const std::vector<int64_t> divs = {2, 3, -3, 5};
        int64_t s = pick_of(divs);
        Tensor t = is_mod ? mod(a.t, s) : floor_div(a.t, s);
        return push(t, is_mod ? std::fabs(static_cast<double>(s)) : a.mag + 1, 0,
                    std::string(is_mod ? "mod(" : "floor_div(") + a.name + ", " + std::to_string(s) + ")");
      }
      case 6: {
        if (a.dtype() == DType::Bool) return;
        if (is_floating(a.dtype())) {
          static const std::vector<double> exps = {2, 0.5, 3, -1.5};
          double s = pick_of(exps);
          if (a.mag > 20) return;
          Val base = abs_plus_one(a);
          Tensor t = pow(base.t, s);
          double m = s > 0 ? std::pow(base.mag, s) : 1;
          double L = std::fabs(s) * (s > 1 ? std::pow(base.mag, s - 1) : 1);
          return push(t, m, L * base.err + rnd(t.dtype(), m, 8), "pow(" + base.name + ", " + Scalar(s).str() + ")");
        }
        int64_t s = range(0, 3);
        double m = std::pow(std::max(a.mag, 1.0), static_cast<double>(s));
        if (m > mag_cap(a.dtype())) return;
        return push(pow(a.t, s), m, 0, "pow(" + a.name + ", " + std::to_string(s) + ")");
      }
      case 7: case 8:
        return push(op == 7 ? maximum(l.t, r.t) : minimum(l.t, r.t), std::max(Ma, Mb), std::max(Ea, Eb),
                    std::string(op == 7 ? "maximum" : "minimum") + args);
      case 9: {
        if (!exact) return;
        static const char* names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
        int w = static_cast<int>(uni(6));
        Tensor t = w == 0 ? eq(l.t, r.t) : w == 1 ? ne(l.t, r.t) : w == 2 ? lt(l.t, r.t)
                 : w == 3 ? le(l.t, r.t) : w == 4 ? gt(l.t, r.t) : ge(l.t, r.t);
        return push(t, 1, 0, names[w] + args);
      }
      case 10: {
        if (!exact) return;
        int w = static_cast<int>(uni(3));
        Tensor t = w == 0 ? logical_and(l.t, r.t) : w == 1 ? logical_or(l.t, r.t) : logical_xor(l.t, r.t);
        return push(t, 1, 0, std::string(w == 0 ? "logical_and" : w == 1 ? "logical_or" : "logical_xor") + args);
      }
      default: {
        if (any_float) return;
        int w = static_cast<int>(uni(3));
        Tensor t = w == 0 ? bitwise_and(l.t, r.t) : w == 1 ? bitwise_or(l.t, r.t) : bitwise_xor(l.t, r.t);
        double m = std::exp2(std::ceil(std::log2(std::max(Ma, Mb) + 1)) + 1);
        return push(t, std::min(m, mag_cap(t.dtype())), 0,
                    std::string(w == 0 ? "bitwise_and" : w == 1 ? "bitwise_or" : "bitwise_xor") + args);
      }
    }
  }

  void do_cast() {
    int i = pick_any();
    if (i < 0) return;
    Val x = pool_[i];
    DType from = x.dtype(), to = random_dtype();
    if (to == from) return;
    std::string what = "cast(" + x.name + ", " + std::string(dtype_name(to)) + ")";
    if (is_floating(from) && is_floating(to)) {
      if (x.mag > mag_cap(to)) return;
      bool widening = unit_roundoff(to) < unit_roundoff(from);
      // A narrowing of an exact value may round: the result stops being exact.
      return push(cast(x.t, to), x.mag, widening ? x.err : x.err + rnd(to, x.mag, 2), what);
    }
    if (is_floating(from)) {
      if (!x.exact()) return;  // truncation and != 0 jump on tiny differences
      return push(cast(x.t, to), std::min(x.mag, mag_cap(to)), 0, what);
    }
    if (is_floating(to)) {
      bool exact_int = x.mag <= exact_int_limit(to);
      return push(cast(x.t, to), x.mag, exact_int ? 0 : rnd(to, x.mag, 2), what);
    }
    return push(cast(x.t, to), std::min(x.mag, mag_cap(to)), 0, what);  // integer wrap / != 0
  }

  // --- shape composites ---
  Shape random_factorization(int64_t n) {
    Shape s;
    int rank = static_cast<int>(range(0, 4));
    if (n == 0) {
      for (int k = 0; k < std::max(rank, 1); ++k) s.push_back(range(1, 4));
      s[uni(s.size())] = 0;
      return s;
    }
    int64_t rest = n;
    for (int k = 0; k + 1 < rank; ++k) {
      std::vector<int64_t> divs;
      for (int64_t q = 1; q <= rest && q <= 8; ++q)
        if (rest % q == 0) divs.push_back(q);
      int64_t q = pick_of(divs);
      s.push_back(q);
      rest /= q;
    }
    if (rank == 0 && rest != 1) rank = 1;
    if (rank > 0) s.insert(s.begin() + static_cast<long>(uni(s.size() + 1)), rest);
    return s;
  }

  void shape_op() {
    int i = pick_any();
    if (i < 0) return;
    Val x = pool_[i];
    const Shape& s = x.shape();
    int r = static_cast<int>(s.size());
    auto keep = [&](Tensor t, const std::string& what, double mag = -1) {
      push(t, mag < 0 ? x.mag : mag, x.err, what);
    };
    int op = static_cast<int>(uni(10));
    switch (op) {
      case 0: {
        if (r < 2) return;
        std::vector<int64_t> axes(static_cast<size_t>(r));
        for (int k = 0; k < r; ++k) axes[k] = k;
        std::shuffle(axes.begin(), axes.end(), rng_);
        if (coin(0.5)) {
          int64_t a0 = range(-r, r - 1), a1 = range(-r, r - 1);
          return keep(transpose(x.t, a0, a1), "transpose(" + x.name + ", " + std::to_string(a0) + ", " +
                                                   std::to_string(a1) + ")");
        }
        return keep(permute(x.t, axes), "permute(" + x.name + ", " + vec_txt(axes) + ")");
      }
      case 1: {
        if (r < 1) return;
        int64_t axis = range(-r, r - 1);
        int64_t n = s[static_cast<size_t>(axis < 0 ? axis + r : axis)];
        int64_t start = range(-n - 1, n), stop = range(-n - 1, n + 1), st = range(1, 3);
        return keep(slice(x.t, axis, start, stop, st), "slice(" + x.name + ", axis=" + std::to_string(axis) +
                                                            ", " + std::to_string(start) + ":" +
                                                            std::to_string(stop) + ":" + std::to_string(st) + ")");
      }
      case 2: {
        if (r < 1) return;
        std::vector<int64_t> axes;
        for (int k = 0; k < r; ++k)
          if (coin(0.5)) axes.push_back(coin(0.3) ? k - r : k);
        if (axes.empty()) axes.push_back(0);
        return keep(flip(x.t, axes), "flip(" + x.name + ", " + vec_txt(axes) + ")");
      }
      case 3: {
        std::vector<std::pair<int64_t, int64_t>> pads;
        std::string txt;
        for (int k = 0; k < r; ++k) {
          int64_t lo = range(-1, 2), hi = range(-1, 2);
          while (s[k] + lo + hi < 0) ++hi;
          pads.push_back({lo, hi});
          txt += "(" + std::to_string(lo) + "," + std::to_string(hi) + ")";
        }
        Scalar v = scalar_for(x.dtype());
        return keep(pad(x.t, pads, v), "pad(" + x.name + ", " + txt + ", value=" + v.str() + ")",
                    std::max(x.mag, mag_of(v)));
      }
      case 4: {
        Shape ns = random_factorization(x.t.numel());
        if (coin(0.2) && !ns.empty() && x.t.numel() > 0) ns[uni(ns.size())] = -1;
        return keep(reshape(x.t, ns), "reshape(" + x.name + ", " + shape_txt(ns) + ")");
      }
      case 5: {
        Shape ns = s;
        for (auto& d : ns)
          if (d == 1 && coin(0.7)) d = range(1, 5);
        int lead = static_cast<int>(range(0, 2));
        for (int k = 0; k < lead && ns.size() < 5; ++k) ns.insert(ns.begin(), range(1, 4));
        return keep(broadcast_to(x.t, ns), "broadcast_to(" + x.name + ", " + shape_txt(ns) + ")");
      }
      case 6: {
        if (r < 1) return;
        int64_t axis = range(0, r - 1);
        std::vector<Tensor> parts = {x.t};
        std::string txt = x.name;
        double mag = x.mag, err = x.err;
        int n_parts = static_cast<int>(range(1, 2));
        for (int p = 0; p < n_parts; ++p) {
          int j = pick([&](const Val& v) {
            if (v.shape().size() != s.size()) return false;
            for (int k = 0; k < r; ++k)
              if (k != axis && v.shape()[k] != s[k]) return false;
            return true;
          });
          if (j < 0) return;
          parts.push_back(pool_[j].t);
          txt += ", " + pool_[j].name;
          mag = std::max(mag, pool_[j].mag);
          err = std::max(err, pool_[j].err);
        }
        bool same = true;
        for (const Tensor& p : parts) same = same && p.shape() == s;
        Tensor t = (same && coin(0.3)) ? stack(parts, range(0, r)) : concat(parts, axis - (coin(0.3) ? r : 0));
        return push(t, mag, err + rnd(t.dtype(), mag, 2), "concat/stack([" + txt + "], axis=" + std::to_string(axis) + ")");
      }
      case 7: {
        if (r < 1) return;
        int axis = static_cast<int>(range(0, r - 1));
        if (s[axis] == 0) return;
        Shape is = s;
        for (int k = 0; k < r; ++k) is[k] = k == axis ? range(1, 5) : range(std::min<int64_t>(s[k], 1), s[k]);
        Tensor idx = random_index(is, s[axis]);
        return keep(gather(x.t, axis, idx), "gather(" + x.name + ", " + std::to_string(axis) + ", idx" +
                                                 shape_txt(is) + ")");
      }
      case 8: {
        if (r < 1) return;
        int axis = static_cast<int>(range(0, r - 1));
        if (s[axis] == 0) return;
        Tensor idx = random_index({range(0, 6)}, s[axis]);
        return keep(index_select(x.t, axis - (coin(0.3) ? r : 0), idx),
                    "index_select(" + x.name + ", " + std::to_string(axis) + ")");
      }
      default: {
        if (r < 1) return;
        Tensor t = coin(0.5) ? unsqueeze(x.t, range(-r - 1, r)) : (coin(0.5) ? squeeze(x.t) : flatten(x.t));
        return keep(t, "unsqueeze/squeeze/flatten(" + x.name + ")");
      }
    }
  }

  /// In-range indices [0, n): a lazy randint, host data (int64 or int32), or an exact
  /// integer pool value folded into range with mod.
  Tensor random_index(const Shape& shape, int64_t n) {
    int kind = static_cast<int>(uni(3));
    if (kind == 0) return randint(0, n, shape, gen_);
    if (kind == 1) {
      std::vector<double> v(static_cast<size_t>(numel(shape)));
      for (auto& e : v) e = static_cast<double>(range(0, n - 1));
      return host_tensor(v, shape, coin(0.5) ? DType::Int32 : DType::Int64);
    }
    int j = pick([&](const Val& v) {
      return v.exact() && is_integer(v.dtype()) && broadcastable(v.shape(), shape) &&
             broadcast_result(v.shape(), shape) == shape;
    });
    if (j < 0) return randint(0, n, shape, gen_);
    return mod(broadcast_to(pool_[j].t, shape), n);
  }

  // --- reductions ---
  void reduction() {
    int i = pick_any();
    if (i < 0) return;
    Val x = pool_[i];
    const Shape& s = x.shape();
    int r = static_cast<int>(s.size());
    DType d = x.dtype();
    bool fl = is_floating(d);
    std::vector<int64_t> axes;
    for (int k = 0; k < r; ++k)
      if (coin(0.5)) axes.push_back(coin(0.3) ? k - r : k);
    int64_t n = 1;
    bool nonempty = true;
    if (axes.empty()) {
      n = x.t.numel();
      nonempty = n > 0 || r == 0;
    } else {
      for (int64_t a : axes) {
        int64_t sz = s[static_cast<size_t>(a < 0 ? a + r : a)];
        n *= sz;
        nonempty = nonempty && sz > 0;
      }
    }
    bool keepdim = coin(0.4);
    double M = x.mag, E = x.err, sn = std::sqrt(static_cast<double>(n));
    double uc = compute_roundoff(d);
    std::string args = "(" + x.name + ", axes=" + vec_txt(axes) + ", keepdim=" + std::to_string(keepdim) + ")";
    int op = static_cast<int>(uni(12));
    switch (op) {
      case 0: case 1: {
        Tensor t = sum(x.t, axes, keepdim);
        double m = static_cast<double>(n) * M;
        return push(t, m, n * E + uc * m * (4 + 4 * sn) + rnd(t.dtype(), m), "sum" + args);
      }
      case 2: {
        if (!fl) return;
        Tensor t = mean(x.t, axes, keepdim);
        return push(t, M, E + uc * M * (8 + 4 * sn) + rnd(t.dtype(), M), "mean" + args, n == 0);
      }
      case 3: {
        if (n > 8) return;
        double Mb = std::max(M, 1.0);
        double m = std::pow(Mb, static_cast<double>(n));
        if (m > mag_cap(fl ? d : DType::Int64) || m > 1e5) return;
        Tensor t = prod(x.t, axes, keepdim);
        return push(t, m, n * m / Mb * E + uc * m * (4 * n + 4) + rnd(t.dtype(), m), "prod" + args);
      }
      case 4: case 5: {
        if (!nonempty) return;
        Tensor t = op == 4 ? max(x.t, axes, keepdim) : min(x.t, axes, keepdim);
        return push(t, M, E, std::string(op == 4 ? "max" : "min") + args);
      }
      case 6: {
        if (!x.exact() || x.t.numel() == 0) return;
        if (r == 0 || coin(0.3)) {
          return push(coin(0.5) ? argmax(x.t) : argmin(x.t), static_cast<double>(x.t.numel()), 0,
                      "argmax/argmin(" + x.name + ")");
        }
        int axis = static_cast<int>(range(0, r - 1));
        Tensor t = coin(0.5) ? argmax(x.t, axis, keepdim) : argmin(x.t, axis, keepdim);
        return push(t, static_cast<double>(s[axis]), 0, "argmax/argmin(" + x.name + ", " + std::to_string(axis) + ")");
      }
      case 7: {
        if (!fl || r < 1) return;
        int64_t axis = range(-r, r - 1);
        bool log_form = coin(0.4);
        int64_t na = s[static_cast<size_t>(axis < 0 ? axis + r : axis)];
        double rn = std::sqrt(static_cast<double>(na));
        if (log_form) {
          Tensor t = log_softmax(x.t, axis);
          double m = 2 * M + std::log(static_cast<double>(na) + 1);
          return push(t, m, 2 * E + uc * (8 * M + 8 + 8 * rn) + rnd(t.dtype(), m),
                      "log_softmax(" + x.name + ", " + std::to_string(axis) + ")");
        }
        Tensor t = softmax(x.t, axis);
        return push(t, 1, 2 * E + uc * (16 * M + 16 + 8 * rn) + rnd(t.dtype(), 1),
                    "softmax(" + x.name + ", " + std::to_string(axis) + ")");
      }
      case 8: {
        if (d == DType::Bool) return;
        Tensor t = logsumexp(x.t, axes, keepdim);
        double m = M + std::log(static_cast<double>(n) + 1);
        double ucc = compute_roundoff(t.dtype());
        return push(t, m, E + ucc * (8 * M + 8 + 8 * sn) + rnd(t.dtype(), m), "logsumexp" + args, n == 0);
      }
      case 9: {
        if (!fl) return;
        int64_t corr = range(0, 1);
        double denom = static_cast<double>(n - corr);
        // Over nothing, var is 0/0 = NaN exactly; with n = correction > 0 it is 0/0 or x/0
        // depending on roundoff in x - mean, so that case is not generated.
        if (n == 0) return push(var(x.t, axes, keepdim, corr), 0, 0, "var" + args, true);
        if (denom <= 0) return;
        double f = static_cast<double>(n) / denom;
        double m = 4 * M * M * f;
        Tensor t = var(x.t, axes, keepdim, corr);
        return push(t, m, f * (4 * M * E + uc * M * M * (48 + 32 * sn)) + rnd(t.dtype(), m),
                    "var" + args + " correction=" + std::to_string(corr));
      }
      default: {
        if (!x.exact()) return;
        Tensor t = coin(0.5) ? any(x.t, axes, keepdim) : all(x.t, axes, keepdim);
        return push(t, 1, 0, "any/all" + args);
      }
    }
  }

  void do_matmul() {
    int i = pick([](const Val& v) { return v.dtype() != DType::Bool && !v.shape().empty(); });
    if (i < 0) return;
    Val a = pool_[i];
    const Shape& sa = a.shape();
    int64_t k = sa.back();
    Shape batch_a(sa.begin(), sa.end() - (sa.size() >= 2 ? 2 : 1));
    int j = pick([&](const Val& v) {
      const Shape& sb = v.shape();
      if (v.dtype() == DType::Bool || sb.empty()) return false;
      if (sb.size() == 1) return sb[0] == k;
      if (sb[sb.size() - 2] != k) return false;
      Shape batch_b(sb.begin(), sb.end() - 2);
      return broadcastable(batch_a, batch_b);
    });
    Val b;
    if (j >= 0 && coin(0.7)) {
      b = pool_[j];
    } else if (sa.size() >= 2) {
      b = a;
      b.t = transpose(a.t, -1, -2);
      b.name = a.name + ".T";
    } else {
      b = a;
    }
    Tensor t = matmul(a.t, b.t);
    double kk = static_cast<double>(k), m = kk * a.mag * b.mag;
    if (!is_floating(t.dtype()) && m > mag_cap(t.dtype())) return;
    double u = compute_roundoff(t.dtype());  // half matmuls accumulate in float32
    push(t, m, kk * (a.err * b.mag + b.err * a.mag + a.err * b.err) + u * m * (4 + 4 * std::sqrt(kk)) +
                  rnd(t.dtype(), m),
         "matmul(" + a.name + ", " + b.name + ")");
  }

  void do_where() {
    int i = pick_any();
    if (i < 0) return;
    Val a = pool_[i];
    const Shape& s = a.shape();
    Tensor cond;
    std::string cname;
    int c = pick([&](const Val& v) { return v.dtype() == DType::Bool && v.exact() && broadcastable(v.shape(), s); });
    if (c >= 0 && coin(0.6)) {
      cond = pool_[c].t;
      cname = pool_[c].name;
    } else {
      // A condition of a broadcast-compatible shape: a's shape with some dims set to 1.
      Shape cs(s.end() - static_cast<long>(uni(s.size() + 1)), s.end());
      for (auto& d : cs)
        if (coin(0.3)) d = 1;
      cond = bernoulli(cs, 0.5, gen_);
      cname = "bernoulli" + shape_txt(cs);
    }
    int j = coin(0.3) ? -1 : partner(a);
    Val b;
    if (j >= 0 && broadcastable(pool_[j].shape(), cond.shape())) {
      b = pool_[j];
    } else {
      Scalar sc = scalar_for(a.dtype());
      b = Val{scalar_tensor(sc), mag_of(sc), 0, false, true, sc.str()};
    }
    bool swap = coin(0.5);
    Tensor t = swap ? where(cond, b.t, a.t) : where(cond, a.t, b.t);
    double e = std::max(a.err + conv(a, t.dtype()), b.err + conv(b, t.dtype()));
    push(t, std::max(a.mag, b.mag), e,
         "where(" + cname + ", " + (swap ? b.name + ", " + a.name : a.name + ", " + b.name) + ")");
  }

  void do_clamp() {
    int i = pick([](const Val& v) { return v.dtype() != DType::Bool; });
    if (i < 0) return;
    Val x = pool_[i];
    int64_t lo = range(-8, 2), hi = lo + range(0, 8);
    bool fl = is_floating(x.dtype());
    Scalar slo = fl ? Scalar(lo / 2.0) : Scalar(lo), shi = fl ? Scalar(hi / 2.0) : Scalar(hi);
    push(clamp(x.t, slo, shi), std::min(x.mag, std::max(mag_of(slo), mag_of(shi))), x.err,
         "clamp(" + x.name + ", " + slo.str() + ", " + shi.str() + ")");
  }

  // --- raw meta-ops ---
  /// A random index expression over `nvars` coordinates for a dimension of size `size`:
  /// an affine combination (may leave the range), sometimes through floordiv or mod.
  IndexExpr random_expr(int nvars, int64_t size) {
    IndexExpr e = IndexExpr::constant(range(-1, std::max<int64_t>(size - 1, 0)));
    for (int j = 0; j < nvars; ++j) {
      static const std::vector<int64_t> coefs = {0, 0, 1, 1, -1, 2};
      int64_t a = pick_of(coefs);
      if (a == 0) continue;
      IndexExpr v = IndexExpr::var(j);
      if (coin(0.15)) v = floordiv(v, IndexExpr::constant(2));
      e = e + IndexExpr::constant(a) * v;
    }
    if (coin(0.15) && size > 0) e = mod(e, IndexExpr::constant(size));
    if (coin(0.1)) e = min(e, IndexExpr::constant(std::max<int64_t>(size - 1, 0)));
    return e;
  }

  static std::string map_txt(const std::vector<IndexExpr>& m) {
    std::string s = "[";
    for (size_t k = 0; k < m.size(); ++k) s += (k ? ", " : "") + m[k].str();
    return s + "]";
  }

  void raw_reindex() {
    int i = pick_any();
    if (i < 0) return;
    Val x = pool_[i];
    const Shape& s = x.shape();
    Shape out;
    int orank = static_cast<int>(range(0, 4));
    for (int k = 0; k < orank; ++k) out.push_back(coin(0.05) ? 0 : range(1, 6));
    std::vector<IndexExpr> map;
    for (size_t d = 0; d < s.size(); ++d) map.push_back(random_expr(orank, s[d]));
    Scalar fill = scalar_for(x.dtype());
    std::string what = "reindex(" + x.name + ", " + shape_txt(out) + ", " + map_txt(map) + ", fill=" + fill.str() + ")";
    push(reindex(x.t, out, map, fill), std::max(x.mag, mag_of(fill)), x.err, what);
  }

  void raw_reindex_reduce() {
    int i = pick_any();
    if (i < 0) return;
    Val x = pool_[i];
    const Shape& s = x.shape();
    DType d = x.dtype();
    if (x.t.numel() > 2000) return;
    Shape out;
    int orank = static_cast<int>(range(0, 3));
    for (int k = 0; k < orank; ++k) out.push_back(range(1, 5));
    std::vector<IndexExpr> map;
    for (int k = 0; k < orank; ++k) map.push_back(random_expr(static_cast<int>(s.size()), out[k]));
    // Count the contributions to each target on the host: the bounds need the largest
    // count, and max/min over an untouched target give the identity (+-inf or a dtype limit).
    std::vector<int64_t> count(static_cast<size_t>(numel(out)), 0);
    std::vector<int64_t> c(s.size(), 0), strides = contiguous_strides(out);
    auto no_load = [](int, const int64_t*) -> int64_t { return 0; };
    for (int64_t e = 0; e < x.t.numel(); ++e) {
      int64_t flat = 0;
      bool inside = true;
      for (size_t k = 0; k < map.size(); ++k) {
        int64_t v = map[k].evaluate(c.data(), no_load);
        if (v < 0 || v >= out[k]) inside = false;
        else flat += v * strides[k];
      }
      if (inside) ++count[static_cast<size_t>(flat)];
      for (size_t k = s.size(); k-- > 0;) {
        if (++c[k] < s[k]) break;
        c[k] = 0;
      }
    }
    int64_t cmax = 0;
    bool empty_target = false;
    for (int64_t v : count) cmax = std::max(cmax, v), empty_target = empty_target || v == 0;
    double n = static_cast<double>(cmax), M = x.mag, E = x.err, u = unit_roundoff(d);
    ReduceOp op;
    double mag, err;
    bool special = false;
    int w = static_cast<int>(uni(d == DType::Bool ? 6 : 4));
    switch (w) {
      case 0:
        op = ReduceOp::Sum;
        mag = n * M;
        err = n * E + u * mag * (4 + 4 * std::sqrt(n));
        break;
      case 1: {
        if (cmax > 6) return;
        op = ReduceOp::Prod;
        double Mb = std::max(M, 1.0);
        mag = std::pow(Mb, n);
        if (mag > 1e5) return;
        err = n * mag / Mb * E + u * mag * (4 * n + 4);
        break;
      }
      case 2: case 3:
        op = w == 2 ? ReduceOp::Max : ReduceOp::Min;
        mag = M;
        err = E;
        special = empty_target;
        break;
      default:
        op = w == 4 ? ReduceOp::And : ReduceOp::Or;
        mag = 1;
        err = 0;
        break;
    }
    std::string what = "reindex_reduce(" + x.name + ", " + std::string(reduce_name(op)) + ", " + shape_txt(out) +
                       ", " + map_txt(map) + ")";
    push(reindex_reduce(x.t, op, out, map), mag, err, what, special);
  }

  void choose_outputs() {
    std::vector<int> chosen;
    for (int k = static_cast<int>(pool_.size()); k-- > 0;) {
      if (!pool_[k].leaf) {
        chosen.push_back(k);
        break;
      }
    }
    int extra = static_cast<int>(uni(3));
    for (int e = 0; e < extra; ++e) {
      int k = static_cast<int>(uni(pool_.size()));
      if (pool_[k].t.node()->op == OpCode::Constant) continue;
      if (std::find(chosen.begin(), chosen.end(), k) == chosen.end()) chosen.push_back(k);
    }
    if (chosen.empty()) chosen.push_back(static_cast<int>(pool_.size()) - 1);
    for (int k : chosen) {
      g_.outputs.push_back(pool_[k].t);
      g_.output_err.push_back(pool_[k].err);
      g_.log.push_back("output " + pool_[k].name);
    }
  }

  std::mt19937_64 rng_;
  Generator gen_;
  RandomGraphOptions opt_;
  RandomGraph& g_;
};

}  // namespace detail_graph

/// Builds the graph of `seed`; deterministic: equal seeds give equal graphs and data.
inline RandomGraph build_random_graph(uint64_t seed, const RandomGraphOptions& options = {}) {
  RandomGraph g;
  g.seed = seed;
  detail_graph::GraphBuilder(seed, options, g).build();
  return g;
}

/// The graph's build log, one line per step (for failure reports).
inline std::string graph_log(const RandomGraph& g) {
  std::string s;
  for (const std::string& line : g.log) s += line + "\n";
  return s;
}

}  // namespace kiln::test
