// The recomputation planner (memory/planner/recompute_planner.h) checked against the harness's
// independent replay: broken plans are rejected, and plans of seeded random steps, with and
// without budgets, checkpoint regions and any input order, keep every rule.
#include <catch2/catch.hpp>

#include "planner_harness.h"

using namespace planner_test;

// ---------------------------------------------------------------------------------------
// The replay checker itself: it must reject broken plans, or the fuzzing proves nothing.

TEST_CASE("planner replay rejects broken plans", "[planner]") {
  Builder b;
  const int x = b.leaf(4);
  const int a = b.op({x}, 10);
  const int c = b.op({a}, 10, 1.0, true);
  const StepGraph& g = b.g;
  RecomputePlan good = simulate_step(g, PlannerOptions{});
  REQUIRE(render(good.actions) == "R0 R1 F1");
  REQUIRE(replay(g, good, 0).error.empty());
  auto broken = [&](std::vector<PlanAction> actions) {
    RecomputePlan p = good;
    p.actions = std::move(actions);
    return replay(g, p, 0).error;
  };
  CHECK_FALSE(broken({{Kind::Run, 1}, {Kind::Run, 0}}).empty());                   // order
  CHECK_FALSE(broken({{Kind::Run, 0}, {Kind::Free, a}, {Kind::Run, 1}}).empty());  // read freed
  CHECK_FALSE(broken({{Kind::Run, 0}, {Kind::Run, 1}, {Kind::Free, a}, {Kind::Free, a}}).empty());
  CHECK_FALSE(broken({{Kind::Run, 0}, {Kind::Run, 1}, {Kind::Free, c}}).empty());  // output
  CHECK_FALSE(broken({{Kind::Run, 0}, {Kind::Run, 1}, {Kind::Free, x}}).empty());  // kept leaf
  CHECK_FALSE(broken({{Kind::Run, 0}, {Kind::Recompute, 0}, {Kind::Run, 1}}).empty());
  CHECK_FALSE(broken({{Kind::Run, 0}}).empty());  // incomplete
  CHECK_FALSE(broken({{Kind::Run, 0}, {Kind::Run, 1, true}, {Kind::Free, a}}).empty());
  RecomputePlan wrong_peak = good;
  wrong_peak.peak += 1;
  CHECK_FALSE(replay(g, wrong_peak, 0).error.empty());
  RecomputePlan over = good;  // peak 24 against a budget of 20
  CHECK_FALSE(replay(g, over, 20).error.empty());
}

// ---------------------------------------------------------------------------------------
// Random steps.

TEST_CASE("planner unbudgeted plans are the schedule plus frees at last reads", "[planner]") {
  std::mt19937_64 rng(20240611);
  StepShape shape;
  shape.unread_donated = true;
  for (int n = 0; n < 200; ++n) {
    const StepGraph g = random_step(rng, shape);
    INFO("graph " << n);
    const RecomputePlan p = simulate_step(g, PlannerOptions{});
    const ReplayResult r = replay(g, p, 0);
    REQUIRE(r.error == "");
    REQUIRE(check_unbudgeted(g, p) == "");
    REQUIRE(p.lower_bound == lower_bound(g));
    REQUIRE(p.lower_bound <= p.peak);
    REQUIRE(p.extra_cost == 0);
  }
}

TEST_CASE("planner budgeted plans of random steps replay within budget", "[planner]") {
  StepShape shape;
  shape.non_recomputable = false;
  shape.ancestors_first = true;
  const FuzzResult plain = fuzz_budgets(shape, 1, 200);
  REQUIRE(plain.error == "");
  shape.regions = true;
  const FuzzResult regions = fuzz_budgets(shape, 2, 100);
  REQUIRE(regions.error == "");
  // 6 budgets per graph; most must plan, and many of those must evict.
  CHECK(plain.plans == 1200);
  CHECK(plain.feasible > 600);
  CHECK(plain.evicting > 300);
  CHECK(regions.evicting > 150);
  WARN("budgeted plans: " << plain.feasible << " of " << plain.plans << " feasible, "
                          << plain.evicting << " evicting; with regions " << regions.feasible
                          << " of " << regions.plans << ", " << regions.evicting << " evicting");
}

// The same with kernels whose inputs come in any order, non-recomputable kernels and
// donated parameters nothing reads: exposes the faults shown by "planner locks an input
// rebuilt as another input's ancestor", "planner evicts values whose non-recomputable
// ancestor is freed" and "planner peak of a step starting with an unread donated leaf".
TEST_CASE("planner budgeted plans of random steps with any input order", "[planner]") {
  StepShape shape;
  shape.unread_donated = true;
  CHECK(fuzz_budgets(shape, 3, 200).error == "");
  shape.regions = true;
  CHECK(fuzz_budgets(shape, 4, 100).error == "");
}
