#pragma once
// The JIT executor: simplify -> fuse -> lower -> print -> compile (cached) -> run.
#include <string>
#include <vector>

#include "../core/node.h"

namespace kiln::jit {

/// Evaluates `schedule` with generated kernels; registered as executor "jit".
void jit_execute(const std::vector<Node*>& schedule, const std::vector<Node*>& requested);

/// Statistics of the most recent JIT evaluation in this process (tests and reports).
struct EvalStats {
  size_t nodes = 0;
  size_t kernels = 0;
  size_t library_calls = 0;
  size_t conv_calls = 0;  ///< of the library calls, convolutions (jit/library_conv.h)
};
/// The statistics of the last jit_execute call.
EvalStats last_eval_stats();

/// The fused plan of `outputs` as Graphviz DOT, each kernel a cluster of its source ops
/// (nothing is evaluated).
std::string plan_to_dot(const std::vector<Node*>& outputs);

}  // namespace kiln::jit
