#include "shape_ops.h"

#include <algorithm>
#include <string>

#include "elementwise.h"
#include "reindex.h"
#include "sources.h"
#include "transfer.h"

namespace kiln {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

void check_defined(const Tensor& x, const char* op) {
  if (!x.defined()) throw ValueError(std::string("[") + op + "] the input tensor is undefined");
}

// A weak zero of x's category, so where(mask, x, zero) keeps x's dtype (bool included).
Scalar zero_of(DType dtype) {
  if (dtype == DType::Bool) return Scalar(false);
  if (is_floating(dtype)) return Scalar(0.0);
  return Scalar(0);
}

std::vector<IndexExpr> identity_map(size_t rank) {
  std::vector<IndexExpr> map;
  for (size_t d = 0; d < rank; ++d) map.push_back(IndexExpr::var(static_cast<int>(d)));
  return map;
}

// Reshape as a reindex. Dimensions are matched in groups whose sizes have equal products
// (size-1 dimensions aside), and only inside a group are coordinates flattened and split
// again by floordiv/mod with constants. Splitting [6] into [2, 3] then reads `i0*3 + i1`
// and squeeze/unsqueeze read plain coordinates, which keeps generated kernels cheap.
Tensor reshape_to(const Tensor& x, const Shape& out, const char* origin) {
  const Shape& in = x.shape();
  if (in == out) return x;
  std::vector<IndexExpr> map(in.size(), IndexExpr::constant(0));
  // With no elements the map is never evaluated; any in-range expression will do.
  if (numel(out) == 0) return reindex(x, out, std::move(map), 0, {}, false, origin);
  std::vector<int> ins, outs;
  for (size_t d = 0; d < in.size(); ++d)
    if (in[d] != 1) ins.push_back(static_cast<int>(d));
  for (size_t d = 0; d < out.size(); ++d)
    if (out[d] != 1) outs.push_back(static_cast<int>(d));
  size_t i = 0, j = 0;
  while (i < ins.size()) {
    size_t i0 = i, j0 = j;
    int64_t pin = in[ins[i++]], pout = out[outs[j++]];
    // Equal total element counts guarantee that both lists end on the same group boundary.
    while (pin != pout) {
      if (pin < pout)
        pin *= in[ins[i++]];
      else
        pout *= out[outs[j++]];
    }
    IndexExpr flat;
    int64_t stride = pout;
    for (size_t q = j0; q < j; ++q) {
      stride /= out[outs[q]];
      flat = flat + IndexExpr::var(outs[q]) * IndexExpr::constant(stride);
    }
    stride = pin;
    for (size_t p = i0; p < i; ++p) {
      stride /= in[ins[p]];
      IndexExpr e = floordiv(flat, IndexExpr::constant(stride));
      // The group's leading coordinate is already below its size; no modulo needed.
      map[ins[p]] = p == i0 ? e : mod(e, IndexExpr::constant(in[ins[p]]));
    }
  }
  return reindex(x, out, std::move(map), 0, {}, false, origin);
}

Tensor permute_to(const Tensor& x, const std::vector<int>& perm, const char* origin) {
  std::vector<IndexExpr> map(perm.size());
  Shape out(perm.size());
  bool identity = true;
  for (size_t k = 0; k < perm.size(); ++k) {
    out[k] = x.shape()[perm[k]];
    map[perm[k]] = IndexExpr::var(static_cast<int>(k));
    identity = identity && perm[k] == static_cast<int>(k);
  }
  if (identity) return x;
  return reindex(x, out, std::move(map), 0, {}, false, origin);
}

// Elements start, start+step, ... (count of them) along an already normalized axis.
Tensor slice_axis(const Tensor& x, int axis, int64_t start, int64_t count, int64_t step,
                  const char* origin) {
  if (start == 0 && step == 1 && count == x.shape()[axis]) return x;
  Shape out = x.shape();
  out[axis] = count;
  std::vector<IndexExpr> map = identity_map(out.size());
  map[axis] = IndexExpr::constant(start) + IndexExpr::var(axis) * IndexExpr::constant(step);
  return reindex(x, out, std::move(map), 0, {}, false, origin);
}

std::vector<Tensor> split_sizes(const Tensor& x, int axis, const std::vector<int64_t>& sizes,
                                const char* origin) {
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(slice_axis(x, axis, start, s, 1, origin));
    start += s;
  }
  return pieces;
}

