#include "reindex.h"

#include "autograd.h"
#include "elementwise.h"
#include "shape_ops.h"
#include "transfer.h"

namespace kiln {
namespace {

std::string origin_name(const char* origin, const char* fallback) {
  return origin ? origin : fallback;
}

// Index-expression reads must refer to an existing integer index tensor with matching rank.
void check_loads(const IndexExpr& e, const std::vector<Tensor>& indices, const std::string& op) {
  if (e.kind() == IndexExpr::Kind::Load) {
    int64_t k = e.value();
    if (k < 1 || k > static_cast<int64_t>(indices.size())) {
      throw ValueError("[" + op + "] index map reads idx" + std::to_string(k) + " but " +
                       std::to_string(indices.size()) + " index tensor(s) were given");
    }
    const Tensor& t = indices[k - 1];
    if (static_cast<size_t>(t.ndim()) != e.args().size()) {
      throw ShapeError("[" + op + "] index map reads idx" + std::to_string(k) + " with " +
                       std::to_string(e.args().size()) + " coordinates but that tensor has shape " +
                       shape_str(t.shape()));
    }
  }
  for (const IndexExpr& a : e.args()) check_loads(a, indices, op);
}

void check_vars(const IndexExpr& e, size_t rank, const std::string& op) {
  if (e.kind() == IndexExpr::Kind::Var &&
      (e.value() < 0 || static_cast<size_t>(e.value()) >= rank)) {
    throw ValueError("[" + op + "] index map uses i" + std::to_string(e.value()) +
                     " but the loop domain has rank " + std::to_string(rank));
  }
  for (const IndexExpr& a : e.args()) check_vars(a, rank, op);
}

std::vector<NodePtr> gather_inputs(const Tensor& x, const std::vector<Tensor>& indices,
                                   const std::string& op) {
  if (!x.defined()) throw ValueError("[" + op + "] the input tensor is undefined");
  std::vector<Tensor> all{x};
  for (const Tensor& t : indices) {
    if (!t.defined()) throw ValueError("[" + op + "] an index tensor is undefined");
    if (!is_integer(t.dtype())) {
      throw DTypeError("[" + op + "] index tensors must have an integer dtype, got " +
                       std::string(dtype_name(t.dtype())) + shape_str(t.shape()));
    }
    all.push_back(t);
  }
  std::vector<Tensor*> refs;
  for (Tensor& t : all) refs.push_back(&t);
  detail::align_devices(op.c_str(), refs);
  std::vector<NodePtr> inputs;
  for (const Tensor& t : all) inputs.push_back(t.node());
  return inputs;
}

}  // namespace

Tensor reindex(const Tensor& x, const Shape& shape, std::vector<IndexExpr> map, const Scalar& fill,
               const std::vector<Tensor>& indices, bool check_indices, const char* origin) {
  std::string op = origin_name(origin, "reindex");
  std::vector<NodePtr> inputs = gather_inputs(x, indices, op);
  check_sizes(op, shape, itemsize(x.dtype()));
  if (map.size() != static_cast<size_t>(x.ndim())) {
    throw ShapeError("[" + op + "] index map has " + std::to_string(map.size()) +
                     " expressions but the input has shape " + shape_str(x.shape()) +
                     "; expected one per input dimension");
  }
  for (const IndexExpr& e : map) {
    check_vars(e, shape.size(), op);
    check_loads(e, indices, op);
  }
  Device device = inputs[0]->device;
  auto node = std::make_shared<Node>(OpCode::Reindex, std::move(inputs), shape, x.dtype(), device);
  node->index_map = std::move(map);
  node->scalar = fill;
  node->check_indices = check_indices;
  node->origin = origin;
  return Tensor(std::move(node));
}

Tensor reindex_reduce(const Tensor& x, ReduceOp reduce, const Shape& shape,
                      std::vector<IndexExpr> map, const std::vector<Tensor>& indices,
                      bool check_indices, const char* origin) {
  std::string op = origin_name(origin, "reindex_reduce");
  std::vector<NodePtr> inputs = gather_inputs(x, indices, op);
  check_sizes(op, shape, itemsize(x.dtype()));
  if (map.size() != shape.size()) {
    throw ShapeError("[" + op + "] index map has " + std::to_string(map.size()) +
                     " expressions but the output shape " + shape_str(shape) +
                     " needs one per output dimension");
  }
  if ((reduce == ReduceOp::And || reduce == ReduceOp::Or) && x.dtype() != DType::Bool) {
    throw DTypeError("[" + op + "] reduction '" + std::string(reduce_name(reduce)) +
                     "' needs a bool input, got " + std::string(dtype_name(x.dtype())));
  }
  for (const IndexExpr& e : map) {
    check_vars(e, static_cast<size_t>(x.ndim()), op);
    check_loads(e, indices, op);
  }
  Device device = inputs[0]->device;
  auto node =
      std::make_shared<Node>(OpCode::ReindexReduce, std::move(inputs), shape, x.dtype(), device);
  node->index_map = std::move(map);
  node->reduce = reduce;
  node->check_indices = check_indices;
  node->origin = origin;
  return Tensor(std::move(node));
}

Tensor broadcast_to(const Tensor& x, const Shape& shape, const char* origin) {
  std::string op = origin_name(origin, "broadcast_to");
  if (!x.defined()) throw ValueError("[" + op + "] the tensor is undefined");
  const Shape& in = x.shape();
  if (in.size() > shape.size()) {
    throw ShapeError("[" + op + "] cannot broadcast shape " + shape_str(in) + " to " +
                     shape_str(shape) + ": the target has fewer dimensions");
  }
  size_t lead = shape.size() - in.size();
  std::vector<IndexExpr> map;
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] == shape[lead + d]) {
      map.push_back(IndexExpr::var(static_cast<int>(lead + d)));
    } else if (in[d] == 1) {
      map.push_back(IndexExpr::constant(0));
    } else {
      throw ShapeError("[" + op + "] cannot broadcast shape " + shape_str(in) + " to " +
                       shape_str(shape) + ": dimension " + std::to_string(d) + " has size " +
                       std::to_string(in[d]) + ", expected 1 or " +
                       std::to_string(shape[lead + d]));
    }
  }
  if (in == shape) return x;
  return reindex(x, shape, std::move(map), 0, {}, false, origin ? origin : "broadcast_to");
}

