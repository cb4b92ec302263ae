// Reductions, softmax and logsumexp against plain float64 loops over the same input values,
// across dtypes, ranks 0-5, keepdim, negative and multiple axes, and zero-size dims.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "frontend/kiln.h"

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Inputs with the dtype's own rounding; integers stay small so products do not overflow.
Tensor random_input(const Shape& shape, DType dtype, kiln::Generator& gen) {
  if (kiln::is_floating(dtype)) return kiln::randn(shape, dtype, gen);
  if (dtype == DType::Bool) return kiln::bernoulli(shape, 0.6, gen);
  return kiln::cast(kiln::randint(-3, 4, shape, gen), dtype);
}

std::vector<bool> mask_of(const Shape& shape, const std::vector<int64_t>& axes) {
  std::vector<bool> mask(shape.size(), axes.empty());
  const auto rank = static_cast<int64_t>(shape.size());
  for (int64_t a : axes) {
    if (rank > 0) mask[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  }
  return mask;
}

Shape out_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// The values of each output element's reduction group, in output order; inside a group the
// order is row-major over the reduced dims, so a single-axis position is the axis index.
std::vector<std::vector<double>> groups(const std::vector<double>& values, const Shape& shape,
                                        const std::vector<bool>& mask) {
  Shape kept = out_shape(shape, mask, false);
  std::vector<std::vector<double>> out(static_cast<size_t>(kiln::numel(kept)));
  std::vector<int64_t> c(shape.size(), 0);
  for (double v : values) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (!mask[d]) flat = flat * shape[d] + c[d];
    }
    out[static_cast<size_t>(flat)].push_back(v);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++c[d] < shape[d]) break;
      c[d] = 0;
    }
  }
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                 double abs_tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
    } else if (std::isinf(want[i])) {
      CHECK(got[i] == want[i]);
    } else {
      CHECK(std::fabs(got[i] - want[i]) <= abs_tol + rel * std::fabs(want[i]));
    }
  }
}

struct ReduceCase {
  Shape shape;
  std::vector<int64_t> axes;
};

// Ranks 0-5 with all-axes, each single axis (alternating negative), a pair and a triple.
std::vector<ReduceCase> reduce_cases() {
  std::vector<Shape> shapes = {{}, {7}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}, {2, 3, 1, 2, 2}};
  std::vector<ReduceCase> cases;
  for (const Shape& s : shapes) {
    const auto r = static_cast<int64_t>(s.size());
    cases.push_back({s, {}});
    if (r == 0) {
      cases.push_back({s, {0}});
      cases.push_back({s, {-1}});
    }
    for (int64_t a = 0; a < r; ++a) cases.push_back({s, {a % 2 ? a - r : a}});
    if (r >= 2) cases.push_back({s, {0, -1}});
    if (r >= 3) cases.push_back({s, {-1, 0, 1}});
  }
  return cases;
}

struct Tolerance {
  double rel, abs;
};

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return {1e-2, 1e-3};
    case DType::BFloat16:
      return {2e-2, 1e-2};
    case DType::Float32:
      return {1e-5, 1e-6};
    case DType::Float64:
      return {1e-12, 1e-12};
    default:
      return {0, 0};
  }
}

using KilnReduce = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;
using LoopReduce = std::function<double(const std::vector<double>&)>;

// Runs `op` over every case and keepdim, comparing shape, dtype and values with `loop`.
void check_reduction(const KilnReduce& op, const LoopReduce& loop, DType dtype, DType want_dtype,
                     uint64_t seed) {
  kiln::Generator gen(seed);
  Tolerance tol = tolerance_for(want_dtype);
  for (const ReduceCase& c : reduce_cases()) {
    for (bool keepdim : {false, true}) {
      INFO("dtype " << kiln::dtype_name(dtype) << " shape " << kiln::shape_str(c.shape) << " axes "
                    << c.axes.size() << " first " << (c.axes.empty() ? 99 : c.axes[0])
                    << " keepdim " << keepdim);
      Tensor x = random_input(c.shape, dtype, gen);
      Tensor y = op(x, c.axes, keepdim);
      std::vector<bool> mask = mask_of(c.shape, c.axes);
      CHECK(y.shape() == out_shape(c.shape, mask, keepdim));
      CHECK(y.dtype() == want_dtype);
      std::vector<double> want;
      for (const auto& g : groups(x.to_vector<double>(), c.shape, mask)) want.push_back(loop(g));
      check_close(y.to_vector<double>(), want, tol.rel, tol.abs);
    }
  }
}