int split_axis(const Tensor& x, int64_t axis, const char* op) {
  check_defined(x, op);
  if (x.ndim() == 0) {
    throw ShapeError(std::string("[") + op + "] cannot split a rank-0 tensor (shape [])" +
                     "; expected at least one dimension");
  }
  return normalize_axis(op, axis, x.shape());
}

Tensor concat_as(const std::vector<Tensor>& inputs, int64_t axis, const char* op) {
  std::string name = op;
  if (inputs.empty()) throw ValueError("[" + name + "] expects a non-empty list of tensors");
  for (const Tensor& t : inputs) check_defined(t, op);
  std::vector<Tensor> tensors = inputs;
  std::vector<Tensor*> refs;
  for (Tensor& t : tensors) refs.push_back(&t);
  detail::align_devices(op, refs);
  const Tensor& first = tensors[0];
  if (first.ndim() == 0) {
    throw ShapeError("[" + name + "] cannot join rank-0 tensors (tensor 0 has shape []); " +
                     "expected at least one dimension");
  }
  int a = normalize_axis(op, axis, first.shape());
  Shape out = first.shape();
  out[a] = 0;
  DType dtype = first.dtype();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k];
    bool match = t.ndim() == first.ndim();
    for (int d = 0; match && d < first.ndim(); ++d) match = d == a || t.shape()[d] == out[d];
    if (!match) {
      throw ShapeError("[" + name + "] tensor " + str(k) + " has shape " + shape_str(t.shape()) +
                       " but tensor 0 has shape " + shape_str(first.shape()) +
                       "; all sizes except along axis " + str(a) + " must match");
    }
    if (__builtin_add_overflow(out[a], t.shape()[a], &out[a])) {
      throw ValueError("[" + name + "] the sizes along axis " + str(a) +
                       " add up to more than int64 can count (tensor " + str(k) + " has shape " +
                       shape_str(t.shape()) + ")");
    }
    dtype = promote_types(dtype, t.dtype());
  }
  // Each piece is placed by a reindex that is in range only over its own segment; a chain
  // of where() on the axis coordinate then picks the piece. Selection copies values, so
  // the result is exact for every dtype (NaN, -0.0, large int64) unlike a sum of pads.
  Shape mask_shape(out.size(), 1);
  mask_shape[a] = out[a];
  Tensor result;
  int64_t offset = out[a];
  for (size_t k = tensors.size(); k-- > 0;) {
    const Tensor& t = tensors[k];
    offset -= t.shape()[a];
    // Empty pieces contribute nothing; when all are empty, the first stands for the result.
    if (t.shape()[a] == 0 && (out[a] != 0 || k != 0)) continue;
    std::vector<IndexExpr> map = identity_map(out.size());
    map[a] = IndexExpr::var(a) - IndexExpr::constant(offset);
    Tensor same_dtype = cast(t, dtype);
    Tensor placed = offset == 0 && t.shape()[a] == out[a]
                        ? same_dtype
                        : reindex(same_dtype, out, std::move(map), 0, {}, false, op);
    if (!result.defined()) {
      result = placed;
      continue;
    }
    // True where the axis coordinate is below the piece's end: a read of a true fill of that
    // extent, false past it. The end is then a size, a kernel parameter, where comparing a
    // coordinate with an integer constant prints it into the kernel: one kernel per offset,
    // and an RNN's joins of its steps compiled anew for every sequence length.
    Shape below = mask_shape;
    below[a] = offset + t.shape()[a];
    Tensor in_piece = reindex(full(below, true, DType::Bool, first.device()), mask_shape,
                              identity_map(mask_shape.size()), false, {}, false, op);
    result = elementwise(OpCode::Where, {in_piece, placed, result}, op);
  }
  return result;
}

