// Reverse-mode differentiation over the lazy graph. The walk finds the nodes that lie on a
// path from the output to a wanted input, then visits them outputs-first, asking each
// node's rule for its inputs' gradients and summing contributions where a value is used
// several times (tied weights). The result is ordinary lazy graph: nothing runs here.
#include "autograd.h"

#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "autocast.h"
#include "custom_function.h"
#include "elementwise.h"
#include "shape_ops.h"
#include "sources.h"
#include "transfer.h"

namespace kiln {
namespace {

std::string describe(const Node& n) {
  return std::string(n.origin ? n.origin : op_name(n.op).data()) + " -> " +
         std::string(dtype_name(n.dtype)) + shape_str(n.shape);
}

// Why `output` has no gradient: the first node on the way down whose inputs carry gradient
// flow but which does not (a comparison, an integer result, a NoGradGuard).
std::string no_grad_reason(const Node& output) {
  std::vector<const Node*> stack{&output};
  std::unordered_set<const Node*> seen{&output};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const NodePtr& in : n->inputs) {
      if (in->requires_grad) {
        return "; it is computed from tensors that require grad through " + describe(*n) +
               ", which is not differentiable" +
               (is_floating(n->dtype) ? " here (built inside a NoGradGuard?)" : "");
      }
      if (seen.insert(in.get()).second) stack.push_back(in.get());
    }
  }
  return "; nothing it depends on requires grad (call requires_grad_() on the parameters)";
}

std::vector<Tensor> vjp(const Node& n, const Tensor& g, bool out_inlined = false) {
  std::vector<Tensor> inputs;
  inputs.reserve(n.inputs.size());
  for (const NodePtr& in : n.inputs) inputs.emplace_back(in);
  Tensor out(const_cast<Node&>(n).shared_from_this());
  switch (op_family(n.op)) {
    case OpFamily::Source:
      return {};
    case OpFamily::Elementwise:
      return detail::elementwise_vjp(n, inputs, out, g, out_inlined);
    case OpFamily::Reindex:
    case OpFamily::ReindexReduce:
      return detail::reindex_vjp(n, inputs, out, g);
    case OpFamily::Transfer:
      return detail::transfer_vjp(n, g);
    case OpFamily::Custom:
      return {};  // a custom kernel's gradient is its Function's backward (custom_grad)
  }
  return {};
}

// Walks from `output` down the edges that carry gradient flow; leaves end the walk.
// `wanted` tells which nodes need a gradient. Returns the nodes that lie on a path to a
// wanted node, outputs first.
// A leaf that assign() or an optimizer step replaced after the graph was built: the graph
// still reads its old value, and a gradient for it would land on a node no handle names
// (lost without a word). PyTorch refuses such a graph too (a saved tensor was modified).
[[noreturn]] void raise_updated_leaf(const char* what, const Node& leaf) {
  throw ValueError(std::string("[") + what + "] the graph reads a parameter " +
                   std::string(dtype_name(leaf.dtype)) + shape_str(leaf.shape) +
                   " that was updated (an optimizer step, assign or set_data) after the graph "
                   "was built; build the graph again from the updated parameters");
}

std::vector<Node*> backward_order(const char* what, Node* output,
                                  const std::function<bool(Node*)>& wanted) {
  // Iterative post-order: inputs finish before their users.
  std::vector<Node*> post;
  std::unordered_map<Node*, bool> reaches;  // node -> lies on a path to a wanted node
  std::vector<std::pair<Node*, size_t>> stack{{output, 0}};
  reaches[output] = false;
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    bool descend = !n->grad_leaf || n == output;
    const std::vector<NodePtr>& edges = detail::gradient_inputs(*n);
    if (descend && next < edges.size()) {
      Node* in = edges[next++].get();
      if (in->grad_leaf && in->replaced) raise_updated_leaf(what, *in);
      if (in->requires_grad && !reaches.count(in)) {
        reaches[in] = false;
        stack.push_back({in, 0});
      }
      continue;
    }
    bool r = wanted(n);
    if (descend) {
      for (const NodePtr& in : detail::gradient_inputs(*n)) {
        auto it = reaches.find(in.get());
        if (it != reaches.end() && it->second) r = true;
      }
    }
    reaches[n] = r;
    if (r) post.push_back(n);
    stack.pop_back();
  }
  return {post.rbegin(), post.rend()};
}

// A slice's gradient: g placed at `at` (per dimension) within its input, zero elsewhere.
struct SlicePiece {
  const Node* slice;
  Tensor g;
  std::vector<int64_t> at;
};

