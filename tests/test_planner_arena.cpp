// Arena placement (memory/planner/arena_plan.h) and fitting a plan's reserve to the budget
// (memory/planner/arena_fit.h), with the searches that choose among plans (simulate_best,
// search_evictions), on hand-built and seeded random steps.
#include <catch2/catch.hpp>

#include "planner_harness.h"

using namespace planner_test;

// ---------------------------------------------------------------------------------------
// Arena placement (memory/planner/arena_plan.h).

namespace {

// One allocation of the arena as the actions imply it, found here without plan_arena: the
// run that allocates it, its bytes, and the actions it is alive from and to (following
// in-place runs that take it over).
struct Lifetime {
  int kernel, run;
  size_t bytes;
  int from, to;
};

std::vector<Lifetime> lifetimes(const StepGraph& g, const std::vector<PlanAction>& actions,
                                const std::vector<size_t>& bytes) {
  std::vector<Lifetime> out;
  std::vector<int> runs(g.kernels.size(), 0), alive(g.values.size(), kNone);
  for (size_t t = 0; t < actions.size(); ++t) {
    const PlanAction& a = actions[t];
    if (a.kind == PlanAction::Kind::Free || a.kind == PlanAction::Kind::Evict) {
      if (int& l = alive[static_cast<size_t>(a.id)]; l != kNone) {
        out[static_cast<size_t>(l)].to = static_cast<int>(t);
        l = kNone;
      }
      continue;
    }
    const PlanKernel& k = g.kernels[static_cast<size_t>(a.id)];
    const int run = runs[static_cast<size_t>(a.id)]++;
    int& mine = alive[static_cast<size_t>(k.output)];
    if (a.in_place) {
      mine = std::exchange(alive[static_cast<size_t>(k.in_place_input)], kNone);
    } else if (bytes[static_cast<size_t>(k.output)] > 0) {
      mine = static_cast<int>(out.size());
      out.push_back({a.id, run, bytes[static_cast<size_t>(k.output)], static_cast<int>(t), -1});
    }
  }
  return out;
}

// The first way `arena` breaks the placement rules for `actions`, or "".
std::string check_arena(const StepGraph& g, const std::vector<PlanAction>& actions,
                        const std::vector<size_t>& bytes, const ArenaPlan& arena) {
  const std::vector<Lifetime> all = lifetimes(g, actions, bytes);
  std::vector<int64_t> at;
  std::vector<int> delta(actions.size() + 1, 0);
  size_t top = 0, placed = 0;
  for (const Lifetime& l : all) {
    const int64_t off = arena.offset(l.kernel, l.run);
    at.push_back(off);
    if (l.to < 0) {  // kept past the step
      if (off >= 0) return "a value kept past the step has an arena offset";
      continue;
    }
    if (off < 0) return "a value freed in the step has no arena offset";
    top = std::max(top, static_cast<size_t>(off) + l.bytes);
    ++placed;
  }
  if (top != arena.bytes) return "arena bytes differ from the highest placed byte";
  if (placed != arena.values) return "arena.values miscounted";
  size_t live = 0;
  for (size_t t = 0; t < actions.size(); ++t) {
    size_t now = 0;
    for (const Lifetime& l : all)
      if (l.to >= 0 && l.from <= static_cast<int>(t) && static_cast<int>(t) <= l.to) now += l.bytes;
    live = std::max(live, now);
  }
  if (live != arena.live_peak) return "live_peak differs from the bytes alive at once";
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = i + 1; j < all.size(); ++j) {
      const Lifetime &a = all[i], &b = all[j];
      if (a.to < 0 || b.to < 0 || a.to < b.from || b.to < a.from) continue;
      const auto ai = static_cast<size_t>(at[i]), bj = static_cast<size_t>(at[j]);
      if (ai < bj + b.bytes && bj < ai + a.bytes)
        return "kernels " + std::to_string(a.kernel) + " and " + std::to_string(b.kernel) +
               " overlap in time and in the arena";
    }
  return "";
}

