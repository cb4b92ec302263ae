#include "bit_mask.h"

#include <cstdint>
#include <vector>

#include "../core/error.h"
#include "elementwise.h"
#include "reindex.h"
#include "shape_ops.h"
#include "sources.h"

namespace kiln::detail {
namespace {

// 1, 2, 4, ..., 128: the weight of bit k. A table read at k rather than a shift, which no
// meta-op has; its 8 bytes are a leaf that every kernel reads.
Tensor bit_weights(Device device) {
  return from_vector<uint8_t>({1, 2, 4, 8, 16, 32, 64, 128}, {8}, device);
}

// The axis packed: the rows (the second to last dimension) where there are rows. Eight rows
// share a row of bytes, so reading a bit divides the row coordinate by 8 once per row, and
// the inner loop over the last dimension reads bytes at unit stride. (Packing along the
// last dimension divided every element's coordinate by 8, a kernel parameter, in the
// backward kernel's inner loop: that kernel took 5x its forward twin's time.)
int packed_axis(int rank) { return rank >= 2 ? rank - 2 : 0; }

}  // namespace

Tensor pack_bits(const Tensor& mask) {
  if (!mask.defined() || mask.dtype() != DType::Bool)
    throw DTypeError("[pack_bits] expected a bool tensor, got " +
                     std::string(mask.defined() ? dtype_name(mask.dtype()) : "an undefined one"));
  const Tensor m = mask.ndim() == 0 ? reshape(mask, {1}) : mask;
  const Shape& shape = m.shape();
  const int r = static_cast<int>(shape.size()), a = packed_axis(r);
  // Byte (.., j, ..) is the sum of 8 selects of 2^k where the mask is set at 8j + k along
  // the axis: distinct powers of two, so the sum is their bitwise or.
  // A map over the packed shape whose inner loop reads the mask's rows at unit stride; as a
  // reduction over a trailing group of 8 it read each byte's 8 elements a row apart.
  Shape packed = shape;
  packed[static_cast<size_t>(a)] = (shape[static_cast<size_t>(a)] + 7) / 8;
  const Tensor zero = full({}, 0, DType::UInt8, m.device());
  Tensor bytes;
  // Rows past the end read the last row: unpack_bits never reads their bits, and a read
  // that is in range at every size keeps the kernel free of a bounds guard whose presence
  // would depend on whether the row count is a multiple of 8 (a new kernel for some batch
  // sizes; kernels are keyed by structure, not sizes).
  const IndexExpr last = IndexExpr::constant(shape[static_cast<size_t>(a)] - 1);
  for (int k = 0; k < 8; ++k) {
    std::vector<IndexExpr> at;
    for (int d = 0; d < r; ++d)
      at.push_back(
          d == a ? min(IndexExpr::var(d) * IndexExpr::constant(8) + IndexExpr::constant(k), last)
                 : IndexExpr::var(d));
    Tensor bit = reindex(m, packed, at, false, {}, false, "pack_bits");
    Tensor term = where(bit, full({}, 1 << k, DType::UInt8, m.device()), zero);
    // Named for the kernels it roots (pack_bits), which reports and kept_for_backward read.
    bytes = k == 0 ? term : elementwise(OpCode::Add, {bytes, term}, "pack_bits");
  }
  return bytes;
}

Tensor unpack_bits(const Tensor& packed, const Shape& shape) {
  const Shape s = shape.empty() ? Shape{1} : shape;
  const int r = static_cast<int>(s.size()), a = packed_axis(r);
  Shape want = s;
  want[static_cast<size_t>(a)] = (s[static_cast<size_t>(a)] + 7) / 8;
  if (!packed.defined() || packed.dtype() != DType::UInt8 || packed.shape() != want)
    throw ShapeError("[unpack_bits] expected uint8 bytes " + shape_str(want) +
                     " packed from a mask of shape " + shape_str(shape) + ", got " +
                     (packed.defined()
                          ? std::string(dtype_name(packed.dtype())) + shape_str(packed.shape())
                          : std::string("an undefined tensor")));
  std::vector<IndexExpr> at;
  for (int d = 0; d < r; ++d)
    at.push_back(d == a ? floordiv(IndexExpr::var(d), IndexExpr::constant(8)) : IndexExpr::var(d));
  Tensor byte = reindex(packed, s, at, 0, {}, false, "unpack_bits");
  Tensor weight =
      reindex(bit_weights(packed.device()), s, {mod(IndexExpr::var(a), IndexExpr::constant(8))}, 0,
              {}, false, "unpack_bits");
  Tensor mask = ne(bitwise_and(byte, weight), full({}, 0, DType::UInt8, packed.device()));
  return shape.empty() ? reshape(mask, shape) : mask;
}

}  // namespace kiln::detail
