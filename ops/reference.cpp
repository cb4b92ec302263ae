#include "reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "../core/custom_op.h"
#include "../core/philox.h"
#include "../core/tensor.h"
#include "elementwise.h"
#include "transfer.h"

namespace kiln {
namespace {

using detail::load_as_double;
using detail::load_as_int64;
using detail::store_double;
using detail::store_int64;

// Errors name the op the user called (a composite around this node, if any).
const char* name_of(const Node& n) { return n.user_op(); }

// Steps `coords` through `shape` in row-major order.
void advance(std::vector<int64_t>& coords, const Shape& shape) {
  for (size_t d = shape.size(); d-- > 0;) {
    if (++coords[d] < shape[d]) return;
    coords[d] = 0;
  }
}

// Reads index tensors for IndexExpr::load; an out-of-range read is a malformed map.
struct IndexReader {
  const Node& node;
  int64_t operator()(int input, const int64_t* at) const {
    const Node& t = *node.inputs[input];
    int64_t flat = 0;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (at[d] < 0 || at[d] >= t.shape[d]) {
        throw IndexError("[" + std::string(name_of(node)) + "] index map reads idx" +
                         std::to_string(input) + " at coordinate " + std::to_string(at[d]) +
                         " of dimension " + std::to_string(d) + ", outside its shape " +
                         shape_str(t.shape));
      }
      flat = flat * t.shape[d] + at[d];
    }
    return load_as_int64(t.buffer->data(), t.dtype, flat);
  }
};

[[noreturn]] void throw_index_error(const Node& n, size_t dim, int64_t value, int64_t size,
                                    const Shape& shape) {
  throw IndexError("[" + std::string(name_of(n)) + "] index " + std::to_string(value) +
                   " is out of range for dimension " + std::to_string(dim) + " of size " +
                   std::to_string(size) + " (shape " + shape_str(shape) +
                   "); expected 0 <= index < " + std::to_string(size));
}

void run_full(Node& n, void* out) {
  for (int64_t i = 0; i < n.numel(); ++i) detail::store_scalar(out, n.dtype, i, n.scalar);
}

void run_iota(Node& n, void* out) {
  std::vector<int64_t> c(n.shape.size(), 0);
  for (int64_t i = 0; i < n.numel(); ++i, advance(c, n.shape))
    store_int64(out, n.dtype, i, c[n.axis]);
}

void run_random(Node& n, void* out) {
  for (int64_t i = 0; i < n.numel(); ++i) {
    uint64_t idx = static_cast<uint64_t>(i);
    double v;
    if (n.op == OpCode::RandNormal) {
      v = normal_double(n.seed, n.offset, idx);
    } else if (n.dtype == DType::Float64) {
      v = uniform_double(n.seed, n.offset, idx);
    } else {
      // Draw only as many bits as the dtype holds so that rounding never reaches 1.0.
      uint32_t x0 = philox_word(n.seed, n.offset, idx);
      int bits = n.dtype == DType::Float16 ? 11 : n.dtype == DType::BFloat16 ? 8 : 24;
      v = std::ldexp(static_cast<double>(x0 >> (32 - bits)), -bits);
    }
    store_double(out, n.dtype, i, v);
  }
}

void run_cast(Node& n, void* out) {
  const Node& in = *n.inputs[0];
  const void* p = in.buffer->data();
  for (int64_t i = 0; i < n.numel(); ++i) {
    if (is_floating(in.dtype))
      store_double(out, n.dtype, i, load_as_double(p, in.dtype, i));
    else
      store_int64(out, n.dtype, i, load_as_int64(p, in.dtype, i));
  }
}

void run_elementwise(Node& n, void* out) {
  if (n.op == OpCode::Cast) return run_cast(n, out);
  const ElementwiseDef& def = elementwise_def(n.op);
  // The operand dtype decides the arithmetic: float64 for floats, int64 for the rest.
  DType operand = n.inputs.back()->dtype;
  const void* p[3] = {nullptr, nullptr, nullptr};
  DType t[3] = {operand, operand, operand};
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    p[k] = n.inputs[k]->buffer->data();
    t[k] = n.inputs[k]->dtype;
  }
  size_t arity = n.inputs.size();
  if (is_floating(operand)) {
    for (int64_t i = 0; i < n.numel(); ++i) {
      double a[3] = {0, 0, 0};
      for (size_t k = 0; k < arity; ++k) a[k] = load_as_double(p[k], t[k], i);
      store_double(out, n.dtype, i, def.f64(a[0], a[1], a[2]));
    }
  } else {
    for (int64_t i = 0; i < n.numel(); ++i) {
      int64_t a[3] = {0, 0, 0};
      for (size_t k = 0; k < arity; ++k) a[k] = load_as_int64(p[k], t[k], i);
      store_int64(out, n.dtype, i, def.i64(a[0], a[1], a[2]));
    }
  }
}