std::vector<size_t> value_bytes(const StepGraph& g) {
  std::vector<size_t> bytes;
  for (const PlanValue& v : g.values) bytes.push_back(v.bytes);
  return bytes;
}

}  // namespace

TEST_CASE("planner arena places a chain's values by hand-derived offsets", "[planner]") {
  // x -> a (100) -> b (200) -> c (100) -> out (1, kept); actions written by hand.
  Builder bl;
  const int x = bl.leaf(8);
  const int a = bl.op({x}, 100), b = bl.op({a}, 200), c = bl.op({b}, 100);
  bl.op({c}, 1, 1.0, true);
  using K = PlanAction::Kind;
  const std::vector<PlanAction> actions{{K::Run, 0},  {K::Run, 1}, {K::Free, a}, {K::Run, 2},
                                        {K::Free, b}, {K::Run, 3}, {K::Free, c}};
  const ArenaPlan arena = plan_arena(bl.g, actions, value_bytes(bl.g));
  // b (largest) at 0; c (alive 3..6, longer than a's 0..2) above b, with which it overlaps;
  // a overlaps b but not c, so it takes c's place: 300 bytes, all alive at once at action 1.
  CHECK(arena.offset(1, 0) == 0);
  CHECK(arena.offset(2, 0) == 200);
  CHECK(arena.offset(0, 0) == 200);
  CHECK(arena.offset(3, 0) == -1);  // kept past the step
  CHECK(arena.bytes == 300);
  CHECK(arena.live_peak == 300);
  CHECK(arena.values == 3);
  CHECK(check_arena(bl.g, actions, value_bytes(bl.g), arena) == "");
}

TEST_CASE("planner arena packs by skyline where greedy by size leaves a gap", "[planner]") {
  // Lifetimes (actions): a 0..6 (200 bytes), b 1..3 (300), c 4..11 (200), d 5..8 (200); at
  // most 600 bytes alive at once (a, c and d at 5..6). Greedy by size, in each of its
  // orders, puts b at 0, a above it at 300, c at 0 and d in no gap below a: 700 bytes. The
  // skyline puts b and c at 0, then d on c (200), then a where b and d end (400): 600.
  Builder bl;
  const int x = bl.leaf(8);
  const int a = bl.op({x}, 200), b = bl.op({a}, 300);
  bl.op({b}, 1, 1.0, true);
  const int c = bl.op({a}, 200), d = bl.op({a, c}, 200);
  bl.op({d}, 1, 1.0, true);
  bl.op({c}, 1, 1.0, true);
  bl.op({c}, 1, 1.0, true);
  using K = PlanAction::Kind;
  const std::vector<PlanAction> actions{{K::Run, 0},  {K::Run, 1}, {K::Run, 2},  {K::Free, b},
                                        {K::Run, 3},  {K::Run, 4}, {K::Free, a}, {K::Run, 5},
                                        {K::Free, d}, {K::Run, 6}, {K::Run, 7},  {K::Free, c}};
  const ArenaPlan arena = plan_arena(bl.g, actions, value_bytes(bl.g));
  CHECK(arena.live_peak == 600);
  CHECK(arena.bytes == 600);
  CHECK(arena.offset(1, 0) == 0);    // b
  CHECK(arena.offset(3, 0) == 0);    // c
  CHECK(arena.offset(4, 0) == 200);  // d
  CHECK(arena.offset(0, 0) == 400);  // a
  CHECK(check_arena(bl.g, actions, value_bytes(bl.g), arena) == "");
}

