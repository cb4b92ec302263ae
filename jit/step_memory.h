#pragma once
// The executor's memory pass: runs a fused schedule with a static memory plan. It builds the
// RecomputePlanner's tables from the fusion groups (which values each kernel reads and
// writes, which dying input a kernel may overwrite, which replaced values an update may take
// over), checks the budget before anything runs, then runs the kernels through the planner
// so that every buffer goes back to the pool after its last read and, under a budget,
// values are released early and rebuilt just before they are read again.
#include <cstdint>
#include <functional>
#include <unordered_set>
#include <vector>

#include "fuse.h"

namespace kiln::jit {

/// Node::checkpoint_region carries this bit on the results of a checkpointed function: they
/// belong to the region (reading its values does not end it) but are kept like any value.
constexpr uint32_t kCheckpointResultBit = 1u << 31;

/// Runs one fusion group (the executor's kernel launcher). It must write into the root's
/// buffer when the root already has one (in-place reuse) and allocate it otherwise.
using GroupRunner = std::function<void(const FusionGroup&)>;

/// Runs `plan`'s groups under the memory budget of the device they run on. `outputs` stay
/// resident; `original` and `simplified` are the pending schedule before and after
/// simplification (every node that may reference a leaf), used to prove that a replaced
/// value can be donated. Throws OutOfMemoryError, before running anything, when the budget
/// is below what the step needs; the message gives the lower bound and the smallest budget
/// that works.
void run_with_memory_plan(const FusionPlan& plan, const std::unordered_set<Node*>& outputs,
                          const std::vector<Node*>& original, const std::vector<Node*>& simplified,
                          const GroupRunner& run);

/// True when every read of `input` by `group` is at the output's own element (an
/// elementwise path from the root to it) and the two have the same shape and bytes, so the
/// output may be written into the input's buffer.
bool reads_at_output_index(const FusionGroup& group, const Node* input);

}  // namespace kiln::jit
