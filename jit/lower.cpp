// Lowering: one fusion group to kernel IR. Inlined producers are expanded at the
// coordinates their consumer reads them (index maps compose by substitution), materialized
// values become loads, and every size-dependent integer becomes a kernel parameter.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "../core/tensor.h"
#include "kernel_ir.h"
#include "printer_common.h"

namespace kiln::jit {
namespace {

struct Interval {
  int64_t lo, hi;
  bool known;
};

class Lowerer {
 public:
  explicit Lowerer(const FusionGroup& g)
      : group_(g), members_(g.members.begin(), g.members.end()) {}

  LoweredKernel run();

 private:
  // --- parameters ---
  IndexExpr param(int64_t v) {
    // 0 and 1 stay literal: they decide broadcasting and unit strides, which are structure.
    if (v == 0 || v == 1) return IndexExpr::constant(v);
    out_.params.push_back(v);
    return IndexExpr::param(static_cast<int>(out_.params.size() - 1));
  }
  int raw_param(int64_t v) {
    out_.params.push_back(v);
    return static_cast<int>(out_.params.size() - 1);
  }

  // --- buffers ---
  int slot_of(Node* n) {
    auto it = slots_.find(n);
    if (it != slots_.end()) return it->second;
    out_.input_nodes.push_back(n);
    out_.ir.inputs.push_back(n->dtype);
    int slot = static_cast<int>(out_.input_nodes.size());
    slots_[n] = slot;
    return slot;
  }
  const std::vector<IndexExpr>& strides_of(Node* n) {
    auto it = strides_.find(n);
    if (it != strides_.end()) return it->second;
    std::vector<int64_t> s = contiguous_strides(n->shape);
    std::vector<IndexExpr> e;
    for (size_t d = 0; d < s.size(); ++d) {
      // Size-1 dims are only ever read at 0; the last stride is 1 (contiguous rows).
      e.push_back(n->shape[d] == 1 || d + 1 == s.size() ? IndexExpr::constant(s[d] == 1 ? 1 : 0)
                                                        : param(s[d]));
    }
    return strides_[n] = e;
  }
  IndexExpr flat_offset(Node* n, const std::vector<IndexExpr>& coords) {
    const std::vector<IndexExpr>& st = strides_of(n);
    IndexExpr off = IndexExpr::constant(0);
    for (size_t d = 0; d < coords.size(); ++d) {
      if (n->shape[d] == 1) continue;
      off = off + coords[d] * st[d];
    }
    return off;
  }

  // --- index expressions ---
  IndexExpr substitute(const IndexExpr& e, const std::vector<IndexExpr>& vars, Node* owner) {
    switch (e.kind()) {
      case IndexExpr::Kind::Const:
        return param(e.value());
      case IndexExpr::Kind::Var:
        return vars[e.value()];
      case IndexExpr::Kind::Param:
        return e;
      case IndexExpr::Kind::Load: {
        Node* t = owner->inputs[e.value()].get();
        std::vector<IndexExpr> cs;
        for (const IndexExpr& a : e.args()) cs.push_back(substitute(a, vars, owner));
        int slot = slot_of(t);
        return IndexExpr::load(slot, {flat_offset(t, cs)});
      }
      default:
        break;
    }
    IndexExpr a = substitute(e.args()[0], vars, owner), b = substitute(e.args()[1], vars, owner);
    switch (e.kind()) {
      case IndexExpr::Kind::Add:
        return a + b;
      case IndexExpr::Kind::Mul:
        return a * b;
      case IndexExpr::Kind::FloorDiv:
        return floordiv(a, b);
      case IndexExpr::Kind::Mod:
        return mod(a, b);
      case IndexExpr::Kind::Min:
        return min(a, b);
      default:
        return max(a, b);
    }
  }