// torch allows 0-d gather/scatter; they are the 1-element case of rank 1.
bool all_rank0(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->ndim() != 0) return false;
  return true;
}

void check_index_dtype(const Tensor& index, const char* op) {
  check_defined(index, op);
  if (!is_integer(index.dtype())) {
    throw DTypeError(std::string("[") + op + "] index must have an integer dtype, got " +
                     describe(index));
  }
}

// Loop coordinates i0..i{rank-1} with the axis coordinate read from index tensor 1 there.
std::vector<IndexExpr> map_through_index(int rank, int axis) {
  std::vector<IndexExpr> map = identity_map(static_cast<size_t>(rank));
  map[axis] = IndexExpr::load(1, identity_map(static_cast<size_t>(rank)));
  return map;
}

Tensor triangle(const Tensor& x, int64_t k, bool lower, const char* op) {
  check_defined(x, op);
  if (x.ndim() < 2) {
    throw ShapeError(std::string("[") + op + "] expects a tensor of rank >= 2, got shape " +
                     shape_str(x.shape()));
  }
  Shape plane{x.size(-2), x.size(-1)};
  Tensor diagonal_offset = elementwise(OpCode::Sub, {index(plane, 1), index(plane, 0)}, op);
  Tensor keep =
      elementwise(lower ? OpCode::Le : OpCode::Ge, {diagonal_offset, scalar_tensor(k)}, op);
  return elementwise(OpCode::Where, {keep, x, scalar_tensor(zero_of(x.dtype()))}, op);
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined(x, "reshape");
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (infer >= 0) {
        throw ValueError("[reshape] shape " + shape_str(shape) + " has more than one -1 (input " +
                         "shape " + shape_str(x.shape()) + "); only one size can be inferred");
      }
      infer = static_cast<int>(d);
    } else if (shape[d] < -1) {
      throw ValueError("[reshape] invalid size " + str(shape[d]) + " in shape " + shape_str(shape) +
                       "; expected sizes >= 0, or -1 to infer one size");
    } else if (__builtin_mul_overflow(known, shape[d], &known)) {
      known = 0;  // check_sizes below reports the overflow
    }
  }
  Shape known_sizes = shape;  // `known` means nothing when these overflow; refuse them
  if (infer >= 0) known_sizes.erase(known_sizes.begin() + infer);
  check_sizes("reshape", known_sizes);
  int64_t n = x.numel();
  std::string what = "[reshape] cannot reshape tensor of shape " + shape_str(x.shape()) + " (" +
                     str(n) + " elements) into shape " + shape_str(shape);
  if (infer >= 0) {
    if (known == 0) {
      throw ShapeError(what + ": the -1 is ambiguous when the other sizes multiply to 0");
    }
    if (n % known != 0) {
      throw ShapeError(what + ": " + str(n) + " is not a multiple of " + str(known));
    }
    out[infer] = n / known;
  }
  if (numel(out) != n) throw ShapeError(what + " (" + str(numel(out)) + " elements)");
  return reshape_to(x, out, "reshape");
}

Tensor flatten(const Tensor& x, int64_t start_axis, int64_t end_axis) {
  check_defined(x, "flatten");
  int s = normalize_axis("flatten", start_axis, x.shape());
  int e = normalize_axis("flatten", end_axis, x.shape());
  if (s > e) {
    throw ShapeError("[flatten] start_axis " + str(start_axis) + " comes after end_axis " +
                     str(end_axis) + " for shape " + shape_str(x.shape()) +
                     "; expected start_axis <= end_axis");
  }
  if (x.ndim() == 0) return reshape_to(x, {1}, "flatten");
  const Shape& in = x.shape();
  Shape out(in.begin(), in.begin() + s);
  int64_t merged = 1;
  for (int d = s; d <= e; ++d) merged *= in[d];
  out.push_back(merged);
  out.insert(out.end(), in.begin() + e + 1, in.end());
  return reshape_to(x, out, "flatten");
}