double loop_sum(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double loop_prod(const std::vector<double>& g) {
  double p = 1;
  for (double v : g) p *= v;
  return p;
}
double loop_mean(const std::vector<double>& g) {
  return loop_sum(g) / static_cast<double>(g.size());
}
double loop_max(const std::vector<double>& g) { return *std::max_element(g.begin(), g.end()); }
double loop_min(const std::vector<double>& g) { return *std::min_element(g.begin(), g.end()); }
double loop_var(const std::vector<double>& g, int64_t correction) {
  double m = loop_mean(g), s = 0;
  for (double v : g) s += (v - m) * (v - m);
  return s / std::max<double>(static_cast<double>(g.size()) - static_cast<double>(correction), 0.0);
}
double loop_logsumexp(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += std::exp(v);
  return std::log(s);
}

template <typename E, typename F>
void check_error(F&& build, const std::vector<std::string>& parts) {
  CHECK_THROWS_AS(build(), E);
  try {
    build();
  } catch (const E& e) {
    for (const std::string& p : parts) CHECK_THAT(e.what(), Catch::Contains(p));
  }
}

}  // namespace

TEST_CASE("sum and prod match a float64 loop with PyTorch result dtypes", "[reduce]") {
  auto sum = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::sum(x, a, k);
  };
  auto prod = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::prod(x, a, k);
  };
  check_reduction(sum, loop_sum, DType::Float32, DType::Float32, 1);
  check_reduction(sum, loop_sum, DType::Float64, DType::Float64, 2);
  check_reduction(sum, loop_sum, DType::Float16, DType::Float16, 3);
  check_reduction(sum, loop_sum, DType::Int32, DType::Int64, 4);
  check_reduction(sum, loop_sum, DType::Int64, DType::Int64, 5);
  check_reduction(sum, loop_sum, DType::Bool, DType::Int64, 6);
  check_reduction(prod, loop_prod, DType::Float32, DType::Float32, 7);
  check_reduction(prod, loop_prod, DType::Float64, DType::Float64, 8);
  check_reduction(prod, loop_prod, DType::Int32, DType::Int64, 9);
  check_reduction(prod, loop_prod, DType::Bool, DType::Int64, 10);
}

TEST_CASE("mean, max and min match a float64 loop", "[reduce]") {
  auto mean = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::mean(x, a, k);
  };
  auto max = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::max(x, a, k);
  };
  auto min = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::min(x, a, k);
  };
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    check_reduction(mean, loop_mean, d, d, 11);
  }
  for (DType d :
       {DType::Float32, DType::Float64, DType::Float16, DType::Int32, DType::Int64, DType::Bool}) {
    check_reduction(max, loop_max, d, d, 12);
    check_reduction(min, loop_min, d, d, 13);
  }
}

TEST_CASE("all and any cast to bool and match a loop", "[reduce]") {
  auto all = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::all(x, a, k);
  };
  auto any = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::any(x, a, k);
  };
  auto loop_all = [](const std::vector<double>& g) {
    return std::all_of(g.begin(), g.end(), [](double v) { return v != 0; }) ? 1.0 : 0.0;
  };
  auto loop_any = [](const std::vector<double>& g) {
    return std::any_of(g.begin(), g.end(), [](double v) { return v != 0; }) ? 1.0 : 0.0;
  };
  for (DType d : {DType::Bool, DType::Int32, DType::Int64}) {
    check_reduction(all, loop_all, d, DType::Bool, 14);
    check_reduction(any, loop_any, d, DType::Bool, 15);
  }
  // NaN is truthy, as bool(float('nan')) in Python.
  Tensor x = kiln::from_vector<float>({0.0f, NAN, 0.5f, 0.0f}, {2, 2});
  CHECK(kiln::any(x, 1).to_vector<int>() == std::vector<int>{1, 1});
  CHECK(kiln::all(x, 0).to_vector<int>() == std::vector<int>{0, 0});
  CHECK(kiln::all(x, -1).to_vector<int>() == std::vector<int>{0, 0});
}