TEST_CASE("planner arena follows in-place runs and gives each rebuild its own place", "[planner]") {
  Builder bl;
  const int x = bl.leaf(8);
  const int a = bl.op({x}, 100);
  const int b = bl.op({a}, 100);  // may overwrite a
  bl.last().in_place_input = a;
  const int c = bl.op({x}, 64);
  const int d = bl.op({b, c}, 1, 1.0, true);
  (void)d;
  using K = PlanAction::Kind;
  // a runs, b takes it over; c runs, is evicted, rebuilt, read by d, freed.
  const std::vector<PlanAction> actions{{K::Run, 0},   {K::Run, 1, true}, {K::Run, 2},
                                        {K::Evict, c}, {K::Recompute, 2}, {K::Run, 3},
                                        {K::Free, b},  {K::Free, c}};
  const ArenaPlan arena = plan_arena(bl.g, actions, value_bytes(bl.g));
  CHECK(arena.offset(0, 0) == 0);   // a's place, b's after the in-place run
  CHECK(arena.offset(1, 0) == -1);  // in place: no place of its own
  CHECK(arena.offset(2, 0) == 100);
  CHECK(arena.offset(2, 1) == 100);  // the rebuild: alive 4..7, beside b (0..6)
  CHECK(arena.offset(2, 2) == -1);   // no third run
  CHECK(arena.bytes == 164);
  CHECK(arena.values == 3);
  CHECK(check_arena(bl.g, actions, value_bytes(bl.g), arena) == "");
}

TEST_CASE("planner arena placements of random steps never overlap values alive together",
          "[planner]") {
  std::mt19937_64 rng(17);
  StepShape shape;
  shape.max_forward = 40;
  int checked = 0, refined_smaller = 0;
  size_t arena_bytes = 0, live_bytes = 0, refined_bytes = 0;
  for (int n = 0; n < 150; ++n) {
    const StepGraph g = random_step(rng, shape);
    const std::vector<size_t> bytes = value_bytes(g);
    const RecomputePlan free_plan = simulate_step(g, PlannerOptions{});
    const size_t lb = lower_bound(g);
    for (size_t budget : {size_t{0}, (lb + free_plan.peak) / 2, lb + (free_plan.peak - lb) / 5}) {
      const RecomputePlan p = budget == 0 ? free_plan : plan_with(g, budget);
      if (!p.feasible) continue;
      const ArenaPlan arena = plan_arena(g, p.actions, bytes);
      INFO("graph " << n << ", budget " << budget << ": " << render(p.actions));
      REQUIRE(check_arena(g, p.actions, bytes, arena) == "");
      // Refined: another valid placement, never bigger, the same for the same plan.
      const ArenaPlan refined = plan_arena(g, p.actions, bytes, true);
      REQUIRE(check_arena(g, p.actions, bytes, refined) == "");
      CHECK(refined.bytes <= arena.bytes);
      CHECK(refined.offsets == plan_arena(g, p.actions, bytes, true).offsets);
      ++checked;
      refined_smaller += refined.bytes < arena.bytes;
      arena_bytes += arena.bytes;
      refined_bytes += refined.bytes;
      live_bytes += arena.live_peak;
    }
  }
  CHECK(checked > 300);
  // Offsets chosen knowing every lifetime: close to the bytes alive at once (1.027 on these;
  // greedy by size alone gave 1.073).
  CHECK(static_cast<double>(arena_bytes) <= 1.05 * static_cast<double>(live_bytes));
  CHECK(refined_smaller > 0);
  WARN("arena placement of " << checked << " plans: arena / bytes alive at once = "
                             << static_cast<double>(arena_bytes) / static_cast<double>(live_bytes)
                             << ", refined "
                             << static_cast<double>(refined_bytes) / static_cast<double>(live_bytes)
                             << " (smaller on " << refined_smaller << ")");
}

namespace {

// Calls fn(g, budget, n) on `graphs` random steps with forward passes of `lo` to `hi`
// kernels, at each share of the way from the step's lower bound to its unbudgeted peak.
template <class Fn>
void for_budgeted_steps(uint64_t seed, int lo, int hi, int graphs,
                        std::initializer_list<double> shares, Fn fn) {
  std::mt19937_64 rng(seed);
  StepShape shape;
  shape.min_forward = lo;
  shape.max_forward = hi;
  for (int n = 0; n < graphs; ++n) {
    const StepGraph g = random_step(rng, shape);
    const size_t lb = lower_bound(g), top = simulate_step(g, PlannerOptions{}).peak;
    for (double share : shares)
      fn(g, lb + static_cast<size_t>(share * static_cast<double>(top - lb)), n);
  }
}

}  // namespace