// Where `n` reads its input as a box (x[i + at] in every dimension, no index tensors),
// the box's offsets; else empty.
std::vector<int64_t> box_offsets(const Node& n) {
  if (n.op != OpCode::Reindex || n.inputs.size() != 1) return {};
  const Node& x = *n.inputs[0];
  if (n.index_map.size() != x.shape.size() || n.shape.size() != x.shape.size()) return {};
  std::vector<int64_t> at(n.shape.size(), 0);
  for (size_t d = 0; d < n.index_map.size(); ++d) {
    const IndexExpr& e = n.index_map[d];
    if (e.kind() == IndexExpr::Kind::Add && e.args().size() == 2) {
      const bool var_first = e.args()[0].kind() == IndexExpr::Kind::Var;
      const IndexExpr& v = e.args()[var_first ? 0 : 1];
      const IndexExpr& c = e.args()[var_first ? 1 : 0];
      if (v.kind() != IndexExpr::Kind::Var || !c.is_const() || v.value() != static_cast<int64_t>(d))
        return {};
      at[d] = c.value();
    } else if (e.kind() != IndexExpr::Kind::Var || e.value() != static_cast<int64_t>(d)) {
      return {};
    }
    if (at[d] < 0 || at[d] + n.shape[d] > x.shape[d]) return {};
  }
  return at;
}

// The gradient of `x` from the gradients of slices of it that are disjoint along one axis
// and whole along the others, joined (zeros between them) instead of summed as padded
// full-size terms: an RNN's input gradient is T step slices, and their sum took T/8
// full-size passes. Undefined when the pieces are not so.
Tensor join_pieces(const Node& x, std::vector<SlicePiece>& pieces) {
  if (pieces.size() < 2 || !is_floating(x.dtype)) return Tensor();
  int axis = -1;
  for (const SlicePiece& p : pieces)
    for (size_t d = 0; d < x.shape.size(); ++d) {
      if (p.at[d] == 0 && p.g.shape()[d] == x.shape[d]) continue;
      if (axis >= 0 && axis != static_cast<int>(d)) return Tensor();
      axis = static_cast<int>(d);
    }
  if (axis < 0) return Tensor();
  const auto a = static_cast<size_t>(axis);
  std::stable_sort(pieces.begin(), pieces.end(),
                   [&](const SlicePiece& p, const SlicePiece& q) { return p.at[a] < q.at[a]; });
  std::vector<Tensor> parts;
  int64_t filled = 0;
  auto gap = [&](int64_t until) {
    if (until == filled) return;
    Shape shape = x.shape;
    shape[a] = until - filled;
    parts.push_back(zeros(shape, x.dtype, x.device));
  };
  for (const SlicePiece& p : pieces) {
    if (p.at[a] < filled) return Tensor();  // overlapping slices add up
    gap(p.at[a]);
    parts.push_back(p.g.dtype() == x.dtype ? p.g : cast(p.g, x.dtype));
    filled = p.at[a] + p.g.shape()[a];
  }
  gap(x.shape[a]);
  return detail::concat_tree(parts, axis);
}

// Gradients of every node in `order` (outputs first) seeded with `seed` at order's front.
std::unordered_map<Node*, Tensor> propagate(const std::vector<Node*>& order, Node* output,
                                            const Tensor& seed) {
  std::unordered_set<Node*> on_path(order.begin(), order.end());
  std::unordered_map<Node*, Tensor> grads;
  std::unordered_map<Node*, std::vector<SlicePiece>> pieces;
  grads[output] = seed;
  // Per gradient sum: its number of terms, and whether each is a reduction's output or a
  // value (stored anyway). A sum of such terms, a bias used at every step of a sequence,
  // keeps each partial sum stored: fused, the chain was cut every 8 reads and the last
  // kernel summed T mod 8 terms, a new kernel for each new sequence length. Stored, every
  // kernel adds one term to a stored total. Sums with terms to compute stay fused.
  std::unordered_map<Node*, std::pair<int, bool>> terms;
  detail::CustomFunctionGradients functions([&](Node* n) { return on_path.count(n) > 0; });
  // Values computed inside the kernels that read them: every reader on the path is
  // elementwise and no user holds them (a matmul's operand, a reduction's input or a held
  // tensor is stored, and then a rule may read it for free).
  std::unordered_set<Node*> stored_reader;
  for (Node* n : order) {
    const bool elementwise = op_family(n->op) == OpFamily::Elementwise;
    for (const NodePtr& in : detail::gradient_inputs(*n))
      if (!elementwise) stored_reader.insert(in.get());
  }
  auto inlined = [&](Node* n) {
    return n != output && !n->is_evaluated() && n->handles.load() == 0 && !stored_reader.count(n);
  };
  auto stored_term = [](const Tensor& t) {
    return t.node()->is_evaluated() || t.node()->op == OpCode::ReindexReduce;
  };
  auto accumulate = [&](Node* in, Tensor gk) {
    if (gk.dtype() != in->dtype) gk = cast(gk, in->dtype);
    auto [slot, fresh] = grads.try_emplace(in, gk);
    auto& [count, all_stored] = terms[in];
    all_stored = (fresh || all_stored) && stored_term(gk);
    ++count;
    if (fresh) return;
    if (count >= 3 && all_stored) detail::store_hint(slot->second);
    slot->second = add(slot->second, gk);
  };
  for (Node* n : order) {
    // Every reader of n came before it: its slices' gradients are all in.
    if (auto p = pieces.find(n); p != pieces.end()) {
      if (Tensor joined = join_pieces(*n, p->second); joined.defined()) {
        accumulate(n, joined);
      } else {
        for (const SlicePiece& piece : p->second) accumulate(n, vjp(*piece.slice, piece.g)[0]);
      }
      pieces.erase(p);
    }
    auto it = grads.find(n);
    if (it == grads.end()) continue;
    if (n->grad_leaf && n != output) continue;
    Tensor g = it->second;
    // A custom function's output: its backward gives the arguments' gradients, once every
    // output of the same application on the path has its gradient.
    if (n->custom_grad) {
      for (auto& [arg, ga] : functions.take(*n, g))
        if (on_path.count(arg)) accumulate(arg, std::move(ga));
      continue;
    }
    // A composite whose rule skips its inner nodes: they get no gradient and are passed over.
    if (Node* z = detail::softmax_input(*n); z != nullptr && on_path.count(z)) {
      accumulate(z, detail::softmax_vjp(*n, g));
      continue;
    }
    if (std::vector<int64_t> at = box_offsets(*n); !at.empty()) {
      Node* in = n->inputs[0].get();
      if (on_path.count(in)) pieces[in].push_back({n, g, std::move(at)});
      continue;
    }
    std::vector<Tensor> in_grads = vjp(*n, g, inlined(n));
    for (size_t k = 0; k < in_grads.size() && k < n->inputs.size(); ++k) {
      Node* in = n->inputs[k].get();
      if (in_grads[k].defined() && on_path.count(in)) accumulate(in, in_grads[k]);
    }
  }
  return grads;
}