namespace {

// e as `i_var + offset`, if it has that form.
bool unit_affine(const IndexExpr& e, int* var, int64_t* offset) {
  if (e.kind() == IndexExpr::Kind::Var) {
    *var = static_cast<int>(e.value());
    *offset = 0;
    return true;
  }
  if (e.kind() != IndexExpr::Kind::Add || e.args().size() != 2) return false;
  const IndexExpr& a = e.args()[0];
  const IndexExpr& b = e.args()[1];
  const IndexExpr* v =
      a.kind() == IndexExpr::Kind::Var ? &a : (b.kind() == IndexExpr::Kind::Var ? &b : nullptr);
  const IndexExpr* c = a.is_const() ? &a : (b.is_const() ? &b : nullptr);
  if (v == nullptr || c == nullptr) return false;
  *var = static_cast<int>(v->value());
  *offset = c->value();
  return true;
}

// When `n` reads x[i_p0 + c0, i_p1 + c1, ...] with every output coordinate used once (a
// permute, slice, narrow or pad), each x element is read at most once and x's gradient is
// the inverse read, out-of-range positions (elements never read) giving 0. That is a map,
// which fuses with its neighbours, rather than a scatter; otherwise undefined.
Tensor inverse_read(const Node& n, const Tensor& x, const Tensor& g) {
  const auto& map = n.index_map;
  if (map.size() != n.shape.size()) return Tensor();
  std::vector<IndexExpr> inverse(n.shape.size());
  std::vector<bool> used(n.shape.size(), false);
  for (size_t j = 0; j < map.size(); ++j) {
    int d = -1;
    int64_t offset = 0;
    if (!unit_affine(map[j], &d, &offset)) return Tensor();
    auto du = static_cast<size_t>(d);
    if (du >= used.size() || used[du]) return Tensor();
    used[du] = true;
    inverse[du] = IndexExpr::var(static_cast<int>(j)) - IndexExpr::constant(offset);
  }
  // An output coordinate no x dimension reads is a broadcast: its gradient is a sum.
  for (bool u : used)
    if (!u) return Tensor();
  return reindex(g, x.shape(), std::move(inverse), 0, {}, false, "reindex backward");
}

}  // namespace