TEST_CASE("planner simulate_best never recomputes more, and its options reproduce its plan",
          "[planner]") {
  // Reproduced as execution runs it: with the chosen options, following the plan's
  // evictions (its search of other evictions changes choices the options alone would not).
  int compared = 0, better = 0;
  double default_cost = 0, best_cost = 0;
  // Long enough that more than the 32 sampled candidates are resident at once.
  for_budgeted_steps(29, 60, 120, 60, {0.5, 0.2}, [&](const StepGraph& g, size_t budget, int n) {
    PlannerOptions o;
    o.budget = budget;
    const RecomputePlan plain = simulate_step(g, o);
    PlannerTuning chosen;
    const RecomputePlan best = simulate_best(g, o, &chosen);
    INFO("graph " << n << ", budget " << budget);
    if (plain.feasible) {
      REQUIRE(best.feasible);
      CHECK(best.extra_cost <= plain.extra_cost);
      ++compared;
      better += best.extra_cost < plain.extra_cost;
      default_cost += plain.extra_cost;
      best_cost += best.extra_cost;
    }
    if (!best.feasible) return;
    PlannerOptions replay(budget, chosen);
    replay.follow = &best.chosen;
    const RecomputePlan again = simulate_step(g, replay);
    CHECK(again.feasible);
    CHECK(render(again.actions) == render(best.actions));
    CHECK(best.peak <= budget);
  });
  CHECK(compared > 60);
  CHECK(better > 0);
  WARN("simulate_best on " << compared << " budgeted random steps: less recomputation on " << better
                           << ", " << best_cost / default_cost
                           << "x the extra work of simulate_step");
}

TEST_CASE("planner following a plan's own evictions reproduces it, and following fewer keeps more",
          "[planner]") {
  int followed = 0, fewer = 0;
  for_budgeted_steps(31, 20, 80, 80, {0.5, 0.25}, [&](const StepGraph& g, size_t budget, int n) {
    PlannerOptions o;
    o.budget = budget;
    const RecomputePlan p = simulate_step(g, o);
    if (!p.feasible) return;
    INFO("graph " << n << ", budget " << budget);
    CHECK(p.chosen.size() <= p.evictions);
    for (const ChosenEviction& e : p.chosen) {
      REQUIRE(static_cast<size_t>(e.action) < p.actions.size());
      CHECK(p.actions[static_cast<size_t>(e.action)].kind == PlanAction::Kind::Evict);
      CHECK(p.actions[static_cast<size_t>(e.action)].id == e.value);
    }
    PlannerOptions follow = o;
    follow.follow = &p.chosen;
    const RecomputePlan again = simulate_step(g, follow);
    CHECK(render(again.actions) == render(p.actions));
    ++followed;
    if (p.chosen.empty()) return;
    // Without the last half of its evictions, under no budget: those values stay, the
    // plan stays valid, and nothing is rebuilt more.
    std::vector<ChosenEviction> half(
        p.chosen.begin(), p.chosen.begin() + static_cast<std::ptrdiff_t>(p.chosen.size() / 2));
    PlannerOptions loose;
    loose.follow = &half;
    const RecomputePlan kept = simulate_step(g, loose);
    REQUIRE(kept.feasible);
    CHECK(replay(g, kept, 0).error == "");
    CHECK(kept.evictions <= p.evictions);
    CHECK(kept.extra_cost <= p.extra_cost + 1e-9);
    fewer += kept.evictions < p.evictions;
  });
  CHECK(followed > 80);
  CHECK(fewer > 20);
}

