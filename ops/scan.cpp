// Running sums and products along a dimension (torch.cumsum / cumprod), composed from
// meta-ops. Up to kQuadraticUpTo elements along the dimension: out[i] reduces the terms x[j]
// masked to j <= i (the others replaced by the identity), one fused reduction over an
// [n, n] domain, which suits the lengths of model dimensions. Longer: Hillis and Steele's
// scan, ceil(log2 n) passes each combining every element with the one 2^k places before,
// O(n log n) work (the [n, n] form took seconds at n = 100k). Gradients follow from the
// elementwise, reindex and reduce rules (cumprod's through products, exact at zeros).
#include <string>
#include <utility>
#include <vector>

#include "ops.h"

namespace kiln {

namespace {

Tensor scan(const Tensor& x, int64_t dim, bool product, const char* op) {
  if (!x.defined()) throw ValueError(std::string("[") + op + "] the tensor is undefined");
  // sum / prod give the result dtypes: bool and integers accumulate in int64.
  DType out = is_floating(x.dtype()) ? x.dtype() : DType::Int64;
  Tensor xs = cast(x, out);
  if (x.ndim() == 0) {
    if (dim != 0 && dim != -1) {
      throw ShapeError(std::string("[") + op + "] dimension " + std::to_string(dim) +
                       " is out of range for a rank-0 tensor; expected 0 or -1");
    }
    return xs;
  }
  int d = normalize_axis(op, dim, x.shape());
  int64_t n = x.shape()[d];
  constexpr int64_t kQuadraticUpTo = 256;
  if (n > kQuadraticUpTo) {
    Tensor y = xs;
    std::vector<std::pair<int64_t, int64_t>> pads(static_cast<size_t>(x.ndim()), {0, 0});
    for (int64_t step = 1; step < n; step *= 2) {
      // y shifted by `step` along d, the identity shifted in.
      pads[static_cast<size_t>(d)] = {step, 0};
      Tensor before = pad(slice(y, d, 0, n - step), pads, product ? 1 : 0);
      y = product ? mul(y, before) : add(y, before);
    }
    return y;
  }
  // keep[i, j] = j <= i, shaped [n, n, 1, ...] to broadcast against xs unsqueezed at d.
  Tensor keep = le(kiln::index(Shape{n, n}, 1, DType::Int64, x.device()),
                   kiln::index(Shape{n, n}, 0, DType::Int64, x.device()));
  Shape s{n, n};
  s.insert(s.end(), x.ndim() - d - 1, 1);
  keep = reshape(keep, s);
  Tensor terms = where(keep, unsqueeze(xs, d), product ? 1 : 0);
  return product ? prod(terms, {d + 1}) : sum(terms, {d + 1});
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) { return scan(x, dim, false, "cumsum"); }
Tensor cumprod(const Tensor& x, int64_t dim) { return scan(x, dim, true, "cumprod"); }

}  // namespace kiln
