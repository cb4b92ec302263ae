// Kernel orders (memory/planner/schedule_order.h), the work floor (memory/planner/work_floor.h) and
// step graph files (memory/reports/step_graph_file.h) on seeded random and hand-built steps.
#include <catch2/catch.hpp>

#include "planner_harness.h"

using namespace planner_test;

// ---------------------------------------------------------------------------------------
// Kernel orders (memory/planner/schedule_order.h).

namespace {

// Trailing kernels nothing reads (the updates step_memory keeps last).
size_t unread_tail(const StepGraph& g) {
  const std::vector<int> last = last_readers(g);
  size_t tail = 0;
  while (tail < g.kernels.size() &&
         last[static_cast<size_t>(g.kernels[g.kernels.size() - 1 - tail].output)] == kNone)
    ++tail;
  return tail;
}

// Empty when `perm` is a permutation of g's kernels in which every producer runs before its
// readers and the last `tail` kernels stay where they are.
std::string check_order(const StepGraph& g, const std::vector<int>& perm, size_t tail) {
  const size_t nk = g.kernels.size();
  if (perm.size() != nk) return "not one position per kernel";
  std::vector<int> at(nk, kNone);
  for (size_t i = 0; i < nk; ++i) {
    if (perm[i] < 0 || static_cast<size_t>(perm[i]) >= nk || at[static_cast<size_t>(perm[i])] >= 0)
      return "not a permutation at " + std::to_string(i);
    at[static_cast<size_t>(perm[i])] = static_cast<int>(i);
  }
  for (size_t i = nk - tail; i < nk; ++i)
    if (perm[i] != static_cast<int>(i)) return "tail kernel " + std::to_string(i) + " moved";
  for (size_t k = 0; k < nk; ++k)
    for (int in : g.kernels[k].inputs) {
      const int p = g.values[static_cast<size_t>(in)].producer;
      if (p >= 0 && at[static_cast<size_t>(p)] >= at[k])
        return "kernel " + std::to_string(k) + " runs before its input's producer " +
               std::to_string(p);
    }
  return "";
}

}  // namespace

TEST_CASE("planner kernel orders of random steps are topological and plan soundly", "[planner]") {
  std::mt19937_64 rng(7);
  StepShape shape;
  shape.unread_donated = true;
  int reordered = 0;
  for (int n = 0; n < 150; ++n) {
    const StepGraph g = random_step(rng, shape);
    const size_t tail = unread_tail(g);
    for (auto order : all_orders()) {
      INFO("graph " << n << ", order " << order_name(order));
      const std::vector<int> perm = schedule_order(g, order, tail);
      REQUIRE(check_order(g, perm, tail) == "");
      const StepGraph h = reorder(g, perm);
      bool moved = false;
      for (size_t i = 0; i < perm.size(); ++i) moved = moved || perm[i] != static_cast<int>(i);
      reordered += moved;
      // The reordered step computes the same values and plans like any other step.
      const RecomputePlan free_plan = simulate_step(h, PlannerOptions{});
      REQUIRE(replay(h, free_plan, 0).error == "");
      PlannerOptions o;
      o.budget = lower_bound(h) + (free_plan.peak - lower_bound(h)) / 3;
      const RecomputePlan p = simulate_step(h, o);
      if (p.feasible) REQUIRE(replay(h, p, o.budget).error == "");
    }
  }
  CHECK(reordered > 150);  // most orders differ from the given one somewhere
}

TEST_CASE("planner order choice never does worse than the given order", "[planner]") {
  std::mt19937_64 rng(8);
  StepShape shape;
  shape.non_recomputable = false;
  for (int n = 0; n < 150; ++n) {
    const StepGraph g = random_step(rng, shape);
    const size_t tail = unread_tail(g);
    INFO("graph " << n);
    const RecomputePlan given = simulate_step(g, PlannerOptions{});
    const auto free_choice = choose_schedule_order(g, PlannerOptions{}, tail);
    CHECK(free_choice.plan.peak <= given.peak);
    PlannerOptions o;
    o.budget = lower_bound(g) + (given.peak - lower_bound(g)) / 2;
    const RecomputePlan tight = simulate_step(g, o);
    const auto choice = choose_schedule_order(g, o, tail, ScheduleOrder::Breadth);
    if (tight.feasible) {
      REQUIRE(choice.plan.feasible);
      CHECK(choice.plan.extra_cost <= tight.extra_cost);
    }
    if (choice.plan.feasible) {
      const StepGraph h = reorder(g, choice.perm);
      CHECK(replay(h, choice.plan, o.budget).error == "");
    }
  }
}