Tensor squeeze(const Tensor& x) {
  check_defined(x, "squeeze");
  Shape out;
  for (int64_t s : x.shape())
    if (s != 1) out.push_back(s);
  return reshape_to(x, out, "squeeze");
}

Tensor squeeze(const Tensor& x, int64_t axis) {
  check_defined(x, "squeeze");
  int a = normalize_axis("squeeze", axis, x.shape());
  if (x.ndim() == 0 || x.shape()[a] != 1) return x;
  Shape out = x.shape();
  out.erase(out.begin() + a);
  return reshape_to(x, out, "squeeze");
}

Tensor unsqueeze(const Tensor& x, int64_t axis) {
  check_defined(x, "unsqueeze");
  int a = normalize_insert_axis("unsqueeze", axis, x.shape());
  Shape out = x.shape();
  out.insert(out.begin() + a, 1);
  return reshape_to(x, out, "unsqueeze");
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& axes) {
  check_defined(x, "permute");
  int rank = x.ndim();
  std::string wrong = "[permute] axes " + shape_str(axes) + " are not a permutation of 0.." +
                      str(rank - 1) + " for shape " + shape_str(x.shape());
  if (static_cast<int>(axes.size()) != rank) {
    throw ShapeError(wrong + ": expected " + str(rank) + " axes, got " + str(axes.size()));
  }
  std::vector<int> perm;
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t axis : axes) {
    int a = normalize_axis("permute", axis, x.shape());
    if (seen[a]) throw ShapeError(wrong + ": axis " + str(a) + " appears twice");
    seen[a] = true;
    perm.push_back(a);
  }
  return permute_to(x, perm, "permute");
}

Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1) {
  check_defined(x, "transpose");
  int a = normalize_axis("transpose", axis0, x.shape());
  int b = normalize_axis("transpose", axis1, x.shape());
  if (x.ndim() == 0) return x;
  std::vector<int> perm;
  for (int d = 0; d < x.ndim(); ++d) perm.push_back(d);
  std::swap(perm[a], perm[b]);
  return permute_to(x, perm, "transpose");
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step) {
  check_defined(x, "slice");
  if (x.ndim() == 0) {
    throw ShapeError("[slice] cannot slice a rank-0 tensor (shape []); expected rank >= 1");
  }
  int a = normalize_axis("slice", axis, x.shape());
  if (step <= 0) {
    throw ValueError("[slice] step must be >= 1, got " + str(step) + " (axis " + str(a) +
                     " of shape " + shape_str(x.shape()) + ")");
  }
  int64_t n = x.shape()[a];
  auto clamp_bound = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  int64_t lo = clamp_bound(start), hi = clamp_bound(stop);
  int64_t count = hi > lo ? (hi - lo + step - 1) / step : 0;
  return slice_axis(x, a, lo, count, step, "slice");
}

