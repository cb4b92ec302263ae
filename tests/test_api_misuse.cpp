// What an outside probe of the public API found: a callback of Module::apply that adds a
// child, schedulers and optimizers asked for a group they lack, eye with a negative column
// count, index_put_ with an index out of range, compound assignment on parameters, long
// cumsum/cumprod (no longer O(n^2)), and schedulers cycling momentum (no longer a new
// kernel per step). Values against float64 references computed here.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "jit/kernel_cache.h"

using namespace kiln;
using Catch::Contains;

namespace {

std::vector<double> random_doubles(size_t n, uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = d(gen);
  return v;
}

}  // namespace

TEST_CASE("Module apply visits a snapshot of the children when the callback adds one",
          "[module][errors]") {
  auto list = std::make_shared<nn::ModuleList>();
  for (int i = 0; i < 3; ++i) list->push_back(std::make_shared<nn::Linear>(2, 2));
  int visited = 0;
  list->apply([&](nn::Module& m) {
    if (m.name() != "Linear") return;
    ++visited;
    list->push_back(std::make_shared<nn::Linear>(2, 2));
  });
  CHECK(visited == 3);  // the children added during the walk are not visited
  CHECK(list->size() == 6);
}

TEST_CASE("schedulers and optimizers refuse a parameter group they do not have", "[errors]") {
  Tensor w = randn({2});
  w.requires_grad_();
  optim::SGD sgd({w}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  optim::LambdaLR lambda(sgd, [](int64_t e) { return 1.0 / (1 + e); });
  optim::ExponentialLR exponential(sgd, 0.5);
  CHECK_THROWS_AS(lambda.lr_at(7, 1), IndexError);
  CHECK_THROWS_WITH(exponential.lr_at(1, 1), Contains("parameter group 1 is out of range"));
  CHECK_THROWS_WITH(exponential.lr_at(0, -5), Contains("expected epoch >= 0"));
  CHECK(exponential.lr_at(0, 2) == Approx(0.1 * 0.25));
  CHECK_THROWS_AS(sgd.options(3), IndexError);
  CHECK_THROWS_AS(sgd.lr(3), IndexError);
  CHECK_THROWS_AS(sgd.set_lr(3, 0.1), IndexError);
  CHECK_THROWS_AS(sgd.momentum(3), IndexError);
  CHECK_THROWS_AS(sgd.set_momentum(3, 0.5), IndexError);
}

TEST_CASE("eye refuses a negative column count other than its default", "[errors]") {
  CHECK_THROWS_WITH(eye(3, -2), Contains("[eye] expected m >= 0"));
  CHECK(eye(3).shape() == Shape{3, 3});
  CHECK(eye(3, 0).shape() == Shape{3, 0});
}

TEST_CASE("index_put_ with an index out of range raises at the call and changes nothing",
          "[tensor_api][errors]") {
  Tensor x = arange(12).reshape({3, 4}).to(DType::Float32);
  x.eval();
  Tensor copy = x;
  CHECK_THROWS_AS(x.index_put_({from_vector<int64_t>({9})}, 1.0), IndexError);
  CHECK_THROWS_AS(x.index_put_({Tensor(from_vector<int64_t>({-4}))}, 1.0), IndexError);
  // Both handles still hold the old values and take a good update.
  CHECK(x.to_vector<float>()[5] == 5);
  x.index_put_({from_vector<int64_t>({1})}, -1.0);
  CHECK(copy.to_vector<float>()[5] == -1);
  CHECK(x.to_vector<float>()[0] == 0);
}

TEST_CASE("compound assignment updates a parameter in place under NoGradGuard only",
          "[tensor_api][module]") {
  nn::Linear lin(3, 2);
  const std::vector<float> before = lin.weight.to_vector<float>();
  {
    NoGradGuard no_grad;
    Tensor w = lin.weight;  // a copy of the handle, as a user's local variable
    w *= 0.5;
  }
  // The module (its parameter list and state_dict) sees the update.
  const std::vector<float> after = lin.state_dict().at("weight").to_vector<float>();
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == before[i] * 0.5f);
  CHECK(lin.parameters()[0].to_vector<float>() == after);
  CHECK(lin.weight.is_leaf());
  CHECK(lin.weight.requires_grad());
  // Outside NoGradGuard it is refused, as torch refuses in-place ops on such leaves.
  CHECK_THROWS_WITH(lin.weight += 1, Contains("is a leaf that requires grad"));
  CHECK(lin.weight.to_vector<float>() == after);
}