// No plan the planner makes, in any kernel order, recomputes less than the floor, and a
// floor that finds no room means the planner finds none either.
TEST_CASE("planner plans of random steps never recompute less than the work floor", "[planner]") {
  std::mt19937_64 rng(31);
  StepShape shape;
  int bounded = 0;
  for (int n = 0; n < 150; ++n) {
    const StepGraph g = random_step(rng, shape);
    const size_t tail = unread_tail(g);
    const size_t lb = lower_bound(g), peak = simulate_step(g, PlannerOptions{}).peak;
    for (double share : {0.0, 0.2, 0.5, 0.8}) {
      PlannerOptions o;
      o.budget = lb + static_cast<size_t>(share * static_cast<double>(peak - lb));
      INFO("graph " << n << ", budget " << o.budget);
      const WorkFloor f = extra_work_floor(g, o.budget);
      PlannerTuning chosen;
      const RecomputePlan best = simulate_best(g, o, &chosen);
      const auto choice = choose_schedule_order(g, o, tail);
      if (!f.feasible) {
        CHECK_FALSE(best.feasible);
        CHECK_FALSE(choice.plan.feasible);
        continue;
      }
      if (best.feasible) CHECK(best.extra_cost >= f.extra_cost - 1e-9);
      if (choice.plan.feasible) CHECK(choice.plan.extra_cost >= f.extra_cost - 1e-9);
      if (f.extra_cost > 0) ++bounded;
    }
  }
  // Most tight budgets force some recomputation: the floor must see it.
  CHECK(bounded > 150);
  WARN(bounded << " of 600 budgets have a nonzero work floor");
}

// x1 -> x2 -> x3 (10 bytes each), each also read by a 1-byte sink s_i, and one result
// reading the sinks. As given (depth-first) every x is alive at once; running s_i as soon
// as it frees x_i keeps at most two alive.
TEST_CASE("planner kernel orders have the hand-derived peaks", "[planner]") {
  Builder b;
  const int l = b.leaf(1);
  const int x1 = b.op({l}, 10), x2 = b.op({x1}, 10), x3 = b.op({x2}, 10);
  const int s1 = b.op({x1}, 1), s2 = b.op({x2}, 1), s3 = b.op({x3}, 1);
  b.op({s1, s2, s3}, 1, 1.0, true);
  const StepGraph& g = b.g;
  auto peak = [&](ScheduleOrder order) {
    return simulate_step(reorder(g, schedule_order(g, order, 0)), PlannerOptions{}).peak;
  };
  // Given: leaf 1 + x1..x3 30 + s1 1 = 32 before x1 goes.
  CHECK(peak(ScheduleOrder::Given) == 32);
  // Eager: nothing frees after x1, so x2 (given order); then s1 frees x1 (12 left), x3
  // (22), s2 with x2 still there (23).
  CHECK(schedule_order(g, ScheduleOrder::Eager, 0) == std::vector<int>{0, 1, 3, 2, 4, 5, 6});
  CHECK(peak(ScheduleOrder::Eager) == 23);
  // Frees: s1 first (it allocates least), then x2 frees x1; s2, x3, s3: 23 at x3.
  CHECK(schedule_order(g, ScheduleOrder::Frees, 0) == std::vector<int>{0, 3, 1, 4, 2, 5, 6});
  CHECK(peak(ScheduleOrder::Frees) == 23);
  CHECK(schedule_order(g, ScheduleOrder::Breadth, 0) == std::vector<int>{0, 1, 3, 2, 4, 5, 6});
  const auto choice = choose_schedule_order(g, PlannerOptions{}, 0);
  CHECK(choice.order == ScheduleOrder::Eager);  // ties with the others; Eager comes first
  CHECK(choice.plan.peak == 23);
  // Under a budget of 23 the given order must recompute (or cannot fit); a reordered one
  // fits without recomputing.
  PlannerOptions o;
  o.budget = 23;
  const RecomputePlan given = simulate_step(g, o);
  CHECK((!given.feasible || given.extra_cost > 0));
  const auto fit = choose_schedule_order(g, o, 0);
  CHECK(fit.plan.feasible);
  CHECK(fit.plan.extra_cost == 0);
  CHECK(fit.order != ScheduleOrder::Given);
}

