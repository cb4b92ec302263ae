#pragma once
// Small graphs of distinct structure, so that each compiles its own kernel: the population
// the compile-time benchmarks (bench_compile, bench_cuda) take their medians over.
#include <functional>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::bench {

/// Number of structurally distinct graphs distinct_graph() makes.
constexpr int kDistinctGraphs = 24;

/// Graph i: one of six unary chains of x, combined with y in one of four ways, half of them
/// reduced over rows.
inline Tensor distinct_graph(int i, const Tensor& x, const Tensor& y) {
  static const std::vector<std::function<Tensor(const Tensor&)>> unary = {
      [](const Tensor& t) { return exp(t); },
      [](const Tensor& t) { return sin(t) * t; },
      [](const Tensor& t) { return tanh(t); },
      [](const Tensor& t) { return sqrt(abs(t)); },
      [](const Tensor& t) { return log1p(abs(t)); },
      [](const Tensor& t) { return sigmoid(t) + cos(t); },
  };
  static const std::vector<std::function<Tensor(const Tensor&, const Tensor&)>> combine = {
      [](const Tensor& a, const Tensor& b) { return a + b; },
      [](const Tensor& a, const Tensor& b) { return a * b - b; },
      [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
      [](const Tensor& a, const Tensor& b) { return where(a > b, a, b * b); },
  };
  Tensor t = combine[static_cast<size_t>((i / 6) % 4)](unary[static_cast<size_t>(i % 6)](x), y);
  return i % 2 ? sum(t, 1) : t;
}

}  // namespace kiln::bench