void run_reindex(Node& n, void* out) {
  const Node& x = *n.inputs[0];
  const char* src = static_cast<const char*>(x.buffer->data());
  size_t item = itemsize(n.dtype);
  IndexReader reader{n};
  std::vector<int64_t> c(n.shape.size(), 0);
  std::vector<int64_t> strides = contiguous_strides(x.shape);
  for (int64_t i = 0; i < n.numel(); ++i, advance(c, n.shape)) {
    int64_t flat = 0;
    bool inside = true;
    for (size_t d = 0; d < n.index_map.size(); ++d) {
      int64_t v = n.index_map[d].evaluate(c.data(), reader);
      if (v < 0 || v >= x.shape[d]) {
        if (n.check_indices && n.index_map[d].has_load())
          throw_index_error(n, d, v, x.shape[d], x.shape);
        inside = false;
        break;
      }
      flat += v * strides[d];
    }
    if (inside)
      std::memcpy(static_cast<char*>(out) + i * item, src + flat * item, item);
    else
      detail::store_scalar(out, n.dtype, i, n.scalar);
  }
}

template <typename Acc>
void combine(ReduceOp op, Acc& acc, Acc v) {
  switch (op) {
    case ReduceOp::Sum:
      if constexpr (std::is_integral_v<Acc>)
        acc = static_cast<Acc>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));
      else
        acc += v;
      break;
    case ReduceOp::Prod:
      if constexpr (std::is_integral_v<Acc>)
        acc = static_cast<Acc>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v));
      else
        acc *= v;
      break;
    case ReduceOp::Max:
      if constexpr (std::is_floating_point_v<Acc>) {
        if (std::isnan(v) || std::isnan(acc))
          acc = NAN;
        else if (v > acc)
          acc = v;
      } else if (v > acc) {
        acc = v;
      }
      break;
    case ReduceOp::Min:
      if constexpr (std::is_floating_point_v<Acc>) {
        if (std::isnan(v) || std::isnan(acc))
          acc = NAN;
        else if (v < acc)
          acc = v;
      } else if (v < acc) {
        acc = v;
      }
      break;
    case ReduceOp::And:
      acc = (acc != 0) && (v != 0);
      break;
    case ReduceOp::Or:
      acc = (acc != 0) || (v != 0);
      break;
  }
}

// The identity of each reduction in the output dtype's own range, so that an empty max of
// int8 reads -128 rather than a wrapped int64 minimum.
template <typename Acc>
Acc reduce_identity(ReduceOp op, DType dtype) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Or:
      return 0;
    case ReduceOp::Prod:
    case ReduceOp::And:
      return 1;
    case ReduceOp::Max:
    case ReduceOp::Min:
      break;
  }
  bool want_max = op == ReduceOp::Min;
  if constexpr (std::is_floating_point_v<Acc>) {
    return want_max ? INFINITY : -INFINITY;
  } else {
    return visit_dtype(dtype, [&](auto tag) -> Acc {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) {
        return want_max ? static_cast<Acc>(std::numeric_limits<T>::max())
                        : static_cast<Acc>(std::numeric_limits<T>::lowest());
      } else {
        return 0;
      }
    });
  }
}

