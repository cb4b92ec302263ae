#pragma once
// The fusion pass: decides which values are materialized and groups every other node into
// the kernel of the value that consumes it.
#include <unordered_set>
#include <utility>
#include <vector>

#include "../core/node.h"
#include "library_conv.h"
#include "library_gemm.h"

namespace kiln::jit {

/// One kernel: computes and stores `root`, with `members` computed inline.
struct FusionGroup {
  /// The group's position in its FusionPlan (the executor's replay cache keys launches by it).
  int index = -1;
  Node* root = nullptr;
  /// Nodes computed inside the kernel (root included), inputs first.
  std::vector<Node*> members;
  /// Materialized nodes (earlier roots or evaluated leaves) that the kernel reads.
  std::vector<Node*> inputs;
  /// Set when the group runs as a library GEMM instead of a generated kernel.
  bool library = false;
  GemmMatch gemm;
  /// Set (conv.root non-null) when the library call is a convolution instead of a GEMM.
  ConvMatch conv;
};

/// Kernels in execution order.
struct FusionPlan {
  std::vector<FusionGroup> groups;
};

/// Groups `schedule` (pending nodes, inputs first) into kernels. Values in `outputs`,
/// reductions, index tensors and costly multi-use values are materialized; the rest is
/// inlined into consumers (duplicated when several consumers share a cheap producer).
/// Matmul compositions of float32/float64 become library GEMM groups.
/// conv2d's products become library convolution groups where oneDNN runs them.
/// KILN_DISABLE_FUSION=1 materializes every node (one kernel per node),
/// KILN_DISABLE_LIBRARY=1 keeps matmuls (and convolutions) as generated code and
/// KILN_DISABLE_CONV=1 keeps conv2d as im2col + library GEMM, for bisecting. On the CPU an
/// add of a product into a value stored anyway becomes one accumulating GEMM group
/// (KILN_DISABLE_ACCUMULATE=1 keeps the add separate).
FusionPlan fuse(const std::vector<Node*>& schedule, const std::unordered_set<Node*>& outputs);

/// Which store hints fusion honours in one evaluation: StoreHint::Always, StoreHint::Unbudgeted
/// while the node's device has no memory budget (memory/pools/budget.h), and
/// StoreHint::Budgeted while it has one.
/// Each device's budget is read once per object: the plan cache's signature asks for every
/// node of every evaluation.
class StoreHints {
 public:
  /// Whether n's hint makes fusion store it.
  bool stored(const Node& n);

 private:
  std::vector<std::pair<Device, bool>> budgeted_;  // a device and whether it has a budget
};

/// The size-dependent part of the fusion choices about `n` (whether a reduction can be a
/// row stage at its sizes): plans cached for one schedule are reused only where it agrees.
uint64_t fusion_size_class(const Node& n);

/// True when KILN_DISABLE_<PASS>=1 is set (read once per pass name).
bool pass_disabled(const char* pass);

}  // namespace kiln::jit
