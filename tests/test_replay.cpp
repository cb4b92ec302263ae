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
