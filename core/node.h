#pragma once
// A node of the lazy graph: one meta-op application with its inputs, output shape, dtype,
// device, attributes and, once evaluated, its buffer. Nodes are built only through ops/,
// which validates them; core just holds and walks them.
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocator.h"
#include "device.h"
#include "dtype.h"
#include "index_expr.h"
#include "op_code.h"
#include "scalar.h"
#include "shape.h"

namespace kiln {

struct Node;
using NodePtr = std::shared_ptr<Node>;
class CustomKernelOp;  // core/custom_op.h
struct CustomGrad;     // ops/custom_function.h: opaque to core

/// One meta-op application. Attributes not used by an op keep their defaults.
/// Whether fusion stores a value it would otherwise inline into its consumers.
enum class StoreHint : uint8_t {
  None,
  /// Always stored: a join's inner pieces, so its kernels do not depend on how many pieces
  /// there are; a value a library product reads anyway.
  Always,
  /// Stored only where no memory budget applies to the evaluation: values a backward pass
  /// reads that cost more to rebuild than to keep (an LSTM's gates). Under a budget they
  /// are inlined again, so the planner releases what they are computed from, as before.
  Unbudgeted,
  /// Stored only where a memory budget applies: a value whose inputs the backward pass would
  /// otherwise keep, larger together (an LSTM's summed gate pre-activations, stored under a
  /// budget so that both products die in the forward pass).
  Budgeted,
};

struct Node : std::enable_shared_from_this<Node> {
  Node(OpCode op, std::vector<NodePtr> inputs, Shape shape, DType dtype, Device device);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  OpCode op;
  DType dtype;
  Device device;
  Shape shape;
  std::vector<NodePtr> inputs;

  // --- attributes ---
  /// Full: the value. Reindex: the fill for out-of-range coordinates.
  Scalar scalar;
  /// Reindex: input coordinates as functions of output coordinates (one per input dim).
  /// ReindexReduce: output coordinates as functions of input coordinates (one per out dim).
  std::vector<IndexExpr> index_map;
  /// ReindexReduce: the combining operator.
  ReduceOp reduce = ReduceOp::Sum;
  /// Reindex/ReindexReduce: an out-of-range coordinate computed from an index tensor read
  /// raises IndexError (gather, scatter) instead of giving the fill / being skipped.
  bool check_indices = false;
  /// Iota: the dimension whose coordinate is the value.
  int axis = 0;
  /// RandUniform/RandNormal: the generator state the values are a pure function of.
  uint64_t seed = 0, offset = 0;
  /// Full: a C++ number used as an operand; it promotes like a Python scalar ("weak").
  bool weak_scalar = false;
  /// The user-level op that created this node ("softmax", "matmul"), for messages and dumps.
  const char* origin = nullptr;
  /// The public composite op being built when this node was made (cross_entropy around
  /// its gather; see CompositeScope), or null: errors about the node name it first.
  const char* composite = nullptr;
  /// Nonzero for nodes built inside kiln::checkpoint (the region's number): the memory
  /// planner releases their values once the region is done and rebuilds them when read.
  uint32_t checkpoint_region = 0;
  /// Fusion stores this value instead of inlining it into its consumers (StoreHint). A hint
  /// only: results do not change, and a memory budget may still drop and rebuild the value.
  StoreHint store_hint = StoreHint::None;
  /// Custom: the user kernel this node runs (core/custom_op.h).
  std::shared_ptr<const CustomKernelOp> custom;

  // --- autograd ---
  /// Gradients flow through this node: set at construction when grad mode is on, the dtype
  /// is floating and some input requires grad; set by hand on leaves (parameters).
  bool requires_grad = false;
  /// A leaf of differentiation (a parameter): backward stops here and accumulates `grad`.
  bool grad_leaf = false;
  /// The accumulated gradient of a leaf (Tensor::grad()); counted as a user handle so that a
  /// pending gradient is evaluated together with the step that reads it.
  NodePtr grad;
  /// Set on a value returned by a custom autograd function (kiln::autograd::Function): its
  /// gradient comes from the function's backward, and autograd walks to the function's
  /// inputs instead of this node's. Simplify never replaces or merges such a node.
  std::shared_ptr<const CustomGrad> custom_grad;