TEST_CASE("planner fit_to_budget holds the arena and the blocks beside it within the budget",
          "[planner]") {
  int held = 0, tighter = 0, gaps = 0, tried = 0;
  double reserve_over_alive = 0;
  for_budgeted_steps(37, 20, 80, 60, {0.5, 0.33}, [&](const StepGraph& g, size_t budget, int n) {
    const std::vector<size_t> bytes = value_bytes(g);
    PlannerOptions o;
    o.budget = budget;
    const RecomputePlan whole = simulate_step(g, o);
    if (!whole.feasible) return;
    for (bool thorough : {false, true}) {
      INFO("graph " << n << ", budget " << budget << (thorough ? ", thorough" : ""));
      // Without a limit on the work it may add; with none allowed, it holds only for free.
      const ArenaFit free_only = fit_to_budget(g, o, bytes, thorough, 0.0);
      CHECK(free_only.plan.feasible);
      if (free_only.holds) CHECK(free_only.reserve_cost == 0);
      if (!free_only.holds) CHECK(free_only.planned_for == budget);
      const ArenaFit fit =
          fit_to_budget(g, o, bytes, thorough, std::numeric_limits<double>::infinity());
      REQUIRE(fit.plan.feasible);
      ++tried;
      // Its arena is a valid placement of its actions, and its figures are what it says.
      CHECK(check_arena(g, fit.plan.actions, bytes, fit.arena) == "");
      CHECK(fit.reserved == fit.arena.bytes + fit.arena.outside_peak);
      CHECK(fit.holds == (fit.reserved <= budget));
      CHECK(fit.budget == budget);
      // Allocated bytes keep the budget always; executed as it runs (following its own
      // evictions under the whole budget), it is the same plan.
      CHECK(replay(g, fit.plan, budget).error == "");
      CHECK(fit.plan.peak <= budget);
      PlannerOptions follow(fit.budget, fit.policy);
      follow.follow = &fit.plan.chosen;
      CHECK(render(simulate_step(g, follow).actions) == render(fit.plan.actions));
      if (!fit.holds) {
        // Only when no tighter plan fits: then it is the plan for the whole budget.
        CHECK(fit.planned_for == budget);
        continue;
      }
      ++held;
      tighter += fit.planned_for < budget;
      gaps += fit.kept_in_gaps > 0;
      reserve_over_alive += static_cast<double>(fit.reserved) / static_cast<double>(fit.plan.peak);
    }
  });
  CHECK(tried > 100);
  CHECK(held > tried / 2);
  CHECK(tighter > 0);
  CHECK(gaps > 0);
  WARN("fit_to_budget: the reserve held on " << held << " of " << tried << " (a tighter plan on "
                                             << tighter << ", releases kept in gaps on " << gaps
                                             << "), reserve / allocated peak "
                                             << reserve_over_alive / held);
}

TEST_CASE("planner evictions_past_gaps keeps a value whose place stays free", "[planner]") {
  // x -> a (100) -> b (100) -> c (100) -> out (kept). a is read by b and by out; evicted
  // after b and rebuilt for out, by hand. Nothing else is placed where a was meanwhile,
  // so the eviction is not needed.
  Builder bl;
  const int x = bl.leaf(8);
  const int a = bl.op({x}, 100), b = bl.op({a}, 100), c = bl.op({b}, 100);
  bl.op({a, c}, 1, 1.0, true);
  using K = PlanAction::Kind;
  RecomputePlan plan;
  plan.actions = {{K::Run, 0},       {K::Run, 1}, {K::Evict, a}, {K::Run, 2}, {K::Free, b},
                  {K::Recompute, 0}, {K::Run, 3}, {K::Free, a},  {K::Free, c}};
  plan.chosen = {{2, 2, 0, a, 2}};
  // Lifetimes: a 0..2, b 1..4, c 3..8, a's rebuild 5..7.
  ArenaPlan placed = plan_arena(bl.g, plan.actions, value_bytes(bl.g));
  // By hand: a at 0, b at 100, c at 200, the rebuild at 0 again: the place stays free.
  placed.offsets = {{0, 0}, {100}, {200}, {}};
  placed.bytes = 300;
  REQUIRE(check_arena(bl.g, plan.actions, value_bytes(bl.g), placed) == "");
  CHECK(evictions_past_gaps(bl.g, plan, placed, value_bytes(bl.g)).empty());
  // c where a was (a dead from 2 on): the place is taken, the eviction is needed.
  placed.offsets = {{0, 100}, {100}, {0}, {}};
  placed.bytes = 200;
  REQUIRE(check_arena(bl.g, plan.actions, value_bytes(bl.g), placed) == "");
  CHECK(evictions_past_gaps(bl.g, plan, placed, value_bytes(bl.g)).size() == 1);
}
