// matmul, linear and outer as reindex + mul + reindex_reduce. The product domain is
// [..batch, m, k, n]; a 1-D operand contributes a size-1 m (or n) that the reduce drops.
#include "linalg.h"

#include "autocast.h"
#include "elementwise.h"
#include "reindex.h"
#include "transfer.h"

namespace kiln {
namespace {

std::string text(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + " tensor of shape " + shape_str(t.shape());
}

void check_operands(const Tensor& a, const Tensor& b, const char* op, bool allow_bool) {
  if (!a.defined() || !b.defined()) {
    throw ValueError("[" + std::string(op) + "] an input tensor is undefined");
  }
  if (a.device() != b.device()) {
    Tensor x = a, y = b;
    detail::align_devices(op, {&x, &y});  // throws unless one side is data-free
  }
  // torch has no bool GEMM; a bool "sum of products" would silently mean logical or-of-ands.
  if (!allow_bool && (a.dtype() == DType::Bool || b.dtype() == DType::Bool)) {
    throw DTypeError("[" + std::string(op) + "] is not defined for bool inputs (got " + text(a) +
                     " and " + text(b) + "); cast to an integer or floating dtype first");
  }
}

// Batch dims broadcast like numpy, but the message names the matmul operands' full shapes.
Shape broadcast_batch(const Shape& ba, const Shape& bb, const Tensor& a, const Tensor& b,
                      const char* op) {
  size_t rank = std::max(ba.size(), bb.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - ba.size() ? 1 : ba[i - (rank - ba.size())];
    int64_t db = i < rank - bb.size() ? 1 : bb[i - (rank - bb.size())];
    if (da != db && da != 1 && db != 1) {
      throw ShapeError("[" + std::string(op) + "] batch dimensions " + shape_str(ba) +
                       " of first input with shape " + shape_str(a.shape()) + " and " +
                       shape_str(bb) + " of second input with shape " + shape_str(b.shape()) +
                       " cannot be broadcast together; expected equal sizes or 1");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Maps an operand's batch dims (right-aligned to the broadcast batch) into the domain.
void push_batch_map(std::vector<IndexExpr>& map, const Shape& own, const Shape& batch) {
  size_t lead = batch.size() - own.size();
  for (size_t d = 0; d < own.size(); ++d) {
    bool broadcast = own[d] == 1 && batch[lead + d] != 1;
    map.push_back(broadcast ? IndexExpr::constant(0) : IndexExpr::var(static_cast<int>(lead + d)));
  }
}

bool is_half(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

// `b_transposed`: b is stored [..., n, k] (a linear layer's weight) and read transposed, so
// neither the product nor its gradients materialize a transpose.
Tensor matmul_impl(const Tensor& a_in, const Tensor& b_in, const char* op,
                   bool b_transposed = false) {
  check_operands(a_in, b_in, op, false);
  // Products are on autocast's lower-precision list.
  const Tensor a = amp::lower_precision(a_in), b = amp::lower_precision(b_in);
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  if (sa.empty() || sb.empty()) {
    throw ShapeError(
        "[" + std::string(op) + "] both inputs must have at least one dimension, got " + "shapes " +
        shape_str(sa) + " and " + shape_str(sb) + "; use mul() to scale by a rank-0 tensor");
  }
  bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  int64_t k = sa.back();
  b_transposed = b_transposed && !b_vec;
  int64_t kb = b_vec ? sb[0] : sb[sb.size() - (b_transposed ? 1 : 2)];
  if (k != kb) {
    std::string lhs = a_vec ? "Size of first input" : "Last dimension of first input";
    std::string rhs = b_vec ? "size of second input" : "second to last dimension of second input";
    throw ShapeError("[" + std::string(op) + "] " + lhs + " with shape " + shape_str(sa) +
                     " must match " + rhs + " with shape " + shape_str(sb) + " (" +
                     std::to_string(k) + " vs " + std::to_string(kb) + ").");
  }
  int64_t m = a_vec ? 1 : sa[sa.size() - 2];
  int64_t n = b_vec ? 1 : sb[sb.size() - (b_transposed ? 2 : 1)];
  Shape batch_a(sa.begin(), sa.end() - (a_vec ? 1 : 2));
  Shape batch_b(sb.begin(), sb.end() - (b_vec ? 1 : 2));
  Shape batch = broadcast_batch(batch_a, batch_b, a, b, op);

  ResultType rt;
  rt.add_tensor(a.dtype(), a.ndim());
  rt.add_tensor(b.dtype(), b.ndim());
  DType out_dtype = rt.result();
  // Half types are storage only: products and sums run in float32, rounded once at the end.
  DType compute = is_half(out_dtype) ? DType::Float32 : out_dtype;

  int nb = static_cast<int>(batch.size());
  Shape domain = batch;
  domain.insert(domain.end(), {m, k, n});
  IndexExpr im = IndexExpr::var(nb), ik = IndexExpr::var(nb + 1), in = IndexExpr::var(nb + 2);

  std::vector<IndexExpr> map_a;
  push_batch_map(map_a, batch_a, batch);
  if (!a_vec) map_a.push_back(im);
  map_a.push_back(ik);
  std::vector<IndexExpr> map_b;
  push_batch_map(map_b, batch_b, batch);
  if (b_transposed) {
    map_b.push_back(in);
    map_b.push_back(ik);
  } else {
    map_b.push_back(ik);
    if (!b_vec) map_b.push_back(in);
  }

  Tensor ea = reindex(cast(a, compute), domain, std::move(map_a), 0, {}, false, op);
  Tensor eb = reindex(cast(b, compute), domain, std::move(map_b), 0, {}, false, op);
  Tensor prod = elementwise(OpCode::Mul, {ea, eb}, op);

  Shape out = batch;
  std::vector<IndexExpr> map_out;
  for (int d = 0; d < nb; ++d) map_out.push_back(IndexExpr::var(d));
  if (!a_vec) {
    out.push_back(m);
    map_out.push_back(im);
  }
  if (!b_vec) {
    out.push_back(n);
    map_out.push_back(in);
  }
  return cast(reindex_reduce(prod, ReduceOp::Sum, out, std::move(map_out), {}, false, op),
              out_dtype);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul_impl(a, b, "matmul"); }

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const char* op = "linear";
  check_operands(x_in, weight_in, op, false);
  // On autocast's lower-precision list as a whole: the bias too, so the result stays half.
  const Tensor x = amp::lower_precision(x_in), weight = amp::lower_precision(weight_in),
               bias = amp::lower_precision(bias_in);
  if (x.ndim() == 0 || weight.ndim() == 0 || weight.ndim() > 2) {
    throw ShapeError(
        "[linear] expected an input with at least one dimension and a weight of shape "
        "[out_features, in_features] or [in_features], got input shape " +
        shape_str(x.shape()) + " and weight shape " + shape_str(weight.shape()));
  }
  if (x.shape().back() != weight.shape().back()) {
    throw ShapeError("[linear] last dimension of input with shape " + shape_str(x.shape()) +
                     " must match the last dimension (in_features) of weight with shape " +
                     shape_str(weight.shape()) + " (" + std::to_string(x.shape().back()) + " vs " +
                     std::to_string(weight.shape().back()) + ")");
  }
  Tensor y = matmul_impl(x, weight, op, true);
  if (!bias.defined()) return y;
  // The bias may broadcast into the output but never enlarge it (torch requires [out]).
  Shape s = broadcast_shapes(op, y.shape(), bias.shape());
  if (s != y.shape()) {
    throw ShapeError("[linear] bias with shape " + shape_str(bias.shape()) +
                     " does not broadcast to the output shape " + shape_str(y.shape()) +
                     "; expected a bias of shape [out_features]");
  }
  return elementwise(OpCode::Add, {y, bias}, op);
}

Tensor outer(const Tensor& a, const Tensor& b) {
  const char* op = "outer";
  check_operands(a, b, op, true);
  if (a.ndim() != 1 || b.ndim() != 1) {
    throw ShapeError("[outer] expected two 1-D inputs, got shapes " + shape_str(a.shape()) +
                     " and " + shape_str(b.shape()));
  }
  Shape out{a.shape()[0], b.shape()[0]};
  Tensor ea = reindex(a, out, {IndexExpr::var(0)}, 0, {}, false, op);
  Tensor eb = reindex(b, out, {IndexExpr::var(1)}, 0, {}, false, op);
  return elementwise(OpCode::Mul, {ea, eb}, op);
}

}  // namespace kiln
