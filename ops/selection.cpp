// max/min with indices, sort, topk and multinomial.
//
// sort and topk find the order's indices and gather the values at them, so gradients reach
// exactly the selected elements through gather. On the host the indices come from a native
// stable sort of each row (an opaque custom node, SortIndices: O(n log n), rows spread over
// the thread pool); the JIT has no sort, and the meta-op form below took seconds and
// gigabytes at n = 100k. On CUDA devices they come from meta-ops: each element's rank along
// the dimension as one fused comparison-and-sum (how many elements come before it, ties
// broken by position, so the order is stable), then each position scattered to its rank (a
// reindex-reduce whose target is read from the rank tensor; targets >= k are skipped, which
// is topk); O(n^2) work, in parallel. max / min with indices gather at argmax / argmin for
// the same reason: torch's gradient goes to the reported index only, while the value-only
// max(x, {dim}) shares it between ties.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <typeinfo>

#include "../core/custom_op.h"
#include "../core/structural_hash.h"
#include "../core/thread_pool.h"
#include "ops.h"

namespace kiln {

namespace {

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

void check_defined(const Tensor& x, const char* op) {
  if (!x.defined()) throw ValueError(std::string("[") + op + "] the tensor is undefined");
}

// The dimension a single-dim op works on; a rank-0 tensor accepts 0 and -1, as torch.
int dim_of(const Tensor& x, int64_t dim, const char* op) {
  if (x.ndim() == 0) {
    if (dim != 0 && dim != -1) {
      throw ShapeError(std::string("[") + op + "] dimension " + std::to_string(dim) +
                       " is out of range for a rank-0 tensor; expected 0 or -1");
    }
    return -1;
  }
  return normalize_axis(op, dim, x.shape());
}

// [..., n, n, 1, ...]-shaped comparison of positions: true where j (dim d + 1) < i (dim d),
// broadcastable against x unsqueezed at d and d + 1.
Tensor position_before(int64_t n, int rank_after, Device device) {
  Tensor before = lt(kiln::index(Shape{n, n}, 1, DType::Int64, device),
                     kiln::index(Shape{n, n}, 0, DType::Int64, device));
  Shape s{n, n};
  s.insert(s.end(), rank_after, 1);
  return reshape(before, s);
}

// Rank of each element along `d` in ascending (or descending) order, ties by position; NaN
// is above every number. int64, x's shape.
Tensor ranks(const Tensor& x, int d, bool descending) {
  Tensor xi = unsqueeze(x, d + 1);                            // element i at dim d
  Tensor xj = unsqueeze(x, d);                                // element j at dim d + 1
  Tensor a = descending ? xi : xj, b = descending ? xj : xi;  // j comes first when a < b
  Tensor first = lt(a, b), same = eq(xj, xi);
  if (is_floating(x.dtype())) {
    first = logical_or(first, logical_and(logical_not(isnan(a)), isnan(b)));
    same = logical_or(same, logical_and(isnan(xj), isnan(xi)));
  }
  int64_t n = x.shape()[d];
  int after = x.ndim() - d - 1;
  Tensor before = logical_or(first, logical_and(same, position_before(n, after, x.device())));
  return sum(before, {d + 1});
}

// Sorts one row of `count` elements `stride` apart starting at `row`: writes the row's
// stable order (positions along the axis) into `order`, NaN above every number.
template <typename T>
void sort_row(const T* row, int64_t count, int64_t stride, bool descending, int64_t* order) {
  std::iota(order, order + count, int64_t{0});
  auto less = [&](int64_t i, int64_t j) {
    const T a = row[i * stride], b = row[j * stride];
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return descending ? !std::isnan(b) : !std::isnan(a);
    }
    return descending ? b < a : a < b;
  };
  std::stable_sort(order, order + count, less);
}

// The payload of a host sort node: the int64 positions that order x along `axis`.
class SortIndices final : public CustomKernelOp {
 public:
  SortIndices(int axis, bool descending) : axis_(axis), descending_(descending) {}
  const std::string& name() const override {
    static const std::string kName = "sort";
    return kName;
  }
  uint64_t hash() const override {
    return hash_combine(hash_combine(0x5047u, static_cast<uint64_t>(axis_)), descending_);
  }
  bool same_as(const CustomKernelOp& other) const override {
    const auto* o = dynamic_cast<const SortIndices*>(&other);
    return o != nullptr && o->axis_ == axis_ && o->descending_ == descending_;
  }
  bool same_kernel(const CustomKernelOp& other) const override { return same_as(other); }
  void run(const Node& n, const std::vector<const void*>& inputs, void* out) const override {
    const Node& x = *n.inputs[0];
    const Shape& shape = x.shape;
    int64_t outer = 1, inner = 1;
    for (int a = 0; a < axis_; ++a) outer *= shape[static_cast<size_t>(a)];
    for (size_t a = static_cast<size_t>(axis_) + 1; a < shape.size(); ++a) inner *= shape[a];
    const int64_t count = shape[static_cast<size_t>(axis_)];
    auto* indices = static_cast<int64_t*>(out);
    const void* data = inputs[0];
    const DType dtype = x.dtype;
    const bool descending = descending_;
    // Rows are independent: chunks of rows on the pool's threads.
    thread_pool().parallel_for(outer * inner, 1, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> order(static_cast<size_t>(count));
      for (int64_t r = begin; r < end; ++r) {
        const int64_t o = r / inner, i = r % inner;
        const int64_t start = o * count * inner + i;
        visit_dtype(dtype, [&](auto tag) {
          using T = decltype(tag);
          const T* row = static_cast<const T*>(data) + start;
          if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
            // Half types compare as the float32 they convert to exactly, converted once.
            std::vector<float> values(static_cast<size_t>(count));
            for (int64_t k = 0; k < count; ++k) values[static_cast<size_t>(k)] = row[k * inner];
            sort_row(values.data(), count, 1, descending, order.data());
          } else {
            sort_row(row, count, inner, descending, order.data());
          }
        });
        for (int64_t k = 0; k < count; ++k)
          indices[start + k * inner] = order[static_cast<size_t>(k)];
      }
    });
  }

 private:
  int axis_;
  bool descending_;
};

