#pragma once
// Reverse-mode differentiation as a graph transform: the gradient of a lazy value is more
// lazy graph, evaluated (and fused) together with the forward pass and the update that
// reads it. Rules are defined with each meta-op (elementwise.cpp, reindex.cpp); composites
// differentiate through the meta-ops they are built from.
#include <vector>

#include "../core/tensor.h"

namespace kiln {

/// d(output)/d(input) for each of `inputs`, as lazy tensors. `grad_output` seeds a
/// non-scalar output (default: ones for a one-element output). An input that the output
/// does not depend on raises ValueError unless `allow_unused`, which gives an undefined
/// tensor. Inputs may be leaves or intermediate values. With `create_graph` the gradients
/// record their own history, so they can be differentiated again.
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output = Tensor(), bool allow_unused = false,
                         bool create_graph = false);

namespace detail {
/// Gradient rule of one elementwise node: the gradient of each input given the output
/// gradient `g` (undefined where none flows). `out` is the node's own value.
std::vector<Tensor> elementwise_vjp(const Node& node, const std::vector<Tensor>& inputs,
                                    const Tensor& out, const Tensor& g);
/// Gradient rule of a reindex or reindex-reduce node (index tensors get none).
std::vector<Tensor> reindex_vjp(const Node& node, const std::vector<Tensor>& inputs,
                                const Tensor& out, const Tensor& g);
/// A softmax's output node `n` (ops/reduce_ops.cpp): the gradient of the softmax's input z
/// given the output gradient `g`, read from the output alone, into `grad`; returns z's node,
/// or null when `n` is not a softmax's output (then its own rule applies).
NodePtr softmax_vjp(const Node& n, const Tensor& g, Tensor* grad);
}  // namespace detail

}  // namespace kiln
