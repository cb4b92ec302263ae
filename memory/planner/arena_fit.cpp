#include "arena_fit.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

namespace kiln::memory {
namespace {

// Tighter plans tried for a plan made once, and for a step planned with estimated costs.
constexpr int kFitRounds = 8;
constexpr int kQuickFitPlans = 2;

RecomputePlan plan_once(const StepGraph& graph, const PlannerOptions& options, bool thorough,
                        PlannerTuning* policy) {
  if (thorough) return simulate_best(graph, options, policy);
  *policy = options;
  return simulate_step(graph, options);
}

// Where each run of `actions` happens: (kernel at, kernel, nth run of it while at that
// kernel), the key PlannerOptions::follow uses. Runs of two plans of one step with the same key
// are the same run.
std::vector<std::tuple<int, int, int>> run_keys(const StepGraph& graph,
                                                const std::vector<PlanAction>& actions) {
  std::vector<std::tuple<int, int, int>> keys;
  std::vector<int> nth(graph.kernels.size(), 0), touched;
  int at = 0;
  for (const PlanAction& a : actions) {
    if (a.kind != PlanAction::Kind::Run && a.kind != PlanAction::Kind::Recompute) continue;
    keys.emplace_back(at, a.id, nth[static_cast<size_t>(a.id)]++);
    touched.push_back(a.id);
    if (a.kind == PlanAction::Kind::Run) {
      ++at;
      for (int k : touched) nth[static_cast<size_t>(k)] = 0;
      touched.clear();
    }
  }
  return keys;
}

// A run_keys key ordered by kernel first.
std::tuple<int, int, int> by_kernel(const std::tuple<int, int, int>& key) {
  return {std::get<1>(key), std::get<0>(key), std::get<2>(key)};
}

// The offsets of `from`'s runs (placed by `arena`) for the same runs in `to`, by run_keys;
// -1 for runs `from` does not have.
std::vector<std::vector<int64_t>> offsets_for(const StepGraph& graph,
                                              const std::vector<PlanAction>& from,
                                              const ArenaPlan& arena,
                                              const std::vector<PlanAction>& to) {
  std::map<std::tuple<int, int, int>, int64_t> placed;
  {
    const auto keys = run_keys(graph, from);
    std::vector<int> runs(graph.kernels.size(), 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      const int k = std::get<1>(keys[i]);
      placed[by_kernel(keys[i])] = arena.offset(k, runs[static_cast<size_t>(k)]++);
    }
  }
  std::vector<std::vector<int64_t>> offsets(graph.kernels.size());
  for (const auto& run : run_keys(graph, to)) {
    const auto key = by_kernel(run);
    // The same run, else the latest earlier run of that kernel: a value the plan no longer
    // evicts needs fewer rebuilds of its ancestors, and one that was rebuilt early for it
    // is rebuilt later, within the old one's lifetime, for its other reader.
    int64_t at = -1;
    auto it = placed.lower_bound(key);
    if (it != placed.end() && it->first == key)
      at = it->second;
    else if (it != placed.begin() && std::get<0>(std::prev(it)->first) == std::get<0>(key))
      at = std::prev(it)->second;
    offsets[static_cast<size_t>(std::get<0>(key))].push_back(at);
  }
  return offsets;
}

// `plan`, made with `policy` for `target` bytes, with its arena placed (thoroughly or not)
// and whether the pool's reserve for it holds within `budget`.
ArenaFit with_arena(const StepGraph& graph, RecomputePlan plan, const PlannerTuning& policy,
                    size_t budget, size_t target, const std::vector<size_t>& bytes, bool thorough,
                    const PoolReserve& pool) {
  ArenaFit fit;
  fit.plan = std::move(plan);
  fit.policy = policy;
  fit.budget = budget;
  fit.planned_for = target;
  if (!fit.plan.feasible) return fit;
  fit.arena = plan_arena(graph, fit.plan.actions, bytes, thorough);
  fit.reserved = pool.reserved(fit.arena);
  fit.holds = fit.reserved <= budget;
  return fit;
}

// Keeps in the arena's gaps what fits there: the plan then runs against the whole budget,
// which its reserve already keeps.
ArenaFit keep_in_gaps(const StepGraph& graph, ArenaFit fit, const std::vector<size_t>& bytes,
                      bool thorough, const PoolReserve& pool) {
  if (!fit.plan.feasible || !fit.holds) return fit;
  const std::vector<ChosenEviction> needed = evictions_past_gaps(graph, fit.plan, fit.arena, bytes);
  if (needed.size() == fit.plan.chosen.size()) return fit;
  PlannerOptions follow(fit.budget, fit.policy);
  follow.follow = &needed;
  RecomputePlan kept = simulate_step(graph, follow);
  if (!kept.feasible || kept.extra_cost > fit.plan.extra_cost) return fit;
  // The values kept in gaps stay where they were placed: the old placement is tried too.
  const std::vector<std::vector<int64_t>> hint =
      offsets_for(graph, fit.plan.actions, fit.arena, kept.actions);
  ArenaPlan arena = plan_arena(graph, kept.actions, bytes, thorough, &hint);
  if (pool.reserved(arena) > fit.budget) return fit;
  fit.kept_in_gaps += fit.plan.chosen.size() - needed.size();
  fit.plan = std::move(kept);
  fit.arena = std::move(arena);
  fit.reserved = pool.reserved(fit.arena);
  return fit;
}

// Of two plans that hold the reserve, the one with less recomputation; within half a
// percent of the step's work (below what kernel timing tells apart) the one that uses more
// of its reserve, which keeps more and leaves less of the pool idle.
bool preferred(const ArenaFit& a, const ArenaFit& b) {
  const double close = 0.005 * a.plan.base_cost;
  if (a.plan.extra_cost < b.plan.extra_cost - close) return true;
  if (a.plan.extra_cost > b.plan.extra_cost + close) return false;
  return a.plan.peak >= b.plan.peak;
}

// The fit's plan searched for other evictions (search_evictions), kept when it needs less
// and its arena holds the reserve wherever the fit's did: searching before the fit moved
// plans whose arena held to ones whose arena did not.
ArenaFit searched(const StepGraph& graph, ArenaFit fit, const std::vector<size_t>& bytes,
                  const PoolReserve& pool) {
  if (!fit.plan.feasible) return fit;
  const PlannerOptions at(fit.planned_for, fit.policy);
  RecomputePlan plan = search_evictions(graph, fit.plan, at);
  if (plan.extra_cost >= fit.plan.extra_cost) return fit;
  ArenaPlan arena = plan_arena(graph, plan.actions, bytes, true);
  const size_t reserved = pool.reserved(arena);
  const bool holds = reserved <= fit.budget;
  if (fit.holds && !holds) return fit;
  fit.plan = std::move(plan);
  fit.arena = std::move(arena);
  fit.reserved = reserved;
  fit.holds = holds;
  // The searched plan evicts other values, so other ones may fit in its arena's gaps.
  return keep_in_gaps(graph, std::move(fit), bytes, true, pool);
}

// fit_to_budget of a thorough plan before the search of other evictions.
ArenaFit fit_once(const StepGraph& graph, const PlannerOptions& options,
                  const std::vector<size_t>& bytes, double work_limit, const PoolReserve& pool) {
  const size_t budget = options.budget;
  // The search plans with the given options (a budget it cannot hold is planned up to the
  // rebuild cap, which takes longest); the plan kept is then made thoroughly.
  auto plan_for = [&](size_t target, bool best_of) {
    PlannerOptions at = options;
    PlannerTuning policy;
    at.budget = target;
    RecomputePlan plan = plan_once(graph, at, best_of, &policy);
    return with_arena(graph, std::move(plan), policy, budget, target, bytes, best_of, pool);
  };
  ArenaFit whole = plan_for(budget, true);
  if (!whole.plan.feasible || whole.holds)
    return keep_in_gaps(graph, std::move(whole), bytes, true, pool);
  // The target whose plan holds the reserve with the least recomputation once gaps are
  // used. Each plan packs differently, so the reserve is not monotone in the target: a
  // plan over the budget moves the next target down by its excess, an infeasible one sets a
  // floor, and once one holds the search moves back up towards the lowest target that did
  // not.
  std::optional<ArenaFit> best;
  size_t high = budget;  // the lowest target whose plan did not hold
  size_t floor = 0;      // the highest infeasible target
  size_t target = budget, over = whole.reserved - budget;
  for (int round = 0; round < kFitRounds; ++round) {
    size_t next;
    if (best) {
      next = best->planned_for + (high - best->planned_for) / 2;
    } else if (over > 0) {
      const size_t cut = std::max(over + over / 8, budget / 256);
      next = target > cut ? target - cut : 0;
      if (floor > 0) next = std::max(next, floor + (target - floor) / 2);
    } else {
      next = floor + (high - floor) / 2;
    }
    if (next <= floor || next >= high) break;
    // Bisection stops once the step is small; a cut by an excess always goes on.
    if ((best || over == 0) && high - next < budget / 256) break;
    target = next;
    ArenaFit fit = plan_for(target, false);
    over = 0;
    if (!fit.plan.feasible) {
      floor = target;
      continue;
    }
    if (!fit.holds) {
      high = target;
      over = fit.reserved - budget;
      continue;
    }
    fit = keep_in_gaps(graph, std::move(fit), bytes, false, pool);
    if (!best || preferred(fit, *best))
      best = std::move(fit);
    else if (target > best->planned_for)
      high = target;  // costs more higher up: stop there
  }
  if (!best) return whole;
  // The target found, planned again thoroughly.
  ArenaFit again = keep_in_gaps(graph, plan_for(best->planned_for, true), bytes, true, pool);
  if (again.holds && preferred(again, *best)) {
    *best = std::move(again);
  } else {
    // Placed again with refinement, its placement so far among the tries: never bigger,
    // so the plan still holds.
    const std::vector<std::vector<int64_t>> placed = best->arena.offsets;
    best->arena = plan_arena(graph, best->plan.actions, bytes, true, &placed);
    best->reserved = pool.reserved(best->arena);
  }
  // Holding the reserve is worth a little work, not much: near the floor a few percent of
  // the budget is a large share of what may be released (the benchmark MLP at 0.33 went
  // from +36% to +60% rebuilds for 2.5 MiB).
  whole.reserve_cost = std::max(best->plan.extra_cost - whole.plan.extra_cost, 0.0);
  if (whole.reserve_cost > work_limit * whole.plan.base_cost) return whole;
  best->reserve_cost = whole.reserve_cost;
  return std::move(*best);
}

// fit_to_budget for a step planned with estimated costs, which plans again on every step
// until its costs settle: the plan for the whole budget and, when its reserve exceeds the
// budget, a plan for less by 1.5 times the excess (a tighter plan packs worse: on the
// benchmark LSTM's steps a cut by 9/8 of it left the reserve over the budget at 1.0, twice
// it took more than the work limit at 0.5), and when that one still exceeds the budget one
// more, cut again by 1.5 times what remains; kept when it holds within the work limit. Bisecting
// for the target and keeping values in gaps took each of those steps 0.2-0.4 s more; the step whose
// costs settle does both.
ArenaFit fit_quickly(const StepGraph& graph, const PlannerOptions& options,
                     const std::vector<size_t>& bytes, double work_limit, const PoolReserve& pool,
                     const RecomputePlan* whole_plan) {
  const size_t budget = options.budget;
  auto fitted = [&](RecomputePlan plan, size_t target) {
    return with_arena(graph, std::move(plan), options, budget, target, bytes, false, pool);
  };
  ArenaFit whole = fitted(whole_plan ? *whole_plan : simulate_step(graph, options), budget);
  if (!whole.plan.feasible || whole.holds) return whole;
  // A tighter plan is of use only within the work limit: it stops planning past it (near
  // the floor, where it would go on into a plan that cannot fit at all).
  PlannerOptions tighter = options;
  if (whole.plan.base_cost > 0)
    tighter.max_extra_cost =
        std::min(options.max_extra_cost, whole.plan.extra_cost / whole.plan.base_cost + work_limit);
  size_t cut = 0, over = whole.reserved - budget;
  for (int round = 0; round < kQuickFitPlans; ++round) {
    cut += std::max(over + over / 2, budget / 256);
    if (cut >= budget) break;
    tighter.budget = budget - cut;
    ArenaFit fit = fitted(simulate_step(graph, tighter), tighter.budget);
    if (!fit.plan.feasible) break;  // past the work limit, or below the floor
    if (!fit.holds) {               // cut again by 1.5 times what it still exceeds
      over = fit.reserved - budget;
      continue;
    }
    whole.reserve_cost = std::max(fit.plan.extra_cost - whole.plan.extra_cost, 0.0);
    if (whole.reserve_cost > work_limit * whole.plan.base_cost) return whole;
    fit.reserve_cost = whole.reserve_cost;
    return fit;
  }
  return whole;
}

}  // namespace

ArenaFit fit_to_budget(const StepGraph& graph, const PlannerOptions& options,
                       const std::vector<size_t>& bytes, bool thorough, double work_limit,
                       const PoolReserve& pool, const RecomputePlan* whole_plan) {
  if (!thorough) return fit_quickly(graph, options, bytes, work_limit, pool, whole_plan);
  return searched(graph, fit_once(graph, options, bytes, work_limit, pool), bytes, pool);
}

}  // namespace kiln::memory
