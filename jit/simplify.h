#pragma once
// The simplify pass, first of the JIT pipeline (DESIGN.md, "Passes and kernels"): common
// subexpression elimination through the one structural key (core/structural_hash.h),
// constant folding of fills, exact algebraic identities, composition of reindex chains and
// dead-node removal. Every rewrite keeps the values bit-identical to the reference
// evaluator's, dtype and shape included; where floating point could tell the difference
// (x + 0.0 for x = -0.0, x * 0 for NaN) the rule does not fire.
//
// Set KILN_DISABLE_SIMPLIFY=1 to turn the pass off (it is read on every call): simplify then
// returns the schedule unchanged with no aliases, so a wrong result can be bisected to it.
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "../core/node.h"

namespace kiln::jit {

/// Result of simplification: `schedule` rewritten (topological, only nodes still needed) and,
/// for each requested node whose value is now computed by another node, the node to take its
/// value from.
struct SimplifyResult {
  /// Pending nodes to run, inputs first: the representatives of the outputs and what they need.
  std::vector<Node*> schedule;
  /// Output node -> the node in `schedule` that computes its value (the executor shares that
  /// node's buffer with the output). Outputs absent from the map compute themselves.
  std::unordered_map<Node*, Node*> alias;
  /// Nodes made by the pass (folded fills, composed reindexes); they stay alive through this
  /// vector and through the input edges now pointing at them.
  std::vector<NodePtr> created;
  /// Replaced nodes. Redirecting edges can drop the last reference to a node that the
  /// caller's `schedule` still points at; these references keep such nodes alive, so keep the
  /// result (or move this vector somewhere) until the input schedule's pointers are done with.
  std::vector<NodePtr> retained;
  /// merged: nodes replaced by an equal earlier node (CSE). folded: nodes replaced by a fill
  /// computed here. identities: nodes replaced by an operand or by a composed reindex.
  /// removed: nodes of the input schedule that are not in `schedule` (replaced or dead).
  size_t merged = 0, folded = 0, removed = 0, identities = 0;
};

/// `schedule`: pending nodes, inputs first (from pending_subgraph); `outputs`: nodes whose
/// values must be produced (requested, plus held ones). Rewrites pending nodes' `inputs` in
/// place to point at representatives — semantically invisible, as in Jittor. Evaluated nodes
/// and the attributes of output nodes are never modified; an output is only aliased to a
/// pending node (never to an evaluated leaf, whose buffer must not be shared with a value
/// that may later be donated).
SimplifyResult simplify(const std::vector<Node*>& schedule, const std::vector<Node*>& outputs);

/// Outputs with aliases applied, in order and without duplicates: the list to hand to an
/// executor together with `result.schedule`.
std::vector<Node*> aliased_outputs(const SimplifyResult& result, const std::vector<Node*>& outputs);

/// True when KILN_DISABLE_SIMPLIFY=1 is set in the environment now.
bool simplify_disabled();

}  // namespace kiln::jit
