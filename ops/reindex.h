#pragma once
// The two index-map meta-ops, exposed as in Jittor, and broadcast_to built on reindex.
#include <vector>

#include "../core/tensor.h"

namespace kiln {

/// out[i] = x[map(i)], with out of `shape`; map has one expression per dimension of x over
/// the output coordinates i0, i1, ... An out-of-range coordinate gives `fill`. Index
/// tensors (integer dtype) are read by IndexExpr::load(k, ...) with k = 1 + position in
/// `indices`; with `check_indices`, an out-of-range coordinate computed from such a read
/// raises IndexError at evaluation instead of giving the fill.
Tensor reindex(const Tensor& x, const Shape& shape, std::vector<IndexExpr> map,
               const Scalar& fill = 0, const std::vector<Tensor>& indices = {},
               bool check_indices = false, const char* origin = nullptr);

/// out[map(i)] op= x[i] over every coordinate i of x, with out of `shape` starting at op's
/// identity; map has one expression per output dimension over x's coordinates. Targets
/// out of range are skipped (or raise IndexError when computed from an index-tensor read
/// and `check_indices` is set). Floating sums accumulate exactly as the dtype allows.
Tensor reindex_reduce(const Tensor& x, ReduceOp op, const Shape& shape, std::vector<IndexExpr> map,
                      const std::vector<Tensor>& indices = {}, bool check_indices = false,
                      const char* origin = nullptr);

/// Broadcasts x to `shape` by numpy rules (a reindex; no memory is shared).
Tensor broadcast_to(const Tensor& x, const Shape& shape, const char* origin = nullptr);

}  // namespace kiln
