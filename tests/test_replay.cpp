// Replayed evaluations (jit/executor.cpp, issue 26): an evaluation whose simplified schedule
// was seen before reuses its fusion plan, lowered kernels and kernel handles, rebinding the
// kernels' inputs to the new nodes. Each test checks values against the reference
// evaluator on random inputs (tolerance stated per test) and reads jit::replay_stats() to
// prove the path it means to test was taken.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "frontend/kiln.h"
#include "jit/executor.h"
#include "op_harness.h"

using namespace kiln;
using kiln::test::ExecutorScope;

namespace {

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

// A two-layer MLP trained with inline SGD at the given batch sizes; returns every step's
// loss followed by the final parameters. The data of each step is new (seeded).
std::vector<double> train_mlp(const std::vector<int64_t>& batches) {
  Generator gen(11);
  Tensor w1 = (randn({6, 16}, DType::Float32, gen) * 0.4).eval();
  Tensor b1 = zeros({16}).eval();
  Tensor w2 = (randn({16, 3}, DType::Float32, gen) * 0.4).eval();
  Tensor b2 = zeros({3}).eval();
  std::vector<Tensor> params = {w1, b1, w2, b2};
  for (Tensor& p : params) p.requires_grad_();
  std::vector<double> out;
  for (int64_t batch : batches) {
    const Tensor x = randn({batch, 6}, DType::Float32, gen).eval();
    const Tensor y = randn({batch, 3}, DType::Float32, gen).eval();
    Tensor h = relu(matmul(x, params[0]) + params[1]);
    Tensor d = matmul(h, params[2]) + params[3] - y;
    Tensor loss = mean(d * d);
    loss.backward();
    {
      NoGradGuard no_grad;
      for (Tensor& p : params) {
        p.assign(p - p.grad() * 0.1);
        p.set_grad(Tensor());
      }
    }
    out.push_back(loss.item<double>());
  }
  for (const Tensor& p : params)
    for (double v : p.to_vector<double>()) out.push_back(v);
  return out;
}

}  // namespace

TEST_CASE("replayed training steps match the reference when the batch size changes",
          "[replay][values]") {
  const std::vector<int64_t> batches = {8, 8, 8, 16, 16, 5, 8, 8};
  std::vector<double> want;
  {
    ExecutorScope ref("reference");
    want = train_mlp(batches);
  }
  const jit::ReplayStats before = jit::replay_stats();
  const std::vector<double> got = train_mlp(batches);
  const jit::ReplayStats after = jit::replay_stats();
  // float32 against the reference's float64 accumulation, over 8 steps of SGD.
  check_close(got, want, 2e-5);
  INFO("hits " << after.hits - before.hits << ", misses " << after.misses - before.misses
               << ", resized " << after.hits_relowered - before.hits_relowered << ", relowered "
               << after.groups_relowered - before.groups_relowered << ", replayed launches "
               << after.launches_replayed - before.launches_replayed);
  // Steps 2, 3, 5 and 8 repeat their predecessor's sizes; 4, 6 and 7 change them.
  CHECK(after.hits - before.hits >= 6);
  CHECK(after.misses - before.misses <= 2 * 3);
  CHECK(after.hits_relowered - before.hits_relowered >= 3);
  CHECK(after.groups_relowered > before.groups_relowered);
  CHECK(after.launches_replayed - before.launches_replayed >= 20);
  CHECK(after.collisions == before.collisions);
}

TEST_CASE("a replayed kernel reads this evaluation's inputs, not the cached plan's",
          "[replay][values]") {
  Generator gen(5);
  const Tensor w = randn({7, 5}, DType::Float32, gen).eval();
  auto f = [&](const Tensor& x) { return sum(relu(matmul(x, w) * 0.5 + sum(x, {1}, true)), {1}); };
  const jit::ReplayStats before = jit::replay_stats();
  for (int k = 0; k < 5; ++k) {
    const Tensor x = randn({4, 7}, DType::Float32, gen).eval();
    std::vector<double> want;
    {
      ExecutorScope ref("reference");
      want = f(x).to_vector<double>();
    }
    // float32 against the reference's float64: 7-term dot products.
    check_close(f(x).to_vector<double>(), want, 1e-5);
  }
  const jit::ReplayStats after = jit::replay_stats();
  CHECK(after.hits - before.hits >= 4);
  CHECK(after.launches_replayed > before.launches_replayed);
}

