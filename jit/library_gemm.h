#pragma once
// Library GEMM: recognises the matmul composition (reindex both operands into
// [batch..., m, k, n], multiply, sum over k) and runs it on the BLAS instead of generated
// code. The composition stays the reference; float32/float64 products take this path, and
// a float32 product of widened float16/bfloat16 operands reads the halves themselves.
#include <functional>
#include <vector>

#include "../core/node.h"

namespace kiln::jit {

/// A recognised batched matrix product out[b] = A[b] @ B[b] (row-major, broadcast batches).
struct GemmMatch {
  Node* reduce = nullptr;       ///< the reindex_reduce that becomes the library call
  std::vector<Node*> absorbed;  ///< the reindexes and the multiply it replaces
  Node* a = nullptr;            ///< left operand (must be materialized)
  Node* b = nullptr;            ///< right operand (must be materialized)
  /// Accumulation (CPU): `sum` = add(`accumulate`, product) is computed as the product added
  /// to a copy of `accumulate` (BLAS beta = 1), in place when the memory plan hands the
  /// group that value's buffer. Both null for a plain product, whose result is `reduce`.
  Node* accumulate = nullptr;
  Node* sum = nullptr;
  /// Rounding: `rounded` = cast(`reduce`, h) for half operands of dtype h is written by the
  /// library itself, the float32 sums rounded once as they are stored, so the float32 product
  /// is never materialized (autocast's products keep half the bytes). Null otherwise.
  Node* rounded = nullptr;
};

/// `e` as sum(coef[d] * coordinate d) + offset, added into *coef (one entry per coordinate)
/// and *offset; false when `e` is not affine in the coordinates alone (no // or %).
bool affine_in_coordinates(const IndexExpr& e, std::vector<int64_t>* coef, int64_t* offset);
/// Per dimension of `dom`, the element stride at which `map` (one expression per dimension
/// of a contiguous tensor of shape `own`) reads it (-1: not read), and the element offset of
/// coordinate 0. False unless the map is a composition of permutes, reshapes and slices that
/// stays in bounds and reads each dimension through one coefficient.
bool operand_strides(const std::vector<IndexExpr>& map, const Shape& own, const Shape& dom,
                     std::vector<int64_t>* strides, int64_t* offset);

/// Matches `reduce` (a pending reindex_reduce) against the matmul pattern. `single_use`
/// says whether a pending node has exactly one consumer and is not an output, so that
/// absorbing it into the library call loses no value anyone needs.
bool match_gemm(Node* reduce, const std::function<bool(Node*)>& single_use, GemmMatch* match);
/// Matches `sum` (a pending add) against add(P, product) for a GEMM `product` in `gemms`
/// that only the add reads, on the CPU, where P is materialized anyway (`stored`): a
/// gradient summed over steps then accumulates into one buffer instead of keeping the
/// terms of a fused sum alive together. Fills match->accumulate and match->sum.
bool match_accumulate(Node* sum, const std::function<bool(Node*)>& single_use,
                      const std::function<const GemmMatch*(Node*)>& gemm_of,
                      const std::function<bool(Node*)>& stored, GemmMatch* match);
/// Matches `cast` (a pending cast to float16/bfloat16) against cast(product) for a GEMM
/// `product` in `gemms` of that dtype's operands that only the cast reads. Fills
/// match->rounded.
bool match_rounding(Node* cast, const std::function<bool(Node*)>& single_use,
                    const std::function<const GemmMatch*(Node*)>& gemm_of, GemmMatch* match);
/// Computes match.reduce's value (match.sum's, for an accumulation; match.rounded's, for a
/// rounding) from the buffers of match.a and match.b (and match.accumulate).
void run_gemm(const GemmMatch& match);

}  // namespace kiln::jit
