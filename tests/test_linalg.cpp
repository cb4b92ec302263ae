// matmul (every torch.matmul shape rule), linear and outer against a plain float64 loop,
// across dtypes and dtype promotion, plus the error messages for bad operands.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "frontend/kiln.h"

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

namespace {

Tensor random_operand(const Shape& shape, DType dtype, kiln::Generator& gen) {
  if (kiln::is_floating(dtype)) return kiln::randn(shape, dtype, gen);
  return kiln::cast(kiln::randint(-5, 6, shape, gen), dtype);
}

struct LoopResult {
  Shape shape;
  std::vector<double> values;
  /// Sum of |a_ik * b_kj| per output: the scale a floating error is relative to.
  std::vector<double> magnitude;
};

// torch.matmul written out directly: promote vectors, broadcast batch, triple loop, drop.
LoopResult loop_matmul(const std::vector<double>& av, Shape sa, const std::vector<double>& bv,
                       Shape sb) {
  bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t rank = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), rank - ba.size(), 1);
  bb.insert(bb.begin(), rank - bb.size(), 1);
  Shape batch(rank);
  for (size_t d = 0; d < rank; ++d) batch[d] = ba[d] == 1 ? bb[d] : ba[d];

  LoopResult r;
  std::vector<int64_t> c(rank, 0);
  for (int64_t bi = 0; bi < kiln::numel(batch); ++bi) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < rank; ++d) {
      oa = oa * ba[d] + (ba[d] == 1 ? 0 : c[d]);
      ob = ob * bb[d] + (bb[d] == 1 ? 0 : c[d]);
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          double t = av[static_cast<size_t>((oa * m + i) * k + p)] *
                     bv[static_cast<size_t>((ob * k + p) * n + j)];
          s += t;
          mag += std::fabs(t);
        }
        r.values.push_back(s);
        r.magnitude.push_back(mag);
      }
    }
    for (size_t d = rank; d-- > 0;) {
      if (++c[d] < batch[d]) break;
      c[d] = 0;
    }
  }
  r.shape = batch;
  if (!a_vec) r.shape.push_back(m);
  if (!b_vec) r.shape.push_back(n);
  return r;
}

double rel_tolerance(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return 1e-2;
    case DType::BFloat16:
      return 2e-2;
    case DType::Float32:
      return 1e-5;
    case DType::Float64:
      return 1e-12;
    default:
      return 0;  // integers are exact
  }
}

void check_matches_loop(const Tensor& got, const LoopResult& want, DType dtype) {
  CHECK(got.shape() == want.shape);
  CHECK(got.dtype() == dtype);
  std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.values.size());
  double rel = rel_tolerance(dtype);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << want.values[i]);
    CHECK(std::fabs(g[i] - want.values[i]) <= rel * (want.magnitude[i] + 1e-3));
  }
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

struct ShapeCase {
  Shape a, b, out;
};

const std::vector<ShapeCase>& shape_cases() {
  static const std::vector<ShapeCase> cases = {
      {{3}, {3}, {}},                                 // dot
      {{2, 3}, {3}, {2}},                             // matrix-vector
      {{3}, {3, 4}, {4}},                             // vector-matrix
      {{2, 3}, {3, 4}, {2, 4}},                       // matrix-matrix
      {{1, 1}, {1, 1}, {1, 1}},                       //
      {{2, 1, 3, 4}, {5, 4, 2}, {2, 5, 3, 2}},        // broadcast batch
      {{4}, {2, 4, 3}, {2, 3}},                       // vector against a batch
      {{2, 3, 4}, {4}, {2, 3}},                       // batch against a vector
      {{1, 2, 3}, {5, 3, 2}, {5, 2, 2}},              // size-1 batch
      {{3, 1, 2, 2, 3}, {2, 3, 2}, {3, 1, 2, 2, 2}},  // rank 5
      {{2, 3, 0}, {0, 4}, {2, 3, 4}},                 // empty k sums to zero
      {{0, 3}, {3, 2}, {0, 2}},                       // empty m
      {{0, 2, 3}, {3, 1}, {0, 2, 1}},                 // empty batch
  };
  return cases;
}

}  // namespace

