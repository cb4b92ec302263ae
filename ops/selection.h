#pragma once
// Ops that select elements by their values: sort, topk and sampling by probability. Each is
// composed from meta-ops (a rank computed by a fused comparison-and-sum, a scatter of the
// ranks, a gather of the values), so the JIT fuses them and gradients reach the selected
// values through gather. (max / min with indices live in reduce_ops.h.)
#include <cstdint>

#include "../core/philox.h"
#include "../core/tensor.h"

namespace kiln {

/// torch.sort: x's values along `dim` in ascending (or descending) order and their int64
/// positions in x. Stable: equal values keep their order; NaN sorts above +inf, as torch.
/// On the host a native stable sort of each row (O(n log n)); on CUDA a rank by comparison
/// fused into one reduction (O(n^2) work in the length of `dim`).
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false);
/// torch.topk: the k largest (or smallest) values along `dim` and their indices, sorted
/// (ties: the earlier position first). k outside [0, size] raises ValueError.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                   bool sorted = true);
/// torch.multinomial: `num_samples` int64 category indices per row of `probs` (1-D or 2-D,
/// non-negative weights, not necessarily normalised). With replacement: inverse-CDF
/// sampling; without: the exponential-race (Gumbel top-k) trick, which needs num_samples <=
/// categories. Reproducible from `gen`, not the same stream as torch's.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false,
                   Generator& gen = default_generator());

}  // namespace kiln
