// Python-style indexing (Tensor::operator[], index, index_put_) as in libtorch's C++ API.
// Basic indices (integers, slices, None, Ellipsis, bools) become reindex nodes through the
// shape ops; an integer Tensor index is one reindex reading that tensor (a gather); a bool
// mask is read on the host, because the result's shape depends on its values. index_put_
// applies the same indices to a ramp of flat positions, so one code path decides which
// elements an index list names for both reading and writing.
#include <limits>
#include <string>

#include "ops.h"

namespace kiln {

namespace {

using indexing::TensorIndex;
using Kind = TensorIndex::Kind;

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

// x with dimension `dim` removed at position `i` (negative counts from the end). Errors
// name dimension `user_dim` of `user_shape`, the tensor the user indexed.
Tensor select(const Tensor& x, int dim, int64_t i, int user_dim, const Shape& user_shape) {
  const Shape& s = x.shape();
  int64_t n = s[dim];
  if (i < -n || i >= n) {
    throw IndexError("[index] index " + std::to_string(i) + " is out of bounds for dimension " +
                     std::to_string(user_dim) + " with size " + std::to_string(n) + " (shape " +
                     shape_str(user_shape) + ")");
  }
  if (i < 0) i += n;
  Shape out;
  std::vector<IndexExpr> map;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d == dim) {
      map.push_back(IndexExpr::constant(i));
    } else {
      map.push_back(IndexExpr::var(static_cast<int>(out.size())));
      out.push_back(s[d]);
    }
  }
  return reindex(x, out, std::move(map), 0, {}, false, "index");
}

// x[..., idx, ...] at `dim` for an integer tensor idx of any rank: the result has x's shape
// with dimension `dim` replaced by idx's shape. Negative entries count from the end; others
// out of range raise IndexError at evaluation.
Tensor take(const Tensor& x, int dim, Tensor idx) {
  const Shape& s = x.shape();
  int64_t n = s[dim];
  idx = where(lt(idx, 0), add(idx, n), idx);
  int r = idx.ndim();
  Shape out(s.begin(), s.begin() + dim);
  out.insert(out.end(), idx.shape().begin(), idx.shape().end());
  out.insert(out.end(), s.begin() + dim + 1, s.end());
  std::vector<IndexExpr> map, at;
  for (int k = 0; k < r; ++k) at.push_back(IndexExpr::var(dim + k));
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < dim)
      map.push_back(IndexExpr::var(d));
    else if (d == dim)
      map.push_back(IndexExpr::load(1, at));
    else
      map.push_back(IndexExpr::var(d + r - 1));
  }
  return reindex(x, out, std::move(map), 0, {idx}, true, "index");
}

// x[mask] at `dim`: the mask covers dimensions dim .. dim + mask.ndim() - 1, which become
// one dimension holding the selected elements in row-major order.
Tensor take_mask(const Tensor& x, int dim, const Tensor& mask) {
  const Shape& s = x.shape();
  int k = mask.ndim();
  for (int j = 0; j < k; ++j) {
    if (mask.shape()[j] != s[dim + j]) {
      throw IndexError("[index] the mask " + shape_str(mask.shape()) +
                       " does not match the indexed tensor " + shape_str(s) + " at dimension " +
                       std::to_string(dim + j) +
                       "; expected the mask's shape to equal dimensions " + std::to_string(dim) +
                       ".." + std::to_string(dim + k - 1));
    }
  }
  std::vector<uint8_t> m = mask.to_vector<uint8_t>();
  std::vector<int64_t> positions;
  for (size_t p = 0; p < m.size(); ++p)
    if (m[p]) positions.push_back(static_cast<int64_t>(p));
  Tensor flat = k == 0 ? unsqueeze(x, dim) : flatten(x, dim, dim + k - 1);
  Tensor idx = from_vector(positions, {static_cast<int64_t>(positions.size())}, x.device());
  return take(flat, dim, idx);
}

}  // namespace

Tensor Tensor::operator[](int64_t i) const {
  const Node& n = checked("index");
  if (n.shape.empty()) {
    throw IndexError("[index] invalid index of a rank-0 tensor (shape []); use item() to read it");
  }
  return select(*this, 0, i, 0, n.shape);
}

