#pragma once
// A step's planning tables on disk: KILN_PLAN_DUMP writes the tables of every evaluation
// that goes through the planner, and `kiln plan FILE` replays the planner on them at other
// budgets. The format is plain text, one value or kernel per line, so a step that does not
// fit its budget can be attached to a bug report and studied without the model.
#include <string>
#include <vector>

#include "../planner/recompute_planner.h"

namespace kiln::memory {

/// A step's tables plus a readable name per kernel (its fused ops) and the budget it ran under.
struct StepGraphFile {
  StepGraph graph;
  std::vector<std::string> kernel_names;  ///< One per kernel; may be empty strings.
  size_t budget = 0;                      ///< The budget in force when it was written.
  size_t fixed_tail = 0;  ///< Trailing kernels (updates) that stay last in every order.
};

/// Writes `file` to `path` (replacing it); throws IOError when it cannot be written.
void save_step_graph(const StepGraphFile& file, const std::string& path);

/// Reads a file written by save_step_graph; throws IOError when it cannot be read and
/// ValueError naming the line when it is not a valid step graph.
StepGraphFile load_step_graph(const std::string& path);

/// Where to write this evaluation's tables: the path KILN_PLAN_DUMP names, or "" when it is
/// unset. With "%n" in it, one file per evaluation: "%n" becomes a count of the calls,
/// zero-padded to six digits (000000, 000001, ...). Without, one file that keeps the last
/// training step (`training_step`: the evaluation ends in parameter updates): evaluations
/// without updates write that path only until a training step has.
std::string plan_dump_path(bool training_step);

}  // namespace kiln::memory
