#pragma once
// Matrix products composed from meta-ops: both operands are reindexed into one
// [..batch, m, k, n] domain, multiplied elementwise and sum-reduced over k, the pattern a
// library GEMM may later replace.
#include "../core/tensor.h"

namespace kiln {

/// torch.matmul: 1-D·1-D is a dot product (rank 0), a 1-D operand is promoted to a matrix
/// and the added dim removed, and batch dims broadcast ([2,1,3,4] x [5,4,2] -> [2,5,3,2]).
Tensor matmul(const Tensor& a, const Tensor& b);
/// torch.nn.functional.linear: x @ weight^T + bias, weight [out, in] (or [in]); bias optional.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
/// Outer product of two 1-D tensors: out[i, j] = a[i] * b[j].
Tensor outer(const Tensor& a, const Tensor& b);

}  // namespace kiln
