// Fused rebuilds (issue 27 §2): a value released under a memory budget whose producer is
// elementwise is computed again inside the kernel that reads it, from what its producer
// reads, instead of by its own kernel into memory of its own. The planner (Inline actions)
// and the executor (one fused kernel) on hand-built tables, random tables and a real step.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "frontend/kiln.h"
#include "memory/memory.h"
#include "memory/pools/budget.h"
#include "planner_harness.h"
#include "test_nn_support.h"

using namespace planner_test;
using nn_test::ExecutorGuard;

namespace {

// A (leaf) -> X (k0, elementwise) -> Y (k1) -> Z (k2, big) -> Z2 (k3) -> W (k4, reads Y
// and Z2; `w` bytes) -> out (k5, reads X and W): X is read early and late with Z in
// between, so a budget below A + X + Y + Z releases X, and k5 needs it again. `inline_x`:
// k5 can compute X itself at half k0's cost.
StepGraph late_reader(size_t w, bool inline_x) {
  Builder b;
  const int a = b.leaf(100);
  const int x = b.op({a}, 1000, 4.0);
  const int y = b.op({x}, 10);
  const int z = b.op({y}, 1000);
  const int z2 = b.op({z}, 10);
  const int ww = b.op({y, z2}, w);
  b.op({x, ww}, 10, 1.0, true);
  if (inline_x) b.last().inline_inputs.push_back({x, 0.5});
  return b.g;
}

}  // namespace

TEST_CASE("planner: a released value its reader can compute is rebuilt inside that reader",
          "[planner][fused_rebuild]") {
  const size_t budget = 1500;
  SECTION("both fit: the fused rebuild costs its share, not the producer's kernel") {
    const StepGraph alone = late_reader(10, false), fused = late_reader(10, true);
    const RecomputePlan p0 = plan_with(alone, budget), p1 = plan_with(fused, budget);
    REQUIRE(p0.feasible);
    REQUIRE(p1.feasible);
    REQUIRE(replay(alone, p0, budget).error == "");
    REQUIRE(replay(fused, p1, budget).error == "");
    CHECK(p0.recomputes == 1);
    CHECK(p0.inlined == 0);
    CHECK(p1.recomputes == 0);
    CHECK(p1.inlined == 1);
    CHECK(p0.extra_cost == Approx(4.0));
    CHECK(p1.extra_cost == Approx(2.0));
    INFO(render(p1.actions));
    // The value is never allocated again: the fused plan's peak is the forward's.
    CHECK(p1.peak <= p0.peak);
  }
  SECTION("only the fused rebuild fits: the value and W do not fit beside each other") {
    // At k5: A 100 + W 1000 + out 10, plus X 1000 for a rebuild on its own: 2110 > 1500.
    const StepGraph alone = late_reader(1000, false), fused = late_reader(1000, true);
    const RecomputePlan p0 = plan_with(alone, budget), p1 = plan_with(fused, budget);
    CHECK_FALSE(p0.feasible);
    REQUIRE(p1.feasible);
    REQUIRE(replay(fused, p1, budget).error == "");
    CHECK(p1.inlined == 1);
    CHECK(p1.peak <= budget);
  }
  SECTION("not when what the producer reads is gone: then its kernel rebuilds it") {
    // A is donated after k0 (its last reader), so k5 cannot compute X from it.
    StepGraph g = late_reader(10, true);
    g.values[0].releasable_leaf = true;
    const RecomputePlan p = plan_with(g, budget);
    // X cannot be rebuilt at all (its input is gone): kept, or the plan fails; never inlined.
    REQUIRE(replay(g, p, budget).error == "");
    CHECK(p.inlined == 0);
  }
}

