#pragma once
// Offline placement of a planned step's values in one block (an arena). A caching pool
// places each value when it is allocated, without knowing when it will be freed, so values
// that live long end up scattered between short-lived ones and pin half-used segments: an
// LSTM step under a budget reserved 1.7-2.5x its peak of allocated bytes. The memory plan
// knows every allocation and free of the step in advance, so the offsets can be chosen
// once, knowing all lifetimes: largest values first, each in the smallest gap left by the
// values placed before it that are alive at the same time (TFLite's "greedy by size"
// arena planner; RECOMPUTE.md §2a, "Pool loop"), or as a skyline that always fills its
// lowest stretch of time (strip packing's best fit), whichever needs less. The arena then
// needs little more than the step's peak of bytes alive at once.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "recompute_planner.h"

namespace kiln::memory {

/// Where each run of each kernel writes its output.
struct ArenaPlan {
  size_t bytes = 0;      ///< Size of the arena.
  size_t live_peak = 0;  ///< Highest sum of bytes of the arena's values alive at once.
  size_t values = 0;     ///< Allocations placed in the arena.
  /// Most bytes held outside the arena at once (leaves and values kept past the step, in
  /// the plan's sizes): the pool's blocks beside the arena.
  size_t outside_peak = 0;
  /// offsets[k][i]: offset of the output of kernel k's i-th run (0: its first run, then
  /// each recomputation), or -1 when it does not come from the arena: an in-place run (it
  /// takes its input's memory), a value kept past the step, or one of another device.
  std::vector<std::vector<int64_t>> offsets;
  /// The kernels of the plan's runs (first runs and recomputations) in order: a run that
  /// departs from it makes the later offsets meaningless.
  std::vector<int> runs;

  /// The offset for kernel `k`'s run number `run`, or -1.
  int64_t offset(int k, int run) const;
};

/// Places the values allocated by `actions` (a plan of `graph`, as simulate_step returns it)
/// in one arena. `bytes[v]` is the memory value v takes in the arena (0: never there).
/// Values never freed in the step, and chains of in-place runs that end in one, stay out.
/// With `refine` it also tries nearby placement orders (up to tens of milliseconds, fewer
/// tries on big steps) and keeps the smallest arena: for placements made once and reused.
/// `hint` (offsets by kernel and run, as ArenaPlan::offsets) is tried as one more
/// placement, kept when it is valid and smallest.
ArenaPlan plan_arena(const StepGraph& graph, const std::vector<PlanAction>& actions,
                     const std::vector<size_t>& bytes, bool refine = false,
                     const std::vector<std::vector<int64_t>>* hint = nullptr);

/// The evictions of `plan` (its `chosen`) still needed when a value may stay where `arena`
/// placed it, instead of being evicted and rebuilt, as long as nothing else is placed there
/// until its rebuilt copy would be freed. Planning again with PlannerOptions::follow set to
/// the result keeps those values and drops their rebuilds; at these offsets the arena would
/// not grow for it (a placement of the new plan may differ).
std::vector<ChosenEviction> evictions_past_gaps(const StepGraph& graph, const RecomputePlan& plan,
                                                const ArenaPlan& arena,
                                                const std::vector<size_t>& bytes);

}  // namespace kiln::memory