TEST_CASE("plan signatures that collide are caught by the exact check and fused afresh",
          "[replay][values]") {
  // Two bits of signature: nearly every new graph lands on a cached plan of another graph.
  jit::set_plan_signature_bits_for_testing(2);
  Generator gen(9);
  const Tensor a = randn({6, 5}, DType::Float32, gen).eval();
  const Tensor b = randn({6, 5}, DType::Float32, gen).eval();
  const Tensor c = randn({5}, DType::Float32, gen).eval();
  const std::vector<std::function<Tensor()>> graphs = {
      [&] { return a * b + c; },
      [&] { return exp(a) - b; },
      [&] { return sum(a * c, {1}); },
      [&] { return max(relu(a) + b * 2.0, {0}); },
      [&] { return softmax(a - b, 1); },
      [&] { return transpose(a, 0, 1) * 3.0 + 1.0; },
      [&] { return sqrt(abs(a) + 1.0) * b; },
      [&] { return sum(a, {0}) * c; },
  };
  const jit::ReplayStats before = jit::replay_stats();
  for (int round = 0; round < 3; ++round) {
    for (size_t g = 0; g < graphs.size(); ++g) {
      INFO("graph " << g << ", round " << round);
      std::vector<double> want;
      {
        ExecutorScope ref("reference");
        want = graphs[g]().to_vector<double>();
      }
      // float32 elementwise and short reductions against float64.
      check_close(graphs[g]().to_vector<double>(), want, 1e-5);
    }
  }
  jit::set_plan_signature_bits_for_testing(64);
  const jit::ReplayStats after = jit::replay_stats();
  INFO("collisions " << after.collisions - before.collisions);
  CHECK(after.collisions - before.collisions >= 4);
}

TEST_CASE("dropout's new draws each step reuse the plan and lower only the kernels they touch",
          "[replay][values]") {
  auto run = [] {
    manual_seed(17);
    Generator gen(4);
    Tensor w = (randn({8, 12}, DType::Float32, gen) * 0.3).eval();
    w.requires_grad_();
    const Tensor x = randn({6, 8}, DType::Float32, gen).eval();
    std::vector<double> out;
    for (int step = 0; step < 5; ++step) {
      Tensor y = nn::F::dropout(tanh(matmul(x, w)), 0.3, true);
      Tensor loss = sum(y * y);
      loss.backward();
      {
        NoGradGuard no_grad;
        w.assign(w - w.grad() * 0.05);
        w.set_grad(Tensor());
      }
      out.push_back(loss.item<double>());
    }
    for (double v : w.to_vector<double>()) out.push_back(v);
    return out;
  };
  std::vector<double> want;
  {
    ExecutorScope ref("reference");
    want = run();
  }
  const jit::ReplayStats before = jit::replay_stats();
  const std::vector<double> got = run();
  const jit::ReplayStats after = jit::replay_stats();
  // The same Philox draws in both executors; float32 against float64 over 5 steps.
  check_close(got, want, 2e-5);
  INFO("hits " << after.hits - before.hits << ", misses " << after.misses - before.misses
               << ", relowered hits " << after.hits_relowered - before.hits_relowered);
  CHECK(after.hits - before.hits >= 4);
  CHECK(after.hits_relowered - before.hits_relowered >= 4);
}