TEST_CASE("matmul follows torch.matmul shape rules and matches a loop", "[matmul]") {
  kiln::Generator gen(101);
  struct DTypeCase {
    DType a, b, out;
  };
  const std::vector<DTypeCase> dtypes = {
      {DType::Float32, DType::Float32, DType::Float32},
      {DType::Float64, DType::Float64, DType::Float64},
      {DType::Float16, DType::Float16, DType::Float16},
      {DType::BFloat16, DType::BFloat16, DType::BFloat16},
      {DType::Int32, DType::Int32, DType::Int32},
      {DType::Int64, DType::Int64, DType::Int64},
      {DType::Int32, DType::Float32, DType::Float32},
      {DType::Float16, DType::Float32, DType::Float32},
      {DType::Int64, DType::Float64, DType::Float64},
      {DType::Int8, DType::Int32, DType::Int32},
  };
  for (const DTypeCase& d : dtypes) {
    for (const ShapeCase& c : shape_cases()) {
      INFO(kiln::dtype_name(d.a) << kiln::shape_str(c.a) << " x " << kiln::dtype_name(d.b)
                                 << kiln::shape_str(c.b));
      Tensor a = random_operand(c.a, d.a, gen);
      Tensor b = random_operand(c.b, d.b, gen);
      Tensor y = kiln::matmul(a, b);
      CHECK(y.shape() == c.out);
      LoopResult want = loop_matmul(a.to_vector<double>(), c.a, b.to_vector<double>(), c.b);
      REQUIRE(want.shape == c.out);
      check_matches_loop(y, want, d.out);
    }
  }
}

TEST_CASE("matmul of integers wraps like the stored type and is exact", "[matmul]") {
  Tensor a = kiln::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = kiln::from_vector<int32_t>({7, 8, 9, 10, 11, 12}, {3, 2});
  CHECK(kiln::matmul(a, b).to_vector<int64_t>() == std::vector<int64_t>{58, 64, 139, 154});
  Tensor v = kiln::from_vector<int64_t>({1, 2, 3});
  CHECK(kiln::matmul(v, v).shape() == Shape{});
  CHECK(kiln::matmul(v, v).item<int64_t>() == 14);
}

TEST_CASE("linear computes x @ weight^T + bias", "[matmul]") {
  kiln::Generator gen(102);
  for (DType d : {DType::Float32, DType::Float64, DType::Float16}) {
    INFO(kiln::dtype_name(d));
    Tensor x = kiln::randn({2, 3, 4}, d, gen);
    Tensor w = kiln::randn({5, 4}, d, gen);
    Tensor bias = kiln::randn({5}, d, gen);
    std::vector<double> wv = w.to_vector<double>(), wt(20);
    for (int o = 0; o < 5; ++o) {
      for (int i = 0; i < 4; ++i)
        wt[static_cast<size_t>(i * 5 + o)] = wv[static_cast<size_t>(o * 4 + i)];
    }
    LoopResult want = loop_matmul(x.to_vector<double>(), {2, 3, 4}, wt, {4, 5});
    check_matches_loop(kiln::linear(x, w), want, d);
    std::vector<double> bv = bias.to_vector<double>();
    for (size_t i = 0; i < want.values.size(); ++i) {
      want.values[i] += bv[i % 5];
      want.magnitude[i] += std::fabs(bv[i % 5]);
    }
    check_matches_loop(kiln::linear(x, w, bias), want, d);
  }
  // A 1-D weight contracts the last dim away, as torch allows.
  Tensor x = kiln::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = kiln::from_vector<float>({1, 0, -1});
  CHECK(kiln::linear(x, w).shape() == Shape{2});
  CHECK(kiln::linear(x, w).to_vector<double>() == std::vector<double>{-2, -2});
  CHECK(kiln::linear(x, w, kiln::tensor(1.0f)).to_vector<double>() == std::vector<double>{-1, -1});
}

