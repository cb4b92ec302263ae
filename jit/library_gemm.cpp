#include "library_gemm.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>

#include "../core/cuda_driver.h"
#include "../core/error.h"
#include "../core/thread_pool.h"
#include "blas.h"
#include "cublas.h"

namespace kiln::jit {
namespace {

// One operand of C = A @ B as BLAS sees it: rows x cols, row-major with leading dimension
// `ld`, transposed when the stored matrix is cols x rows.
struct MatrixView {
  bool trans = false;
  int64_t ld = 1;
};

// Element (i, j) of a rows x cols matrix lives at i * stride_r + j * stride_c; BLAS needs one
// of the two to be 1 (row-major as stored, or transposed).
bool blas_view(int64_t rows, int64_t cols, int64_t stride_r, int64_t stride_c, MatrixView* v) {
  if (cols == 1 || stride_c == 1) {
    v->trans = false;
    v->ld = rows == 1 ? std::max<int64_t>(cols, 1) : stride_r;
    return v->ld >= std::max<int64_t>(cols, 1);
  }
  if (rows == 1 || stride_r == 1) {
    v->trans = true;
    v->ld = stride_c;
    return v->ld >= std::max<int64_t>(rows, 1);
  }
  return false;
}

// How a recognised contraction maps to batched GEMM calls.
struct GemmLayout {
  int64_t m = 1, n = 1, k = 1;
  MatrixView a, b;
  int64_t ldc = 1;
  bool swap = false;                   // C is stored transposed: compute C^T = B^T A^T
  int64_t a_offset = 0, b_offset = 0;  // element offsets of coordinate 0 (slices)
  struct Batch {
    int64_t size, a, b, c;  // extent and element strides
    bool summed = false;    // a k dimension summed by repeated calls (beta = 1)
  };
  std::vector<Batch> batches;
};

// Interval of values an index expression takes over the domain, or nullopt when unknown.
struct Range {
  int64_t lo, hi;
};
std::optional<Range> range_of(const IndexExpr& e, const Shape& dom) {
  using K = IndexExpr::Kind;
  switch (e.kind()) {
    case K::Const:
      return Range{e.value(), e.value()};
    case K::Var:
      return Range{0, dom[static_cast<size_t>(e.value())] - 1};
    case K::Add:
    case K::Mul: {
      auto r = range_of(e.args()[0], dom);
      for (size_t i = 1; r && i < e.args().size(); ++i) {
        auto q = range_of(e.args()[i], dom);
        if (!q) return std::nullopt;
        if (e.kind() == K::Add) {
          r = Range{r->lo + q->lo, r->hi + q->hi};
        } else {
          int64_t c[4] = {r->lo * q->lo, r->lo * q->hi, r->hi * q->lo, r->hi * q->hi};
          r = Range{*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
        }
      }
      return r;
    }
    case K::FloorDiv:
    case K::Mod: {
      auto x = range_of(e.args()[0], dom);
      const IndexExpr& d = e.args()[1];
      if (!x || !d.is_const() || d.value() <= 0 || x->lo < 0) return std::nullopt;
      if (e.kind() == K::FloorDiv) return Range{x->lo / d.value(), x->hi / d.value()};
      if (x->hi < d.value()) return x;
      return Range{0, d.value() - 1};
    }
    default:
      return std::nullopt;
  }
}

// An address as sum(coeff * atom) + offset, atoms being coordinates or the floor-division
// and modulo pieces that reshapes produce. `add` expands e * scale into the terms.
struct Linear {
  std::vector<std::pair<int64_t, IndexExpr>> terms;
  int64_t offset = 0;

  bool add(const IndexExpr& e, int64_t scale) {
    using K = IndexExpr::Kind;
    switch (e.kind()) {
      case K::Const:
        offset += scale * e.value();
        return true;
      case K::Var:
      case K::FloorDiv:
      case K::Mod:
        terms.push_back({scale, e});
        return true;
      case K::Add:
        for (const IndexExpr& a : e.args())
          if (!add(a, scale)) return false;
        return true;
      case K::Mul: {
        // Only products with constants are affine.
        int64_t c = scale;
        const IndexExpr* rest = nullptr;
        for (const IndexExpr& a : e.args()) {
          if (a.is_const()) {
            c *= a.value();
          } else if (rest == nullptr) {
            rest = &a;
          } else {
            return false;
          }
        }
        return rest ? add(*rest, c) : (offset += c, true);
      }
      default:
        return false;
    }
  }
};

// Rewrites x // c * (c*s) + x % c * s into x * s (a reshape that splits and re-merges a
// dimension), and drops // and % that cannot wrap, until only coordinates remain.
bool reduce_to_vars(Linear& lin, const Shape& dom) {
  using K = IndexExpr::Kind;
  for (int guard = 0; guard < 64; ++guard) {
    bool changed = false;
    for (size_t i = 0; i < lin.terms.size() && !changed; ++i) {
      auto [ci, ei] = lin.terms[i];
      if (ei.kind() != K::FloorDiv && ei.kind() != K::Mod) continue;
      const IndexExpr& x = ei.args()[0];
      const IndexExpr& d = ei.args()[1];
      if (!d.is_const() || d.value() <= 0) return false;
      auto r = range_of(x, dom);
      if (r && r->lo >= 0 && r->hi < d.value()) {  // x // c == 0 and x % c == x
        lin.terms.erase(lin.terms.begin() + static_cast<std::ptrdiff_t>(i));
        if (ei.kind() == K::Mod && !lin.add(x, ci)) return false;
        changed = true;
        continue;
      }
      if (ei.kind() != K::Mod) continue;
      for (size_t j = 0; j < lin.terms.size(); ++j) {
        auto [cj, ej] = lin.terms[j];
        if (ej.kind() == K::FloorDiv && ej.args()[0] == x && ej.args()[1] == d &&
            cj == ci * d.value()) {
          lin.terms.erase(lin.terms.begin() + static_cast<std::ptrdiff_t>(std::max(i, j)));
          lin.terms.erase(lin.terms.begin() + static_cast<std::ptrdiff_t>(std::min(i, j)));
          if (!lin.add(x, ci)) return false;
          changed = true;
          break;
        }
      }
    }
    if (!changed) break;
  }
  for (const auto& t : lin.terms)
    if (t.second.kind() != K::Var) return false;
  return true;
}

}  // namespace

bool affine_in_coordinates(const IndexExpr& e, std::vector<int64_t>* coef, int64_t* offset) {
  Linear lin;
  if (!lin.add(e, 1)) return false;
  for (const auto& [c, term] : lin.terms) {
    if (term.kind() != IndexExpr::Kind::Var) return false;
    const auto d = static_cast<size_t>(term.value());
    if (d >= coef->size()) return false;
    (*coef)[d] += c;
  }
  *offset += lin.offset;
  return true;
}

bool operand_strides(const std::vector<IndexExpr>& map, const Shape& own, const Shape& dom,
                     std::vector<int64_t>* strides, int64_t* offset) {
  strides->assign(dom.size(), -1);
  if (map.size() != own.size()) return false;
  std::vector<int64_t> st = contiguous_strides(own);
  Linear lin;
  for (size_t j = 0; j < map.size(); ++j) {
    if (own[j] == 1) {
      if (!(map[j].is_const() && map[j].value() == 0)) {
        auto r = range_of(map[j], dom);
        if (!r || r->lo != 0 || r->hi != 0) return false;
      }
      continue;
    }
    auto r = range_of(map[j], dom);
    if (!r || r->lo < 0 || r->hi >= own[j]) return false;
    if (!lin.add(map[j], st[j])) return false;
  }
  if (!reduce_to_vars(lin, dom)) return false;
  for (const auto& [c, e] : lin.terms) {
    auto d = static_cast<size_t>(e.value());
    if (dom[d] == 1) continue;
    if ((*strides)[d] != -1 || c <= 0) return false;
    (*strides)[d] = c;
  }
  *offset = lin.offset;
  return true;
}

namespace {

// A group of dimensions read as one: its total extent and, per operand, the stride of its
// innermost member (a size-1 group has stride 0).
struct Merged {
  int64_t size = 1;
  std::vector<int64_t> strides{0, 0};
};

// Whether `dims` flatten into one dimension in every operand: ordered by the first
// operand's strides, each stride must be the next one times that dimension's extent.
bool merge_dims(std::vector<int> dims, const Shape& dom,
                const std::vector<const std::vector<int64_t>*>& strides, Merged* out) {
  const std::vector<int64_t>& first = *strides[0];
  std::sort(dims.begin(), dims.end(), [&](int x, int y) { return first[x] > first[y]; });
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    for (const auto* s : strides) {
      if ((*s)[dims[i]] != (*s)[dims[i + 1]] * dom[dims[i + 1]]) return false;
    }
  }
  out->size = 1;
  for (int d : dims) out->size *= dom[d];
  out->strides.clear();
  for (const auto* s : strides) out->strides.push_back((*s)[dims.back()]);
  return true;
}

// Recognises out = reduce_sum(reindex(A) * reindex(B)) with plain coordinate maps as a
// (batched) matrix product with any operand or result transposed: the forward matmul, and
// the products autograd builds for its gradients (g @ B^T, A^T @ g).
bool gemm_layout(const Node& r, GemmLayout* out) {
  if (r.op != OpCode::ReindexReduce || r.reduce != ReduceOp::Sum || r.inputs.size() != 1)
    return false;
  // float32/float64; cuBLAS also float16/bfloat16 results (accumulating in float32). On the
  // CPU, half operands of a float32 product are matched in match_gemm.
  bool half = r.dtype == DType::Float16 || r.dtype == DType::BFloat16;
  if (r.dtype != DType::Float32 && r.dtype != DType::Float64 && !(half && r.device.is_cuda()))
    return false;
  const Node& p = *r.inputs[0];
  if (p.op != OpCode::Mul || p.inputs.size() != 2) return false;
  const Node& ra = *p.inputs[0];
  const Node& rb = *p.inputs[1];
  for (const Node* x : {&ra, &rb}) {
    if (x->op != OpCode::Reindex || x->inputs.size() != 1 || x->dtype != r.dtype) return false;
    if (x->inputs[0]->dtype != r.dtype) return false;
  }
  const Shape& dom = p.shape;
  std::vector<int64_t> sa, sb, sc;
  int64_t oa = 0, ob = 0, oc = 0;
  if (!operand_strides(ra.index_map, ra.inputs[0]->shape, dom, &sa, &oa)) return false;
  if (!operand_strides(rb.index_map, rb.inputs[0]->shape, dom, &sb, &ob)) return false;
  // The result must cover its buffer exactly: every element written once, from offset 0.
  if (!operand_strides(r.index_map, r.shape, dom, &sc, &oc) || oc != 0) return false;
  // Classify the dimensions: k is read by both operands and summed, m by A and C, n by B
  // and C, batch by all three.
  std::vector<int> ks, ms, ns, batch;
  for (size_t d = 0; d < dom.size(); ++d) {
    if (dom[d] == 1) continue;
    bool in_a = sa[d] >= 0, in_b = sb[d] >= 0, in_c = sc[d] >= 0;
    int di = static_cast<int>(d);
    if (in_a && in_b) {
      (in_c ? batch : ks).push_back(di);
    } else if (in_c && (in_a || in_b)) {
      (in_a ? ms : ns).push_back(di);
    } else {
      return false;  // summed over one operand alone, or a broadcast result
    }
  }
  if (ks.empty()) return false;  // an outer product: no reduction for the library to do
  // A dot product (m = n = 1) is no GEMM: per batch element (a row-wise sum of a product,
  // such as flash attention's delta = rowsum(dO * O)) it would be one 1 x 1 library call per
  // element, and over strided operands whose k dims do not flatten (a loss sum(o * o) of a
  // sliced o) one call per run of k, thousands of calls each costing more than its few
  // multiplies. The generated reduction reads both operands once instead.
  if (ms.empty() && ns.empty()) return false;
  // Several k dims (a linear layer's weight gradient sums over batch and time) are one k when
  // they flatten together in both operands. Several m (n) dims flatten likewise or, failing
  // that, all but the innermost become batch dimensions that B (A) broadcasts over.
  Merged m, n;
  // The longest innermost run that flattens is kept (a convolution's gradient reads
  // [N, O, OH, OW] with OH and OW flattening but N apart).
  auto pick = [&](std::vector<int>& dims, const std::vector<int64_t>& own, Merged* out) {
    if (dims.empty() || merge_dims(dims, dom, {&own, &sc}, out)) return;
    std::sort(dims.begin(), dims.end(), [&](int x, int y) { return sc[x] < sc[y]; });
    size_t len = dims.size() - 1;
    for (; len > 1; --len)
      if (merge_dims({dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(len)}, dom,
                     {&own, &sc}, out))
        break;
    if (len == 1) *out = {dom[dims[0]], {own[dims[0]], sc[dims[0]]}};
    batch.insert(batch.end(), dims.begin() + static_cast<std::ptrdiff_t>(len), dims.end());
  };
  pick(ms, sa, &m);
  pick(ns, sb, &n);
  // Several k dims that do not flatten together (a weight gradient summed over permuted
  // batch and time) become one k per call, the others summed by repeated calls.
  std::vector<std::pair<Merged, std::vector<int>>> k_choices;
  Merged merged_k;
  if (merge_dims(ks, dom, {&sa, &sb}, &merged_k)) {
    k_choices.push_back({merged_k, {}});
  } else {
    // The longest innermost runs that flatten first, then single dimensions.
    std::vector<int> by_a = ks;
    std::sort(by_a.begin(), by_a.end(), [&](int x, int y) { return sa[x] < sa[y]; });
    for (size_t len = by_a.size() - 1; len > 1; --len) {
      std::vector<int> run(by_a.begin(), by_a.begin() + static_cast<std::ptrdiff_t>(len));
      if (merge_dims(run, dom, {&sa, &sb}, &merged_k))
        k_choices.push_back(
            {merged_k, {by_a.begin() + static_cast<std::ptrdiff_t>(len), by_a.end()}});
    }
    for (int inner : ks) {
      std::vector<int> rest;
      for (int d : ks)
        if (d != inner) rest.push_back(d);
      k_choices.push_back({Merged{dom[inner], {sa[inner], sb[inner]}}, rest});
    }
  }
  GemmLayout g;
  bool found = false;
  for (const auto& [k, summed] : k_choices) {
    g = GemmLayout{};
    g.k = k.size;
    g.m = m.size;
    g.n = n.size;
    int64_t a_m = m.strides[0], c_m = m.strides[1];
    int64_t b_n = n.strides[0], c_n = n.strides[1];
    const int64_t a_k = k.strides[0], b_k = k.strides[1];
    MatrixView cv;
    bool ok = false;
    if (blas_view(g.m, g.n, c_m, c_n, &cv) && !cv.trans) {
      g.ldc = cv.ld;
      ok = blas_view(g.m, g.k, a_m, a_k, &g.a) && blas_view(g.k, g.n, b_k, b_n, &g.b);
    } else if (blas_view(g.n, g.m, c_n, c_m, &cv) && !cv.trans) {
      // C^T[n][m] = sum_k B[k][n] A[m][k]: B^T is the left operand, A^T the right.
      g.swap = true;
      g.ldc = cv.ld;
      std::swap(g.m, g.n);
      ok = blas_view(g.m, g.k, b_n, b_k, &g.a) && blas_view(g.k, g.n, a_k, a_m, &g.b);
    }
    if (!ok) continue;
    // Summed dims go last: the odometer then visits each output block's first call (all
    // summed indices 0, beta = 0) before the calls that add to it.
    for (int d : batch)
      g.batches.push_back(
          {dom[d], std::max<int64_t>(sa[d], 0), std::max<int64_t>(sb[d], 0), sc[d]});
    for (int d : summed) g.batches.push_back({dom[d], sa[d], sb[d], 0, true});
    found = true;
    break;
  }
  if (!found) return false;
  g.a_offset = oa;
  g.b_offset = ob;
  *out = std::move(g);
  return true;
}

}  // namespace

bool match_gemm(Node* r, const std::function<bool(Node*)>& single_use, GemmMatch* match) {
  if (r->op != OpCode::ReindexReduce || r->inputs.size() != 1) return false;
  if (!(r->device.is_cuda() ? cublas_available() : cpu_gemm_available(r->dtype))) return false;
  Node* p = r->inputs[0].get();
  if (p->is_evaluated() || p->op != OpCode::Mul || !single_use(p)) return false;
  Node* ra = p->inputs[0].get();
  Node* rb = p->inputs[1].get();
  // The operand reindexes are views: other consumers inline them again, so they may be
  // shared (autograd's products reuse the forward's).
  if (ra->is_evaluated() || rb->is_evaluated()) return false;
  GemmLayout layout;
  if (!gemm_layout(*r, &layout)) return false;
  match->reduce = r;
  match->absorbed = {p, ra, rb};
  match->a = ra->inputs[0].get();
  match->b = rb->inputs[0].get();
  // A half-precision matmul reads its operands widened to float32 (ops/linalg.cpp). The
  // library reads the halves themselves and accumulates in float32 (jit/blas.h on the CPU,
  // cublasGemmEx's half inputs with a float32 result on CUDA), so no widened copy of either
  // operand is made.
  auto widened_half = [](Node* x) -> Node* {
    if (x->is_evaluated() || x->op != OpCode::Cast || x->dtype != DType::Float32) return nullptr;
    Node* h = x->inputs[0].get();
    return h->dtype == DType::Float16 || h->dtype == DType::BFloat16 ? h : nullptr;
  };
  Node* ha = widened_half(match->a);
  Node* hb = widened_half(match->b);
  if (r->dtype == DType::Float32 && ha && hb && ha->dtype == hb->dtype &&
      (r->device.is_cuda() || cpu_gemm_available(ha->dtype))) {
    for (Node* cast : {match->a, match->b})
      if (single_use(cast) &&
          std::find(match->absorbed.begin(), match->absorbed.end(), cast) == match->absorbed.end())
        match->absorbed.insert(match->absorbed.begin(), cast);
    match->a = ha;
    match->b = hb;
  }
  return true;
}

bool match_rounding(Node* cast, const std::function<bool(Node*)>& single_use,
                    const std::function<const GemmMatch*(Node*)>& gemm_of, GemmMatch* match) {
  if (cast->op != OpCode::Cast || cast->is_evaluated() || cast->inputs.size() != 1) return false;
  if (cast->dtype != DType::Float16 && cast->dtype != DType::BFloat16) return false;
  Node* product = cast->inputs[0].get();
  const GemmMatch* g = gemm_of(product);
  if (g == nullptr || g->sum != nullptr || !single_use(product)) return false;
  // The operands are halves of the cast's dtype (read as they are) and the sums float32.
  if (product->dtype != DType::Float32 || g->a->dtype != cast->dtype || g->b->dtype != cast->dtype)
    return false;
  // Each output block must come from one call: blocks summed over several calls would round
  // their partial sums.
  GemmLayout layout;
  if (!gemm_layout(*product, &layout)) return false;
  for (const auto& batch : layout.batches)
    if (batch.summed) return false;
  *match = *g;
  match->rounded = cast;
  return true;
}

bool match_accumulate(Node* sum, const std::function<bool(Node*)>& single_use,
                      const std::function<const GemmMatch*(Node*)>& gemm_of,
                      const std::function<bool(Node*)>& stored, GemmMatch* match) {
  if (sum->op != OpCode::Add || sum->inputs.size() != 2 || sum->device.is_cuda() ||
      sum->is_evaluated())
    return false;
  for (int i = 0; i < 2; ++i) {
    Node* product = sum->inputs[static_cast<size_t>(i)].get();
    Node* into = sum->inputs[static_cast<size_t>(1 - i)].get();
    const GemmMatch* g = gemm_of(product);
    if (g == nullptr || g->accumulate || into == product || !single_use(product) || !stored(into) ||
        product->shape != sum->shape || into->shape != sum->shape || product->dtype != sum->dtype ||
        into->dtype != sum->dtype || into->device != sum->device || into == g->a || into == g->b)
      continue;
    *match = *g;
    match->accumulate = into;
    match->sum = sum;
    return true;
  }
  return false;
}

namespace {

// Below this many multiply-adds a call runs on one thread: waking the pool costs more.
constexpr int64_t kParallelGemmWork = int64_t{1} << 18;

}  // namespace

namespace {

// One BLAS call of a layout: element offsets into A, B and C, and whether it adds to C.
struct Call {
  int64_t oa, ob, oc;
  bool accumulate;
};

// Every call of `L` in order: batch dims odometer-style, summed dims innermost, so the calls
// adding to one output block are consecutive.
std::vector<Call> calls_of(const GemmLayout& L, int64_t base_a, int64_t base_b) {
  std::vector<Call> calls;
  int64_t total = 1;
  for (const auto& bt : L.batches) total *= bt.size;
  std::vector<int64_t> bi(L.batches.size(), 0);
  for (int64_t t = 0; t < total && L.m > 0 && L.n > 0 && L.k > 0; ++t) {
    Call call{base_a, base_b, 0, false};
    for (size_t d = 0; d < L.batches.size(); ++d) {
      call.oa += bi[d] * L.batches[d].a;
      call.ob += bi[d] * L.batches[d].b;
      call.oc += bi[d] * L.batches[d].c;
      call.accumulate = call.accumulate || (L.batches[d].summed && bi[d] > 0);
    }
    calls.push_back(call);
    for (size_t d = L.batches.size(); d-- > 0;) {
      if (++bi[d] < L.batches[d].size) break;
      bi[d] = 0;
    }
  }
  return calls;
}

// The BLAS operands of a layout: with L.swap (C stored transposed) B^T is the left operand,
// so the nodes, their base offsets and the batch strides trade places.
struct Operands {
  Node* left;
  Node* right;
  int64_t base_a, base_b;
};
Operands operands_of(const GemmMatch& g, GemmLayout& L) {
  if (!L.swap) return {g.a, g.b, L.a_offset, L.b_offset};
  for (auto& bt : L.batches) std::swap(bt.a, bt.b);
  return {g.b, g.a, L.b_offset, L.a_offset};
}

// The same calls on cuBLAS: one strided-batched call when the batch is a single plain
// dimension, else one call per output block in order (summed dims accumulate with beta = 1).
void run_gemm_cuda(const GemmMatch& g, Node& out, GemmLayout& L) {
  const int device = out.device.index;
  cuda::set_current(device);
  const auto elem = static_cast<int64_t>(itemsize(out.dtype));
  // Operands may be halves read as they are (match_gemm); the result is float32 then.
  const DType operands = g.a->dtype;
  const auto elem_ab = static_cast<int64_t>(itemsize(operands));
  const auto [left, right, base_a, base_b] = operands_of(g, L);
  Buffer::Use use_a(*left->buffer, false), use_b(*right->buffer, false);
  auto buffer = std::make_shared<Buffer>(out.nbytes(), out.device);
  Buffer::Use use_c(*buffer, true);
  char* c = static_cast<char*>(use_c.data());
  const char* a = static_cast<const char*>(use_a.data());
  const char* b = static_cast<const char*>(use_b.data());
  if (out.nbytes() > 0 && (L.k == 0 || L.m == 0 || L.n == 0))
    cuda::memset_device(device, c, 0, out.nbytes());
  if (L.m > 0 && L.n > 0 && L.k > 0) {
    auto call = [&](int64_t oa, int64_t ob, int64_t oc, int64_t batch, int64_t sa, int64_t sb,
                    int64_t sc, bool acc) {
      cublas_gemm(device, operands, L.a.trans, L.b.trans, L.m, L.n, L.k, a + oa * elem_ab, L.a.ld,
                  sa, b + ob * elem_ab, L.b.ld, sb, c + oc * elem, L.ldc, sc, batch, 1.0f,
                  acc ? 1.0f : 0.0f, out.dtype);
    };
    if (L.batches.size() == 1 && !L.batches[0].summed) {
      const auto& bt = L.batches[0];
      call(base_a, base_b, 0, bt.size, bt.a, bt.b, bt.c, false);
    } else {
      for (const Call& k : calls_of(L, base_a, base_b))
        call(k.oa, k.ob, k.oc, 1, 0, 0, 0, k.accumulate);
    }
  }
  out.buffer = std::move(buffer);
}

}  // namespace

void run_gemm(const GemmMatch& g) {
  if (g.sum && g.reduce->device.is_cuda())
    throw ValueError("[matmul] a GEMM accumulation was planned on a CUDA device");
  if (g.reduce->device.is_cuda()) {
    GemmLayout L;
    if (!gemm_layout(*g.reduce, &L))
      throw ValueError("[matmul] the library GEMM no longer matches its plan");
    return run_gemm_cuda(g, g.rounded ? *g.rounded : *g.reduce, L);
  }
  Node& out = g.sum ? *g.sum : g.rounded ? *g.rounded : *g.reduce;
  GemmLayout L;
  if (!gemm_layout(*g.reduce, &L))
    throw ValueError("[matmul] the library GEMM no longer matches its plan");
  const auto elem = static_cast<int64_t>(itemsize(out.dtype));
  // Operands may be halves read as they are (match_gemm); the result is float32 then.
  const DType operands = g.a->dtype;
  const auto elem_ab = static_cast<int64_t>(itemsize(operands));
  // The memory plan may have handed the result a buffer: the accumulated value's own (in
  // place), or a planned place in its arena.
  std::shared_ptr<Buffer> buffer =
      out.buffer ? out.buffer : std::make_shared<Buffer>(out.nbytes(), out.device);
  if (g.sum && buffer != g.accumulate->buffer)
    std::memcpy(buffer->data(), g.accumulate->buffer->data(), out.nbytes());
  char* c = static_cast<char*>(buffer->data());
  if (L.k == 0 && !g.sum) std::memset(c, 0, out.nbytes());
  const auto [left, right, base_a, base_b] = operands_of(g, L);
  const char* a = static_cast<const char*>(left->buffer->data());
  const char* b = static_cast<const char*>(right->buffer->data());
  // The calls, grouped by output block: the calls adding to one block must run in order.
  std::vector<std::vector<Call>> blocks;
  for (const Call& call : calls_of(L, base_a, base_b)) {
    if (!call.accumulate) blocks.emplace_back();
    blocks.back().push_back(call);
  }
  // Rows [r0, r1) and columns [c0, c1) of one call's result.
  auto part = [&](const Call& call, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t oa = call.oa + (L.a.trans ? r0 : r0 * L.a.ld);
    int64_t ob = call.ob + (L.b.trans ? c0 * L.b.ld : c0);
    int64_t oc = call.oc + r0 * L.ldc + c0;
    cpu_gemm(operands, L.a.trans, L.b.trans, r1 - r0, c1 - c0, L.k, a + oa * elem_ab, L.a.ld,
             b + ob * elem_ab, L.b.ld, call.accumulate || g.sum != nullptr, c + oc * elem, L.ldc,
             g.rounded != nullptr);
  };
  const int64_t threads = thread_pool().size();
  const int64_t work = L.m * L.n * L.k;
  if (static_cast<int64_t>(blocks.size()) >= threads || work < kParallelGemmWork) {
    // Enough independent blocks (attention heads, batches): one thread per block.
    int64_t grain = work * static_cast<int64_t>(blocks.size()) < kParallelGemmWork
                        ? static_cast<int64_t>(blocks.size())
                        : 1;
    thread_pool().parallel_for(static_cast<int64_t>(blocks.size()), std::max<int64_t>(grain, 1),
                               [&](int64_t lo, int64_t hi) {
                                 for (int64_t i = lo; i < hi; ++i)
                                   for (const Call& call : blocks[static_cast<size_t>(i)])
                                     part(call, 0, L.m, 0, L.n);
                               });
  } else {
    // Few large products: split each one's rows (or columns) across the pool.
    for (const auto& block : blocks) {
      for (const Call& call : block) {
        bool rows = L.m >= L.n;
        int64_t extent = rows ? L.m : L.n;
        int64_t grain = std::max<int64_t>(1, (extent + threads - 1) / threads);
        thread_pool().parallel_for(extent, grain, [&](int64_t lo, int64_t hi) {
          if (rows)
            part(call, lo, hi, 0, L.n);
          else
            part(call, 0, L.m, lo, hi);
        });
      }
    }
  }
  out.buffer = std::move(buffer);
}

}  // namespace kiln::jit