// Rows long enough for the vectorized reduction loops (printer_cpp.cpp, reduce_loop): the
// vector body, its epilogue and the scalar tail (1037 = 16 * 64 + 13), per row, over a
// middle dim and over the whole domain; NaN in the vector body, in the tail and nowhere.
TEST_CASE("long rows match a loop and propagate NaN and repeat bit for bit", "[reduce]") {
  kiln::Generator gen(41);
  const std::vector<ReduceCase> cases = {
      {{3, 1037}, {1}}, {{3, 1037}, {}}, {{4, 5, 131}, {1, 2}}, {{4, 5, 131}, {-1}}};
  // Compares with a float64 loop; sums get a tolerance per group that scales with the sum
  // of magnitudes (the combining order is the kernel's, not the loop's).
  auto check = [&](const Tensor& x, const ReduceCase& c, const KilnReduce& op,
                   const LoopReduce& loop, double rel) {
    INFO("dtype " << kiln::dtype_name(x.dtype()) << " shape " << kiln::shape_str(c.shape)
                  << " axes " << c.axes.size());
    std::vector<double> want, tol;
    for (const auto& g : groups(x.to_vector<double>(), c.shape, mask_of(c.shape, c.axes))) {
      want.push_back(loop(g));
      double mag = 0;
      for (double v : g) mag += std::fabs(v);
      tol.push_back(rel * mag);
    }
    const std::vector<double> got = op(x, c.axes, false).to_vector<double>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      if (std::isnan(want[i])) {
        CHECK(std::isnan(got[i]));
      } else {
        CHECK((got[i] == want[i] || std::fabs(got[i] - want[i]) <= tol[i]));
      }
    }
  };
  auto sum = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::sum(x, a, k);
  };
  auto prod = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::prod(x, a, k);
  };
  auto max = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::max(x, a, k);
  };
  auto min = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::min(x, a, k);
  };
  auto all = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::all(x, a, k);
  };
  auto any = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::any(x, a, k);
  };
  // NaN (or the max/min extreme) is the loop's answer when the group holds one.
  auto nan_loop = [](const LoopReduce& loop) {
    return [loop](const std::vector<double>& g) {
      for (double v : g)
        if (std::isnan(v)) return std::nan("");
      return loop(g);
    };
  };
  auto loop_all = [](const std::vector<double>& g) {
    return std::all_of(g.begin(), g.end(), [](double v) { return v != 0; }) ? 1.0 : 0.0;
  };
  auto loop_any = [](const std::vector<double>& g) {
    return std::any_of(g.begin(), g.end(), [](double v) { return v != 0; }) ? 1.0 : 0.0;
  };
  for (const ReduceCase& c : cases) {
    const int64_t n = kiln::numel(c.shape);
    for (DType d : {DType::Float32, DType::Float64}) {
      const double eps = d == DType::Float32 ? 1e-6 : 1e-14;
      Tensor x = kiln::randn(c.shape, d, gen);
      check(x, c, sum, loop_sum, eps);
      // Factors near one keep a product of a thousand in range.
      check(
          kiln::randn(c.shape, d, gen) * 0.01 + 1.0, c, prod,
          [](const std::vector<double>& g) { return loop_prod(g); }, 8 * eps);
      std::vector<double> v = x.to_vector<double>();
      v[5] = NAN;                           // the vector body of the first row
      v[static_cast<size_t>(n) - 3] = NAN;  // the scalar tail of the last row
      v[static_cast<size_t>(n) / 2] = kInf;
      Tensor xn = kiln::cast(kiln::from_vector<double>(v, c.shape), d);
      check(xn, c, max, nan_loop(loop_max), 0);
      check(xn, c, min, nan_loop(loop_min), 0);
      check(x, c, max, loop_max, 0);
      check(x, c, min, loop_min, 0);
    }
    Tensor xi = kiln::randint(-3, 4, c.shape, gen);
    check(xi, c, sum, loop_sum, 0);
    check(xi, c, max, loop_max, 0);
    check(xi, c, min, loop_min, 0);
    // Signs only: an exact product of a thousand integers.
    check(
        kiln::cast(kiln::bernoulli(c.shape, 0.5, gen), DType::Int64) * 2 - 1, c, prod,
        [](const std::vector<double>& g) { return loop_prod(g); }, 0);
    std::vector<double> ones(static_cast<size_t>(n), 1.0);
    ones[1000] = 0;
    Tensor mostly = kiln::from_vector<double>(ones, c.shape);
    check(kiln::cast(mostly, DType::Int64), c, all, loop_all, 0);
    check(kiln::cast(mostly, DType::Int64) - 1, c, any, loop_any, 0);
  }
  // The same input gives the same bits on every evaluation (the pool's split of the range
  // and each row's combining order are fixed by the shape and the thread count).
  Tensor a = kiln::randn({100003}, DType::Float32, gen),
         b = kiln::randn({100003}, DType::Float32, gen),
         cc = kiln::randn({100003}, DType::Float32, gen);
  const float first = kiln::sum(kiln::relu(a * b + cc)).item<float>();
  for (int rep = 0; rep < 3; ++rep) CHECK(kiln::sum(kiln::relu(a * b + cc)).item<float>() == first);
}

