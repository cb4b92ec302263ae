// The memory stage's entry point (memory/planner/plan_step.h) on hand-built and seeded random
// steps: a plan is stored once the costs are final and run again only for tables equal to the ones
// it was made for (compared whole, not by hash), its execution options reproduce it, its tables are
// the given ones in the order it chose, and an infeasible budget comes back with the figures the
// error needs.
#include <catch2/catch.hpp>

#include "memory/planner/plan_step.h"
#include "planner_harness.h"

using namespace planner_test;
using kiln::memory::PlanRequest;
using kiln::memory::StepPlan;

namespace {

// A request under `budget` whose costs are final at once (nothing timed), without an arena.
PlanRequest untimed(size_t budget, size_t tail = 0) {
  PlanRequest r;
  r.budget = budget;
  r.fixed_tail = tail;
  return r;
}

}  // namespace

TEST_CASE("plan_step stores a plan and runs it again for equal tables only", "[planner]") {
  Mlp m(3.0, 2.0);
  const StepGraph& g = m.b.g;
  const StepPlan first = kiln::memory::plan_step(g, untimed(409));
  REQUIRE(first.feasible);
  CHECK_FALSE(first.reused);
  const StepPlan again = kiln::memory::plan_step(g, untimed(409));
  CHECK(again.reused);
  CHECK(render(again.actions->actions) == render(first.actions->actions));
  // Tables that differ only where the lookup's hash does not look (whether a kernel may run
  // twice) are another step: the key is compared whole.
  StepGraph other = g;
  other.kernels[static_cast<size_t>(g.values[static_cast<size_t>(m.a3)].producer)].recomputable =
      false;
  const StepPlan different = kiln::memory::plan_step(other, untimed(409));
  CHECK_FALSE(different.reused);
  CHECK(replay(other, *different.actions, 409).error == "");
  // Another budget is another plan too.
  CHECK_FALSE(kiln::memory::plan_step(g, untimed(509)).reused);
}

TEST_CASE("plan_step's tables, order and execution options reproduce its plan", "[planner]") {
  std::mt19937_64 rng(41);
  StepShape shape;
  shape.min_forward = 10;
  shape.max_forward = 40;
  int planned = 0;
  for (int n = 0; n < 30; ++n) {
    const StepGraph g = random_step(rng, shape);
    const size_t lb = lower_bound(g), top = unbudgeted_peak(g);
    const size_t budget = lb + (top - lb) / 2;
    INFO("graph " << n << ", budget " << budget);
    const StepPlan p = kiln::memory::plan_step(g, untimed(budget));
    if (!p.feasible) {
      CHECK(p.smallest_budget >= lb);
      CHECK_FALSE(p.actions->failure.empty());
      continue;
    }
    ++planned;
    CHECK(p.graph == kiln::memory::reorder_to_run(g, p.perm));
    CHECK(p.executes_at <= budget);
    CHECK(replay(p.graph, *p.actions, budget).error == "");
    const RecomputePlan followed = simulate_step(p.graph, p.execution());
    CHECK(render(followed.actions) == render(p.actions->actions));
  }
  CHECK(planned > 10);
}

TEST_CASE("plan_step reports an infeasible budget with its bound and smallest budget",
          "[planner]") {
  Mlp m(1.0);
  const StepPlan p = kiln::memory::plan_step(m.b.g, untimed(308));
  CHECK_FALSE(p.feasible);
  CHECK(p.actions->lower_bound == 309);
  CHECK(p.smallest_budget >= 309);
  CHECK(p.unplanned_peak == 509);
  CHECK_FALSE(p.actions->failure.empty());
}

TEST_CASE("plan_step plans quickly within the budget until the costs settle, then as if settled",
          "[planner][plan_step]") {
  // A CPU step: timed, with an arena of the values' own sizes. Until three steps have been
  // timed each plan is the quick one (an order race, one tighter plan at most); the step
  // whose costs settle makes the plan `kiln plan` would make of the same tables with those
  // costs, and later steps run it again.
  for (uint64_t seed : {3u, 4u}) {
    const StepGraph g = lstm_step(60, seed);
    const size_t lb = lower_bound(g), top = unbudgeted_peak(g);
    // Measured times unlike the estimates, so the settled costs choose for themselves.
    std::vector<double> measured(g.kernels.size());
    for (size_t k = 0; k < g.kernels.size(); ++k)
      measured[k] = g.kernels[k].cost * (0.5 + 0.25 * static_cast<double>(k % 5));
    for (double share : {0.5, 0.33}) {
      const auto budget = lb + static_cast<size_t>(share * static_cast<double>(top - lb));
      INFO("seed " << seed << ", budget " << budget);
      PlanRequest request = untimed(budget);
      request.timed = true;
      request.arena = true;
      for (const PlanValue& v : g.values) request.arena_bytes.push_back(v.bytes);
      StepPlan p;
      for (int step = 0; step < 4; ++step) {
        p = kiln::memory::plan_step(g, request);
        REQUIRE(p.feasible);
        CHECK_FALSE(p.reused);
        CHECK(p.actions->peak <= budget);
        CHECK(replay(p.graph, *p.actions, budget).error == "");
        REQUIRE(p.arena);
        if (step == 3) break;
        std::vector<double> seconds(p.perm.size());
        for (size_t i = 0; i < p.perm.size(); ++i)
          seconds[i] = measured[static_cast<size_t>(p.perm[i])];
        kiln::memory::record_kernel_times(p, seconds);
      }
      StepGraph settled_tables = g;
      for (size_t k = 0; k < g.kernels.size(); ++k)
        settled_tables.kernels[k].cost = std::max(measured[k], 1e-7);
      PlanRequest settled = request;
      settled.timed = false;
      const StepPlan thorough = kiln::memory::plan_step(settled_tables, settled);
      CHECK(p.order == thorough.order);
      CHECK(render(p.actions->actions) == render(thorough.actions->actions));
      CHECK(p.arena->bytes == thorough.arena->bytes);
      CHECK(p.fitted_for == thorough.fitted_for);
      CHECK(kiln::memory::plan_step(g, request).reused);
    }
  }
}
