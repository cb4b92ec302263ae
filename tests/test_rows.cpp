// Row stages: reductions computed inside the kernel of their consumer, once per row
// (jit/lower.cpp, KernelIR::Kind::Rows). Kernel counts of the per-row patterns (issue 24
// §3 targets: softmax and layer_norm forward at most 2 kernels, cross_entropy at most 3),
// and results against the reference evaluator on random shapes and values, including the
// cases where a reduction cannot be a stage and is stored instead.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "jit/executor.h"
#include "jit/kernel_ir.h"
#include "op_harness.h"

using namespace kiln;
using kiln::test::ExecutorScope;

namespace {

// Evaluates `build()` with the JIT and with the reference evaluator (float64 accumulation)
// and checks that they agree within `tol` (relative and absolute); returns the JIT's stats.
jit::EvalStats agree(const std::function<Tensor()>& build, double tol) {
  std::vector<double> want;
  {
    ExecutorScope ref("reference");
    want = build().to_vector<double>();
  }
  ExecutorScope jit_scope("jit");
  Tensor got_t = build();
  got_t.eval();
  const jit::EvalStats stats = jit::last_eval_stats();
  std::vector<double> got = got_t.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << " of " << got.size() << ": " << got[i] << " vs " << want[i]);
    if (std::isnan(want[i])) {
      REQUIRE(std::isnan(got[i]));
    } else if (std::isinf(want[i])) {
      REQUIRE(got[i] == want[i]);
    } else {
      REQUIRE(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
    }
  }
  return stats;
}

Tensor ready(Tensor t) {
  t.eval();
  return t;
}

}  // namespace

TEST_CASE("per-row reductions and their epilogues run in one kernel on random shapes",
          "[fusion][rows][reduce]") {
  std::mt19937 rng(24);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t rows = pick(1, 70), cols = pick(1, 300);
    INFO("x is [" << rows << ", " << cols << "]");
    manual_seed(static_cast<uint64_t>(trial));
    Tensor x = ready(randn({rows, cols}) * 3.0);
    Tensor g = ready(randn({cols})), b = ready(randn({cols}));
    Tensor y = ready(randint(0, cols, {rows}));
    struct Case {
      const char* name;
      std::function<Tensor()> build;
      size_t kernels;
    };
    const std::vector<Case> cases = {
        {"mean", [&] { return mean(x, {-1}, true); }, 1},
        {"var", [&] { return var(x, {-1}, false); }, 1},
        {"std", [&] { return kiln::std(x, {-1}, true); }, 1},
        {"logsumexp", [&] { return logsumexp(x, {-1}); }, 1},
        {"softmax", [&] { return softmax(x, -1); }, 1},
        {"log_softmax", [&] { return log_softmax(x, -1); }, 1},
        {"layer_norm", [&] { return nn::functional::layer_norm(x, Shape{cols}, g, b, 1e-5); }, 1},
        {"x - max(x)", [&] { return x - max(x, {1}, true); }, 1},
        {"cross_entropy", [&] { return nn::cross_entropy(x, y); }, 3},
    };
    for (const Case& c : cases) {
      INFO(c.name);
      const jit::EvalStats s = agree(c.build, 2e-5);
      CHECK(s.kernels <= c.kernels);
    }
  }
}

TEST_CASE("row stages over several reduced dims, leading rows and other dtypes",
          "[fusion][rows][reduce][dtype]") {
  manual_seed(3);
  // layer_norm over the last two dims of a 4-D input: two reduced dims per stage, three
  // leading dims of rows.
  Tensor x = ready(randn({2, 3, 5, 7}));
  Tensor g = ready(randn({5, 7})), b = ready(randn({5, 7}));
  CHECK(agree(
            [&] {
              return nn::functional::layer_norm(x, Shape{5, 7}, g, b, 1e-5);
            },
            2e-5)
            .kernels == 1);
  CHECK(agree([&] { return softmax(x, 3); }, 2e-5).kernels == 1);
  // float64 stays float64 through the stages.
  Tensor xd = ready(randn({9, 33}, DType::Float64));
  CHECK(agree([&] { return log_softmax(xd, 1); }, 1e-12).kernels == 1);
  CHECK(agree([&] { return var(xd, {1}, true) * 2.0 + mean(xd, {1}, true); }, 1e-12).kernels == 1);
  // bfloat16 and float16: stage totals round to the reduction's dtype as a stored one does.
  Tensor xb = ready(randn({6, 50}, DType::BFloat16));
  agree([&] { return softmax(xb, 1); }, 2e-2);
  Tensor xh = ready(randn({6, 50}, DType::Float16));
  agree([&] { return xh - mean(xh, {1}, true); }, 4e-3);
  // Integers: a row sum feeding an integer epilogue.
  Tensor xi = ready(randint(-50, 50, {7, 13}));
  CHECK(agree([&] { return xi * 3 - sum(xi, {1}, true); }, 0).kernels == 1);
  CHECK(agree([&] { return max(xi, {1}, true) - min(xi, {1}, true); }, 0).kernels == 1);
}