// The first k positions in sorted order along `d`.
ValuesIndices sorted_prefix(const Tensor& x, int d, bool descending, int64_t k, const char* op) {
  if (!x.device().is_cuda()) {
    auto node = std::make_shared<Node>(OpCode::Custom, std::vector<NodePtr>{x.node()}, x.shape(),
                                       DType::Int64, x.device());
    node->custom = std::make_shared<SortIndices>(d, descending);
    node->origin = op;
    node->requires_grad = false;
    Tensor order(std::move(node));
    Tensor indices = k == x.shape()[d] ? order : slice(order, d, 0, k);
    return {gather(x, d, indices), indices};
  }
  Tensor rank = ranks(x, d, descending);
  Shape out = x.shape();
  out[d] = k;
  std::vector<IndexExpr> map, at;
  for (int a = 0; a < x.ndim(); ++a) at.push_back(IndexExpr::var(a));
  for (int a = 0; a < x.ndim(); ++a)
    map.push_back(a == d ? IndexExpr::load(1, at) : IndexExpr::var(a));
  Tensor position = kiln::index(x.shape(), d, DType::Int64, x.device());
  Tensor indices = reindex_reduce(position, ReduceOp::Sum, out, std::move(map), {rank}, false, op);
  return {gather(x, d, indices), indices};
}

}  // namespace