  // Range of an original (unsubstituted) map expression given the ranges of its vars.
  Interval bound(const IndexExpr& e, const std::vector<Interval>& var_range) {
    switch (e.kind()) {
      case IndexExpr::Kind::Const:
        return {e.value(), e.value(), true};
      case IndexExpr::Kind::Var:
        return var_range[e.value()];
      case IndexExpr::Kind::Add: {
        Interval a = bound(e.args()[0], var_range), b = bound(e.args()[1], var_range);
        return {a.lo + b.lo, a.hi + b.hi, a.known && b.known};
      }
      case IndexExpr::Kind::Mul: {
        Interval a = bound(e.args()[0], var_range), b = bound(e.args()[1], var_range);
        if (!a.known || !b.known) return {0, 0, false};
        int64_t c[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
        return {*std::min_element(c, c + 4), *std::max_element(c, c + 4), true};
      }
      case IndexExpr::Kind::FloorDiv:
      case IndexExpr::Kind::Mod: {
        Interval a = bound(e.args()[0], var_range), b = bound(e.args()[1], var_range);
        if (!a.known || !b.known || b.lo != b.hi || b.lo <= 0) return {0, 0, false};
        if (e.kind() == IndexExpr::Kind::Mod) return {0, b.lo - 1, true};
        return {floordiv_i64(a.lo, b.lo), floordiv_i64(a.hi, b.lo), true};
      }
      default:
        return {0, 0, false};
    }
  }

  // The terms of a sum: a + (b + c) -> {a, b, c}.
  static std::vector<IndexExpr> sum_terms(const IndexExpr& e) {
    if (e.kind() != IndexExpr::Kind::Add) return {e};
    std::vector<IndexExpr> terms;
    for (const IndexExpr& a : e.args()) {
      std::vector<IndexExpr> more = sum_terms(a);
      terms.insert(terms.end(), more.begin(), more.end());
    }
    return terms;
  }

  // Of the terms of a sum, one c*v whose var's distinct values give distinct sums whatever
  // the other vars are: the other terms are free of v and span less than |c| over
  // `ranges`. Returns {term, var}, the longest var of several, or {-1, -1}.
  std::pair<int, int> separating_term(const std::vector<IndexExpr>& terms,
                                      const std::vector<Interval>& ranges) {
    std::pair<int, int> best = {-1, -1};
    for (size_t t = 0; t < terms.size(); ++t) {
      int64_t v = -1, c = 0;
      const IndexExpr& term = terms[t];
      if (term.kind() == IndexExpr::Kind::Var) {
        v = term.value(), c = 1;
      } else if (term.kind() == IndexExpr::Kind::Mul && term.args().size() == 2) {
        const IndexExpr &a = term.args()[0], &b = term.args()[1];
        if (a.kind() == IndexExpr::Kind::Var && b.is_const()) v = a.value(), c = b.value();
        if (b.kind() == IndexExpr::Kind::Var && a.is_const()) v = b.value(), c = a.value();
      }
      if (v < 0 || c == 0) continue;
      int64_t span = 0;
      bool separates = true;
      for (size_t u = 0; u < terms.size() && separates; ++u) {
        if (u == t) continue;
        const Interval b = bound(terms[u], ranges);
        separates = b.known && !printing::mentions_var(terms[u], static_cast<int>(v));
        span += b.hi - b.lo;
      }
      const auto dim = static_cast<size_t>(v);
      if (separates && span < std::abs(c) &&
          (best.second < 0 || ranges[dim].hi > ranges[static_cast<size_t>(best.second)].hi))
        best = {static_cast<int>(t), static_cast<int>(v)};
    }
    return best;
  }

  // An input dim whose distinct values give distinct values of the output index `m`, or -1
  // (the gradient of attention's head split writes [b*S + s, off + h*D + d]: b). Threads
  // that take different values of it write different outputs, each output's terms stay
  // in one thread in loop order, and the scatter runs in parallel with the bits of a
  // sequential one.
  int separating_dim(const IndexExpr& m, const std::vector<Interval>& ranges) {
    if (m.has_load()) return -1;
    return separating_term(sum_terms(m), ranges).second;
  }

  // True when no two points of the domain store to the same output: peeling separating
  // terms off the output's index expressions (a var once peeled is known, its terms fixed)
  // determines every input dim longer than one. For the head split's gradient, b and then
  // s from the row, h and then d from the column.
  bool one_to_one(const std::vector<IndexExpr>& map, std::vector<Interval> ranges) {
    std::vector<std::vector<IndexExpr>> sums;
    for (const IndexExpr& m : map)
      if (!m.has_load()) sums.push_back(sum_terms(m));
    // v // c and v % c, once both are known, give v (a reshape's inverse writes them to
    // two output dims): bit 1 and bit 2 per (v, c).
    std::map<std::pair<int64_t, int64_t>, int> parts;
    auto learn = [&](std::vector<IndexExpr>& terms) {
      const auto [t, v] = separating_term(terms, ranges);
      if (t >= 0) {
        terms.erase(terms.begin() + t);
        ranges[static_cast<size_t>(v)] = {0, 0, true};  // known: its terms are constants
        return true;
      }
      // One term v // c or v % c beside terms whose value is known.
      for (size_t u = 0; u < terms.size(); ++u) {
        const IndexExpr& e = terms[u];
        const bool div = e.kind() == IndexExpr::Kind::FloorDiv;
        if ((!div && e.kind() != IndexExpr::Kind::Mod) ||
            e.args()[0].kind() != IndexExpr::Kind::Var || !e.args()[1].is_const() ||
            e.args()[1].value() <= 0)
          continue;
        bool rest_known = true;
        for (size_t w = 0; w < terms.size() && rest_known; ++w) {
          const Interval b = bound(terms[w], ranges);
          rest_known = w == u || (b.known && b.lo == b.hi);
        }
        if (!rest_known) continue;
        const int64_t v = e.args()[0].value(), c = e.args()[1].value();
        Interval& r = ranges[static_cast<size_t>(v)];
        int& bits = parts[{v, c}];
        bits |= div ? 1 : 2;
        if (bits == 3 || (!div && r.lo >= 0 && r.hi < c)) r = {0, 0, true};
        terms.erase(terms.begin() + static_cast<std::ptrdiff_t>(u));
        return true;
      }
      return false;
    };
    for (bool progress = true; progress;) {
      progress = false;
      for (std::vector<IndexExpr>& terms : sums) progress = learn(terms) || progress;
    }
    for (const Interval& r : ranges)
      if (r.hi > r.lo) return false;
    return true;
  }

  // --- values ---
  int emit(IrValue v) {
    out_.ir.values.push_back(std::move(v));
    return static_cast<int>(out_.ir.values.size() - 1);
  }
  int constant(const Scalar& s, DType dtype) {
    IrValue v;
    v.kind = IrValue::Kind::Const;
    v.dtype = dtype;
    // Convert exactly as a store of that dtype would, so literals match the reference.
    alignas(8) unsigned char tmp[8] = {};
    kiln::detail::store_scalar(tmp, dtype, 0, s);
    if (is_floating(dtype))
      v.value = kiln::detail::load_as_double(tmp, dtype, 0);
    else if (dtype == DType::Bool)
      v.value = kiln::detail::load_as_int64(tmp, dtype, 0) != 0;
    else
      v.value = kiln::detail::load_as_int64(tmp, dtype, 0);
    // A floating value is a parameter (its float64 bits), so `a * s`, a mean's 1/N or a
    // dropout probability compile one kernel for every value. Literals stay where the
    // compiler makes different code of them: 0 and +-1 (x*1, x+0, -x fold), infinities and
    // NaN, and a power's whole-number exponent (pow(x, 2) becomes x*x, pow(x, -1) 1/x).
    // Integers stay literal: a division or remainder by a literal becomes a multiply.
    if (is_floating(dtype)) {
      const double d = v.value.to_double();
      const bool whole_exponent = literal_constants_ && std::nearbyint(d) == d;
      if (std::isfinite(d) && d != 0 && d != 1 && d != -1 && !whole_exponent) {
        v.param = raw_param(std::bit_cast<int64_t>(d));
        v.value = Scalar(0.0);  // the kernel's structure no longer depends on it
      }
    }
    return emit(std::move(v));
  }
  // Set while lowering a power's exponent: its whole-number constants print as literals.
  bool literal_constants_ = false;

  int guard_value() {
    if (bounds_.empty()) return -1;
    IrValue g;
    g.kind = IrValue::Kind::InRange;
    g.dtype = DType::Bool;
    g.bounds = bounds_;
    g.bound_is_error = bound_errors_;
    g.bound_site = bound_sites_;
    return emit(std::move(g));
  }

  int value_of(Node* n, const std::vector<IndexExpr>& coords, bool is_root = false);
  int stage_value(Node* r, const std::vector<IndexExpr>& coords);

  // Rows kernels: reductions inlined into the group run as stages of each row of the
  // kernel's `rows_kept_` outer vars, whose extents are `outer_extent_`.
  bool rows_ = false;
  int rows_kept_ = 0;
  std::vector<int64_t> outer_extent_;
  int next_var_ = 0;
  std::unordered_map<Node*, int> stage_values_;

  const FusionGroup& group_;
  std::unordered_set<Node*> members_;
  LoweredKernel out_;
  std::unordered_map<Node*, int> slots_;
  std::unordered_map<Node*, std::vector<IndexExpr>> strides_;
  // Bounds of every enclosing reindex: loads inside are guarded by them.
  std::vector<std::pair<IndexExpr, IndexExpr>> bounds_;
  std::vector<bool> bound_errors_;
  std::vector<int> bound_sites_;

  int error_site(const Node& n, size_t dim, const Shape& shape) {
    out_.ir.error_sites.push_back({std::string(n.user_op()), static_cast<int>(dim), shape});
    return static_cast<int>(out_.ir.error_sites.size() - 1);
  }
};

int Lowerer::value_of(Node* n, const std::vector<IndexExpr>& coords, bool is_root) {
  if (!is_root && !n->is_evaluated() && members_.count(n) && n->op == OpCode::ReindexReduce)
    return stage_value(n, coords);
  if (!is_root && (n->is_evaluated() || !members_.count(n))) {
    IrValue v;
    v.kind = IrValue::Kind::Load;
    v.dtype = n->dtype;
    v.buffer = slot_of(n);
    v.index = flat_offset(n, coords);
    v.guard = guard_value();
    return emit(std::move(v));
  }
  switch (n->op) {
    case OpCode::Full:
      return constant(n->scalar, n->dtype);
    case OpCode::Iota: {
      IrValue v;
      v.kind = IrValue::Kind::Coord;
      v.dtype = n->dtype;
      v.index = coords[n->axis];
      return emit(std::move(v));
    }
    case OpCode::RandUniform:
    case OpCode::RandNormal: {
      IrValue v;
      v.kind = IrValue::Kind::Random;
      v.dtype = n->dtype;
      v.normal = n->op == OpCode::RandNormal;
      // Seed and offset are arguments: a new random tensor each step reuses the kernel.
      v.seed_param = raw_param(static_cast<int64_t>(n->seed));
      raw_param(static_cast<int64_t>(n->offset));
      IndexExpr flat = IndexExpr::constant(0);
      std::vector<int64_t> st = contiguous_strides(n->shape);
      for (size_t d = 0; d < coords.size(); ++d) {
        if (n->shape[d] != 1) flat = flat + coords[d] * param(st[d]);
      }
      v.index = flat;
      return emit(std::move(v));
    }
    case OpCode::Cast: {
      int a = value_of(n->inputs[0].get(), coords);
      IrValue v;
      v.kind = IrValue::Kind::Cast;
      v.dtype = n->dtype;
      v.args = {a};
      return emit(std::move(v));
    }
    case OpCode::Reindex: {
      Node* x = n->inputs[0].get();
      std::vector<Interval> ranges;
      for (int64_t s : n->shape) ranges.push_back({0, s - 1, true});
      size_t saved = bounds_.size();
      std::vector<IndexExpr> inner;
      for (size_t d = 0; d < n->index_map.size(); ++d) {
        const IndexExpr& m = n->index_map[d];
        IndexExpr e = substitute(m, coords, n);
        Interval b = bound(m, ranges);
        if (!b.known || b.lo < 0 || b.hi >= x->shape[d]) {
          bounds_.push_back({e, param(x->shape[d])});
          bound_errors_.push_back(n->check_indices && m.has_load());
          bound_sites_.push_back(bound_errors_.back() ? error_site(*n, d, x->shape) : -1);
          out_.ir.can_fail = out_.ir.can_fail || bound_errors_.back();
        }
        inner.push_back(e);
      }
      if (bounds_.size() == saved) return value_of(x, inner);
      int g = guard_value();
      // A true fill read with false outside (concat's "before this piece's end") is the guard
      // itself: a select between two literals would hide from the printer's row split that
      // the rows decide it.
      if (n->dtype == DType::Bool && x->op == OpCode::Full && !x->is_evaluated() &&
          x->dtype == DType::Bool && x->scalar.to_bool() && !n->scalar.to_bool()) {
        bounds_.resize(saved);
        bound_errors_.resize(saved);
        bound_sites_.resize(saved);
        return g;
      }
      int val = value_of(x, inner);
      bounds_.resize(saved);
      bound_errors_.resize(saved);
      bound_sites_.resize(saved);
      int fill = constant(n->scalar, n->dtype);
      IrValue w;
      w.kind = IrValue::Kind::Op;
      w.op = OpCode::Where;
      w.dtype = n->dtype;
      w.args = {g, val, fill};
      return emit(std::move(w));
    }
    default:
      break;
  }
  IrValue v;
  v.kind = IrValue::Kind::Op;
  v.op = n->op;
  v.dtype = n->dtype;
  for (size_t i = 0; i < n->inputs.size(); ++i) {
    const bool exponent = n->op == OpCode::Pow && i == 1;
    const bool saved = literal_constants_;
    literal_constants_ = saved || exponent;
    v.args.push_back(value_of(n->inputs[i].get(), coords));
    literal_constants_ = saved;
  }
  return emit(std::move(v));
}

// A reduction read at the kernel's row coordinates: computed once per row as a stage (its
// reduced dims become fresh domain vars), and read as the stage's total. Anything else is
// RowsUnsupported, and the fusion pass stores the reduction instead.
int Lowerer::stage_value(Node* r, const std::vector<IndexExpr>& coords) {
  if (!rows_ || standard_reduction_kept(*r) != rows_kept_) throw RowsUnsupported{r};
  for (size_t j = 0; j < r->index_map.size(); ++j) {
    const IndexExpr& m = r->index_map[j];
    // A kept dim must be read at the row's own coordinate; size-1 dims hold one value.
    if (m.kind() == IndexExpr::Kind::Var &&
        !(coords[j].kind() == IndexExpr::Kind::Var && coords[j].value() == m.value()))
      throw RowsUnsupported{r};
  }
  if (auto it = stage_values_.find(r); it != stage_values_.end()) return it->second;
  Node* x = r->inputs[0].get();
  RowStage st;
  st.reduce = r->reduce;
  st.dtype = r->dtype;
  st.first_var = next_var_;
  std::vector<IndexExpr> vars(x->shape.size());
  for (size_t d = 0; d < x->shape.size(); ++d) {
    if (static_cast<int>(d) < rows_kept_) {
      vars[d] = IndexExpr::var(static_cast<int>(d));
    } else {
      st.dims.push_back(param(x->shape[d]));
      vars[d] = IndexExpr::var(next_var_++);
    }
  }
  // The kernel's rows may outnumber the reduction's (it is read through a padding reindex,
  // whose select discards those rows): the stage's loads are guarded there. Guards of the
  // reader's context do not apply inside: the stage is computed for every row.
  auto saved_bounds = std::move(bounds_);
  auto saved_errors = std::move(bound_errors_);
  auto saved_sites = std::move(bound_sites_);
  bounds_.clear(), bound_errors_.clear(), bound_sites_.clear();
  for (int d = 0; d < rows_kept_; ++d) {
    if (outer_extent_[static_cast<size_t>(d)] <= x->shape[static_cast<size_t>(d)]) continue;
    bounds_.push_back({IndexExpr::var(d), param(x->shape[static_cast<size_t>(d)])});
    bound_errors_.push_back(false);
    bound_sites_.push_back(-1);
  }
  st.value = value_of(x, vars);
  bounds_ = std::move(saved_bounds);
  bound_errors_ = std::move(saved_errors);
  bound_sites_ = std::move(saved_sites);
  out_.ir.stages.push_back(std::move(st));
  IrValue v;
  v.kind = IrValue::Kind::Stage;
  v.dtype = r->dtype;
  v.stage = static_cast<int>(out_.ir.stages.size() - 1);
  const int id = emit(std::move(v));
  stage_values_[r] = id;
  return id;
}

LoweredKernel Lowerer::run() {
  Node* root = group_.root;
  KernelIR& ir = out_.ir;
  ir.out_dtype = root->dtype;
  for (Node* m : group_.members) {
    std::string name = m->origin ? m->origin : std::string(op_name(m->op));
    if (std::find(ir.source_ops.begin(), ir.source_ops.end(), name) == ir.source_ops.end())
      ir.source_ops.push_back(name);
  }
  std::vector<IndexExpr> vars;
  auto make_domain = [&](const Shape& shape) {
    for (size_t d = 0; d < shape.size(); ++d) {
      ir.dims.push_back(param(shape[d]));
      vars.push_back(IndexExpr::var(static_cast<int>(d)));
    }
  };

  // Reductions inlined into the group make it a Rows kernel: all of them keep the same
  // leading dims, which are the kernel's rows; the root is a map over those rows and more,
  // or a reduction keeping them (its own last stage).
  Node* first_stage = nullptr;
  for (Node* m : group_.members)
    if (m != root && m->op == OpCode::ReindexReduce && !m->is_evaluated()) {
      first_stage = m;
      break;
    }
  if (first_stage) {
    rows_ = true;
    rows_kept_ = standard_reduction_kept(*first_stage);
    if (rows_kept_ < 0) throw RowsUnsupported{first_stage};
    const auto k = static_cast<size_t>(rows_kept_);
    ir.kind = KernelIR::Kind::Rows;
    ir.kept = rows_kept_;
    int64_t rows = 1, work = 0;
    if (root->op != OpCode::ReindexReduce) {
      if (root->shape.size() < k || (k == 0 && root->numel() > kSerialRowElements))
        throw RowsUnsupported{first_stage};
      make_domain(root->shape);
      outer_extent_.assign(root->shape.begin(), root->shape.begin() + rows_kept_);
      // Vars past the domain's; at least 1, since a rank-0 kernel names its d0.
      next_var_ = std::max<int>(static_cast<int>(root->shape.size()), 1);
      ir.result = value_of(root, vars, true);
      work = root->numel();
    } else {
      Node* x = root->inputs[0].get();
      if (standard_reduction_kept(*root) != rows_kept_ ||
          (k == 0 && x->numel() > kSerialRowElements))
        throw RowsUnsupported{first_stage};
      for (size_t d = 0; d < k; ++d) {
        ir.dims.push_back(param(x->shape[d]));
        vars.push_back(IndexExpr::var(static_cast<int>(d)));
      }
      outer_extent_.assign(x->shape.begin(), x->shape.begin() + rows_kept_);
      next_var_ = std::max(rows_kept_, 1);
      // The root is the last stage, read at its own rows.
      std::vector<IndexExpr> at;
      for (const IndexExpr& m : root->index_map)
        at.push_back(m.kind() == IndexExpr::Kind::Var ? m : IndexExpr::constant(0));
      members_.erase(root);
      ir.result = stage_value(root, at);
    }
    for (int64_t e : outer_extent_) rows *= e;
    for (Node* m : group_.members)
      if (m->op == OpCode::ReindexReduce) work += m->inputs[0]->numel();
    out_.parallel_extent = rows;
    out_.work = work;
    return std::move(out_);
  }

  if (root->op != OpCode::ReindexReduce) {
    ir.kind = KernelIR::Kind::Map;
    make_domain(root->shape);
    ir.result = value_of(root, vars, true);
    out_.parallel_extent = root->numel();
    return std::move(out_);
  }

  Node* x = root->inputs[0].get();
  ir.reduce = root->reduce;
  // A "standard" reduction keeps some input dims in order and reduces a trailing block:
  // it runs as an inner loop with lane accumulators. Anything else is a scatter.
  const int standard_kept = standard_reduction_kept(*root);
  const bool standard = standard_kept >= 0;
  // Whether each output dim takes an input dim of its own (or is a size-1 dim at 0).
  bool one_each = !root->index_map.empty();
  std::vector<char> taken(x->shape.size(), 0);
  for (size_t d = 0; d < root->index_map.size(); ++d) {
    const IndexExpr& m = root->index_map[d];
    if (m.kind() == IndexExpr::Kind::Var) {
      const auto v = static_cast<size_t>(m.value());
      one_each = one_each && !taken[v];
      taken[v] = 1;
    } else if (!(m.is_const() && m.value() == 0 && root->shape[d] == 1)) {
      one_each = false;
    }
  }
  // The domain var of each input dim: its own position, except that a scatter whose
  // output dims each take one input dim of their own loops last over the input dim of the
  // output's last (unit stride) dim. Its innermost loop then writes consecutive outputs
  // instead of striding through them (the gradient of a transposed product over a batch
  // took 65 ms instead of 2), and each output still gets its terms in the same order: the
  // dims it sums over keep their order, and only they differ between its terms.
  std::vector<int> position(x->shape.size());
  std::iota(position.begin(), position.end(), 0);
  if (!standard && one_each && root->shape.back() > 1 &&
      root->index_map.back().kind() == IndexExpr::Kind::Var) {
    const auto u = static_cast<int>(root->index_map.back().value());
    for (int& p : position)
      if (p > u) --p;
    position[static_cast<size_t>(u)] = static_cast<int>(x->shape.size()) - 1;
  }
  ir.dims.resize(x->shape.size());
  vars.resize(x->shape.size());
  for (size_t d = 0; d < x->shape.size(); ++d) {
    ir.dims[static_cast<size_t>(position[d])] = param(x->shape[d]);
    vars[d] = IndexExpr::var(position[d]);
  }
  if (standard) {
    ir.kind = KernelIR::Kind::InnerReduce;
    ir.kept = standard_kept;
    ir.result = value_of(x, vars);
    int64_t kept_n = 1, reduced_n = 1;
    for (size_t d = 0; d < x->shape.size(); ++d)
      (static_cast<int>(d) < ir.kept ? kept_n : reduced_n) *= x->shape[d];
    out_.parallel_extent = ir.kept > 0 ? kept_n : reduced_n;
    return std::move(out_);
  }

  ir.kind = KernelIR::Kind::Scatter;
  ir.result = value_of(x, vars);
  std::vector<Interval> ranges;
  for (int64_t s : x->shape) ranges.push_back({0, s - 1, true});
  std::vector<int64_t> ost = contiguous_strides(root->shape);
  IndexExpr store = IndexExpr::constant(0);
  std::vector<std::pair<IndexExpr, IndexExpr>> store_bounds;
  std::vector<bool> store_errors;
  std::vector<int> store_sites;
  size_t parallel_dim = 0;  // the input dim of the parallel var
  for (size_t d = 0; d < root->index_map.size(); ++d) {
    const IndexExpr& m = root->index_map[d];
    IndexExpr e = substitute(m, vars, root);
    Interval b = bound(m, ranges);
    if (!b.known || b.lo < 0 || b.hi >= root->shape[d]) {
      store_bounds.push_back({e, param(root->shape[d])});
      store_errors.push_back(root->check_indices && m.has_load());
      store_sites.push_back(store_errors.back() ? error_site(*root, d, root->shape) : -1);
      ir.can_fail = ir.can_fail || store_errors.back();
    }
    if (root->shape[d] != 1) store = store + e * param(ost[d]);
    if (ir.parallel_var < 0 && m.kind() == IndexExpr::Kind::Var) {
      parallel_dim = static_cast<size_t>(m.value());
      ir.parallel_var = position[parallel_dim];
    }
  }
  for (size_t d = 0; d < root->index_map.size() && ir.parallel_var < 0; ++d) {
    const int v = separating_dim(root->index_map[d], ranges);
    if (v < 0 || x->shape[static_cast<size_t>(v)] < 2) continue;
    parallel_dim = static_cast<size_t>(v);
    ir.parallel_var = position[parallel_dim];
  }
  ir.injective = one_to_one(root->index_map, ranges);
  // One-to-one: distinct values of any dim write distinct outputs; split the longest.
  if (ir.injective && ir.parallel_var < 0 && !x->shape.empty()) {
    parallel_dim =
        static_cast<size_t>(std::max_element(x->shape.begin(), x->shape.end()) - x->shape.begin());
    if (x->shape[parallel_dim] > 1) ir.parallel_var = position[parallel_dim];
  }
  ir.store_index = store;
  if (!store_bounds.empty()) {
    IrValue g;
    g.kind = IrValue::Kind::InRange;
    g.dtype = DType::Bool;
    g.bounds = store_bounds;
    g.bound_is_error = store_errors;
    g.bound_site = store_sites;
    ir.store_guard = emit(std::move(g));
  }
  out_.parallel_extent = ir.parallel_var >= 0 ? x->shape[parallel_dim] : 1;
  return std::move(out_);
}

std::string value_str(const IrValue& v, int id) {
  std::string s = "  v" + std::to_string(id) + ": " + std::string(dtype_name(v.dtype)) + " = ";
  auto args = [&] {
    std::string a;
    for (size_t k = 0; k < v.args.size(); ++k) a += (k ? ", v" : "v") + std::to_string(v.args[k]);
    return a;
  };
  switch (v.kind) {
    case IrValue::Kind::Load:
      s += "load b" + std::to_string(v.buffer) + "[" + v.index.str() + "]";
      if (v.guard >= 0) s += " if v" + std::to_string(v.guard);
      break;
    case IrValue::Kind::Const:
      s += v.param >= 0 ? "p" + std::to_string(v.param) + " (float64 bits)" : v.value.str();
      break;
    case IrValue::Kind::Coord:
      s += "coord " + v.index.str();
      break;
    case IrValue::Kind::Op:
      s += std::string(op_name(v.op)) + "(" + args() + ")";
      break;
    case IrValue::Kind::Cast:
      s += "cast(" + args() + ")";
      break;
    case IrValue::Kind::Random:
      s += std::string(v.normal ? "randn" : "rand") + "(seed=p" + std::to_string(v.seed_param) +
           ", offset=p" + std::to_string(v.seed_param + 1) + ", index=" + v.index.str() + ")";
      break;
    case IrValue::Kind::Stage:
      s += "stage " + std::to_string(v.stage);
      break;
    case IrValue::Kind::InRange:
      s += "in_range(";
      for (size_t k = 0; k < v.bounds.size(); ++k)
        s += (k ? ", " : "") + v.bounds[k].first.str() + " < " + v.bounds[k].second.str() +
             (v.bound_is_error[k] ? " else IndexError" : "");
      s += ")";
      break;
  }
  return s + "\n";
}

}  // namespace

LoweredKernel lower(const FusionGroup& group) { return Lowerer(group).run(); }

int standard_reduction_kept(const Node& r) {
  if (r.op != OpCode::ReindexReduce || r.inputs.empty()) return -1;
  const Node& x = *r.inputs[0];
  int kept = 0;
  for (size_t d = 0; d < r.index_map.size(); ++d) {
    const IndexExpr& m = r.index_map[d];
    // A kept var must span its output dim exactly, or some outputs would go unwritten;
    // kept vars come first and in order.
    if (m.kind() == IndexExpr::Kind::Var) {
      if (m.value() != kept || x.shape[static_cast<size_t>(m.value())] != r.shape[d]) return -1;
      ++kept;
    } else if (!(m.is_const() && m.value() == 0 && r.shape[d] == 1)) {
      return -1;
    }
  }
  return kept;
}

uint64_t KernelIR::structure_hash() const {
  uint64_t h = 0x6b696c6e6b65726eULL;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
  };
  mix(static_cast<uint64_t>(kind));
  for (const IndexExpr& d : dims) mix(d.hash());
  mix(static_cast<uint64_t>(kept));
  mix(static_cast<uint64_t>(parallel_var + 1) << 1 | static_cast<uint64_t>(injective));
  for (DType t : inputs) mix(static_cast<uint64_t>(t));
  mix(static_cast<uint64_t>(out_dtype));
  for (const IrValue& v : values) {
    mix(static_cast<uint64_t>(v.kind) << 16 | static_cast<uint64_t>(v.dtype) << 8 |
        static_cast<uint64_t>(v.op));
    for (int a : v.args) mix(static_cast<uint64_t>(a));
    mix(static_cast<uint64_t>(v.buffer + 1));
    mix(v.index.hash());
    mix(static_cast<uint64_t>(v.guard + 1));
    // A literal's bits, not its printed form (printing a double per value cost a tenth of
    // a training step's lowering); a value passed as a parameter is not structure at all.
    if (v.param >= 0) {
      mix(0);
    } else if (v.value.kind() == Scalar::Kind::Float) {
      const double d = v.value.to_double();
      uint64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      mix(bits ^ static_cast<uint64_t>(v.value.kind()));
    } else {
      mix(static_cast<uint64_t>(v.value.to_int64()) ^ static_cast<uint64_t>(v.value.kind()) << 62);
    }
    mix(static_cast<uint64_t>(v.param + 1));
    mix(static_cast<uint64_t>(v.normal) << 32 | static_cast<uint64_t>(v.seed_param + 1));
    mix(static_cast<uint64_t>(v.stage + 1));
    for (size_t k = 0; k < v.bounds.size(); ++k) {
      mix(v.bounds[k].first.hash());
      mix(v.bounds[k].second.hash() ^ (v.bound_is_error[k] ? 1 : 0));
      mix(static_cast<uint64_t>(v.bound_site[k] + 1));
    }
  }
  for (const RowStage& st : stages) {
    mix(static_cast<uint64_t>(st.reduce) << 8 | static_cast<uint64_t>(st.dtype));
    for (const IndexExpr& d : st.dims) mix(d.hash());
    mix(static_cast<uint64_t>(st.first_var) << 32 | static_cast<uint64_t>(st.value + 1));
  }
  mix(static_cast<uint64_t>(result + 1));
  mix(static_cast<uint64_t>(reduce));
  mix(store_index.hash());
  mix(static_cast<uint64_t>(store_guard + 1));
  mix(static_cast<uint64_t>(can_fail));
  return h;
}

std::string KernelIR::dump() const {
  static const char* kinds[] = {"map", "inner_reduce", "scatter", "rows"};
  std::string s = std::string(kinds[static_cast<int>(kind)]) + " over [";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + dims[d].str();
  s += "]";
  if (kind == Kind::Rows) {
    s += " rows=" + std::to_string(kept);
    for (size_t k = 0; k < stages.size(); ++k) {
      const RowStage& st = stages[k];
      s += "\n  stage " + std::to_string(k) + ": " + std::string(reduce_name(st.reduce)) + " of v" +
           std::to_string(st.value) + " over [";
      for (size_t d = 0; d < st.dims.size(); ++d)
        s += (d ? ", i" : "i") + std::to_string(st.first_var + static_cast<int>(d)) + " < " +
             st.dims[d].str();
      s += "] -> " + std::string(dtype_name(st.dtype));
    }
  }
  if (kind == Kind::InnerReduce)
    s += " kept=" + std::to_string(kept) + " " + std::string(reduce_name(reduce));
  if (kind == Kind::Scatter) {
    s += " " + std::string(reduce_name(reduce)) + " into out[" + store_index.str() + "]";
    if (parallel_var >= 0) s += " parallel over i" + std::to_string(parallel_var);
    if (injective) s += " one-to-one";
  }
  s += " -> " + std::string(dtype_name(out_dtype)) + "\n  ops: ";
  for (size_t k = 0; k < source_ops.size(); ++k) s += (k ? ", " : "") + source_ops[k];
  s += "\n";
  for (size_t i = 0; i < values.size(); ++i) s += value_str(values[i], static_cast<int>(i));
  s += "  store v" + std::to_string(result) + "\n";
  return s;
}

}  // namespace kiln::jit
