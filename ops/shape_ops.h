#pragma once
// Shape composites with PyTorch semantics (reshape, permute, slice, pad, concat, gather, ...),
// each built only from reindex, reindex_reduce, elementwise ops and sources. None of them
// aliases memory: every result is a new node that fuses into its consumers or materializes.
// Axes may be negative; zero-size dimensions are allowed everywhere.
#include <cstdint>
#include <utility>
#include <vector>

#include "../core/tensor.h"

namespace kiln {

/// x with the same elements in row-major order and a new shape; one size may be -1 (inferred).
/// Returns x itself when the shape does not change.
Tensor reshape(const Tensor& x, const Shape& shape);
/// Merges dimensions start_axis..end_axis (inclusive) into one; a rank-0 x becomes shape [1].
Tensor flatten(const Tensor& x, int64_t start_axis = 0, int64_t end_axis = -1);
/// Removes every dimension of size 1.
Tensor squeeze(const Tensor& x);
/// Removes dimension `axis` if its size is 1; otherwise returns x unchanged (as PyTorch).
Tensor squeeze(const Tensor& x, int64_t axis);
/// Inserts a dimension of size 1 at position `axis` in [-ndim-1, ndim].
Tensor unsqueeze(const Tensor& x, int64_t axis);

/// Reorders dimensions: output dimension k is input dimension axes[k].
Tensor permute(const Tensor& x, const std::vector<int64_t>& axes);
/// Swaps two dimensions.
Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1);

/// x[start:stop:step] along `axis` with Python rules: negative bounds count from the end and
/// out-of-range bounds are clamped; step must be >= 1.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
/// Reverses the order of elements along each of `axes` (no repeats).
Tensor flip(const Tensor& x, const std::vector<int64_t>& axes);
/// Pads every axis with pads[d] = (before, after) copies of `value`; pads.size() must equal
/// ndim. Negative pads crop, as in torch.nn.functional.pad.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads,
           const Scalar& value = 0);

/// Joins tensors along an existing axis (torch.cat); dtypes promote, other sizes must match.
Tensor concat(const std::vector<Tensor>& tensors, int64_t axis = 0);
/// torch.cat: the same as concat().
inline Tensor cat(const std::vector<Tensor>& tensors, int64_t axis = 0) {
  return concat(tensors, axis);
}
/// Joins equally shaped tensors along a new axis inserted at `axis`.
Tensor stack(const std::vector<Tensor>& tensors, int64_t axis = 0);
/// Pieces of `split_size` along `axis`; the last may be smaller (torch.split).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t axis = 0);
/// Pieces with the given sizes along `axis`; the sizes must sum to x.size(axis).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis = 0);
/// Pieces of ceil(n / chunks) along `axis`; may return fewer than `chunks` (torch.chunk).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis = 0);

/// out[i][j][k] = x[i][index[i][j][k]][k] for axis 1 (torch.gather); index has x's rank,
/// out has index's shape. An index outside [0, x.size(axis)) raises IndexError at evaluation.
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index);
/// The slices of x at positions `index` (1-D integer) along `axis`; out-of-range raises
/// IndexError at evaluation.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index);
/// x plus src summed into positions index along `axis` (torch.scatter_add; x and src share a
/// dtype). Contributions are summed before being added to x; out-of-range raises IndexError.
Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);

namespace detail {

/// Asks fusion to store x's pending value rather than inline it into its consumers
/// (Node::store_hint; StoreHint::Unbudgeted only where no memory budget applies,
/// StoreHint::Budgeted only where one does); returns x.
/// Results do not change; an evaluated x is left as it is.
Tensor store_hint(const Tensor& x, StoreHint hint = StoreHint::Always);
/// concat(pieces, axis) of any number of pieces as a balanced tree of joins of two, every
/// inner one stored, so that its kernels do not depend on the number of pieces: an RNN's
/// sequence of steps (its output, its input's gradient) compiles the same kernels for every
/// sequence length, in log2(T) passes.
Tensor concat_tree(const std::vector<Tensor>& pieces, int64_t axis);

}  // namespace detail

/// Keeps elements with col - row <= k in the last two dimensions, zeroing the rest.
Tensor tril(const Tensor& x, int64_t k = 0);
/// Keeps elements with col - row >= k in the last two dimensions, zeroing the rest.
Tensor triu(const Tensor& x, int64_t k = 0);

/// int64 tensor of shape index.shape + [num_classes] with a 1 at each index value. index must
/// be integer; a value outside [0, num_classes) raises IndexError at evaluation (as PyTorch).
Tensor one_hot(const Tensor& index, int64_t num_classes);

}  // namespace kiln
