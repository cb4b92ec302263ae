#pragma once
// Boolean masks packed eight to a byte, built from meta-ops: a backward pass that needs only
// where a forward value was positive keeps one bit per element instead of the value.
#include "../core/tensor.h"

namespace kiln::detail {

/// The bool tensor `mask` [..., R, F] packed along its rows into uint8 [..., ceil(R/8), F]:
/// bit k of byte (j, f) is mask[..., min(8j + k, R - 1), f]. A rank-1 mask [F] packs along F into
/// [ceil(F/8)], a rank-0 one as [1]. One map kernel.
Tensor pack_bits(const Tensor& mask);

/// The bool tensor of `shape` that pack_bits(mask) was made from, read back bit by bit; it
/// fuses into the kernels that read it.
Tensor unpack_bits(const Tensor& packed, const Shape& shape);

}  // namespace kiln::detail