TEST_CASE("long cumsum and cumprod match float64 sequential scans, with gradients",
          "[tensor_api]") {
  for (int64_t n : {257, 1000, 4099}) {
    INFO("n = " << n);
    const std::vector<double> xs = random_doubles(static_cast<size_t>(n), 7, -1, 1);
    const std::vector<double> ps = random_doubles(static_cast<size_t>(n), 8, 0.97, 1.03);
    Tensor x = from_vector(xs, {n});
    Tensor p = from_vector(ps, {n});
    std::vector<double> want_sum(xs.size()), want_prod(ps.size());
    double acc = 0, prod = 1;
    for (size_t i = 0; i < xs.size(); ++i) {
      want_sum[i] = acc += xs[i];
      want_prod[i] = prod *= ps[i];
    }
    const std::vector<double> got_sum = cumsum(x, 0).to_vector<double>();
    const std::vector<double> got_prod = cumprod(p, 0).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      CHECK(std::abs(got_sum[i] - want_sum[i]) <= 1e-12 * (1 + std::abs(want_sum[i])));
      CHECK(std::abs(got_prod[i] - want_prod[i]) <= 1e-12 * std::abs(want_prod[i]));
    }
  }
  // Along the first of two axes, float32, against float64: the same order of magnitude as
  // n float32 roundings.
  const int64_t n = 3000;
  const std::vector<double> xs = random_doubles(static_cast<size_t>(2 * n), 9, -1, 1);
  const std::vector<float> got =
      cumsum(from_vector(xs, {n, 2}).to(DType::Float32), 0).to_vector<float>();
  double acc0 = 0, acc1 = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc0 += static_cast<float>(xs[static_cast<size_t>(2 * i)]);
    acc1 += static_cast<float>(xs[static_cast<size_t>(2 * i + 1)]);
    CHECK(std::abs(got[static_cast<size_t>(2 * i)] - acc0) <= 1e-4 * (1 + std::abs(acc0)));
    CHECK(std::abs(got[static_cast<size_t>(2 * i + 1)] - acc1) <= 1e-4 * (1 + std::abs(acc1)));
  }

  // Gradients of sum(w * scan(x)) at n = 300 (above the quadratic form's range): cumsum's
  // is the reversed running sum of w; cumprod's sums w_i * prod_{k <= i, k != j} x_k,
  // one x being 0 so that the rule must be exact at zeros.
  const int64_t m = 300;
  std::vector<double> xv = random_doubles(static_cast<size_t>(m), 10, 0.9, 1.1);
  xv[17] = 0;
  const std::vector<double> wv = random_doubles(static_cast<size_t>(m), 11, -1, 1);
  Tensor xl = from_vector(xv, {m});
  xl.requires_grad_();
  const Tensor wl = from_vector(wv, {m});
  const std::vector<double> g_sum = grad(sum(wl * cumsum(xl, 0)), {xl})[0].to_vector<double>();
  const std::vector<double> g_prod = grad(sum(wl * cumprod(xl, 0)), {xl})[0].to_vector<double>();
  double tail = 0;
  for (int64_t j = m - 1; j >= 0; --j) {
    tail += wv[static_cast<size_t>(j)];
    CHECK(std::abs(g_sum[static_cast<size_t>(j)] - tail) <= 1e-12 * (1 + std::abs(tail)));
  }
  for (int64_t j = 0; j < m; ++j) {
    double want = 0;
    for (int64_t i = j; i < m; ++i) {
      double term = wv[static_cast<size_t>(i)];
      for (int64_t k = 0; k <= i; ++k)
        if (k != j) term *= xv[static_cast<size_t>(k)];
      want += term;
    }
    CHECK(std::abs(g_prod[static_cast<size_t>(j)] - want) <= 1e-10 * (1 + std::abs(want)));
  }
}

TEST_CASE("a momentum changed every step compiles no new kernels", "[optim]") {
  Tensor w = randn({16, 16});
  w.requires_grad_();
  const Tensor x = randn({4, 16});
  optim::SGD sgd({w}, optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .dampening = 0.1});
  Tensor v = randn({16, 16});
  v.requires_grad_();
  optim::RMSprop rms({v}, optim::RMSpropOptions{.lr = 0.01, .momentum = 0.9});
  Tensor u = randn({16, 16});
  u.requires_grad_();
  optim::Adam adam({u}, optim::AdamOptions{.lr = 0.01});
  auto step = [&](double momentum) {
    for (optim::Optimizer* o : std::vector<optim::Optimizer*>{&sgd, &rms, &adam}) {
      o->zero_grad();
      o->set_momentum(0, momentum);
    }
    sum(matmul(x, w) * matmul(x, v) * matmul(x, u)).backward();
    for (optim::Optimizer* o : std::vector<optim::Optimizer*>{&sgd, &rms, &adam}) o->step();
    eval({w, v, u});
  };
  for (int i = 0; i < 3; ++i) step(0.9);  // the first steps compile the update kernels
  const uint64_t compiled = jit::kernel_cache().stats().kernels_compiled;
  for (int i = 0; i < 6; ++i) step(0.80 + 0.01 * i);
  CHECK(jit::kernel_cache().stats().kernels_compiled == compiled);
}

