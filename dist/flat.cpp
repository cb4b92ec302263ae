#include "flat.h"

#include <algorithm>
#include <cstring>

#include "../ops/ops.h"
#include "backends.h"

namespace kiln::dist::detail {

Tensor flat_range(const std::vector<Tensor>& pieces, int64_t start, int64_t count, DType dtype,
                  Device device) {
  std::vector<Tensor> flat;
  int64_t total = 0;
  for (const Tensor& piece : pieces) {
    flat.push_back(piece.dtype() == dtype ? piece : cast(piece, dtype));
    total += piece.numel();
  }
  if (device.is_cuda()) {
    for (Tensor& piece : flat) piece = reshape(piece, {piece.numel()});
    Tensor joined = flat.size() == 1 ? flat[0] : concat(flat, 0);
    if (start + count > total) joined = pad(joined, {{0, start + count - total}});
    return slice(joined, 0, start, start + count).eval();
  }
  eval(flat);  // an evaluated tensor's buffer holds its elements in row-major order
  const size_t item = itemsize(dtype);
  auto buffer = std::make_shared<Buffer>(static_cast<size_t>(count) * item, device);
  auto* out = static_cast<char*>(buffer->host_data());
  int64_t at = 0;  // where the piece starts in the flat vector
  for (const Tensor& piece : flat) {
    const int64_t from = std::max(start, at), to = std::min(start + count, at + piece.numel());
    if (from < to) {
      std::memcpy(out + (from - start) * item,
                  static_cast<const char*>(piece.raw_data()) + (from - at) * item,
                  static_cast<size_t>(to - from) * item);
    }
    at += piece.numel();
  }
  const int64_t covered = std::clamp<int64_t>(at - start, 0, count);
  std::memset(out + covered * item, 0, static_cast<size_t>(count - covered) * item);
  return constant_from(std::move(buffer), {count}, dtype, device);
}

Tensor flat_slice(const Tensor& flat, int64_t start, const Shape& shape) {
  if (flat.device().is_cuda()) return reshape(slice(flat, 0, start, start + numel(shape)), shape);
  const auto* base = static_cast<const char*>(flat.raw_data());
  return from_data(base + static_cast<size_t>(start) * itemsize(flat.dtype()), shape, flat.dtype(),
                   flat.device());
}

}  // namespace kiln::dist::detail