TEST_CASE("var and std honour the correction and match a loop", "[reduce]") {
  for (int64_t correction : {0, 1, 2}) {
    auto var = [=](const Tensor& x, const std::vector<int64_t>& a, bool k) {
      return kiln::var(x, a, k, correction);
    };
    auto stdev = [=](const Tensor& x, const std::vector<int64_t>& a, bool k) {
      return kiln::std(x, a, k, correction);
    };
    auto loop_v = [=](const std::vector<double>& g) { return loop_var(g, correction); };
    auto loop_s = [=](const std::vector<double>& g) { return std::sqrt(loop_var(g, correction)); };
    for (DType d : {DType::Float32, DType::Float64, DType::Float16}) {
      check_reduction(var, loop_v, d, d, 16 + static_cast<uint64_t>(correction));
      check_reduction(stdev, loop_s, d, d, 20 + static_cast<uint64_t>(correction));
    }
  }
  // One element with correction 1 divides 0 by 0, as torch does.
  CHECK(std::isnan(kiln::var(kiln::from_vector<float>({3.0f})).item<double>()));
  CHECK(kiln::var(kiln::from_vector<double>({1.0, 2.0, 4.0})).item<double>() ==
        Approx(7.0 / 3.0).epsilon(1e-12));
}

TEST_CASE("logsumexp is stable and maps all -inf rows to -inf", "[reduce]") {
  auto lse = [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    return kiln::logsumexp(x, a, k);
  };
  for (DType d : {DType::Float32, DType::Float64, DType::Float16})
    check_reduction(lse, loop_logsumexp, d, d, 24);
  check_reduction(lse, loop_logsumexp, DType::Int32, DType::Float32, 25);

  const float inf = std::numeric_limits<float>::infinity();
  Tensor x =
      kiln::from_vector<float>({-inf, -inf, -inf, 1000.0f, 1000.0f, -inf, 0.0f, inf, 1.0f}, {3, 3});
  std::vector<double> got = kiln::logsumexp(x, 1).to_vector<double>();
  CHECK(got[0] == -kInf);
  CHECK(got[1] == Approx(1000.0 + std::log(2.0)).epsilon(1e-6));
  CHECK(got[2] == kInf);
  CHECK(kiln::logsumexp(x, 1, true).shape() == Shape{3, 1});
}