namespace detail {

ValuesIndices extreme_with_index(const Tensor& x, int64_t dim, bool keepdim, bool largest) {
  const char* op = largest ? "max" : "min";
  check_defined(x, op);
  int d = dim_of(x, dim, op);
  if (d < 0) return {x, full({}, 0, DType::Int64, x.device())};
  if (x.shape()[d] == 0) {
    throw ValueError(std::string("[") + op + "] cannot reduce over dimension " + std::to_string(d) +
                     " of size 0 (input " + describe(x) + "); expected a non-empty dimension");
  }
  Tensor indices = largest ? argmax(x, d, true) : argmin(x, d, true);
  Tensor values = gather(x, d, indices);
  if (!keepdim) return {squeeze(values, d), squeeze(indices, d)};
  return {values, indices};
}

}  // namespace detail

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending) {
  check_defined(x, "sort");
  int d = dim_of(x, dim, "sort");
  if (d < 0) return {x, full({}, 0, DType::Int64, x.device())};
  return sorted_prefix(x, d, descending, x.shape()[d], "sort");
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
  // Results are always sorted: torch leaves the order unspecified when sorted is false.
  check_defined(x, "topk");
  int d = dim_of(x, dim, "topk");
  int64_t n = d < 0 ? 1 : x.shape()[d];
  if (k < 0 || k > n) {
    throw ValueError("[topk] k = " + std::to_string(k) + " is out of range for dimension " +
                     std::to_string(dim) + " of size " + std::to_string(n) + " (input " +
                     describe(x) + "); expected 0 <= k <= " + std::to_string(n));
  }
  if (d < 0) {
    if (k == 1) return {x, full({}, 0, DType::Int64, x.device())};
    return {slice(reshape(x, {1}), 0, 0, 0), zeros({0}, DType::Int64, x.device())};
  }
  return sorted_prefix(x, d, largest, k, "topk");
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, Generator& gen) {
  check_defined(probs, "multinomial");
  if (!is_floating(probs.dtype())) {
    throw DTypeError("[multinomial] expects floating probabilities, got " + describe(probs));
  }
  if (probs.ndim() != 1 && probs.ndim() != 2) {
    throw ShapeError("[multinomial] expects probabilities of rank 1 or 2, got shape " +
                     shape_str(probs.shape()));
  }
  int64_t n = probs.shape().back();
  if (n == 0)
    throw ValueError("[multinomial] the distribution has no categories (shape " +
                     shape_str(probs.shape()) + ")");
  if (num_samples <= 0) {
    throw ValueError("[multinomial] expected num_samples >= 1, got " + std::to_string(num_samples));
  }
  if (!replacement && num_samples > n) {
    throw ValueError("[multinomial] cannot draw " + std::to_string(num_samples) +
                     " samples without replacement from " + std::to_string(n) +
                     " categories (shape " + shape_str(probs.shape()) + ")");
  }
  NoGradGuard no_grad;
  Tensor p = cast(probs.ndim() == 1 ? unsqueeze(probs, 0) : probs, DType::Float64).detach();
  int64_t rows = p.shape()[0];
  {
    // Checked now, as torch does: a weight below 0, NaN or inf, or a row without weight has
    // no distribution to draw from (and would give samples silently).
    const std::vector<double> w = p.to_vector<double>();
    for (int64_t r = 0; r < rows; ++r) {
      double total = 0;
      int64_t positive = 0;
      for (int64_t c = 0; c < n; ++c) {
        const double v = w[static_cast<size_t>(r * n + c)];
        if (!(v >= 0) || std::isinf(v)) {
          throw ValueError("[multinomial] weight " + Scalar(v).str() + " at row " +
                           std::to_string(r) + ", category " + std::to_string(c) + " of " +
                           describe(probs) + "; expected finite weights >= 0");
        }
        total += v;
        positive += v > 0;
      }
      if (!(total > 0)) {
        throw ValueError("[multinomial] row " + std::to_string(r) + " of " + describe(probs) +
                         " has no weight (all zero); expected a positive sum");
      }
      if (!replacement && positive < num_samples) {
        throw ValueError("[multinomial] row " + std::to_string(r) + " of " + describe(probs) +
                         " has " + std::to_string(positive) + " categories of positive weight, " +
                         "too few for " + std::to_string(num_samples) +
                         " samples without replacement");
      }
    }
  }
  Tensor idx;
  if (replacement) {
    // Inverse CDF: the sample is the number of categories whose cumulative weight is <= u *
    // total, so a zero-weight category (equal cumulative weight) is never chosen. (Past 256
    // categories cumsum adds in a tree, whose rounding can leave a zero-weight category an
    // ulp of the total above its neighbour: a chance near 1e-16 per draw.)
    Tensor cdf = cumsum(p, 1);
    Tensor total = slice(cdf, 1, n - 1, n);
    Tensor target = mul(rand({rows, num_samples}, DType::Float64, gen, p.device()), total);
    idx = sum(le(unsqueeze(cdf, 1), unsqueeze(target, 2)), {2});
    idx = minimum(idx, n - 1);
  } else {
    // Exponential race: w / E with E ~ Exp(1) per category; the k largest are a draw without
    // replacement with probabilities proportional to w.
    Tensor e = neg(log(rand({rows, n}, DType::Float64, gen, p.device())));
    idx = topk(div(p, e), num_samples, 1, true).indices;
  }
  return probs.ndim() == 1 ? squeeze(idx, 0) : idx;
}

}  // namespace kiln
