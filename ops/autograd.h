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
/// gradient `g` (undefined where none flows). `out` is the node's own value. With
/// `out_inlined` (every reader of `out` on the gradient path is elementwise, so fusion
/// computes it inside their kernels and never stores it), a rule that needs only where `out`
/// is positive (relu's) reads a bitmask packed in the forward pass: reading `out` itself
/// would keep what it is computed from, 4 bytes per element, until the backward pass.
std::vector<Tensor> elementwise_vjp(const Node& node, const std::vector<Tensor>& inputs,
                                    const Tensor& out, const Tensor& g, bool out_inlined = false);
/// Gradient rule of a reindex or reindex-reduce node (index tensors get none).
std::vector<Tensor> reindex_vjp(const Node& node, const std::vector<Tensor>& inputs,
                                const Tensor& out, const Tensor& g);
/// When `n` is a softmax's output (ops/reduce_ops.cpp): the node z it exponentiates, the
/// input in the compute dtype less its detached row maximum, so z's gradient is the input's;
/// else null, and `n`'s own rule applies.
Node* softmax_input(const Node& n);
/// The gradient of softmax_input(n) given the output gradient `g`, read from the output
/// alone: p * (g - sum(g * p)) along the softmax's axis.
Tensor softmax_vjp(const Node& n, const Tensor& g);
}  // namespace detail

}  // namespace kiln
