#include "node.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

#include "cuda_driver.h"
#include "error.h"
#include "settings.h"

namespace kiln {
namespace {

std::atomic<int64_t> g_live_nodes{0};
std::atomic<uint64_t> g_next_id{0};

struct OpTraits {
  std::string_view name;
  OpFamily family;
  int arity;
};

constexpr OpTraits kOpTraits[] = {
#define KILN_X(id, name, family, arity) {name, OpFamily::family, arity},
    KILN_META_OPS(KILN_X)
#undef KILN_X
};

struct ExecutorEntry {
  const char* name;
  int priority;
  ExecutorFn fn;
};

struct ExecutorRegistry {
  std::mutex mutex;
  std::vector<ExecutorEntry> entries;
  std::string forced;  // set_executor() or KILN_EXECUTOR
};

ExecutorRegistry& registry() {
  // Leaked on purpose: executors may run while other statics are being destroyed.
  static ExecutorRegistry* r = [] {
    auto* reg = new ExecutorRegistry;
    reg->forced = settings::text("KILN_EXECUTOR").value_or("");
    return reg;
  }();
  return *r;
}

ExecutorFn select_executor(std::string* chosen) {
  ExecutorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  const ExecutorEntry* best = nullptr;
  for (const ExecutorEntry& e : r.entries) {
    if (!r.forced.empty()) {
      if (r.forced == e.name) best = &e;
    } else if (best == nullptr || e.priority > best->priority) {
      best = &e;
    }
  }
  if (best == nullptr) {
    std::string known;
    for (const ExecutorEntry& e : r.entries)
      known += std::string(known.empty() ? "" : ", ") + e.name;
    throw ValueError("[eval] no executor named '" + r.forced + "'; available: " + known);
  }
  if (chosen) *chosen = best->name;
  return best->fn;
}

// Pending nodes with user handles. Only 0<->1 transitions take the lock, and they re-read
// the count under it so that racing transitions settle on the final state.
std::mutex g_held_mutex;
std::unordered_set<Node*> g_held_pending;

// Held pending nodes whose pending subgraph reaches a node of `scheduled`. The walk runs
// under the registry lock: a registered node still has a handle, and a handle's last
// release waits for the lock, so no candidate can be destroyed mid-walk; the result holds
// strong references so the nodes outlive their evaluation whatever other threads drop.
std::vector<NodePtr> overlapping_held(const std::unordered_set<Node*>& scheduled) {
  std::vector<NodePtr> extra;
  // Nodes whose whole pending subgraph was walked without meeting the schedule: later
  // candidates skip them. A walk that finds an overlap stops early, so what it saw is not
  // known to be clear and is not recorded.
  std::unordered_set<Node*> clear;
  std::lock_guard lock(g_held_mutex);
  for (auto it = g_held_pending.begin(); it != g_held_pending.end();) {
    Node* c = *it;
    if (c->is_evaluated()) {
      it = g_held_pending.erase(it);
      continue;
    }
    ++it;
    if (scheduled.count(c) || clear.count(c)) continue;
    std::vector<Node*> stack{c};
    std::unordered_set<Node*> seen{c};
    bool overlaps = false;
    while (!stack.empty() && !overlaps) {
      Node* n = stack.back();
      stack.pop_back();
      for (const NodePtr& in : n->inputs) {
        Node* m = in.get();
        if (m->is_evaluated() || clear.count(m)) continue;
        if (scheduled.count(m)) {
          overlaps = true;
          break;
        }
        if (seen.insert(m).second) stack.push_back(m);
      }
    }
    if (overlaps) {
      extra.push_back(c->shared_from_this());
    } else {
      clear.insert(seen.begin(), seen.end());
    }
  }
  // In creation order, not the set's (which follows addresses): the held values are roots
  // of the evaluation, and their order is the schedule's, so a training loop's steps must
  // see them in the same order to be recognised as the same step (memory plans are reused
  // by the step's tables) and to run their kernels in the same order.
  std::sort(extra.begin(), extra.end(),
            [](const NodePtr& a, const NodePtr& b) { return a->id < b->id; });
  return extra;
}

thread_local bool t_grad_mode = true;
thread_local uint32_t t_checkpoint_region = 0;
thread_local const char* t_composite = nullptr;

[[noreturn]] void raise_donated(const Node& n) {
  throw ValueError("[" + std::string(n.user_op()) + "] the value " + shape_str(n.shape) + " " +
                   std::string(dtype_name(n.dtype)) +
                   " was overwritten by an in-place update (an optimizer step or assign took "
                   "over its buffer); compute what reads it before the update, or keep a "
                   "handle to it (a held value is never donated)");
}

// Evaluations touch shared graph state (buffers, edges) of possibly overlapping graphs, so
// they are serialized; building ops concurrently stays lock-free.
std::recursive_mutex g_eval_mutex;

}  // namespace

namespace {
std::atomic<uint32_t> g_default_device{0};  // kind << 16 | index
}  // namespace

NodePtr Node::with(OpCode new_op, std::vector<NodePtr> new_inputs, Device new_device) const {
  auto copy = std::make_shared<Node>(new_op, std::move(new_inputs), shape, dtype, new_device);
  copy->scalar = scalar;
  copy->index_map = index_map;
  copy->reduce = reduce;
  copy->check_indices = check_indices;
  copy->axis = axis;
  copy->seed = seed;
  copy->offset = offset;
  copy->weak_scalar = weak_scalar;
  copy->origin = origin;
  copy->composite = composite;
  copy->checkpoint_region = checkpoint_region;
  copy->store_hint = store_hint;
  copy->custom = custom;
  copy->requires_grad = false;
  return copy;
}

Device default_device() {
  uint32_t v = g_default_device.load(std::memory_order_relaxed);
  return Device{static_cast<Device::Kind>(v >> 16), static_cast<int>(v & 0xffff)};
}

void set_default_device(Device device) {
  check_device_available("set_default_device", device);
  g_default_device.store(
      static_cast<uint32_t>(device.kind) << 16 | static_cast<uint32_t>(device.index),
      std::memory_order_relaxed);
}

void check_device_available(const char* op, Device device) {
  if (device.kind == Device::Kind::CPU) return;
  if (device.index < 0 || device.index > 0xffff) {
    throw DeviceError(std::string("[") + op + "] " + device.str() + " is not a device index");
  }
  int count = cuda::device_count();
  if (device.index >= count) {
    throw DeviceError(std::string("[") + op + "] " + device.str() + " is not available: " +
                      (count == 0
                           ? cuda::driver_status()
                           : "this machine has " + std::to_string(count) + " CUDA device(s)") +
                      "; use Device::cpu()");
  }
}

std::string_view op_name(OpCode op) { return kOpTraits[static_cast<int>(op)].name; }
OpFamily op_family(OpCode op) { return kOpTraits[static_cast<int>(op)].family; }
int op_arity(OpCode op) { return kOpTraits[static_cast<int>(op)].arity; }

std::string_view reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Prod:
      return "prod";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::And:
      return "and";
    case ReduceOp::Or:
      break;
  }
  return "or";
}

