#pragma once
// Reductions and the normalisations built on them (softmax, logsumexp), composed from
// reindex_reduce and elementwise ops. `axes` empty means every axis; negative axes count
// from the end; repeating an axis is a ShapeError. Result dtypes follow PyTorch.
#include <concepts>
#include <cstdint>
#include <vector>

#include "../core/tensor.h"

namespace kiln {

/// An integer axis (not bool). The single-axis overloads are templates on it so that
/// `sum(x, {})` selects the vector overload (all axes) instead of converting `{}` to axis 0.
template <typename T>
concept SingleAxis = std::integral<T> && !std::same_as<T, bool>;

#define KILN_SINGLE_AXIS(fn)                                                 \
  template <SingleAxis Axis>                                                 \
  Tensor fn(const Tensor& x, Axis axis, bool keepdim = false) {              \
    return fn(x, std::vector<int64_t>{static_cast<int64_t>(axis)}, keepdim); \
  }

/// Sum over `axes`; bool and integer inputs accumulate and return int64, floats keep dtype.
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
KILN_SINGLE_AXIS(sum)
/// Product over `axes`, with the dtypes of sum(); an empty product is 1.
Tensor prod(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
KILN_SINGLE_AXIS(prod)
/// Arithmetic mean over `axes` of a floating tensor (integers raise DTypeError); empty gives NaN.
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
KILN_SINGLE_AXIS(mean)
/// Largest element over `axes`, same dtype; NaN propagates; a zero-size reduced dim raises
/// ValueError. (The single-dim max(x, dim) below returns indices too, as torch.max.)
Tensor max(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
/// Smallest element over `axes`, as max().
Tensor min(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);

namespace detail {
ValuesIndices extreme_with_index(const Tensor& x, int64_t dim, bool keepdim, bool largest);
}  // namespace detail
/// torch.max(x, dim): the largest values along `dim` and the int64 index of the first of
/// each (NaN counts as largest); the gradient reaches that index only.
template <SingleAxis Axis>
ValuesIndices max(const Tensor& x, Axis dim, bool keepdim = false) {
  return detail::extreme_with_index(x, static_cast<int64_t>(dim), keepdim, true);
}
/// torch.min(x, dim): the smallest values along `dim` and the index of the first of each.
template <SingleAxis Axis>
ValuesIndices min(const Tensor& x, Axis dim, bool keepdim = false) {
  return detail::extreme_with_index(x, static_cast<int64_t>(dim), keepdim, false);
}
/// True where every element over `axes` is non-zero (bool result; empty gives true).
Tensor all(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
KILN_SINGLE_AXIS(all)
/// True where some element over `axes` is non-zero (bool result; empty gives false).
Tensor any(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
KILN_SINGLE_AXIS(any)
/// Log of the summed exponentials over `axes`, computed stably; all -inf gives -inf.
/// Integer and bool inputs are promoted to float32 as torch.logsumexp does.
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
KILN_SINGLE_AXIS(logsumexp)
#undef KILN_SINGLE_AXIS

/// Variance over `axes` of a floating tensor, dividing by max(N - correction, 0) like torch.var.
Tensor var(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
           int64_t correction = 1);
/// Standard deviation: sqrt(var(x, axes, keepdim, correction)).
Tensor std(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false,
           int64_t correction = 1);
template <SingleAxis Axis>
Tensor var(const Tensor& x, Axis axis, bool keepdim = false, int64_t correction = 1) {
  return var(x, std::vector<int64_t>{static_cast<int64_t>(axis)}, keepdim, correction);
}
template <SingleAxis Axis>
Tensor std(const Tensor& x, Axis axis, bool keepdim = false, int64_t correction = 1) {
  return std(x, std::vector<int64_t>{static_cast<int64_t>(axis)}, keepdim, correction);
}

/// Index (int64) of the first largest element along `axis`; NaN counts as largest.
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false);
/// Row-major flat index (rank-0 int64) of the first largest element of the whole tensor.
Tensor argmax(const Tensor& x);
/// Index (int64) of the first smallest element along `axis`; NaN counts as smallest.
Tensor argmin(const Tensor& x, int64_t axis, bool keepdim = false);
/// Row-major flat index (rank-0 int64) of the first smallest element of the whole tensor.
Tensor argmin(const Tensor& x);

/// Running sum along `dim` (torch.cumsum): out[i] = x[0] + ... + x[i]; bool and integer
/// inputs give int64. Up to 256 elements along `dim` one masked reduction (O(n^2) work);
/// longer, log2(n) scan passes (O(n log n)).
Tensor cumsum(const Tensor& x, int64_t dim);
/// Running product along `dim` (torch.cumprod), with cumsum's dtypes and cost.
Tensor cumprod(const Tensor& x, int64_t dim);

/// exp(x) / sum(exp(x)) along `axis`, shifted by the max for stability; floats only.
Tensor softmax(const Tensor& x, int64_t axis);
/// x - logsumexp(x) along `axis`; floats only.
Tensor log_softmax(const Tensor& x, int64_t axis);

}  // namespace kiln
