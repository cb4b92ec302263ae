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

// 1, 2, 4, ..., 128: the weight of bit k. A table read at k % 8 rather than a shift, which
// no meta-op has; its 8 bytes are a leaf that every kernel reads.
Tensor bit_weights(Device device) {
  return from_vector<uint8_t>({1, 2, 4, 8, 16, 32, 64, 128}, {8}, device);
}

}  // namespace

Tensor pack_bits(const Tensor& mask) {
  if (!mask.defined() || mask.dtype() != DType::Bool)
    throw DTypeError("[pack_bits] expected a bool tensor, got " +
                     std::string(mask.defined() ? dtype_name(mask.dtype()) : "an undefined one"));
  Shape shape = mask.shape();
  if (shape.empty()) shape = {1};
  const int r = static_cast<int>(shape.size());
  const int64_t bytes = (shape.back() + 7) / 8;
  // [..., bytes, 8]: element (j, k) is the mask at 8j + k, false past the end.
  Shape grouped = shape;
  grouped.back() = bytes;
  grouped.push_back(8);
  std::vector<IndexExpr> at;
  for (int d = 0; d + 1 < r; ++d) at.push_back(IndexExpr::var(d));
  at.push_back(IndexExpr::var(r - 1) * IndexExpr::constant(8) + IndexExpr::var(r));
  Tensor bits = reindex(mask.ndim() == 0 ? reshape(mask, shape) : mask, grouped, at, false, {},
                        false, "pack_bits");
  Tensor weight =
      reindex(bit_weights(mask.device()), grouped, {IndexExpr::var(r)}, 0, {}, false, "pack_bits");
  Tensor terms = where(bits, weight, full({}, 0, DType::UInt8, mask.device()));
  // Distinct powers of two: their sum is their bitwise or, at most 255.
  Shape packed = grouped;
  packed.pop_back();
  std::vector<IndexExpr> keep;
  for (int d = 0; d < r; ++d) keep.push_back(IndexExpr::var(d));
  return reindex_reduce(terms, ReduceOp::Sum, packed, keep, {}, false, "pack_bits");
}

Tensor unpack_bits(const Tensor& packed, const Shape& shape) {
  const Shape s = shape.empty() ? Shape{1} : shape;
  const int r = static_cast<int>(s.size());
  if (!packed.defined() || packed.dtype() != DType::UInt8 || packed.ndim() != r ||
      packed.shape().back() != (s.back() + 7) / 8)
    throw ShapeError("[unpack_bits] expected uint8 bytes packed from a mask of shape " +
                     shape_str(shape));
  std::vector<IndexExpr> at;
  for (int d = 0; d + 1 < r; ++d) at.push_back(IndexExpr::var(d));
  at.push_back(floordiv(IndexExpr::var(r - 1), IndexExpr::constant(8)));
  Tensor byte = reindex(packed, s, at, 0, {}, false, "unpack_bits");
  Tensor weight =
      reindex(bit_weights(packed.device()), s, {mod(IndexExpr::var(r - 1), IndexExpr::constant(8))},
              0, {}, false, "unpack_bits");
  Tensor mask = ne(bitwise_and(byte, weight), full({}, 0, DType::UInt8, packed.device()));
  return shape.empty() ? reshape(mask, shape) : mask;
}

}  // namespace kiln::detail
