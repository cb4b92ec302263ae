#pragma once
// Text and Graphviz views of the lazy graph behind some tensors.
#include <string>
#include <vector>

#include "tensor.h"

namespace kiln {

/// One line per node, inputs first: id, op (and the user-level op it came from), shape,
/// dtype, attributes (index maps, fill, reduce op, seed) and whether it holds a value.
std::string dump_graph(const std::vector<Tensor>& outputs);
/// The same graph as a Graphviz DOT digraph; evaluated nodes are drawn filled.
std::string graph_to_dot(const std::vector<Tensor>& outputs);

}  // namespace kiln