namespace detail {

// Gradient rules of the two index-map meta-ops. A reindex reads x[map(i)], so x's gradient
// sums g back through the same map (reads out of range took the fill and pass nothing
// back); a sum-reduce is the transpose, reading g at map(i). Index tensors get no gradient.
std::vector<Tensor> reindex_vjp(const Node& n, const std::vector<Tensor>& inputs, const Tensor& out,
                                const Tensor& g) {
  const Tensor& x = inputs[0];
  std::vector<Tensor> indices(inputs.begin() + 1, inputs.end());
  std::vector<Tensor> grads(inputs.size());
  if (n.op == OpCode::Reindex) {
    // Maps that read each element at most once (permutes, slices, pads, reshapes) have the
    // inverse read as gradient, a plain map, rather than a scatter-add through the map.
    if (indices.empty()) {
      if (Tensor back = inverse_read(n, x, g); back.defined()) {
        grads[0] = back;
        return grads;
      }
      if (x.numel() == out.numel() && n.index_map == reshape(x, n.shape).node()->index_map) {
        grads[0] = reshape(g, x.shape());
        return grads;
      }
    }
    grads[0] = reindex_reduce(g, ReduceOp::Sum, x.shape(), n.index_map, indices, false,
                              "reindex backward");
    return grads;
  }
  switch (n.reduce) {
    case ReduceOp::Sum:
      grads[0] = reindex(g, x.shape(), n.index_map, 0, indices, false, "reduce backward");
      break;
    case ReduceOp::Prod: {
      // d prod / d x_i is the product of the other elements of x_i's group. That is prod / x_i
      // only where the group has no zero; with one zero, the zero's gradient is the product of
      // the non-zeros and the rest get 0; with several, every gradient is 0 (torch.prod's
      // rule). Zeros are divided by 1 instead, so no branch of the selects holds 0/0 that a
      // second derivative would carry.
      auto spread = [&](const Tensor& t) {
        return reindex(t, x.shape(), n.index_map, 0, indices, false, "prod backward");
      };
      auto group = [&](const Tensor& t, ReduceOp op) {
        return reindex_reduce(t, op, n.shape, n.index_map, indices, false, "prod backward");
      };
      Tensor zero = eq(x, 0);
      Tensor zeros_in_group = group(cast(zero, x.dtype()), ReduceOp::Sum);
      Tensor others = group(where(zero, 1, x), ReduceOp::Prod);
      Tensor at_zero = spread(g * where(zeros_in_group == 1, others, 0));
      Tensor at_nonzero = spread(g * where(zeros_in_group == 0, out, 0)) / where(zero, 1, x);
      grads[0] = where(zero, at_zero, at_nonzero);
      break;
    }
    case ReduceOp::Max:
    case ReduceOp::Min: {
      // Ties share the gradient evenly, as torch.amax / amin. A NaN extreme is the group's
      // NaNs (which equal nothing), as torch.max()'s even split gives them the gradient.
      Tensor spread = reindex(out, x.shape(), n.index_map, 0, indices, false, "max backward");
      Tensor hit = logical_or(eq(x, spread), logical_and(ne(x, x), ne(spread, spread)));
      Tensor count = reindex_reduce(cast(hit, g.dtype()), ReduceOp::Sum, n.shape, n.index_map,
                                    indices, false, "max backward");
      Tensor share = reindex(g / count, x.shape(), n.index_map, 0, indices, false, "max backward");
      grads[0] = where(hit, share, 0);
      break;
    }
    case ReduceOp::And:
    case ReduceOp::Or:
      break;  // bool: no gradient
  }
  return grads;
}

}  // namespace detail

}  // namespace kiln
