// The least extra work any plan of a step needs to fit a budget: a lower bound that tells
// how far a plan's recomputation could still fall, whatever the policy or kernel order.
//
// When a kernel d runs, in any order, every value made before it by one of its ancestors
// and read after it by one of its descendants is either resident or made again later, at
// the cost of its kernel at least. d's own inputs and output, the leaves that stay (or are
// read later), and the results made before it must be resident. So the bytes of the other
// such values above the budget must be dropped, and the cheapest way, allowing fractions
// of a value (fractional knapsack by cost per byte), bounds the extra work from below. Each
// kernel gives a bound; the floor is the highest. A dropped value's kernel reads inputs
// too: one that no longer exists at d is kept past it (its bytes count) or made again
// (its cost counts), shared among the dropped values that read it. Inputs further up,
// and the order rebuilds must follow, are left out, so real plans can need more, never
// less (the `[planner]` tests check that no plan kiln makes recomputes less).
//
// The plans it bounds rebuild whole kernels of the step's fusion, or (InlineInput) compute
// a value again inside a reader that can: such an input of d need not be resident at d,
// and a value's rebuild costs at least the smallest share any of its readers is charged.
#pragma once

#include <cstddef>

#include "recompute_planner.h"

namespace kiln::memory {

/// The floor of a step at one budget.
struct WorkFloor {
  /// False when the bytes that must be resident at some kernel exceed the budget alone:
  /// no plan fits, whatever it recomputes.
  bool feasible = true;
  /// Least extra run time (the kernels' costs, seconds) any plan within the budget adds.
  double extra_cost = 0;
  /// The step's own cost (sum of its kernels' costs), as RecomputePlan::base_cost.
  double base_cost = 0;
  /// The kernel whose moment gives the floor (or the first that does not fit), or -1.
  int at_kernel = -1;
};

/// The least extra work any plan of `graph` within `budget` bytes needs (see above).
/// Takes O(kernels × values) time; meant for analysis (`kiln plan`), not for every step.
WorkFloor extra_work_floor(const StepGraph& graph, size_t budget);

}  // namespace kiln::memory
