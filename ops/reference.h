#pragma once
// The reference evaluator: runs a graph node by node, simply and obviously correctly,
// accumulating floating-point reductions in float64. It shares nothing with jit/ and is
// the oracle that every executor is tested against (select it with KILN_EXECUTOR=reference).
#include <vector>

#include "../core/node.h"

namespace kiln {

/// Evaluates `schedule` (pending nodes, inputs first) and attaches buffers to `requested`
/// nodes and to nodes that users still hold; intermediates are freed after their last use.
void reference_execute(const std::vector<Node*>& schedule, const std::vector<Node*>& requested);

}  // namespace kiln
