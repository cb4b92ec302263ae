// Running sums and products along a dimension (torch.cumsum / cumprod), composed from
// meta-ops: out[i] reduces the terms x[j] masked to j <= i (the others replaced by the
// identity), one fused reduction over an [n, n] domain. O(n^2) work in the length of the
// dimension, which suits the lengths of model dimensions; gradients follow from the
// elementwise, reindex and reduce rules (cumprod's through prod's, exact at zeros).
#include <string>

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
