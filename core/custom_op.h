#pragma once
// What core knows of a user kernel (OpCode::Custom, see frontend/custom_kernel.h): an
// opaque payload that hashes, compares and runs itself. Passes never look inside it; the
// JIT executor and the reference evaluator both call run(), so a custom node has one
// definition of its value whichever executor runs it.
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct Node;

/// The payload of an OpCode::Custom node: one output of a user kernel.
class CustomKernelOp {
 public:
  virtual ~CustomKernelOp() = default;
  /// The kernel's name, for messages, dumps and the kernel cache's metadata.
  virtual const std::string& name() const = 0;
  /// Structural hash (source, declared inputs and outputs, which output this node is):
  /// CSE and the plan cache key custom nodes by it.
  virtual uint64_t hash() const = 0;
  /// Exact comparison behind hash(): true when both compute the same value from the same
  /// inputs.
  virtual bool same_as(const CustomKernelOp& other) const = 0;
  /// The same kernel and output whatever the sizes (what hash() sees): the plan cache's
  /// structural comparison, so a new batch size reuses a plan.
  virtual bool same_kernel(const CustomKernelOp& other) const = 0;
  /// Computes node `n`'s value on the host: `inputs` are its inputs' data (n.inputs order,
  /// host memory), `out` is n.nbytes() of host memory to fill.
  virtual void run(const Node& n, const std::vector<const void*>& inputs, void* out) const = 0;
};

}  // namespace kiln
