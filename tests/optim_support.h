#pragma once
// Helpers shared by the optimizer tests: a closeness check that names the first mismatch and
// a quadratic bowl whose exact gradient the float64 reference updates use.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "frontend/kiln.h"

namespace optim_test {

using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

/// REQUIREs |actual - expected| <= tol * (1 + |expected|) element by element.
inline void require_close(const std::vector<double>& actual, const std::vector<double>& expected,
                          double tol) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i << ": " << actual[i] << " vs " << expected[i]);
    REQUIRE(std::fabs(actual[i] - expected[i]) <= tol * (1 + std::fabs(expected[i])));
  }
}

/// A quadratic bowl sum(w * (p - t)^2): its gradient 2 w (p - t) depends on p, so an update
/// rule that is wrong in any step shows in the later ones.
struct Bowl {
  Tensor p, t, w;
  std::vector<double> t_host, w_host;

  Bowl(const Shape& shape, uint64_t seed, DType dtype = DType::Float32) {
    kiln::Generator gen(seed);
    p = kiln::randn(shape, dtype, gen).eval();
    t = kiln::randn(shape, dtype, gen).eval();
    w = (kiln::rand(shape, dtype, gen) + 0.5).eval();
    p.requires_grad_();
    t_host = t.to_vector<double>();
    w_host = w.to_vector<double>();
  }
  /// The loss as a lazy tensor.
  Tensor loss() const { return kiln::sum(w * kiln::square(p - t)); }
  /// The exact gradient at host point x.
  std::vector<double> grad_at(const std::vector<double>& x) const {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) g[i] = 2 * w_host[i] * (x[i] - t_host[i]);
    return g;
  }
};

}  // namespace optim_test
