#pragma once
// Library GEMM: recognises the matmul composition (reindex both operands into
// [batch..., m, k, n], multiply, sum over k) and runs it on the BLAS instead of generated
// code. The composition stays the reference; only float32/float64 take this path.
#include <functional>
#include <vector>

#include "../core/node.h"

namespace kiln::jit {

/// A recognised batched matrix product out[b] = A[b] @ B[b] (row-major, broadcast batches).
struct GemmMatch {
  Node* reduce = nullptr;            ///< the reindex_reduce that becomes the library call
  std::vector<Node*> absorbed;       ///< the reindexes and the multiply it replaces
  Node* a = nullptr;                 ///< left operand (must be materialized)
  Node* b = nullptr;                 ///< right operand (must be materialized)
};

/// True when kiln was built with a BLAS.
bool have_blas();
/// Matches `reduce` (a pending reindex_reduce) against the matmul pattern. `single_use`
/// says whether a pending node has exactly one consumer and is not an output, so that
/// absorbing it into the library call loses no value anyone needs.
bool match_gemm(Node* reduce, const std::function<bool(Node*)>& single_use, GemmMatch* match);
/// Computes match.reduce's value from the buffers of match.a and match.b.
void run_gemm(const GemmMatch& match);

}  // namespace kiln::jit
