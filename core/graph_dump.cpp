// Text and DOT views of a graph. Both walk the graph iteratively: an unevaluated training
// loop or a long `x = x + 1` chain is far deeper than the stack allows recursion.
#include "graph_dump.h"

#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "custom_op.h"

namespace kiln {
namespace {

// Every node reachable from the outputs, inputs before users. Evaluated nodes are
// included (as leaves once their edges are dropped) because they are the graph's inputs.
std::vector<const Node*> topological_order(const std::vector<Tensor>& outputs,
                                           std::string_view op) {
  std::vector<const Node*> order;
  std::unordered_set<const Node*> seen;
  std::vector<std::pair<const Node*, size_t>> stack;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined()) {
      throw ValueError("[" + std::string(op) + "] output " + std::to_string(k) +
                       " is an undefined tensor");
    }
    const Node* root = outputs[k].node().get();
    if (!seen.insert(root).second) continue;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        const Node* in = node->inputs[next++].get();
        if (seen.insert(in).second) stack.push_back({in, 0});
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }
  return order;
}

// Output position(s) of each requested node; one node may be requested several times.
std::unordered_map<const Node*, std::vector<size_t>> output_positions(
    const std::vector<Tensor>& outputs) {
  std::unordered_map<const Node*, std::vector<size_t>> at;
  for (size_t k = 0; k < outputs.size(); ++k) at[outputs[k].node().get()].push_back(k);
  return at;
}

// Sources name themselves as their origin ("full"); repeating that is noise.
bool has_origin(const Node& n) { return n.origin != nullptr && op_name(n.op) != n.origin; }

std::string op_title(const Node& n) {
  std::string s(op_name(n.op));
  if (n.op == OpCode::ReindexReduce) s += "." + std::string(reduce_name(n.reduce));
  return s;
}

std::string index_map_str(const std::vector<IndexExpr>& map) {
  std::string s = "(";
  for (size_t k = 0; k < map.size(); ++k) {
    if (k > 0) s += ", ";
    s += map[k].str();
  }
  return s + ")";
}

// The attributes that distinguish this node from another of the same op, as " key=value".
std::string attributes(const Node& n) {
  std::string s;
  switch (n.op) {
    case OpCode::Full:
      s += " value=" + n.scalar.str();
      if (n.weak_scalar) s += " weak";
      break;
    case OpCode::Iota:
      s += " axis=" + std::to_string(n.axis);
      break;
    case OpCode::RandUniform:
    case OpCode::RandNormal:
      s += " seed=" + std::to_string(n.seed) + " offset=" + std::to_string(n.offset);
      break;
    case OpCode::Reindex:
      s += " map=" + index_map_str(n.index_map) + " fill=" + n.scalar.str();
      if (n.check_indices) s += " check_indices";
      break;
    case OpCode::ReindexReduce:
      s += " map=" + index_map_str(n.index_map);
      if (n.check_indices) s += " check_indices";
      break;
    case OpCode::Custom:
      if (n.custom) s += " kernel=" + n.custom->name();
      break;
    default:
      // A weak scalar may also be a constant (a rank-0 buffer) rather than a full.
      if (n.weak_scalar) s += " weak";
      break;
  }
  return s;
}

std::string node_line(const Node& n, const std::vector<size_t>* outputs, size_t num_outputs) {
  std::string s = "%" + std::to_string(n.id) + " = " + op_title(n) + "(";
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    if (k > 0) s += ", ";
    s += "%" + std::to_string(n.inputs[k]->id);
  }
  s += ")";
  if (has_origin(n)) s += " origin=" + std::string(n.origin);
  s += " shape=" + shape_str(n.shape) + " dtype=" + std::string(dtype_name(n.dtype));
  if (n.device != Device::cpu()) s += " device=" + n.device.str();
  s += attributes(n);
  if (n.is_evaluated()) s += " [evaluated]";
  if (outputs != nullptr) {
    if (num_outputs == 1) {
      s += " [output]";
    } else {
      for (size_t k : *outputs) s += " [output " + std::to_string(k) + "]";
    }
  }
  return s;
}

// DOT string literals need backslashes and quotes escaped; newlines become "\n" breaks.
std::string dot_escape(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (c == '"' || c == '\\') s += '\\';
    if (c == '\n') {
      s += "\\n";
      continue;
    }
    s += c;
  }
  return s;
}

}  // namespace

std::string dump_graph(const std::vector<Tensor>& outputs) {
  const std::vector<const Node*> order = topological_order(outputs, "dump_graph");
  const auto outs = output_positions(outputs);
  std::string text;
  for (const Node* n : order) {
    auto it = outs.find(n);
    text += node_line(*n, it == outs.end() ? nullptr : &it->second, outputs.size());
    text += '\n';
  }
  return text;
}

std::string graph_to_dot(const std::vector<Tensor>& outputs) {
  const std::vector<const Node*> order = topological_order(outputs, "graph_to_dot");
  const auto outs = output_positions(outputs);
  std::string dot = "digraph kiln {\n  node [shape=box, fontname=\"monospace\"];\n";
  for (const Node* n : order) {
    std::string label = "%" + std::to_string(n->id) + " " + op_title(*n);
    if (has_origin(*n)) label += "\n" + std::string(n->origin);
    label += "\n" + shape_str(n->shape) + " " + std::string(dtype_name(n->dtype));
    dot += "  n" + std::to_string(n->id) + " [label=\"" + dot_escape(label) + "\"";
    if (n->is_evaluated()) dot += ", style=filled, fillcolor=lightgrey";
    if (outs.count(n) != 0) dot += ", peripheries=2";
    dot += "];\n";
  }
  for (const Node* n : order) {
    for (const NodePtr& in : n->inputs)
      dot += "  n" + std::to_string(in->id) + " -> n" + std::to_string(n->id) + ";\n";
  }
  dot += "}\n";
  return dot;
}

}  // namespace kiln