TEST_CASE("a plan miss names the guard that failed against the plan of the same ops",
          "[replay][values]") {
  Generator gen(21);
  auto f = [](const Tensor& x, const Tensor& y, const Tensor& z) { return exp(x * y) - z; };
  // Evaluates f on new inputs; returns the replay counts of f's evaluation alone.
  auto delta = [&](const Shape& shape, DType dtype) {
    const Tensor x = randn(shape, dtype, gen).eval(), y = randn(shape, dtype, gen).eval(),
                 z = randn(shape, dtype, gen).eval();
    std::vector<double> want;
    {
      ExecutorScope ref("reference");
      want = f(x, y, z).to_vector<double>();
    }
    const jit::ReplayStats before = jit::replay_stats();
    const Tensor got = f(x, y, z).eval();
    const jit::ReplayStats after = jit::replay_stats();
    // float32 exp of a product against float64: a few ulps.
    check_close(got.to_vector<double>(), want, 1e-5);
    jit::ReplayStats d;
    d.hits = after.hits - before.hits;
    d.misses = after.misses - before.misses;
    d.hits_relowered = after.hits_relowered - before.hits_relowered;
    d.missed_new_graph = after.missed_new_graph - before.missed_new_graph;
    d.missed_dtype = after.missed_dtype - before.missed_dtype;
    d.missed_broadcast = after.missed_broadcast - before.missed_broadcast;
    d.missed_attributes = after.missed_attributes - before.missed_attributes;
    d.missed_roles = after.missed_roles - before.missed_roles;
    d.missed_dropped = after.missed_dropped - before.missed_dropped;
    INFO("hits " << d.hits << ", misses " << d.misses << " (new " << d.missed_new_graph
                 << ", dtype " << d.missed_dtype << ", broadcast " << d.missed_broadcast
                 << ", attributes " << d.missed_attributes << ", roles " << d.missed_roles
                 << ", dropped " << d.missed_dropped << ")");
    CHECK(d.hits + d.misses == 1);
    return d;
  };
  delta({6, 5}, DType::Float32);
  CHECK(delta({6, 5}, DType::Float32).hits == 1);
  // Each miss is compared with the last plan made for the same ops.
  CHECK(delta({6, 1}, DType::Float32).missed_broadcast == 1);  // which dims are 1 is structure
  CHECK(delta({6, 1}, DType::Float64).missed_dtype == 1);
  const jit::ReplayStats resized = delta({7, 3}, DType::Float32);  // other sizes: a hit
  CHECK(resized.hits_relowered == 1);
  const jit::ReplayStats before = jit::replay_stats();
  const Tensor x = randn({4}, DType::Float32, gen).eval();
  const double first = sum(sqrt(abs(x) + 2.5) * tanh(x)).item<double>();
  CHECK(sum(sqrt(abs(x) + 2.5) * tanh(x)).item<double>() == first);  // the replay, same bits
  const jit::ReplayStats after = jit::replay_stats();
  CHECK(after.missed_new_graph > before.missed_new_graph);
  const uint64_t reasons = after.missed_new_graph + after.missed_dtype + after.missed_device +
                           after.missed_broadcast + after.missed_attributes + after.missed_roles +
                           after.missed_dropped;
  CHECK(reasons == after.misses);  // every miss has exactly one reason
}

TEST_CASE("small schedules that simplify left unchanged skip it when replayed, others do not",
          "[replay][values]") {
  Generator gen(23);
  auto run = [&](const std::function<Tensor(const Tensor&, const Tensor&)>& f, const Shape& shape) {
    const Tensor a = randn(shape, DType::Float32, gen).eval();
    const Tensor b = randn(shape, DType::Float32, gen).eval();
    std::vector<double> want;
    {
      ExecutorScope ref("reference");
      want = f(a, b).to_vector<double>();
    }
    // float32 elementwise against float64: one rounding per op.
    check_close(f(a, b).to_vector<double>(), want, 1e-6);
  };
  auto plain = [](const Tensor& a, const Tensor& b) { return relu(a * b + a); };
  // x * 1 and x + (-0.0) are rewritten by simplify each time: never skipped.
  auto rewritten = [](const Tensor& a, const Tensor& b) { return (a * 1.0 + (-0.0)) * b; };
  run(plain, {16});
  const jit::ReplayStats before = jit::replay_stats();
  for (int k = 0; k < 4; ++k) run(plain, {16});
  const jit::ReplayStats after_plain = jit::replay_stats();
  CHECK(after_plain.simplify_skipped - before.simplify_skipped == 4);
  run(plain, {9});  // new sizes: simplify runs again (its rules read sizes)
  const jit::ReplayStats after_resize = jit::replay_stats();
  CHECK(after_resize.simplify_skipped == after_plain.simplify_skipped);
  run(plain, {9});
  CHECK(jit::replay_stats().simplify_skipped - after_resize.simplify_skipped == 1);
  const jit::ReplayStats before_rewritten = jit::replay_stats();
  for (int k = 0; k < 4; ++k) run(rewritten, {16});
  const jit::ReplayStats after_rewritten = jit::replay_stats();
  CHECK(after_rewritten.simplify_skipped == before_rewritten.simplify_skipped);
  CHECK(after_rewritten.hits - before_rewritten.hits >= 3);
}