Tensor Tensor::index(const std::vector<TensorIndex>& indices) const {
  const Node& n = checked("index");
  const int rank = static_cast<int>(n.shape.size());
  int consumed = 0, ellipses = 0, tensors = 0;
  for (const TensorIndex& ix : indices) {
    switch (ix.kind()) {
      case Kind::Integer:
      case Kind::Slice:
        ++consumed;
        break;
      case Kind::Tensor: {
        const Tensor& t = ix.tensor();
        if (!t.defined()) throw ValueError("[index] a Tensor index is undefined");
        consumed += t.dtype() == DType::Bool ? t.ndim() : 1;
        ++tensors;
        break;
      }
      case Kind::Ellipsis:
        ++ellipses;
        break;
      case Kind::None:
      case Kind::Boolean:
        break;
    }
  }
  if (ellipses > 1) throw ValueError("[index] an index can only have a single Ellipsis");
  if (tensors > 1) {
    throw ValueError("[index] " + std::to_string(tensors) +
                     " Tensor indices in one call are not supported; expected at most one (apply "
                     "them one after another, or combine them into one flat index)");
  }
  if (consumed > rank) {
    throw IndexError("[index] too many indices for a tensor of dimension " + std::to_string(rank) +
                     " (shape " + shape_str(n.shape) + "): " + std::to_string(consumed) +
                     " dimensions indexed");
  }
  Tensor out = *this;
  int dim = 0;   // the next dimension of `out` to index
  int user = 0;  // the same dimension of this tensor, for messages
  for (const TensorIndex& ix : indices) {
    switch (ix.kind()) {
      case Kind::None:
        out = kiln::unsqueeze(out, dim++);
        break;
      case Kind::Boolean:
        out = kiln::unsqueeze(out, dim);
        if (!ix.boolean()) out = slice(out, dim, 0, 0);
        ++dim;
        break;
      case Kind::Ellipsis:
        dim += rank - consumed;
        user += rank - consumed;
        break;
      case Kind::Integer:
        out = select(out, dim, ix.integer(), user++, n.shape);
        break;
      case Kind::Slice: {
        const indexing::Slice& sl = ix.slice();
        int64_t step = sl.step.value_or(1);
        if (step <= 0) {
          throw ValueError("[index] slice step must be positive, got " + std::to_string(step) +
                           " (dimension " + std::to_string(user) + " of shape " +
                           shape_str(n.shape) + ")");
        }
        out = slice(out, dim, sl.start.value_or(0),
                    sl.stop.value_or(std::numeric_limits<int64_t>::max()), step);
        ++dim;
        ++user;
        break;
      }
      case Kind::Tensor: {
        const Tensor& t = ix.tensor();
        user += t.dtype() == DType::Bool ? t.ndim() : 1;
        if (t.dtype() == DType::Bool) {
          out = take_mask(out, dim, t);
          ++dim;
        } else if (is_integer(t.dtype())) {
          out = take(out, dim, t);
          dim += t.ndim();
        } else {
          throw DTypeError("[index] tensors used as indices must be integer or bool, got " +
                           describe(t));
        }
        break;
      }
    }
  }
  return out;
}

Tensor& Tensor::index_put_(const std::vector<TensorIndex>& indices, const Tensor& value) {
  const Node& n = checked("index_put_");
  if (!value.defined()) throw ValueError("[index_put_] the value is undefined");
  if (n.grad_leaf && n.requires_grad && grad_mode_enabled()) {
    throw ValueError("[index_put_] " + describe(*this) +
                     " is a leaf that requires grad and cannot be updated in place while "
                     "gradients are recorded; update it inside a NoGradGuard, as torch.no_grad()");
  }
  // The flat positions the indices name, in the shape the indexed result has.
  Tensor ramp = kiln::index(Shape{numel()}, 0, DType::Int64, device());
  Tensor positions = kiln::reshape(ramp, shape()).index(indices);
  const Shape& target = positions.shape();
  if (broadcast_shapes("index_put_", value.shape(), target) != target) {
    throw ShapeError("[index_put_] the value " + describe(value) +
                     " cannot be broadcast to the indexed shape " + shape_str(target) +
                     " of the tensor " + describe(*this));
  }
  int64_t count = kiln::numel(target);
  if (count == 0) return *this;
  // A tensor index is checked against its axis only when evaluated: evaluating the positions
  // now makes a bad index raise here, before the update, and leaves this tensor as it was
  // (torch's in-place ops are eager too). Without tensor indices nothing can fail later.
  bool tensor_index = false;
  for (const TensorIndex& i : indices)
    tensor_index = tensor_index || i.kind() == TensorIndex::Kind::Tensor;
  if (tensor_index) positions.eval();
  Tensor src = kiln::reshape(broadcast_to(cast(value.to(device()), dtype()), target), {count});
  Tensor flat_positions = kiln::reshape(positions, {count});
  // source[j] = 1 + the last k with flat_positions[k] == j (below 1 where nothing is
  // written): a max-reduction, so a position named twice takes the last value (torch leaves
  // it unspecified; its CPU kernel gives the last too).
  Tensor order = add(kiln::index(Shape{count}, 0, DType::Int64, device()), 1);
  Tensor source = reindex_reduce(order, ReduceOp::Max, Shape{numel()},
                                 {IndexExpr::load(1, {IndexExpr::var(0)})}, {flat_positions}, true,
                                 "index_put_");
  Tensor written = gt(source, 0);  // unwritten positions hold the max's identity (negative)
  Tensor picked = index_select(src, 0, where(written, sub(source, 1), 0));
  Tensor updated = kiln::reshape(where(written, picked, kiln::reshape(*this, {numel()})), shape());
  rebind(updated, "index_put_", true, true);
  return *this;
}

Tensor& Tensor::index_put_(const std::vector<TensorIndex>& indices, const Scalar& value) {
  checked("index_put_");
  return index_put_(indices, full({}, value, dtype(), device()));
}

}  // namespace kiln