TEST_CASE("row stages keep NaN and infinity semantics", "[fusion][rows][reduce]") {
  std::vector<float> v = {1.f,       2.f,       NAN,       4.f,        // a NaN row
                          -INFINITY, -INFINITY, -INFINITY, -INFINITY,  // all -inf
                          INFINITY,  0.f,       1.f,       2.f,        // +inf
                          3.f,       -1.f,      0.5f,      7.f};
  Tensor x = from_vector(v, {4, 4});
  agree([&] { return softmax(x, 1); }, 1e-6);
  agree([&] { return log_softmax(x, 1); }, 1e-6);
  agree([&] { return logsumexp(x, {1}); }, 1e-6);
  agree([&] { return x - max(x, {1}, true); }, 0);
}

TEST_CASE("whole-tensor reductions are stages only while small, at every size the plan sees",
          "[fusion][rows][reduce][plan]") {
  // One graph structure at sizes on both sides of the serial limit (2^16 elements): the
  // plan cache must not reuse a plan with a one-thread stage for the large size.
  for (int64_t n : {100, 1 << 17, 300, 1 << 17}) {
    INFO("n = " << n);
    manual_seed(static_cast<uint64_t>(n));
    Tensor a = ready(randn({n})), t = ready(randn({n}));
    const jit::EvalStats s = agree([&] { return nn::mse_loss(a, t); }, 1e-5);
    if (n <= 300) CHECK(s.kernels == 1);
  }
  // A small whole reduction read by a large kernel is stored: as a one-row kernel, the
  // large one would run on one thread.
  Tensor small = ready(randn({50})), big = ready(randn({300, 400}));
  CHECK(agree([&] { return big - mean(small); }, 1e-5).kernels == 2);
  agree([&] { return sum(big * mean(small)); }, 1e-4);
  CHECK(agree([&] { return mean(small) * 2.0 + max(small); }, 1e-6).kernels == 1);
}

TEST_CASE("reductions read outside their rows are stored, and stages read through padding",
          "[fusion][rows][reduce]") {
  manual_seed(5);
  Tensor x = ready(randn({6, 10}));
  // Read transposed: the consumer's rows are the reduction's columns.
  agree([&] { return transpose(sum(x, {1}, true), 0, 1) * sum(x); }, 1e-5);
  agree([&] { return matmul(transpose(x - mean(x, {1}, true), 0, 1), x); }, 1e-4);
  // Read by two kernels (an output and another consumer): stored once.
  agree([&] { return concat({softmax(x, 1), x - max(x, {1}, true)}, 0); }, 1e-5);
  // A stage read through padding: the kernel has more rows than the reduction; the stage
  // is computed for rows it does not have under a guard and the padding's fill is used.
  Tensor y = ready(randn({9, 4}));
  agree([&] { return pad(sum(x, {1}, true), {{0, 3}, {0, 0}}) + y; }, 1e-5);
  agree([&] { return concat({max(x, {1}, true), min(x, {1}, true)}, 0) * 2.0; }, 1e-6);
}

TEST_CASE("training through row stages matches the reference", "[fusion][rows][train]") {
  // Forward and backward of softmax, layer_norm and cross_entropy in one evaluation: the
  // backward graph reads the statistics again, so they may be stored or recomputed, and the
  // gradients must be the reference's either way.
  manual_seed(8);
  auto run = [](const char* executor) {
    ExecutorScope scope(executor);
    manual_seed(8);
    Tensor x = randn({12, 20});
    Tensor w = randn({20, 20});
    w.requires_grad_(true);
    Tensor g = ones({20}), b = zeros({20});
    g.requires_grad_(true), b.requires_grad_(true);
    Tensor y = randint(0, 20, {12});
    Tensor h = nn::functional::layer_norm(matmul(x, w), Shape{20}, g, b, 1e-5);
    Tensor loss = nn::cross_entropy(h, y) + mean(softmax(h, 1) * h);
    loss.backward();
    std::vector<double> out = loss.to_vector<double>();
    for (const Tensor& t : {w.grad(), g.grad(), b.grad()}) {
      std::vector<double> v = t.to_vector<double>();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  const std::vector<double> want = run("reference"), got = run("jit");
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("value " << i);
    CHECK(std::abs(got[i] - want[i]) <= 1e-4 * (1 + std::abs(want[i])));
  }
}