Node::Node(OpCode op_, std::vector<NodePtr> inputs_, Shape shape_, DType dtype_, Device device_)
    : op(op_),
      dtype(dtype_),
      device(device_),
      shape(std::move(shape_)),
      inputs(std::move(inputs_)),
      id(g_next_id.fetch_add(1, std::memory_order_relaxed)) {
  // Ops check their shapes with their own names first; this catches any path that did not.
  check_sizes(op_name(op), shape, itemsize(dtype));
  g_live_nodes.fetch_add(1, std::memory_order_relaxed);
  checkpoint_region = t_checkpoint_region;
  composite = t_composite;
  if (t_grad_mode && is_floating(dtype)) {
    for (const NodePtr& in : inputs) {
      if (in->requires_grad) {
        requires_grad = true;
        break;
      }
    }
  }
}

Node::~Node() {
  g_live_nodes.fetch_sub(1, std::memory_order_relaxed);
  if (grad) release_handle(grad.get());
  // Release long chains iteratively: recursive destruction of a 100k-node unevaluated
  // graph would overflow the stack.
  std::vector<NodePtr> pending = std::move(inputs);
  while (!pending.empty()) {
    NodePtr n = std::move(pending.back());
    pending.pop_back();
    if (n && n.use_count() == 1) {
      for (NodePtr& in : n->inputs) pending.push_back(std::move(in));
      n->inputs.clear();
    }
  }
}

bool grad_mode_enabled() { return t_grad_mode; }

const char* Node::user_op() const {
  return composite ? composite : origin ? origin : op_name(op).data();
}

CompositeScope::CompositeScope(const char* op) : previous_(t_composite) {
  if (t_composite == nullptr) t_composite = op;
}

CompositeScope::~CompositeScope() { t_composite = previous_; }

uint32_t set_checkpoint_region(uint32_t region) {
  uint32_t previous = t_checkpoint_region;
  t_checkpoint_region = region;
  return previous;
}

