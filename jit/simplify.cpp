// The simplify pass. One walk over the schedule (inputs first) gives every node a
// representative: itself, an equal earlier node (CSE), a fill computed here (folding), an
// operand (identities) or a composed reindex. Input edges of pending nodes are redirected to
// representatives as the walk goes, so each rule sees already-simplified operands and chains
// collapse in one pass (reindex(reindex(reindex(x))) becomes one reindex of x). The final
// schedule is the pending subgraph of the outputs' representatives over the rewritten edges,
// which is both the topological order and the dead-node removal.
//
// Exactness: folds never re-derive an op's arithmetic. They run the reference evaluator's own
// code path (elementwise_def's f64/i64 chosen by operand dtype, detail::store_* conversions)
// on one-element buffers, and a fold is kept only when a Full of the result stores the very
// same bytes; otherwise the node is left alone.
#include "simplify.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <unordered_set>

#include "../core/settings.h"
#include "../core/structural_hash.h"
#include "../core/tensor.h"
#include "../ops/elementwise.h"

namespace kiln::jit {
namespace {

using detail::load_as_double;
using detail::load_as_int64;
using detail::store_double;
using detail::store_int64;

// ---------------------------------------------------------------------------------------
// One-element values, converted exactly as the reference evaluator converts them.

struct Element {
  alignas(8) unsigned char bytes[8] = {};
};

Element stored(DType dtype, const Scalar& value) {
  Element e;
  detail::store_scalar(e.bytes, dtype, 0, value);
  return e;
}

bool same_bytes(const Element& a, const Element& b, DType dtype) {
  return std::memcmp(a.bytes, b.bytes, itemsize(dtype)) == 0;
}

// The Scalar whose fill stores exactly `e`, or nothing when no Scalar does (a NaN payload
// that the double round trip would not keep).
std::optional<Scalar> as_scalar(const Element& e, DType dtype) {
  Scalar s;
  if (is_floating(dtype)) s = Scalar(load_as_double(e.bytes, dtype, 0));
  else if (dtype == DType::Bool) s = Scalar(load_as_int64(e.bytes, dtype, 0) != 0);
  else s = Scalar(load_as_int64(e.bytes, dtype, 0));
  if (!same_bytes(stored(dtype, s), e, dtype)) return std::nullopt;
  return s;
}

bool is_pending_full(const Node& n) { return n.op == OpCode::Full && !n.is_evaluated(); }

const Node* fill_of(const Node& n);

// True when every element of `n` is a pending fill's, stored as the bytes of `v` in its
// dtype (so -0.0 and +0.0 differ for floats, and 0 means 0 for integers).
bool fill_is(const Node& n, double v) {
  const Node* f = fill_of(n);
  return f != nullptr && same_bytes(stored(f->dtype, f->scalar), stored(f->dtype, Scalar(v)), f->dtype);
}

// run_cast of ops/reference.cpp on one element.
std::optional<Scalar> fold_cast(const Node& n) {
  const Node& x = *fill_of(*n.inputs[0]);
  Element in = stored(x.dtype, x.scalar), out;
  if (is_floating(x.dtype)) store_double(out.bytes, n.dtype, 0, load_as_double(in.bytes, x.dtype, 0));
  else store_int64(out.bytes, n.dtype, 0, load_as_int64(in.bytes, x.dtype, 0));
  return as_scalar(out, n.dtype);
}

// run_elementwise of ops/reference.cpp on one element: the last operand's dtype picks the
// float64 or int64 function, operands are loaded from their own dtypes, the result is stored
// in the node's dtype.
std::optional<Scalar> fold_elementwise(const Node& n) {
  const ElementwiseDef& def = elementwise_def(n.op);
  DType operand = n.inputs.back()->dtype;
  size_t arity = n.inputs.size();
  if (arity > 3) return std::nullopt;
  Element in[3];
  for (size_t k = 0; k < arity; ++k) {
    const Node& f = *fill_of(*n.inputs[k]);
    in[k] = stored(f.dtype, f.scalar);
  }
  Element out;
  if (is_floating(operand)) {
    if (def.f64 == nullptr) return std::nullopt;
    double a[3] = {0, 0, 0};
    for (size_t k = 0; k < arity; ++k) a[k] = load_as_double(in[k].bytes, n.inputs[k]->dtype, 0);
    store_double(out.bytes, n.dtype, 0, def.f64(a[0], a[1], a[2]));
  } else {
    if (def.i64 == nullptr) return std::nullopt;
    int64_t a[3] = {0, 0, 0};
    for (size_t k = 0; k < arity; ++k) a[k] = load_as_int64(in[k].bytes, n.inputs[k]->dtype, 0);
    store_int64(out.bytes, n.dtype, 0, def.i64(a[0], a[1], a[2]));
  }
  return as_scalar(out, n.dtype);
}

// ---------------------------------------------------------------------------------------
// Index maps: interval bounds over a loop domain, and substitution of coordinates.

struct Interval {
  int64_t lo = 0, hi = 0;
  bool known = false;
};

constexpr __int128 kBoundLimit = static_cast<__int128>(1) << 62;

Interval make_interval(__int128 lo, __int128 hi) {
  if (lo < -kBoundLimit || hi > kBoundLimit) return {};
  return {static_cast<int64_t>(lo), static_cast<int64_t>(hi), true};
}

// Bounds of `e` when each coordinate i_j ranges over [0, domain[j]); unknown for index-tensor
// reads, empty domains and divisors that may be <= 0.
Interval bounds(const IndexExpr& e, const Shape& domain) {
  using K = IndexExpr::Kind;
  switch (e.kind()) {
    case K::Const: return {e.value(), e.value(), true};
    case K::Var: {
      int64_t j = e.value();
      if (j < 0 || j >= static_cast<int64_t>(domain.size()) || domain[j] <= 0) return {};
      return {0, domain[j] - 1, true};
    }
    case K::Load: return {};
    default: break;
  }
  Interval a = bounds(e.args()[0], domain), b = bounds(e.args()[1], domain);
  if (!a.known || !b.known) return {};
  switch (e.kind()) {
    case K::Add: return make_interval(static_cast<__int128>(a.lo) + b.lo, static_cast<__int128>(a.hi) + b.hi);
    case K::Mul: {
      __int128 p[4] = {static_cast<__int128>(a.lo) * b.lo, static_cast<__int128>(a.lo) * b.hi,
                       static_cast<__int128>(a.hi) * b.lo, static_cast<__int128>(a.hi) * b.hi};
      __int128 lo = p[0], hi = p[0];
      for (__int128 v : p) lo = v < lo ? v : lo, hi = v > hi ? v : hi;
      return make_interval(lo, hi);
    }
    case K::FloorDiv: {
      if (b.lo <= 0) return {};
      // Monotone in each argument for a positive divisor: the corners bound it.
      int64_t p[4] = {floordiv_i64(a.lo, b.lo), floordiv_i64(a.lo, b.hi), floordiv_i64(a.hi, b.lo),
                      floordiv_i64(a.hi, b.hi)};
      int64_t lo = p[0], hi = p[0];
      for (int64_t v : p) lo = std::min(lo, v), hi = std::max(hi, v);
      return {lo, hi, true};
    }
    case K::Mod:
      if (b.lo <= 0) return {};
      if (a.lo >= 0 && a.hi < b.lo) return a;
      return {0, b.hi - 1, true};
    case K::Min: return {std::min(a.lo, b.lo), std::min(a.hi, b.hi), true};
    case K::Max: return {std::max(a.lo, b.lo), std::max(a.hi, b.hi), true};
    default: return {};
  }
}

// True when every coordinate of `map` over `domain` is provably inside `target`.
bool map_in_range(const std::vector<IndexExpr>& map, const Shape& domain, const Shape& target) {
  for (size_t d = 0; d < map.size(); ++d) {
    Interval b = bounds(map[d], domain);
    if (!b.known || b.lo < 0 || b.hi >= target[d]) return false;
  }
  return true;
}

// `e` with each coordinate i_j replaced by `by[j]`, rebuilt with the folding builders so the
// result reads as simply as if it had been written by hand.
IndexExpr substitute(const IndexExpr& e, const std::vector<IndexExpr>& by) {
  using K = IndexExpr::Kind;
  switch (e.kind()) {
    case K::Const: return e;
    case K::Var: return by[static_cast<size_t>(e.value())];
    case K::Load: {
      std::vector<IndexExpr> coords;
      coords.reserve(e.args().size());
      for (const IndexExpr& a : e.args()) coords.push_back(substitute(a, by));
      return IndexExpr::load(static_cast<int>(e.value()), std::move(coords));
    }
    default: break;
  }
  IndexExpr a = substitute(e.args()[0], by), b = substitute(e.args()[1], by);
  switch (e.kind()) {
    case K::Add: return a + b;
    case K::Mul: return a * b;
    case K::FloorDiv: return floordiv(a, b);
    case K::Mod: return mod(a, b);
    case K::Min: return min(a, b);
    case K::Max: return max(a, b);
    default: return e;
  }
}

bool has_any_load(const std::vector<IndexExpr>& map) {
  for (const IndexExpr& e : map)
    if (e.has_load()) return true;
  return false;
}

// The pending fill whose value every element of `n` has: n itself, or a plain reindex of
// one that stays in range (a broadcast, which the pass keeps as a reindex: see
// reindex_of_fill). Null for anything else.
const Node* fill_of(const Node& n) {
  if (is_pending_full(n)) return &n;
  if (n.op != OpCode::Reindex || n.is_evaluated() || n.inputs.size() != 1 || has_any_load(n.index_map))
    return nullptr;
  const Node& x = *n.inputs[0];
  if (x.dtype != n.dtype || n.index_map.size() != x.shape.size()) return nullptr;
  const Node* f = fill_of(x);
  // Out of range the reindex gives its own fill: no matter when it stores the same bytes.
  if (f == nullptr || (!map_in_range(n.index_map, n.shape, x.shape) &&
                       !same_bytes(stored(n.dtype, n.scalar), stored(f->dtype, f->scalar), n.dtype)))
    return nullptr;
  return f;
}

bool is_identity_map(const std::vector<IndexExpr>& map) {
  for (size_t d = 0; d < map.size(); ++d) {
    const IndexExpr& e = map[d];
    if (e.kind() != IndexExpr::Kind::Var || e.value() != static_cast<int64_t>(d)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// The walk.

enum class Reason { Merged, Folded, Identity };

struct Replacement {
  Node* node = nullptr;
  bool created = false;
  Reason reason = Reason::Identity;
};

class Simplifier {
 public:
  Simplifier(const std::vector<Node*>& outputs, SimplifyResult& result)
      : outputs_(outputs.begin(), outputs.end()), result_(result) {}

  void run(const std::vector<Node*>& schedule, const std::vector<Node*>& outputs) {
    // Owning pointers of every node some schedule node reads: needed to redirect an edge.
    for (Node* n : schedule)
      for (const NodePtr& in : n->inputs) owners_.emplace(in.get(), in);
    for (Node* n : schedule) {
      if (n->is_evaluated()) continue;
      Node* r = visit(n, 0);
      (void)r;
    }
    for (const auto& [replaced, by] : rep_) {
      auto it = owners_.find(replaced);
      if (it != owners_.end()) result_.retained.push_back(it->second);
    }
    std::vector<Node*> roots;
    for (Node* o : outputs) {
      Node* r = find(o);
      if (r != o) result_.alias[o] = r;
      roots.push_back(r);
    }
    result_.schedule = pending_subgraph(roots);
    std::unordered_set<Node*> kept(result_.schedule.begin(), result_.schedule.end());
    for (Node* n : schedule)
      if (!kept.count(n)) ++result_.removed;
  }

 private:
  Node* find(Node* n) {
    Node* r = n;
    for (auto it = rep_.find(r); it != rep_.end(); it = rep_.find(r)) r = it->second;
    // Path compression keeps long merge chains cheap.
    while (n != r) {
      auto it = rep_.find(n);
      Node* next = it->second;
      it->second = r;
      n = next;
    }
    return r;
  }

  void rewrite_inputs(Node* n) {
    for (NodePtr& in : n->inputs) {
      Node* r = find(in.get());
      if (r == in.get()) continue;
      auto it = owners_.find(r);
      // Every representative that replaced an input has an owner (see intern); if one ever
      // did not, keeping the old edge is still correct, only less simplified.
      if (it != owners_.end()) in = it->second;
    }
  }

  Node* visit(Node* n, int depth) {
    rewrite_inputs(n);
    if (depth < 32) {
      Replacement r = apply_rules(*n);
      if (r.node != nullptr) {
        Node* target = r.created ? visit(r.node, depth + 1) : r.node;
        // An output may share a pending representative's buffer, never a leaf's.
        if (!(target->is_evaluated() && outputs_.count(n))) {
          keep_hint(n, target);
          rep_[n] = target;
          count(r.reason);
          return target;
        }
      }
    }
    return intern(n);
  }

  // A store hint survives its node being replaced: the representative computes the same
  // value (a fill or a leaf needs no storing).
  static void keep_hint(const Node* replaced, Node* by) {
    if (replaced->store_hint != StoreHint::None && by->store_hint != StoreHint::Always &&
        !by->is_evaluated() && by->op != OpCode::Full)
      by->store_hint = replaced->store_hint;
  }

  void count(Reason why) {
    switch (why) {
      case Reason::Merged: ++result_.merged; break;
      case Reason::Folded: ++result_.folded; break;
      case Reason::Identity: ++result_.identities; break;
    }
  }

  uint64_t key_of(Node* n) {
    auto it = keys_.find(n);
    return it != keys_.end() ? it->second : node_value_key(*n, nullptr, 0);
  }

  // Hash-consing: the first node of each value stays; later equal ones map to it.
  Node* intern(Node* n) {
    uint64_t in_keys[8];
    std::vector<uint64_t> many;
    uint64_t* keys = in_keys;
    if (n->inputs.size() > 8) {
      many.resize(n->inputs.size());
      keys = many.data();
    }
    for (size_t k = 0; k < n->inputs.size(); ++k) keys[k] = key_of(n->inputs[k].get());
    uint64_t key = node_value_key(*n, keys, n->inputs.size());
    auto range = table_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it) {
      Node* c = it->second;
      if (!same_value(*c, *n)) continue;
      ++result_.merged;
      if (!owners_.count(c) && owners_.count(n)) {
        // The first occurrence is read by no schedule node, so no edge could be redirected
        // to it; the duplicate, which has readers, becomes the representative instead.
        it->second = n;
        keys_[n] = key;
        keep_hint(c, n);
        rep_[c] = n;
        return n;
      }
      keep_hint(n, c);
      rep_[n] = c;
      return c;
    }
    table_.emplace(key, n);
    keys_[n] = key;
    return n;
  }

  Node* make_full(const Node& like, const Scalar& value) {
    auto node = std::make_shared<Node>(OpCode::Full, std::vector<NodePtr>{}, like.shape, like.dtype, like.device);
    node->scalar = value;
    node->origin = like.origin;
    return adopt(std::move(node));
  }

  Node* adopt(NodePtr node) {
    Node* raw = node.get();
    owners_.emplace(raw, node);
    result_.created.push_back(std::move(node));
    return raw;
  }

  static bool same_type(const Node& a, const Node& b) { return a.dtype == b.dtype && a.shape == b.shape; }

  // An existing node that computes n's value, provided dtype and shape agree.
  static Replacement operand(const Node& n, const Node& x) {
    if (!same_type(n, x)) return {};
    return {const_cast<Node*>(&x), false, Reason::Identity};
  }

  Replacement folded(const Node& n, const std::optional<Scalar>& value) {
    if (!value) return {};
    return {make_full(n, *value), true, Reason::Folded};
  }

  Replacement apply_rules(const Node& n) {
    // A custom function's output is its own gradient edge: replacing it by the equal value
    // it wraps would cut autograd's path to the function's backward.
    if (n.custom_grad) return {};
    switch (op_family(n.op)) {
      case OpFamily::Elementwise: return n.op == OpCode::Cast ? cast_rules(n) : elementwise_rules(n);
      case OpFamily::Reindex: return reindex_rules(n);
      case OpFamily::ReindexReduce: return reduce_rules(n);
      default: return {};
    }
  }

  Replacement cast_rules(const Node& n) {
    const Node& x = *n.inputs[0];
    if (x.dtype == n.dtype) return operand(n, x);
    if (fill_of(x) != nullptr) return folded(n, fold_cast(n));
    return {};
  }

  Replacement elementwise_rules(const Node& n) {
    if (n.inputs.empty()) return {};
    bool all_fills = true;
    for (const NodePtr& in : n.inputs)
      all_fills = all_fills && fill_of(*in) != nullptr && in->shape == n.shape;
    if (all_fills) return folded(n, fold_elementwise(n));
    if (n.inputs.size() == 3 && n.op == OpCode::Where) {
      const Node& c = *n.inputs[0];
      if (n.inputs[1] == n.inputs[2]) return operand(n, *n.inputs[1]);
      if (const Node* f = fill_of(c)) {
        bool pick_a = load_as_int64(stored(f->dtype, f->scalar).bytes, f->dtype, 0) != 0;
        return operand(n, *n.inputs[pick_a ? 1 : 2]);
      }
      return {};
    }
    if (n.inputs.size() != 2) return {};
    const Node& a = *n.inputs[0];
    const Node& b = *n.inputs[1];
    bool floating = is_floating(a.dtype);
    switch (n.op) {
      case OpCode::Mul:
        // x*1 is x in every dtype (the float64 product is exact and converts back unchanged).
        if (fill_is(b, 1.0)) return operand(n, a);
        if (fill_is(a, 1.0)) return operand(n, b);
        // x*0 is 0 for integers. Not for floats: 0*inf and 0*NaN are NaN, and a float x is not
        // known finite here (a zero initial state times a weight or a gradient gives NaN where
        // they hold one, as in PyTorch); such products run on the library GEMM instead.
        if (!floating && a.dtype != DType::Bool && (fill_is(a, 0.0) || fill_is(b, 0.0)))
          return folded(n, Scalar(int64_t{0}));
        break;
      case OpCode::Div:
        if (floating && fill_is(b, 1.0)) return operand(n, a);
        break;
      case OpCode::Add:
        // x + 0 is x for integers; for floats only x + (-0.0) is (-0.0 + +0.0 gives +0.0).
        if (fill_is(b, floating ? -0.0 : 0.0)) return operand(n, a);
        if (fill_is(a, floating ? -0.0 : 0.0)) return operand(n, b);
        break;
      case OpCode::Sub:
        // x - (+0.0) = x + (-0.0) = x for every float x, -0.0 included.
        if (fill_is(b, 0.0)) return operand(n, a);
        break;
      default: break;
    }
    return {};
  }

  // A sum of zeros is zero: every output starts at the identity (+0) and adds +0 (-0.0
  // terms would not be, -0.0 + -0.0 being -0.0 where the empty sum is +0.0).
  Replacement reduce_rules(const Node& n) {
    if (n.reduce != ReduceOp::Sum || n.inputs.size() != 1 || has_any_load(n.index_map)) return {};
    const Node& x = *n.inputs[0];
    if (x.dtype != n.dtype || n.dtype == DType::Bool || !fill_is(x, 0.0)) return {};
    return folded(n, is_floating(n.dtype) ? Scalar(0.0) : Scalar(int64_t{0}));
  }

  Replacement reindex_rules(const Node& n) {
    if (n.inputs.size() != 1 || has_any_load(n.index_map)) return {};
    const Node& x = *n.inputs[0];
    if (n.index_map.size() != x.shape.size()) return {};
    if (n.shape == x.shape && is_identity_map(n.index_map)) return operand(n, x);
    if (is_pending_full(x)) return reindex_of_fill(n, x);
    if (x.op == OpCode::Reindex && !x.is_evaluated()) return reindex_of_reindex(n, x);
    if (x.op == OpCode::Where && !x.is_evaluated()) return reindex_of_select(n, x);
    return {};
  }

  // A read of where(c, a, b) over a region where the condition is a comparison of a
  // coordinate with a constant that holds (or fails) everywhere reads a (or b) alone: a slice
  // of a concat is its piece, and the gradient of a concat's piece is a slice of the
  // gradient instead of a chain of selects, one per piece before it.
  Replacement reindex_of_select(const Node& n, const Node& select) {
    std::optional<bool> pick = constant_condition(*select.inputs[0], n.index_map, n.shape);
    if (!pick) return {};
    const NodePtr& branch = select.inputs[*pick ? 1 : 2];
    if (branch->dtype != select.dtype || branch->shape != select.shape) return {};
    return {adopt(n.with(OpCode::Reindex, {branch}, n.device)), true, Reason::Identity};
  }

  // The value of integer coordinate node `n` (an iota, or a plain in-range reindex of one) at
  // point `at` of some domain, as an index expression; nothing for any other node.
  static std::optional<IndexExpr> coordinate_at(const Node& n, const std::vector<IndexExpr>& at) {
    if (n.is_evaluated() || is_floating(n.dtype) || n.dtype == DType::Bool) return std::nullopt;
    if (n.op == OpCode::Iota && n.axis >= 0 && static_cast<size_t>(n.axis) < at.size())
      return at[static_cast<size_t>(n.axis)];
    if (n.op != OpCode::Reindex || n.inputs.size() != 1 || has_any_load(n.index_map)) return std::nullopt;
    const Node& x = *n.inputs[0];
    if (n.index_map.size() != x.shape.size() || x.dtype != n.dtype ||
        !map_in_range(n.index_map, n.shape, x.shape))
      return std::nullopt;
    std::vector<IndexExpr> inner;
    for (const IndexExpr& e : n.index_map) inner.push_back(substitute(e, at));
    return coordinate_at(x, inner);
  }

  // Whether boolean `cond`, read at `at` for every point of `domain`, is the same
  // everywhere: a comparison of a coordinate with an integer fill (possibly broadcast by a
  // plain reindex). Points where the read leaves cond's shape can only widen the bounds.
  static std::optional<bool> constant_condition(const Node& cond, const std::vector<IndexExpr>& at,
                                                const Shape& domain) {
    if (cond.is_evaluated()) return std::nullopt;
    if (cond.op == OpCode::Reindex && cond.inputs.size() == 1 && !has_any_load(cond.index_map) &&
        is_pending_full(*cond.inputs[0]) && cond.inputs[0]->dtype == DType::Bool &&
        cond.index_map.size() == cond.inputs[0]->shape.size()) {
      // A fill read in range (its value) or provably out of range in some dimension (the
      // reindex's fill): concat's "before the piece's end".
      const Node& x = *cond.inputs[0];
      bool inside = true;
      for (size_t d = 0; d < cond.index_map.size(); ++d) {
        const Interval b = bounds(substitute(cond.index_map[d], at), domain);
        if (!b.known) return std::nullopt;
        if (b.hi < 0 || b.lo >= x.shape[d]) return load_as_int64(stored(cond.dtype, cond.scalar).bytes, cond.dtype, 0) != 0;
        inside = inside && b.lo >= 0 && b.hi < x.shape[d];
      }
      if (!inside) return std::nullopt;
      return load_as_int64(stored(x.dtype, x.scalar).bytes, x.dtype, 0) != 0;
    }
    if (cond.op == OpCode::Reindex && cond.inputs.size() == 1 && !has_any_load(cond.index_map)) {
      const Node& x = *cond.inputs[0];
      if (cond.index_map.size() != x.shape.size() || x.dtype != cond.dtype ||
          !map_in_range(cond.index_map, cond.shape, x.shape))
        return std::nullopt;
      std::vector<IndexExpr> inner;
      for (const IndexExpr& e : cond.index_map) inner.push_back(substitute(e, at));
      return constant_condition(x, inner, domain);
    }
    const OpCode op = cond.op;
    if (op != OpCode::Lt && op != OpCode::Le && op != OpCode::Gt && op != OpCode::Ge) return std::nullopt;
    const Node& c = *cond.inputs[1];
    if (!is_pending_full(c) || is_floating(c.dtype) || c.dtype == DType::Bool) return std::nullopt;
    std::optional<IndexExpr> v = coordinate_at(*cond.inputs[0], at);
    if (!v) return std::nullopt;
    const Interval b = bounds(*v, domain);
    if (!b.known) return std::nullopt;
    const int64_t k = load_as_int64(stored(c.dtype, c.scalar).bytes, c.dtype, 0);
    switch (op) {
      case OpCode::Lt: return b.hi < k ? std::optional<bool>(true) : b.lo >= k ? std::optional<bool>(false) : std::nullopt;
      case OpCode::Le: return b.hi <= k ? std::optional<bool>(true) : b.lo > k ? std::optional<bool>(false) : std::nullopt;
      case OpCode::Gt: return b.lo > k ? std::optional<bool>(true) : b.hi <= k ? std::optional<bool>(false) : std::nullopt;
      default: return b.lo >= k ? std::optional<bool>(true) : b.hi < k ? std::optional<bool>(false) : std::nullopt;
    }
  }

  // Every element is either the fill's value (in range) or the reindex's fill (out of range);
  // fold when only one of them can occur or both store the same bytes.
  //
  // A reindex that widens a fill (a broadcast) stays: it costs nothing in a kernel (the
  // value is a literal either way, and rules see through it with fill_of), and folded it
  // hid a product with a broadcast fill from the library GEMM, which needs the narrow fill
  // as its operand. The weight gradient through an LSTM's zero initial state had become a
  // float64 scatter over [4H, H, B] (13.8 ms) instead of a GEMM (0.9 ms).
  Replacement reindex_of_fill(const Node& n, const Node& x) {
    if (n.dtype != x.dtype) return {};
    if (numel(x.shape) == 0) return folded(n, n.scalar);
    if (numel(n.shape) > numel(x.shape)) return {};
    if (numel(n.shape) == 0 || map_in_range(n.index_map, n.shape, x.shape)) return folded(n, x.scalar);
    if (same_bytes(stored(n.dtype, n.scalar), stored(n.dtype, x.scalar), n.dtype)) return folded(n, x.scalar);
    return {};
  }

  // outer(inner(x)) -> one reindex of x with the inner map evaluated at the outer map. Exact
  // when (1) the inner reindex never leaves x (then it never uses its fill), and (2) whenever
  // the outer one leaves the inner's domain, the composed map leaves x too, so the outer fill
  // still appears exactly there: per inner dimension j, either the outer map provably stays
  // inside it, or some dimension d of x is read as exactly i_j with x.shape[d] equal to the
  // size of j (the composed map then carries the outer coordinate unchanged into x).
  // Also exact when the outer map stays inside the inner's domain and the composed map
  // inside x: no fill can appear at all (a slice of a padded piece that reads only the piece).
  Replacement reindex_of_reindex(const Node& n, const Node& inner) {
    if (inner.inputs.size() != 1 || has_any_load(inner.index_map)) return {};
    const NodePtr& x = inner.inputs[0];
    if (numel(inner.shape) == 0 || inner.index_map.size() != x->shape.size()) return {};
    std::vector<IndexExpr> map;
    map.reserve(inner.index_map.size());
    for (const IndexExpr& e : inner.index_map) map.push_back(substitute(e, n.index_map));
    if (!map_in_range(inner.index_map, inner.shape, x->shape)) {
      if (numel(n.shape) == 0 || !map_in_range(n.index_map, n.shape, inner.shape) ||
          !map_in_range(map, n.shape, x->shape))
        return {};
      return composed(n, x, std::move(map));
    }
    for (size_t j = 0; j < inner.shape.size(); ++j) {
      Interval b = bounds(n.index_map[j], n.shape);
      if (b.known && b.lo >= 0 && b.hi < inner.shape[j]) continue;
      bool carried = false;
      for (size_t d = 0; d < inner.index_map.size() && !carried; ++d) {
        const IndexExpr& e = inner.index_map[d];
        carried = e.kind() == IndexExpr::Kind::Var && e.value() == static_cast<int64_t>(j) &&
                  x->shape[d] == inner.shape[j];
      }
      if (!carried) return {};
    }
    return composed(n, x, std::move(map));
  }

  Replacement composed(const Node& n, const NodePtr& x, std::vector<IndexExpr> map) {
    auto node = std::make_shared<Node>(OpCode::Reindex, std::vector<NodePtr>{x}, n.shape, n.dtype, n.device);
    node->index_map = std::move(map);
    node->scalar = n.scalar;
    node->origin = n.origin;
    return {adopt(std::move(node)), true, Reason::Identity};
  }

  std::unordered_set<Node*> outputs_;
  SimplifyResult& result_;
  std::unordered_map<Node*, Node*> rep_;
  std::unordered_map<Node*, NodePtr> owners_;
  std::unordered_map<Node*, uint64_t> keys_;
  std::unordered_multimap<uint64_t, Node*> table_;
};

}  // namespace

bool simplify_disabled() { return settings::flag("KILN_DISABLE_SIMPLIFY"); }

SimplifyResult simplify(const std::vector<Node*>& schedule, const std::vector<Node*>& outputs) {
  SimplifyResult result;
  if (simplify_disabled()) {
    result.schedule = schedule;
    return result;
  }
  Simplifier(outputs, result).run(schedule, outputs);
  return result;
}

std::vector<Node*> aliased_outputs(const SimplifyResult& result, const std::vector<Node*>& outputs) {
  std::vector<Node*> out;
  std::unordered_set<Node*> seen;
  for (Node* o : outputs) {
    auto it = result.alias.find(o);
    Node* r = it != result.alias.end() ? it->second : o;
    if (seen.insert(r).second) out.push_back(r);
  }
  return out;
}

}  // namespace kiln::jit
