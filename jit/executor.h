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

/// How evaluations found their plans since the process started (the replay cache: a
/// schedule seen before reuses its fusion plan, lowered kernels and kernel handles).
struct ReplayStats {
  uint64_t hits = 0;               ///< evaluations that reused a cached plan
  uint64_t misses = 0;             ///< evaluations that fused afresh (new signature)
  uint64_t collisions = 0;         ///< of the misses: a cached signature, another graph
  uint64_t hits_relowered = 0;     ///< of the hits: sizes or random draws changed
  uint64_t groups_relowered = 0;   ///< groups lowered again for those changes
  uint64_t launches_replayed = 0;  ///< kernel launches that skipped lowering and lookup
  uint64_t simplify_skipped = 0;   ///< of the hits: small schedules simplify had left as is
  /// Of the misses, the first guard that failed against the last plan made for the same ops
  /// and edges (KILN_LOG=debug prints the node): none had been made, a dtype, a device, a
  /// rank or which dimensions are 1, a scalar/index map/reduction/axis/flag, which nodes are
  /// outputs or stored; or nothing (the graph's plan was dropped when the cache filled).
  uint64_t missed_new_graph = 0, missed_dtype = 0, missed_device = 0, missed_broadcast = 0,
           missed_attributes = 0, missed_roles = 0, missed_dropped = 0;
};
/// The replay cache's counts (process-wide).
ReplayStats replay_stats();
/// For tests: keeps only the low `bits` bits of plan signatures (64: all), so that
/// unrelated graphs collide and the exact check that confirms each hit is exercised.
void set_plan_signature_bits_for_testing(int bits);

/// The fused plan of `outputs` as Graphviz DOT, each kernel a cluster of its source ops
/// (nothing is evaluated).
std::string plan_to_dot(const std::vector<Node*>& outputs);

}  // namespace kiln::jit
