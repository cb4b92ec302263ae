#pragma once
// Activation checkpointing by hand: values computed inside a checkpointed function are not
// kept for the backward pass; the memory planner releases them as soon as the function's
// part of the step is done and rebuilds them just before the backward reads them. Results
// are bit-identical to the unchecked run (random ops carry their counters).
#include <functional>
#include <vector>

#include "../core/tensor.h"

namespace kiln {

/// Runs `fn(inputs)` so that the intermediates it builds are released after the forward
/// use and recomputed when read again; its results are kept as usual.
std::vector<Tensor> checkpoint(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    const std::vector<Tensor>& inputs);

/// One-tensor form of checkpoint().
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

}  // namespace kiln