TEST_CASE("softmax and log_softmax match a loop and rows sum to one", "[reduce]") {
  kiln::Generator gen(26);
  for (DType d : {DType::Float32, DType::Float64, DType::Float16}) {
    Tolerance tol = tolerance_for(d);
    for (const Shape& shape : std::vector<Shape>{{}, {6}, {3, 5}, {2, 3, 4}, {2, 1, 3, 2, 2}}) {
      const auto rank = static_cast<int64_t>(shape.size());
      for (int64_t axis = -std::max<int64_t>(rank, 1); axis < std::max<int64_t>(rank, 1); ++axis) {
        INFO("dtype " << kiln::dtype_name(d) << " shape " << kiln::shape_str(shape) << " axis "
                      << axis);
        // Scaled by 30 so that an unshifted exp would overflow float16.
        Tensor x = kiln::cast(kiln::randn(shape, DType::Float64, gen) * 30.0, d);
        std::vector<bool> mask(shape.size(), false);
        if (rank > 0) mask[static_cast<size_t>(axis < 0 ? axis + rank : axis)] = true;
        std::vector<double> xs = x.to_vector<double>();
        auto gs = groups(xs, shape, mask);
        // Rebuild the softmax in input order: value i belongs to group g at a known slot.
        std::vector<double> want_sm, want_lsm;
        {
          std::vector<size_t> slot(gs.size(), 0);
          std::vector<int64_t> c(shape.size(), 0);
          for (size_t i = 0; i < xs.size(); ++i) {
            int64_t flat = 0;
            for (size_t dd = 0; dd < shape.size(); ++dd) {
              if (!mask[dd]) flat = flat * shape[dd] + c[dd];
            }
            const auto& g = gs[static_cast<size_t>(flat)];
            double m = loop_max(g), s = 0;
            for (double v : g) s += std::exp(v - m);
            want_sm.push_back(std::exp(xs[i] - m) / s);
            want_lsm.push_back(xs[i] - m - std::log(s));
            for (size_t dd = shape.size(); dd-- > 0;) {
              if (++c[dd] < shape[dd]) break;
              c[dd] = 0;
            }
          }
        }
        Tensor sm = kiln::softmax(x, axis);
        Tensor lsm = kiln::log_softmax(x, axis);
        CHECK(sm.shape() == shape);
        CHECK(sm.dtype() == d);
        CHECK(lsm.dtype() == d);
        check_close(sm.to_vector<double>(), want_sm, tol.rel, tol.abs);
        check_close(lsm.to_vector<double>(), want_lsm, tol.rel, std::max(tol.abs, tol.rel));
        std::vector<double> row_sums =
            kiln::sum(kiln::cast(sm, DType::Float64), {axis}).to_vector<double>();
        for (double s : row_sums)
          CHECK(s == Approx(1.0).epsilon(d == DType::Float16 ? 1e-2 : 1e-5));
      }
    }
  }
}

