#pragma once
// Flat vectors of many tensors, the messages DataParallel and ZeRO send: gradients laid end
// to end in one buffer, and tensors taken back out of a reduced or gathered one. Private to
// dist/.
//
// Host tensors are copied (memcpy) rather than joined or split by kernels: a concat of a
// model's gradients selects among all of its pieces for every element, and each lazy slice
// of a flat vector becomes a reindex kernel in the next step; together they cost more than
// an MLP's whole Adam update (docs/benchmarks.md). CUDA tensors are joined and sliced lazily.
#include <cstdint>
#include <vector>

#include "../core/tensor.h"

namespace kiln::dist::detail {

/// Elements [start, start + count) of `pieces` flattened and laid end to end, zeros past
/// their end, as one evaluated 1-D tensor of `dtype` on `device` (pieces are cast to it).
/// Evaluates the pieces (together, in one evaluation).
Tensor flat_range(const std::vector<Tensor>& pieces, int64_t start, int64_t count, DType dtype,
                  Device device);
/// Elements [start, start + numel(shape)) of the evaluated 1-D tensor `flat` as a tensor of
/// `shape`: a copy on the host, a lazy slice on CUDA devices.
Tensor flat_slice(const Tensor& flat, int64_t start, const Shape& shape);

}  // namespace kiln::dist::detail
