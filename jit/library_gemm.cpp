#include "library_gemm.h"

#include <cstring>
#include <mutex>

#include "../core/thread_pool.h"

#ifndef KILN_WITH_BLAS
#define KILN_WITH_BLAS 0
#endif

#if KILN_WITH_BLAS
// Declared here rather than through cblas.h: the header's location differs between
// distributions, and these three entry points are all kiln needs.
extern "C" {
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc);
void cblas_dgemm(int order, int transa, int transb, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc);
void openblas_set_num_threads(int threads);
}
#endif

namespace kiln::jit {
namespace {

bool is_var(const IndexExpr& e, int64_t v) { return e.kind() == IndexExpr::Kind::Var && e.value() == v; }

// Checks the batch prefix of an operand map: right-aligned against the domain's batch dims,
// each entry either the batch coordinate or 0 for a broadcast size-1 dim.
bool batch_ok(const std::vector<IndexExpr>& map, const Shape& own, size_t batch_rank, int nb, const Shape& domain) {
  if (batch_rank > static_cast<size_t>(nb)) return false;
  size_t lead = static_cast<size_t>(nb) - batch_rank;
  for (size_t d = 0; d < batch_rank; ++d) {
    const IndexExpr& e = map[d];
    if (is_var(e, static_cast<int64_t>(lead + d)) && own[d] == domain[lead + d]) continue;
    if (e.is_const() && e.value() == 0 && own[d] == 1) continue;
    return false;
  }
  return true;
}

}  // namespace

bool have_blas() { return KILN_WITH_BLAS != 0; }

bool match_gemm(Node* r, const std::function<bool(Node*)>& single_use, GemmMatch* match) {
  if (!have_blas() || r->op != OpCode::ReindexReduce || r->reduce != ReduceOp::Sum || r->inputs.size() != 1) return false;
  if (r->dtype != DType::Float32 && r->dtype != DType::Float64) return false;
  Node* p = r->inputs[0].get();
  if (p->is_evaluated() || p->op != OpCode::Mul || !single_use(p)) return false;
  Node* ra = p->inputs[0].get();
  Node* rb = p->inputs[1].get();
  for (Node* x : {ra, rb}) {
    if (x->is_evaluated() || x->op != OpCode::Reindex || x->inputs.size() != 1 || !single_use(x)) return false;
  }
  Node* a = ra->inputs[0].get();
  Node* b = rb->inputs[0].get();
  if (a->dtype != r->dtype || b->dtype != r->dtype) return false;
  const Shape& dom = p->shape;
  if (dom.size() < 3) return false;
  const int nb = static_cast<int>(dom.size()) - 3;
  // Output map: batch vars, then m (unless A is a vector), then n (unless B is a vector).
  const auto& mo = r->index_map;
  if (mo.size() < static_cast<size_t>(nb)) return false;
  for (int d = 0; d < nb; ++d)
    if (!is_var(mo[d], d)) return false;
  size_t pos = static_cast<size_t>(nb);
  bool has_m = pos < mo.size() && is_var(mo[pos], nb);
  if (has_m) ++pos;
  bool has_n = pos < mo.size() && is_var(mo[pos], nb + 2);
  if (has_n) ++pos;
  if (pos != mo.size()) return false;
  if ((!has_m && dom[nb] != 1) || (!has_n && dom[nb + 2] != 1)) return false;
  // A: batch..., [m], k.
  const auto& ma = ra->index_map;
  size_t a_tail = has_m ? 2 : 1;
  if (ma.size() < a_tail || !batch_ok(ma, a->shape, ma.size() - a_tail, nb, dom)) return false;
  if (has_m && !is_var(ma[ma.size() - 2], nb)) return false;
  if (!is_var(ma.back(), nb + 1)) return false;
  // B: batch..., k, [n].
  const auto& mb = rb->index_map;
  size_t b_tail = has_n ? 2 : 1;
  if (mb.size() < b_tail || !batch_ok(mb, b->shape, mb.size() - b_tail, nb, dom)) return false;
  if (!is_var(mb[mb.size() - b_tail], nb + 1)) return false;
  if (has_n && !is_var(mb.back(), nb + 2)) return false;
  match->reduce = r;
  match->absorbed = {p, ra, rb};
  match->a = a;
  match->b = b;
  return true;
}

void run_gemm(const GemmMatch& g) {
#if KILN_WITH_BLAS
  static std::once_flag threads_set;
  std::call_once(threads_set, [] { openblas_set_num_threads(thread_pool().size()); });
#endif
  Node& out = *g.reduce;
  Node* p = out.inputs[0].get();
  const Shape& dom = p->shape;
  const int nb = static_cast<int>(dom.size()) - 3;
  const int64_t m = dom[nb], k = dom[nb + 1], n = dom[nb + 2];
  const Node& ra = *p->inputs[0];
  const Node& rb = *p->inputs[1];
  const size_t elem = itemsize(out.dtype);
  auto buffer = std::make_shared<Buffer>(out.nbytes(), out.device);
  char* c = static_cast<char*>(buffer->data());
  const char* a = static_cast<const char*>(g.a->buffer->data());
  const char* b = static_cast<const char*>(g.b->buffer->data());
  if (k == 0) std::memset(c, 0, out.nbytes());
  int64_t batches = 1;
  for (int d = 0; d < nb; ++d) batches *= dom[d];
  std::vector<int64_t> sa = contiguous_strides(g.a->shape), sb = contiguous_strides(g.b->shape);
  std::vector<int64_t> bi(static_cast<size_t>(nb), 0);
  for (int64_t t = 0; t < batches && k > 0 && m > 0 && n > 0; ++t) {
    int64_t oa = 0, ob = 0;
    // Batch coordinates are the map's vars below nb; broadcast dims (constant 0) add nothing.
    for (size_t d = 0; d < ra.index_map.size(); ++d) {
      const IndexExpr& e = ra.index_map[d];
      if (e.kind() == IndexExpr::Kind::Var && e.value() < nb) oa += bi[e.value()] * sa[d];
    }
    for (size_t d = 0; d < rb.index_map.size(); ++d) {
      const IndexExpr& e = rb.index_map[d];
      if (e.kind() == IndexExpr::Kind::Var && e.value() < nb) ob += bi[e.value()] * sb[d];
    }
    char* ct = c + t * m * n * elem;
#if KILN_WITH_BLAS
    constexpr int kRowMajor = 101, kNoTrans = 111;
    if (out.dtype == DType::Float32) {
      cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
                  reinterpret_cast<const float*>(a) + oa, static_cast<int>(k), reinterpret_cast<const float*>(b) + ob,
                  static_cast<int>(n), 0.0f, reinterpret_cast<float*>(ct), static_cast<int>(n));
    } else {
      cblas_dgemm(kRowMajor, kNoTrans, kNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0,
                  reinterpret_cast<const double*>(a) + oa, static_cast<int>(k), reinterpret_cast<const double*>(b) + ob,
                  static_cast<int>(n), 0.0, reinterpret_cast<double*>(ct), static_cast<int>(n));
    }
#endif
    for (int d = nb - 1; d >= 0; --d) {
      if (++bi[d] < dom[d]) break;
      bi[d] = 0;
    }
  }
  out.buffer = std::move(buffer);
}

}  // namespace kiln::jit