uint32_t new_checkpoint_region() {
  static std::atomic<uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

bool set_grad_mode(bool enabled) {
  bool previous = t_grad_mode;
  t_grad_mode = enabled;
  return previous;
}

void set_node_grad(Node& node, NodePtr grad) {
  if (grad) acquire_handle(grad.get());
  if (node.grad) release_handle(node.grad.get());
  node.grad = std::move(grad);
}

int64_t Node::live_count() { return g_live_nodes.load(std::memory_order_relaxed); }

void register_executor(const char* name, int priority, ExecutorFn fn) {
  ExecutorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entries.push_back({name, priority, fn});
}

const char* current_executor() {
  std::string chosen;
  select_executor(&chosen);
  ExecutorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const ExecutorEntry& e : r.entries)
    if (chosen == e.name) return e.name;
  return "";
}

void set_executor(const char* name) {
  ExecutorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  r.forced = name ? name : "";
}

std::vector<Node*> pending_subgraph(const std::vector<Node*>& roots) {
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  // Iterative post-order DFS: graphs can be deeper than the stack allows recursion.
  std::vector<std::pair<Node*, size_t>> stack;
  for (Node* root : roots) {
    if (root != nullptr && root->donated) raise_donated(*root);
    if (root == nullptr || root->is_evaluated() || !seen.insert(root).second) continue;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        Node* in = node->inputs[next++].get();
        if (in->donated) raise_donated(*in);
        if (!in->is_evaluated() && seen.insert(in).second) stack.push_back({in, 0});
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }
  return order;
}

void acquire_handle(Node* node) {
  if (node->handles.fetch_add(1, std::memory_order_relaxed) == 0 && !node->is_evaluated()) {
    std::lock_guard lock(g_held_mutex);
    if (node->handles.load(std::memory_order_relaxed) > 0) g_held_pending.insert(node);
  }
}

void release_handle(Node* node) {
  if (node->handles.fetch_sub(1, std::memory_order_relaxed) == 1) {
    {
      std::lock_guard lock(g_held_mutex);
      if (node->handles.load(std::memory_order_relaxed) == 0) g_held_pending.erase(node);
    }
    // A gradient graph usually reads the leaf it belongs to (d(w*w)/dw = 2w): with no handle
    // left nobody can read the gradient, and keeping it would keep that cycle alive forever.
    if (node->handles.load(std::memory_order_relaxed) == 0 && node->grad) {
      NodePtr grad = std::move(node->grad);
      release_handle(grad.get());
    }
  }
}

void evaluate_nodes(const std::vector<Node*>& nodes) {
  std::lock_guard lock(g_eval_mutex);
  // Passes build nodes (folded fills, composed reindexes) that stand in for user nodes; they
  // must carry gradient flow like the nodes they replace, whatever scope the user is in.
  struct GradModeOn {
    bool previous = set_grad_mode(true);
    ~GradModeOn() { set_grad_mode(previous); }
  } grad_mode_on;
  std::vector<Node*> requested;
  for (Node* n : nodes)
    if (n != nullptr && !n->is_evaluated()) requested.push_back(n);
  std::vector<Node*> schedule = pending_subgraph(requested);
  if (schedule.empty()) return;
  // Executors may rewire edges (CSE drops duplicates), which can release nodes this list
  // still names; hold them until the edges are dropped below.
  std::vector<NodePtr> alive;
  alive.reserve(schedule.size());
  for (Node* n : schedule) alive.push_back(n->shared_from_this());
  ExecutorFn fn = select_executor(nullptr);
  std::vector<NodePtr> extra = overlapping_held({schedule.begin(), schedule.end()});
  bool ran = false;
  if (!extra.empty()) {
    std::vector<Node*> all = requested;
    for (const NodePtr& e : extra) all.push_back(e.get());
    std::vector<Node*> joint = pending_subgraph(all);
    for (Node* n : joint) alive.push_back(n->shared_from_this());
    try {
      fn(joint, all);
      schedule = std::move(joint);
      ran = true;
    } catch (const OutOfMemoryError&) {
      throw;  // the memory budget holds for the whole step, not for the request alone
    } catch (const Error&) {
      // A held tensor the user did not ask for failed (say, a bad gather index): that
      // error belongs to its own evaluation, so run just the request.
    }
  }
  if (!ran) {
    schedule = pending_subgraph(requested);
    if (!schedule.empty()) fn(schedule, requested);
  }
  for (Node* n : schedule) {
    // A value now stands for its whole history: drop the edges so that graphs of earlier
    // steps are freed once no handle refers to them. Values that gradients still flow
    // through keep them until their graph is released (a leaf ends differentiation, so it
    // keeps nothing and parameter updates never chain steps together).
    if (n->is_evaluated() && (!n->requires_grad || n->grad_leaf)) n->inputs.clear();
  }
}

}  // namespace kiln