Tensor flip(const Tensor& x, const std::vector<int64_t>& axes) {
  check_defined(x, "flip");
  std::vector<IndexExpr> map = identity_map(static_cast<size_t>(x.ndim()));
  std::vector<bool> seen(std::max(x.ndim(), 1), false);
  for (int64_t axis : axes) {
    int a = normalize_axis("flip", axis, x.shape());
    if (seen[a]) {
      throw ShapeError("[flip] axis " + str(a) + " appears twice in axes " + shape_str(axes) +
                       " for shape " + shape_str(x.shape()) + "; expected distinct axes");
    }
    seen[a] = true;
    if (x.ndim() > 0) map[a] = IndexExpr::constant(x.shape()[a] - 1) - IndexExpr::var(a);
  }
  if (axes.empty() || x.ndim() == 0) return x;
  return reindex(x, x.shape(), std::move(map), 0, {}, false, "flip");
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads,
           const Scalar& value) {
  check_defined(x, "pad");
  if (static_cast<int>(pads.size()) != x.ndim()) {
    throw ShapeError("[pad] got " + str(pads.size()) + " (before, after) pairs for shape " +
                     shape_str(x.shape()) + "; expected one per dimension (" + str(x.ndim()) + ")");
  }
  Shape out = x.shape();
  std::vector<IndexExpr> map;
  bool any = false;
  for (size_t d = 0; d < pads.size(); ++d) {
    auto [before, after] = pads[d];
    if (__builtin_add_overflow(out[d], before, &out[d]) ||
        __builtin_add_overflow(out[d], after, &out[d])) {
      throw ValueError("[pad] padding (" + str(before) + ", " + str(after) + ") of axis " + str(d) +
                       " in shape " + shape_str(x.shape()) + " gives a size int64 cannot hold");
    }
    if (out[d] < 0) {
      throw ShapeError("[pad] padding (" + str(before) + ", " + str(after) + ") of axis " + str(d) +
                       " in shape " + shape_str(x.shape()) + " gives size " + str(out[d]) +
                       "; expected a size >= 0");
    }
    any = any || before != 0 || after != 0;
    map.push_back(IndexExpr::var(static_cast<int>(d)) - IndexExpr::constant(before));
  }
  if (!any) return x;
  return reindex(x, out, std::move(map), value, {}, false, "pad");
}

Tensor concat(const std::vector<Tensor>& tensors, int64_t axis) {
  return concat_as(tensors, axis, "concat");
}

namespace detail {

Tensor store_hint(const Tensor& x, StoreHint hint) {
  // A fill is a literal in every kernel that reads it: storing it would only cost a pass.
  // The stronger hint wins when two callers hint the same value; stored with a budget and
  // without one is stored always.
  if (!x.defined() || x.node()->is_evaluated() || x.node()->op == OpCode::Full) return x;
  StoreHint& now = x.node()->store_hint;
  if (now == StoreHint::None || hint == StoreHint::Always)
    now = hint;
  else if (now != hint && hint != StoreHint::None)
    now = StoreHint::Always;
  return x;
}

namespace {

// A balanced tree of concats of 2 over values that are all stored, itself stored unless it
// is the root of the whole join.
Tensor concat_pairs(const std::vector<Tensor>& items, size_t begin, size_t end, int64_t axis,
                    bool root) {
  if (end - begin == 1) return items[begin];
  const size_t mid = begin + (end - begin) / 2;
  Tensor joined = concat(
      {concat_pairs(items, begin, mid, axis, false), concat_pairs(items, mid, end, axis, false)},
      axis);
  return root ? joined : store_hint(joined);
}

}  // namespace

// A kernel is keyed by its structure, and a concat of k pieces is a chain of k - 1 selects,
// so a tree whose fan-in follows the number of pieces (groups of 8 and a remainder) compiled
// new kernels for each new count; fusion, which inlines unstored inner joins into their
// parents, made kernel shapes follow the count too. Here every join is of two values, every
// inner one stored, halves split evenly: the kernels are a pair of leaves, a leaf and a
// stored value, and two stored values (a kernel reads stored values of any size alike, sizes
// being parameters, though an extent of 1 is a literal), whatever the count, at log2(n)
// passes over the result. Fixed joins of 8 with the remainder carried up took fewer passes
// but mixed one-step leftovers with larger values in patterns that followed n mod 8.
Tensor concat_tree(const std::vector<Tensor>& pieces, int64_t axis) {
  return concat_pairs(pieces, 0, pieces.size(), axis, true);
}

}  // namespace detail