TEST_CASE("planner step graphs survive a round trip through a file", "[planner]") {
  std::mt19937_64 rng(9);
  StepShape shape;
  shape.regions = true;
  StepGraphFile file{random_step(rng, shape), {}, 12345, 2};
  for (size_t k = 0; k < file.graph.kernels.size(); ++k)
    file.kernel_names.push_back(k % 2 ? "matmul+relu" : "");
  file.graph.kernels[0].cost = 1.0 / 3.0;
  // Candidates travel with the tables, so a replay reorders them as the stage does.
  for (auto& k : file.graph.kernels)
    if (!k.inputs.empty()) k.in_place_candidates = {k.inputs.back()};
  const std::string path = std::filesystem::temp_directory_path().string() + "/kiln-step-" +
                           std::to_string(::getpid()) + ".graph";
  save_step_graph(file, path);
  const StepGraphFile back = load_step_graph(path);
  CHECK(back.budget == 12345);
  CHECK(back.fixed_tail == 2);
  CHECK(back.kernel_names == file.kernel_names);
  CHECK(back.graph.start_bytes == file.graph.start_bytes);
  REQUIRE(back.graph.kernels.size() == file.graph.kernels.size());
  for (size_t k = 0; k < file.graph.kernels.size(); ++k) {
    const auto &a = file.graph.kernels[k], &c = back.graph.kernels[k];
    CHECK((a.inputs == c.inputs && a.output == c.output && a.cost == c.cost &&
           a.recomputable == c.recomputable && a.in_place_input == c.in_place_input &&
           a.region == c.region && a.region_result == c.region_result &&
           a.in_place_candidates == c.in_place_candidates));
  }
  REQUIRE(back.graph.values.size() == file.graph.values.size());
  for (size_t v = 0; v < file.graph.values.size(); ++v) {
    const auto &a = file.graph.values[v], &c = back.graph.values[v];
    CHECK((a.bytes == c.bytes && a.producer == c.producer && a.output == c.output &&
           a.releasable_leaf == c.releasable_leaf));
  }
  // A damaged file is refused with its line, never half-read.
  {
    std::ofstream out(path);
    out << "kiln-step-graph 1\nbudget 0\nstart_bytes 0\nfixed_tail 0\nvalues 1\n4 0 0 0\n"
           "kernels 1\n0 1.0 1 -1 0 0 1 0 | reads itself\n";
  }
  CHECK_THROWS_WITH(load_step_graph(path), Catch::Contains(":8:") && Catch::Contains("before"));
  CHECK_THROWS_AS(load_step_graph(path + ".missing"), kiln::IOError);
  std::filesystem::remove(path);
}

TEST_CASE("planner order race keeps choose_schedule_order's order when every plan finishes",
          "[planner]") {
  std::mt19937_64 rng(23);
  StepShape shape;
  shape.min_forward = 10;
  shape.max_forward = 40;
  int raced = 0;
  for (int n = 0; n < 30; ++n) {
    const StepGraph g = random_step(rng, shape);
    const size_t lb = lower_bound(g), top = unbudgeted_peak(g);
    PlannerOptions o;
    o.budget = lb + (top - lb) / 2;
    const size_t tail = unread_tail(g);
    INFO("graph " << n << ", budget " << o.budget);
    const kiln::memory::OrderChoice full = kiln::memory::choose_schedule_order(g, o, tail);
    // Work enough for any plan of a step this small: the race is the full choice.
    const kiln::memory::OrderChoice race =
        kiln::memory::race_schedule_orders(g, o, tail, size_t{1} << 40);
    CHECK(race.plan.feasible == full.plan.feasible);
    if (!full.plan.feasible) continue;
    ++raced;
    CHECK(race.order == full.order);
    CHECK(race.perm == full.perm);
    // Its plan is the one of the winner's tables as a step runs them.
    const StepGraph ran = race.order == kiln::memory::ScheduleOrder::Given
                              ? g
                              : kiln::memory::reorder_to_run(g, race.perm);
    CHECK(render(race.plan.actions) == render(simulate_step(ran, o).actions));
    // With no work allowed, no plan that evicts finishes, and an order is still named.
    const kiln::memory::OrderChoice starved = kiln::memory::race_schedule_orders(g, o, tail, 0);
    CHECK(check_order(g, starved.perm, tail) == "");
  }
  CHECK(raced > 10);
}

TEST_CASE("planner max_work stops a plan without changing one that finishes within it",
          "[planner]") {
  const StepGraph g = lstm_step(40, 5);
  const size_t lb = lower_bound(g), top = unbudgeted_peak(g);
  PlannerOptions o;
  o.budget = lb + (top - lb) / 3;
  const RecomputePlan free = simulate_step(g, o);
  REQUIRE(free.feasible);
  REQUIRE(free.work > 0);
  o.max_work = free.work;  // stops only once past it
  const RecomputePlan enough = simulate_step(g, o);
  CHECK(enough.feasible);
  CHECK(render(enough.actions) == render(free.actions));
  CHECK(enough.work == free.work);
  o.max_work = free.work / 4;
  const RecomputePlan stopped = simulate_step(g, o);
  CHECK_FALSE(stopped.feasible);
  CHECK(stopped.over_work);
  CHECK(stopped.work > o.max_work);
  CHECK(stopped.work < free.work);
}