TEST_CASE("argmax and argmin return the first extreme as int64", "[reduce]") {
  kiln::Generator gen(27);
  for (DType d : {DType::Float32, DType::Int32, DType::Int64, DType::Float16}) {
    for (const Shape& shape : std::vector<Shape>{{5}, {4, 6}, {2, 3, 5}, {2, 1, 3, 2, 4}}) {
      const auto rank = static_cast<int64_t>(shape.size());
      // Values in {0, 1, 2} make ties in almost every row.
      Tensor x = kiln::cast(kiln::randint(0, 3, shape, gen), d);
      std::vector<double> xs = x.to_vector<double>();
      for (int64_t axis = -rank; axis < rank; ++axis) {
        for (bool keepdim : {false, true}) {
          INFO("dtype " << kiln::dtype_name(d) << " shape " << kiln::shape_str(shape) << " axis "
                        << axis << " keepdim " << keepdim);
          std::vector<bool> mask(shape.size(), false);
          mask[static_cast<size_t>(axis < 0 ? axis + rank : axis)] = true;
          std::vector<double> want_max, want_min;
          for (const auto& g : groups(xs, shape, mask)) {
            want_max.push_back(
                static_cast<double>(std::max_element(g.begin(), g.end()) - g.begin()));
            want_min.push_back(
                static_cast<double>(std::min_element(g.begin(), g.end()) - g.begin()));
          }
          Tensor am = kiln::argmax(x, axis, keepdim);
          Tensor an = kiln::argmin(x, axis, keepdim);
          CHECK(am.dtype() == DType::Int64);
          CHECK(am.shape() == out_shape(shape, mask, keepdim));
          CHECK(am.to_vector<double>() == want_max);
          CHECK(an.to_vector<double>() == want_min);
        }
      }
      // Without an axis the answer is the row-major flat index.
      CHECK(kiln::argmax(x).shape() == Shape{});
      CHECK(kiln::argmax(x).item<int64_t>() == std::max_element(xs.begin(), xs.end()) - xs.begin());
      CHECK(kiln::argmin(x).item<int64_t>() == std::min_element(xs.begin(), xs.end()) - xs.begin());
    }
  }
  // torch treats NaN as the extreme of both argmax and argmin and reports the first one.
  Tensor n = kiln::from_vector<float>({1.0f, NAN, 5.0f, NAN, -2.0f, 0.0f, 4.0f, 4.0f}, {2, 4});
  CHECK(kiln::argmax(n, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  CHECK(kiln::argmin(n, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(kiln::argmax(kiln::from_vector<bool>({false, true, true})).item<int64_t>() == 1);
  CHECK(kiln::argmax(kiln::tensor(3.5f)).item<int64_t>() == 0);
  CHECK(kiln::argmin(kiln::tensor(3.5f), 0).item<int64_t>() == 0);
}

TEST_CASE("reductions over zero-size dims follow torch", "[reduce]") {
  Tensor e = kiln::zeros({0, 3});
  CHECK(kiln::sum(e, 0).shape() == Shape{3});
  CHECK(kiln::sum(e, 0).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(kiln::sum(e).item<double>() == 0.0);
  CHECK(kiln::prod(e, 0).to_vector<double>() == std::vector<double>{1, 1, 1});
  CHECK(kiln::sum(kiln::zeros({0}, DType::Int32)).dtype() == DType::Int64);
  CHECK(kiln::sum(kiln::zeros({0}, DType::Int32)).item<int64_t>() == 0);
  for (double v : kiln::mean(e, 0).to_vector<double>()) CHECK(std::isnan(v));
  CHECK(kiln::max(e, {1}).shape() == Shape{0});
  CHECK(kiln::argmax(e, 1).shape() == Shape{0});
  CHECK(kiln::all(e, {0, 1}).item<bool>());
  CHECK_FALSE(kiln::any(e, {0, 1}).item<bool>());
  CHECK(kiln::logsumexp(e, 0).to_vector<double>() == std::vector<double>{-kInf, -kInf, -kInf});
  CHECK(kiln::softmax(e, 0).shape() == Shape{0, 3});
  CHECK(kiln::sum(kiln::zeros({2, 0, 4}), {1}, true).shape() == Shape{2, 1, 4});
}

TEST_CASE("rank-0 and single-axis overloads", "[reduce]") {
  Tensor s = kiln::tensor(2.5f);
  CHECK(kiln::sum(s).item<double>() == 2.5);
  CHECK(kiln::sum(s, 0).shape() == Shape{});
  CHECK(kiln::sum(s, -1, true).shape() == Shape{});
  CHECK(kiln::softmax(s, 0).item<double>() == 1.0);
  CHECK(kiln::log_softmax(s, -1).item<double>() == 0.0);

  Tensor x = kiln::cast(kiln::arange(24), DType::Float32);
  Tensor x3 = kiln::reindex(
      x, {2, 3, 4},
      {kiln::IndexExpr::var(0) * kiln::IndexExpr::constant(12) +
       kiln::IndexExpr::var(1) * kiln::IndexExpr::constant(4) + kiln::IndexExpr::var(2)});
  // `{}` selects every axis, `{1}` and `1` the same single axis.
  CHECK(kiln::sum(x3, {}).item<double>() == 276.0);
  CHECK(kiln::sum(x3, {1}).to_vector<double>() == kiln::sum(x3, 1).to_vector<double>());
  CHECK(kiln::sum(x3, int64_t{-2}).to_vector<double>() == kiln::sum(x3, 1).to_vector<double>());
  CHECK(kiln::max(x3, {0, 2}).to_vector<double>() == std::vector<double>{15, 19, 23});
  CHECK(kiln::mean(x3, {-1, 0}, true).shape() == Shape{1, 3, 1});
  CHECK(kiln::var(x3, 1).to_vector<double>() == kiln::var(x3, {1}).to_vector<double>());
  CHECK(kiln::std(x3, -1, true, 0).shape() == Shape{2, 3, 1});
  CHECK(kiln::var(x3, size_t{2}).to_vector<double>() == kiln::var(x3, {-1}).to_vector<double>());
}

TEST_CASE("reduction errors name the op, the shape or dtype, and what was expected",
          "[reduce][errors]") {
  Tensor f = kiln::zeros({2, 3});
  Tensor i = kiln::zeros({2, 3}, DType::Int32);
  check_error<kiln::DTypeError>([&] { return kiln::mean(i); },
                                {"[mean]", "int32", "[2, 3]", "floating"});
  check_error<kiln::ShapeError>(
      [&] {
        return kiln::sum(f, {1, -1});
      },
      {"[sum]", "more than once", "[1, -1]", "[2, 3]"});
  check_error<kiln::ShapeError>([&] { return kiln::max(f, {2}); },
                                {"[max]", "axis 2", "[2, 3]", "[-2, 1]"});
  check_error<kiln::ShapeError>([&] { return kiln::var(f, {-3}); }, {"[var]", "axis -3", "[2, 3]"});
  check_error<kiln::ValueError>(
      [&] {
        return kiln::max(kiln::zeros({2, 0, 3}), {1});
      },
      {"[max]", "zero-size", "[2, 0, 3]"});
  check_error<kiln::ValueError>(
      [&] {
        return kiln::min(kiln::zeros({0, 3}));
      },
      {"[min]", "zero-size", "[0, 3]"});
  check_error<kiln::ValueError>(
      [&] {
        return kiln::argmax(kiln::zeros({4, 0}), 1);
      },
      {"[argmax]", "zero-size", "[4, 0]"});
  check_error<kiln::ValueError>([&] { return kiln::argmin(kiln::zeros({0})); },
                                {"[argmin]", "[0]"});
  check_error<kiln::DTypeError>([&] { return kiln::softmax(i, 1); },
                                {"[softmax]", "int32", "[2, 3]"});
  check_error<kiln::DTypeError>(
      [&] { return kiln::log_softmax(kiln::zeros({4}, DType::Int64), 0); },
      {"[log_softmax]", "int64", "[4]"});
  check_error<kiln::DTypeError>([&] { return kiln::var(i); }, {"[var]", "int32", "[2, 3]"});
  check_error<kiln::DTypeError>([&] { return kiln::std(kiln::zeros({3}, DType::Bool)); },
                                {"[std]", "bool"});
  check_error<kiln::ShapeError>([&] { return kiln::softmax(f, 2); }, {"[softmax]", "[2, 3]"});
  check_error<kiln::ShapeError>([&] { return kiln::argmax(f, -3); }, {"[argmax]", "[2, 3]"});
  check_error<kiln::ValueError>([&] { return kiln::sum(Tensor()); }, {"[sum]", "undefined"});
}