Tensor stack(const std::vector<Tensor>& tensors, int64_t axis) {
  if (tensors.empty()) throw ValueError("[stack] expects a non-empty list of tensors");
  for (const Tensor& t : tensors) check_defined(t, "stack");
  const Shape& shape = tensors[0].shape();
  int a = normalize_insert_axis("stack", axis, shape);
  std::vector<Tensor> parts;
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].shape() != shape) {
      throw ShapeError("[stack] tensor " + str(k) + " has shape " + shape_str(tensors[k].shape()) +
                       " but tensor 0 has shape " + shape_str(shape) + "; expected equal shapes");
    }
    Shape expanded = shape;
    expanded.insert(expanded.begin() + a, 1);
    parts.push_back(reshape_to(tensors[k], expanded, "stack"));
  }
  return concat_as(parts, a, "stack");
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t axis) {
  int a = split_axis(x, axis, "split");
  int64_t n = x.shape()[a];
  if (split_size < 0 || (split_size == 0 && n != 0)) {
    throw ValueError("[split] split_size must be >= 1, got " + str(split_size) + " for axis " +
                     str(a) + " of shape " + shape_str(x.shape()));
  }
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size)
    sizes.push_back(std::min(split_size, n - start));
  // An empty axis still yields one (empty) piece, as torch.split does.
  if (sizes.empty()) sizes.push_back(0);
  return split_sizes(x, a, sizes, "split");
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  int a = split_axis(x, axis, "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) {
      throw ValueError("[split] sizes " + shape_str(sizes) + " contain a negative size for " +
                       "shape " + shape_str(x.shape()) + "; expected sizes >= 0");
    }
    total += s;
  }
  if (total != x.shape()[a]) {
    throw ShapeError("[split] sizes " + shape_str(sizes) + " sum to " + str(total) + " but axis " +
                     str(a) + " of shape " + shape_str(x.shape()) + " has size " +
                     str(x.shape()[a]) + "; expected them to match");
  }
  return split_sizes(x, a, sizes, "split");
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis) {
  int a = split_axis(x, axis, "chunk");
  if (chunks <= 0) {
    throw ValueError("[chunk] chunks must be >= 1, got " + str(chunks) + " for shape " +
                     shape_str(x.shape()));
  }
  int64_t n = x.shape()[a];
  // An empty axis gives `chunks` empty pieces (torch keeps the requested count there).
  if (n == 0) return split_sizes(x, a, std::vector<int64_t>(chunks, 0), "chunk");
  int64_t size = (n + chunks - 1) / chunks;
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += size) sizes.push_back(std::min(size, n - start));
  return split_sizes(x, a, sizes, "chunk");
}