TEST_CASE("outer multiplies every pair", "[matmul]") {
  kiln::Generator gen(103);
  Tensor a = kiln::randn({3}, DType::Float32, gen);
  Tensor b = kiln::cast(kiln::randint(-4, 5, {4}, gen), DType::Int32);
  Tensor y = kiln::outer(a, b);
  CHECK(y.shape() == Shape{3, 4});
  CHECK(y.dtype() == DType::Float32);
  std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(),
                      got = y.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < 4; ++j) CHECK(got[i * 4 + j] == Approx(av[i] * bv[j]).epsilon(1e-6));
  }
  CHECK(kiln::outer(kiln::zeros({0}), kiln::zeros({2})).shape() == Shape{0, 2});
  CHECK(kiln::outer(a, b).to_vector<double>() ==
        kiln::matmul(kiln::reindex(a, {3, 1}, {kiln::IndexExpr::var(0)}),
                     kiln::reindex(b, {1, 4}, {kiln::IndexExpr::var(1)}))
            .to_vector<double>());
}

TEST_CASE("matmul, linear and outer reject bad operands with the shapes in the message",
          "[matmul][errors]") {
  check_error<kiln::ShapeError>(
      [] {
        return kiln::matmul(kiln::zeros({3, 4}), kiln::zeros({5, 2}));
      },
      {"[matmul] Last dimension of first input with shape [3, 4] must match "
       "second to last dimension of second input with shape [5, 2]"});
  check_error<kiln::ShapeError>([] { return kiln::matmul(kiln::zeros({3}), kiln::zeros({4})); },
                                {"[matmul]", "[3]", "[4]", "must match"});
  check_error<kiln::ShapeError>(
      [] {
        return kiln::matmul(kiln::zeros({2, 3}), kiln::zeros({4}));
      },
      {"[matmul]", "[2, 3]", "[4]"});
  check_error<kiln::ShapeError>([] { return kiln::matmul(kiln::tensor(1.0f), kiln::zeros({3})); },
                                {"[matmul]", "at least one dimension", "[]", "[3]"});
  check_error<kiln::ShapeError>(
      [] {
        return kiln::matmul(kiln::zeros({3, 3}), kiln::tensor(2.0f));
      },
      {"[matmul]", "[3, 3]", "[]"});
  check_error<kiln::ShapeError>(
      [] {
        return kiln::matmul(kiln::zeros({2, 3, 4}), kiln::zeros({5, 4, 2}));
      },
      {"[matmul]", "batch", "[2, 3, 4]", "[5, 4, 2]", "broadcast"});
  check_error<kiln::DTypeError>(
      [] {
        return kiln::matmul(kiln::zeros({2, 2}, DType::Bool), kiln::zeros({2, 2}));
      },
      {"[matmul]", "bool", "[2, 2]"});
  check_error<kiln::ShapeError>(
      [] {
        return kiln::linear(kiln::zeros({2, 3}), kiln::zeros({4, 5}));
      },
      {"[linear]", "[2, 3]", "[4, 5]", "in_features"});
  check_error<kiln::ShapeError>(
      [] {
        return kiln::linear(kiln::zeros({2, 3}), kiln::zeros({4, 3}), kiln::zeros({3}));
      },
      {"[linear]", "[3]", "[2, 4]"});
  check_error<kiln::ShapeError>(
      [] {
        return kiln::linear(kiln::zeros({2, 3}), kiln::zeros({4, 3}), kiln::zeros({5, 2, 4}));
      },
      {"[linear]", "[5, 2, 4]", "[2, 4]"});
  check_error<kiln::ShapeError>(
      [] {
        return kiln::outer(kiln::zeros({2, 3}), kiln::zeros({4}));
      },
      {"[outer]", "[2, 3]", "[4]", "1-D"});
  check_error<kiln::ValueError>([] { return kiln::matmul(Tensor(), kiln::zeros({3})); },
                                {"[matmul]"});
}