TEST_CASE("planner: random steps with fused rebuilds replay within budget",
          "[planner][fused_rebuild]") {
  std::mt19937_64 rng(27);
  StepShape shape;
  shape.non_recomputable = false;
  shape.ancestors_first = true;
  int plans = 0, feasible = 0, inlining = 0;
  for (int n = 0; n < 150; ++n) {
    StepGraph g = random_step(rng, shape);
    // Every third input with a producer can be computed inside its reader, at a random share.
    for (PlanKernel& k : g.kernels)
      for (int v : k.inputs)
        if (g.values[static_cast<size_t>(v)].producer >= 0 && rng() % 3 == 0)
          k.inline_inputs.push_back({v, static_cast<double>(rng() % 100) / 100.0});
    const RecomputePlan free_plan = simulate_step(g, PlannerOptions{});
    REQUIRE(free_plan.feasible);
    REQUIRE(free_plan.inlined == 0);  // nothing is released early without a budget
    const size_t top = free_plan.peak, lb = g.start_bytes;
    for (int i = 0; i < 6; ++i) {
      const size_t budget = std::uniform_int_distribution<size_t>(lb, top)(rng);
      if (budget == 0) continue;
      const RecomputePlan p = plan_with(g, budget);
      INFO("graph " << n << ", budget " << budget << ": " << render(p.actions));
      REQUIRE(replay(g, p, budget).error == "");
      // The floor covers fused rebuilds too: no plan needs less.
      const kiln::memory::WorkFloor floor = extra_work_floor(g, budget);
      if (p.feasible) {
        REQUIRE(floor.feasible);
        REQUIRE(p.extra_cost >= floor.extra_cost - 1e-9 * (1 + floor.extra_cost));
      }
      ++plans;
      if (p.feasible) ++feasible, inlining += p.inlined > 0;
    }
  }
  // The budgets bite: many plans fit, and some of those rebuild inside a reader.
  CHECK(feasible > plans / 4);
  CHECK(inlining > 20);
  WARN("fused rebuilds: " << feasible << " of " << plans << " plans feasible, " << inlining
                          << " rebuilding inside a reader");
}

namespace {

struct BudgetGuard {
  ~BudgetGuard() { kiln::memory::clear_budget(); }
};

// One step: v = exp(sin(x*w) + cos(x*w)) is costly and read twice (by a sum in the forward
// and by w's gradient), so fusion stores it. A product made after the sum, from it but
// without a gradient, needs room while v waits for the backward pass: under a budget below
// the unplanned peak v is released, and w's gradient kernel computes it again from x and w.
struct Step {
  kiln::Tensor x, w, a, b;
  Step() {
    kiln::manual_seed(41);
    x = kiln::randn({1 << 16}).eval();
    w = (kiln::randn({1 << 16}) * 0.5f).eval();
    w.requires_grad_(true);
    a = kiln::randn({256, 256}).eval();
    b = kiln::randn({256, 256}).eval();
  }
  // The gradient's graph, built in a scope of its own: a tensor still held when the step is
  // evaluated is a result, kept whole, which nothing may release.
  kiln::Tensor pending_grad() {
    using namespace kiln;
    Tensor u = x * w;
    Tensor v = exp(sin(u) + cos(u));
    Tensor s1 = sum(v);
    Tensor p = matmul(a * (s1.detach() * 1e-6f), b);
    Tensor loss = s1 * sum(p * p) * 1e-3f;
    return kiln::grad(loss, {w})[0];
  }
  std::vector<float> grad() { return pending_grad().to_vector<float>(); }
};

}  // namespace

TEST_CASE("a released elementwise value is rebuilt inside the kernel that reads it",
          "[memory][fused_rebuild]") {
  ExecutorGuard jit("jit");
  BudgetGuard guard;
  Step step;
  const std::vector<float> free_run = step.grad();
  const kiln::memory::PlanSummary unplanned = kiln::memory::last_plan();
  REQUIRE(unplanned.measured_peak > unplanned.start_bytes);
  // Half of v's 256 KiB below the unplanned peak: v must go while the product is made.
  const size_t budget = unplanned.measured_peak - (128u << 10);
  kiln::memory::set_budget(budget);
  std::vector<float> budgeted;
  for (int i = 0; i < 3; ++i) budgeted = step.grad();  // the plan settles on measured times
  const kiln::memory::PlanSummary planned = kiln::memory::last_plan();
  INFO(kiln::memory::plan_report());
  CHECK(planned.inlined >= 1);
  CHECK(planned.measured_peak <= budget);
  REQUIRE(budgeted.size() == free_run.size());
  // Bit for bit: the fused kernel computes v with the same operations, without contraction.
  CHECK(std::memcmp(budgeted.data(), free_run.data(), free_run.size() * sizeof(float)) == 0);
}