Tensor seed_for(const char* what, const Tensor& output, const Tensor& grad_output) {
  if (!output.defined())
    throw ValueError(std::string("[") + what + "] the output tensor is undefined");
  const Node& n = *output.node();
  if (!n.requires_grad) {
    throw ValueError(std::string("[") + what + "] " + std::string(dtype_name(n.dtype)) +
                     shape_str(n.shape) + " does not require grad" + no_grad_reason(n));
  }
  if (grad_output.defined()) {
    if (grad_output.shape() != n.shape) {
      throw ShapeError(std::string("[") + what + "] grad_output " + shape_str(grad_output.shape()) +
                       " does not match the output " + shape_str(n.shape));
    }
    return grad_output.dtype() == n.dtype ? grad_output.detach()
                                          : cast(grad_output.detach(), n.dtype);
  }
  if (n.numel() != 1) {
    throw ShapeError(std::string("[") + what + "] the output " + shape_str(n.shape) +
                     " is not a scalar; pass a gradient of the same shape");
  }
  return ones(n.shape, n.dtype, n.device);
}

}  // namespace

std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output, bool allow_unused, bool create_graph) {
  Tensor seed = seed_for("grad", output, grad_output);
  amp::autocast_off no_autocast;  // backward ops take their forward ops' dtypes
  // Without create_graph the gradients are plain values: they keep no history, so holding
  // them never keeps a forward graph alive.
  bool previous = set_grad_mode(create_graph && grad_mode_enabled());
  struct Restore {
    bool mode;
    ~Restore() { set_grad_mode(mode); }
  } restore{previous};
  std::unordered_set<Node*> wanted;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined())
      throw ValueError("[grad] input " + std::to_string(i) + " is undefined");
    wanted.insert(inputs[i].node().get());
  }
  Node* out = output.node().get();
  std::vector<Node*> order =
      backward_order("grad", out, [&](Node* n) { return wanted.count(n) > 0; });
  std::unordered_map<Node*, Tensor> grads = propagate(order, out, seed);
  std::vector<Tensor> result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto it = grads.find(inputs[i].node().get());
    if (it == grads.end()) {
      if (!allow_unused) {
        const Node& n = *inputs[i].node();
        throw ValueError("[grad] input " + std::to_string(i) + " (" +
                         std::string(dtype_name(n.dtype)) + shape_str(n.shape) +
                         ") is not used to compute the output" +
                         (n.requires_grad ? "" : " with gradient flow: it does not require grad") +
                         "; pass allow_unused=true to get an undefined gradient");
      }
      result.emplace_back();
    } else {
      result.push_back(it->second);
    }
  }
  return result;
}

void Tensor::backward(const Tensor& gradient) const {
  Tensor seed = seed_for("backward", *this, gradient);
  amp::autocast_off no_autocast;  // backward ops take their forward ops' dtypes
  Node* out = node().get();
  NoGradGuard no_grad;  // gradients of backward() are values, never differentiated again
  // Every leaf a handle names is wanted; a temporary marked requires_grad_ has no reader.
  auto readable_leaf = [](Node* n) {
    return n->grad_leaf && n->handles.load(std::memory_order_relaxed) > 0;
  };
  std::vector<Node*> order = backward_order("backward", out, readable_leaf);
  std::unordered_map<Node*, Tensor> grads = propagate(order, out, seed);
  for (Node* leaf : order) {
    auto it = grads.find(leaf);
    if (!readable_leaf(leaf) || it == grads.end()) continue;
    Tensor g = it->second;
    set_node_grad(*leaf, (leaf->grad ? add(Tensor(leaf->grad), g) : g).node());
  }
}

}  // namespace kiln