TEST_CASE("isclose compares integers beyond 2^53 exactly", "[tensor_api]") {
  const int64_t big = int64_t{1} << 53, top = std::numeric_limits<int64_t>::max();
  const Tensor a = from_vector<int64_t>({big + 1, top, top, 5, -3});
  const Tensor b = from_vector<int64_t>({big, top - 1, top, 7, -1});
  // PyTorch at rtol = atol = 0: [False, False, True, False, False]; at atol = 2 the last two
  // are close and the first two as well (differences of 1).
  CHECK(isclose(a, b, 0, 0).to_vector<uint8_t>() == std::vector<uint8_t>{0, 0, 1, 0, 0});
  CHECK(isclose(a, b, 0, 2).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1, 1, 1, 1});
  CHECK_FALSE(allclose(from_vector<int64_t>({top}), from_vector<int64_t>({-1}), 0, 1));
}

TEST_CASE("sort and topk of long rows match a stable std::sort", "[tensor_api]") {
  // 100k elements with many ties and NaNs: the host sort (O(n log n)); the meta-op form it
  // replaced on the host took seconds and gigabytes here.
  const int64_t n = 100000;
  std::mt19937 gen(12);
  std::uniform_int_distribution<int> pick(0, 999);
  std::vector<float> xs(static_cast<size_t>(n));
  for (float& v : xs) {
    const int r = pick(gen);
    v = r < 5 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(r % 300) - 150.0f;
  }
  const Tensor x = from_vector(xs, {n});
  for (bool descending : {false, true}) {
    INFO("descending " << descending);
    std::vector<int64_t> want(static_cast<size_t>(n));
    std::iota(want.begin(), want.end(), int64_t{0});
    std::stable_sort(want.begin(), want.end(), [&](int64_t i, int64_t j) {
      const float a = xs[static_cast<size_t>(i)], b = xs[static_cast<size_t>(j)];
      if (std::isnan(a) || std::isnan(b)) return descending ? !std::isnan(b) : !std::isnan(a);
      return descending ? b < a : a < b;
    });
    auto [values, indices] = sort(x, 0, descending);
    CHECK(indices.to_vector<int64_t>() == want);
    const std::vector<float> got = values.to_vector<float>();
    size_t mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float w = xs[static_cast<size_t>(want[i])];
      if (!(got[i] == w || (std::isnan(got[i]) && std::isnan(w)))) ++mismatches;
    }
    CHECK(mismatches == 0);
  }
  // topk along the first axis of a 2-D int64 tensor beyond float64's exact range.
  const int64_t big = int64_t{1} << 60;
  const Tensor m = from_vector<int64_t>({big + 1, 3, big, 7, big + 2, 5, -big, 9}, {4, 2});
  auto [top, where] = topk(m, 2, 0);
  CHECK(top.to_vector<int64_t>() == std::vector<int64_t>{big + 2, 9, big + 1, 7});
  CHECK(where.to_vector<int64_t>() == std::vector<int64_t>{2, 3, 0, 1});
  // bfloat16 rows compare as the floats they hold; gradients reach the chosen elements.
  Tensor h = from_vector<float>({0.5f, -2.0f, 3.0f, 0.25f}, {4}).to(DType::BFloat16);
  CHECK(sort(h).indices.to_vector<int64_t>() == std::vector<int64_t>{1, 3, 0, 2});
  Tensor leaf = from_vector<double>({0.5, -2.0, 3.0, 0.25, 1.0}, {5});
  leaf.requires_grad_();
  const Tensor g =
      grad(sum(topk(leaf, 2).values * from_vector<double>({10.0, 1.0}, {2})), {leaf})[0];
  CHECK(g.to_vector<double>() == std::vector<double>{0, 0, 10, 0, 1});
}

TEST_CASE("multinomial refuses weights that are no distribution, as torch",
          "[tensor_api][errors]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(multinomial(from_vector<double>({0, 0, 0}), 1),
                    Contains("has no weight (all zero)"));
  CHECK_THROWS_WITH(multinomial(from_vector<double>({0.5, -0.1}), 1),
                    Contains("expected finite weights >= 0"));
  CHECK_THROWS_AS(multinomial(from_vector<double>({nan, 1}), 1), ValueError);
  CHECK_THROWS_AS(multinomial(from_vector<double>({inf, 2}), 1), ValueError);
  CHECK_THROWS_WITH(multinomial(from_vector<double>({1, 0, 2}), 3, false),
                    Contains("2 categories of positive weight"));
  CHECK(multinomial(from_vector<double>({1, 0, 2}), 2, false).shape() == Shape{2});
}