template <typename Acc>
void run_reindex_reduce_as(Node& n, void* out) {
  const Node& x = *n.inputs[0];
  const void* src = x.buffer->data();
  IndexReader reader{n};
  std::vector<Acc> acc(static_cast<size_t>(n.numel()), reduce_identity<Acc>(n.reduce, n.dtype));
  std::vector<int64_t> c(x.shape.size(), 0);
  std::vector<int64_t> strides = contiguous_strides(n.shape);
  for (int64_t i = 0; i < x.numel(); ++i, advance(c, x.shape)) {
    int64_t flat = 0;
    bool inside = true;
    for (size_t d = 0; d < n.index_map.size(); ++d) {
      int64_t v = n.index_map[d].evaluate(c.data(), reader);
      if (v < 0 || v >= n.shape[d]) {
        if (n.check_indices && n.index_map[d].has_load())
          throw_index_error(n, d, v, n.shape[d], n.shape);
        inside = false;
        break;
      }
      flat += v * strides[d];
    }
    if (!inside) continue;
    Acc v;
    if constexpr (std::is_floating_point_v<Acc>)
      v = load_as_double(src, x.dtype, i);
    else
      v = load_as_int64(src, x.dtype, i);
    combine(n.reduce, acc[flat], v);
  }
  for (int64_t i = 0; i < n.numel(); ++i) {
    if constexpr (std::is_floating_point_v<Acc>)
      store_double(out, n.dtype, i, acc[i]);
    else
      store_int64(out, n.dtype, i, acc[i]);
  }
}

void run_on_host(Node& n, void* out) {
  switch (n.op) {
    case OpCode::Full:
      run_full(n, out);
      break;
    case OpCode::Iota:
      run_iota(n, out);
      break;
    case OpCode::RandUniform:
    case OpCode::RandNormal:
      run_random(n, out);
      break;
    case OpCode::Reindex:
      run_reindex(n, out);
      break;
    case OpCode::ReindexReduce:
      if (is_floating(n.dtype))
        run_reindex_reduce_as<double>(n, out);
      else
        run_reindex_reduce_as<int64_t>(n, out);
      break;
    case OpCode::Transfer:
      if (n.nbytes() > 0) std::memcpy(out, n.inputs[0]->buffer->data(), n.nbytes());
      break;
    case OpCode::Custom: {
      // A user kernel is opaque: the oracle runs the same compiled kernel the JIT does.
      std::vector<const void*> inputs;
      for (const NodePtr& in : n.inputs) inputs.push_back(in->buffer->data());
      n.custom->run(n, inputs, out);
      break;
    }
    case OpCode::Constant:
      throw ValueError("[reference] constant node without a value");
    default:
      run_elementwise(n, out);
      break;
  }
}

// The reference computes on the host. Values on a CUDA device are read through host copies
// (swapped in for the duration of the node) and results bound for one are copied there.
void run_node(Node& n) {
  std::vector<std::pair<Node*, std::shared_ptr<Buffer>>> device_inputs;
  for (const NodePtr& in : n.inputs) {
    if (in->device.is_cuda() && in->buffer && in->buffer->device().is_cuda()) {
      device_inputs.emplace_back(in.get(), in->buffer);
      in->buffer = detail::copy_buffer(*in->buffer, Device::cpu());
    }
  }
  auto restore = [&] {
    for (auto& [node, buffer] : device_inputs) node->buffer = std::move(buffer);
  };
  std::shared_ptr<Buffer> buffer;
  try {
    buffer = std::make_shared<Buffer>(n.nbytes(), Device::cpu());
    run_on_host(n, buffer->data());
  } catch (...) {
    restore();
    throw;
  }
  restore();
  n.buffer = n.device.is_cuda() ? detail::copy_buffer(*buffer, n.device) : std::move(buffer);
}

const bool kRegistered = [] {
  register_executor("reference", 0, &reference_execute);
  return true;
}();

}  // namespace

void reference_execute(const std::vector<Node*>& schedule, const std::vector<Node*>& requested) {
  std::unordered_map<Node*, size_t> last_use;
  for (size_t p = 0; p < schedule.size(); ++p) {
    for (const NodePtr& in : schedule[p]->inputs) last_use[in.get()] = p;
  }
  std::unordered_set<Node*> keep(requested.begin(), requested.end());
  // Only values computed here are freed: an input evaluated earlier has lost its edges and
  // could not be recomputed.
  std::unordered_set<Node*> computed(schedule.begin(), schedule.end());
  for (size_t p = 0; p < schedule.size(); ++p) {
    Node& n = *schedule[p];
    run_node(n);
    for (const NodePtr& in : n.inputs) {
      Node* m = in.get();
      auto it = last_use.find(m);
      // Values a user still holds stay (weak sync); other intermediates go back to the pool.
      if (it != last_use.end() && it->second == p && !keep.count(m) && computed.count(m) &&
          m->handles.load(std::memory_order_relaxed) == 0 && m->op != OpCode::Constant) {
        m->buffer.reset();
      }
    }
  }
}

}  // namespace kiln