Tensor gather(const Tensor& x, int64_t axis, const Tensor& index) {
  check_defined(x, "gather");
  check_index_dtype(index, "gather");
  if (index.ndim() != x.ndim()) {
    throw ShapeError("[gather] index of shape " + shape_str(index.shape()) +
                     " must have the same rank as the input of shape " + shape_str(x.shape()));
  }
  int a = normalize_axis("gather", axis, x.shape());
  if (all_rank0({&x, &index})) {
    Tensor one = gather(reshape_to(x, {1}, "gather"), 0, reshape_to(index, {1}, "gather"));
    return reshape_to(one, {}, "gather");
  }
  for (int d = 0; d < x.ndim(); ++d) {
    if (d != a && index.shape()[d] > x.shape()[d]) {
      throw ShapeError("[gather] index of shape " + shape_str(index.shape()) +
                       " is larger than the input of shape " + shape_str(x.shape()) +
                       " in dimension " + str(d) + "; expected index.size(d) <= input.size(d) " +
                       "for every d != axis " + str(a));
    }
  }
  return reindex(x, index.shape(), map_through_index(x.ndim(), a), 0, {index}, true, "gather");
}

Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index) {
  check_defined(x, "index_select");
  check_index_dtype(index, "index_select");
  if (x.ndim() == 0) {
    throw ShapeError("[index_select] expects an input of rank >= 1, got shape []");
  }
  if (index.ndim() > 1) {
    throw ShapeError("[index_select] index must be 1-D, got shape " + shape_str(index.shape()) +
                     " (input shape " + shape_str(x.shape()) + ")");
  }
  int a = normalize_axis("index_select", axis, x.shape());
  Shape out = x.shape();
  out[a] = index.numel();
  std::vector<IndexExpr> map = identity_map(out.size());
  std::vector<IndexExpr> at;
  if (index.ndim() == 1) at.push_back(IndexExpr::var(a));
  map[a] = IndexExpr::load(1, std::move(at));
  return reindex(x, out, std::move(map), 0, {index}, true, "index_select");
}

Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  check_defined(x, "scatter_add");
  check_defined(src, "scatter_add");
  check_index_dtype(index, "scatter_add");
  if (src.dtype() != x.dtype()) {
    throw DTypeError("[scatter_add] src is " + describe(src) + " but the input is " + describe(x) +
                     "; expected the same dtype");
  }
  if (index.ndim() != x.ndim() || src.ndim() != x.ndim()) {
    throw ShapeError("[scatter_add] input " + shape_str(x.shape()) + ", index " +
                     shape_str(index.shape()) + " and src " + shape_str(src.shape()) +
                     " must have the same rank");
  }
  int a = normalize_axis("scatter_add", axis, x.shape());
  if (all_rank0({&x, &index, &src})) {
    Tensor one =
        scatter_add(reshape_to(x, {1}, "scatter_add"), 0, reshape_to(index, {1}, "scatter_add"),
                    reshape_to(src, {1}, "scatter_add"));
    return reshape_to(one, {}, "scatter_add");
  }
  for (int d = 0; d < x.ndim(); ++d) {
    if (index.shape()[d] > src.shape()[d] || (d != a && index.shape()[d] > x.shape()[d])) {
      throw ShapeError("[scatter_add] index of shape " + shape_str(index.shape()) +
                       " is larger than src " + shape_str(src.shape()) + " or input " +
                       shape_str(x.shape()) + " in dimension " + str(d) +
                       "; expected index.size(d) <= src.size(d) for all d and <= " +
                       "input.size(d) for d != axis " + str(a));
    }
  }
  // Only the leading index-shaped block of src takes part, as in torch.
  Tensor used = src.shape() == index.shape()
                    ? src
                    : reindex(src, index.shape(), identity_map(src.shape().size()), 0, {}, false,
                              "scatter_add");
  Tensor sums = reindex_reduce(used, ReduceOp::Sum, x.shape(), map_through_index(x.ndim(), a),
                               {index}, true, "scatter_add");
  return elementwise(OpCode::Add, {x, sums}, "scatter_add");
}

Tensor tril(const Tensor& x, int64_t k) { return triangle(x, k, true, "tril"); }

Tensor triu(const Tensor& x, int64_t k) { return triangle(x, k, false, "triu"); }

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  check_index_dtype(index, "one_hot");
  if (num_classes <= 0) {
    throw ValueError("[one_hot] num_classes must be >= 1, got " + str(num_classes) +
                     " (index shape " + shape_str(index.shape()) + ")");
  }
  // Summing a one per index position into its class lets check_indices reject values
  // outside [0, num_classes) at evaluation, where an eq() against iota would give zeros.
  Shape out = index.shape();
  out.push_back(num_classes);
  std::vector<IndexExpr> map = identity_map(index.shape().size());
  map.push_back(IndexExpr::load(1, identity_map(index.shape().size())));
  Tensor ones_at = full(index.shape(), 1, DType::Int64, index.device());
  return reindex_reduce(ones_at, ReduceOp::Sum, out, std::move(map), {index}, true, "one_hot");
}

}  // namespace kiln
