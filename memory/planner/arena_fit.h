#pragma once
// Fitting a budgeted step's reserved memory, not only its allocated bytes, into the budget.
// The planner counts the bytes alive at once; the step's arena (arena_plan.h) is bigger by
// its packing, 5-30% on steps with many rebuilds, and the pool holds it for the whole step
// beside the blocks outside it. So the budget is planned for less by what the arena and
// the outside blocks exceed it (RECOMPUTE.md §2a, "Pool loop"), two or three times, and
// then the gaps that the placement leaves are used: a value the plan evicts stays where it
// was placed while nothing else needs that place until its rebuilt copy would be freed
// (evictions_past_gaps), and its rebuild is dropped. The pool's reserve then stays within
// the budget and close to what is allocated, for at most a set share more of the step's
// work than a plan for the whole budget (budget.h, set_reserve_work_limit: 5% unless set);
// where it would take more (near the floor a few percent of the budget is much of what may
// be released), the plan for the whole budget runs.
#include <cstddef>
#include <vector>

#include "arena_plan.h"
#include "recompute_planner.h"

namespace kiln::memory {

/// How a pool turns a step's arena and the blocks outside it into reserved bytes: the
/// arena's own segment, the outside blocks' most bytes at once, and the free space the
/// segments of the blocks already there pin (measured when the step is planned). Without
/// it the benchmark LSTM's plan held a reserve the pool exceeded by 0.8-2.3 MiB.
struct PoolReserve {
  /// Reserved bytes of an arena of `bytes` (its segment); identity when not given.
  size_t (*arena_segment)(size_t bytes) = nullptr;
  size_t outside_slack = 0;  ///< Free bytes in segments that hold live blocks.

  /// The pool's reserve with `arena` open and its outside blocks at their peak.
  size_t reserved(const ArenaPlan& arena) const {
    const size_t segment =
        arena_segment && arena.bytes > 0 ? arena_segment(arena.bytes) : arena.bytes;
    return segment + arena.outside_peak + outside_slack;
  }
};

/// A budgeted plan with its arena placement.
struct ArenaFit {
  RecomputePlan plan;      ///< What to run; execute it following plan.chosen.
  ArenaPlan arena;         ///< Where its values go.
  PlannerTuning policy;    ///< How victims were chosen (sampling, seed).
  size_t budget = 0;       ///< The budget asked for, which the reserve is held within.
  size_t planned_for = 0;  ///< The budget of allocated bytes the plan was made for.
  size_t reserved = 0;     ///< PoolReserve::reserved of the arena.
  bool holds = false;      ///< reserved <= the budget.
  /// Evictions dropped because the value could stay in place: in the fitted plan's arena,
  /// then in the searched plan's.
  size_t kept_in_gaps = 0;
  /// Recomputation a plan that holds the reserve adds to the plan for the whole budget (the
  /// step's estimated seconds; 0 when none was found or none was needed).
  double reserve_cost = 0;
};

/// Plans `graph` under `options.budget` so that its arena and the blocks outside it fit the
/// budget, then keeps what fits in the arena's gaps. `bytes` are the values' arena sizes
/// (plan_arena). `thorough` (a plan made once and reused) uses simulate_best and refined
/// placements, bisects for the target in up to eight plans and keeps values in gaps;
/// otherwise (a step planned with estimated costs) two tighter plans are tried at most, and
/// `whole_plan`, when given, is simulate_step(graph, options) made already. When no tighter plan
/// fits (near the floor), or the one that does would add more than `work_limit` × the step's work
/// in rebuilds (`reserve_cost` says how much), the plan for the whole budget is returned with holds
/// = false: its allocated bytes keep the budget, its reserve does not. plan.feasible is false only
/// when the budget itself cannot be planned. `pool` says what an arena and the outside blocks
/// reserve.
ArenaFit fit_to_budget(const StepGraph& graph, const PlannerOptions& options,
                       const std::vector<size_t>& bytes, bool thorough, double work_limit,
                       const PoolReserve& pool = {}, const RecomputePlan* whole_plan = nullptr);

}  // namespace kiln::memory