  // --- state ---
  /// The value, once evaluated. Constants are created with one and never lose it.
  std::shared_ptr<Buffer> buffer;
  /// Number of user-visible Tensor handles; evaluation keeps values that users still hold.
  std::atomic<int32_t> handles{0};
  /// Set when an in-place update took over this value's buffer (donation, e.g. a parameter
  /// replaced by an optimizer step): the old value is gone and reading it raises ValueError.
  bool donated = false;
  /// Set when assign() or set_data() moved a tensor off this value: only graphs already
  /// built can read it, so the update that replaces it may take over its buffer.
  bool replaced = false;
  /// Creation order, unique per process; names nodes in dumps.
  const uint64_t id;

  bool is_evaluated() const { return buffer != nullptr; }
  /// A new node with this one's attributes (fill, map, reduce, seed, origin, ...) but the
  /// given op, inputs and device; no buffer, no gradient flags.
  NodePtr with(OpCode new_op, std::vector<NodePtr> new_inputs, Device new_device) const;
  int64_t numel() const { return kiln::numel(shape); }
  /// The op a user called to build this node, for error messages: composite, else origin,
  /// else the meta-op's name.
  const char* user_op() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(dtype); }

  /// Number of Node objects alive in the process (graph lifetime tests watch this).
  static int64_t live_count();
};

/// Runs the graph: given pending nodes in topological order and the subset requested, it
/// must attach a buffer to every requested node, and should also keep values that have
/// user handles. Registered by ops/ (reference evaluator) and jit/.
using ExecutorFn = void (*)(const std::vector<Node*>& schedule,
                            const std::vector<Node*>& requested);

/// Registers an executor under `name` ("reference", "jit"); higher priority wins by default.
void register_executor(const char* name, int priority, ExecutorFn fn);
/// The executor in use: `KILN_EXECUTOR` if set, else the registered one of highest priority.
const char* current_executor();
/// Overrides the executor for this process (tests use it to compare executors).
void set_executor(const char* name);

/// Evaluates the given nodes: runs the pending subgraph, then drops the input edges of
/// every node that now holds a value so that earlier graphs are freed. Pending tensors
/// that users hold and whose graphs overlap the request are evaluated too (weak sync), so
/// reading a loss after an optimizer step recomputes nothing.
void evaluate_nodes(const std::vector<Node*>& nodes);

/// Tensor handles call these when they start and stop referring to a node; they keep the
/// set of pending nodes that users hold, which evaluation uses for weak sync.
void acquire_handle(Node* node);
void release_handle(Node* node);

/// Whether nodes built on this thread record gradient flow (false inside a NoGradGuard).
bool grad_mode_enabled();
/// Turns gradient recording on or off for this thread; returns the previous setting.
bool set_grad_mode(bool enabled);

/// Makes nodes built on this thread belong to checkpoint region `region` (0: none);
/// returns the previous region. kiln::checkpoint uses it.
uint32_t set_checkpoint_region(uint32_t region);
/// While alive, names `op` as the composite of every node built on this thread; nested
/// scopes keep the outermost (the op the user called), so cross_entropy's inner
/// log_softmax and gather report "[cross_entropy]".
class CompositeScope {
 public:
  explicit CompositeScope(const char* op);
  ~CompositeScope();
  CompositeScope(const CompositeScope&) = delete;
  CompositeScope& operator=(const CompositeScope&) = delete;

 private:
  const char* previous_;
};
/// A new, process-unique checkpoint region number.
uint32_t new_checkpoint_region();
/// Replaces a leaf's accumulated gradient, keeping the handle accounting right.
void set_node_grad(Node& node, NodePtr grad);

/// Pending nodes (no buffer) reachable from `roots`, inputs before users.
std::vector<Node*> pending_subgraph(const std::vector<Node*>& roots);

}  // namespace kiln
