#pragma once
// Attention that keeps row statistics instead of the probability matrix (FlashAttention's
// forward and backward, tiled, as two kiln custom kernels). The forward keeps, per query
// row, its output and the log-sum-exp of its scores: O(L) beside q, k and v, where the
// composed path (softmax of a materialized [.., L, S] score matrix) keeps O(L * S) for its
// backward. The backward rebuilds the scores tile by tile from q, k, v and the row
// statistics. Results equal the composed path's to float32 rounding (sums run in another
// order).
//
// scaled_dot_product_attention and nn::MultiheadAttention choose between the two by
// SDPBackend (sdp_backend(), SDPBackendGuard): Auto picks flash where it is cheaper (see
// flash_attention_preferred), Math and Flash force one.
#include <optional>

#include "../../core/tensor.h"

namespace kiln::nn {

/// Which attention kernel scaled_dot_product_attention and MultiheadAttention use.
enum class SDPBackend {
  Auto,   ///< flash where flash_attention_preferred says so, the composed path elsewhere
  Math,   ///< always the composed path (matmul, mask, softmax, dropout, matmul)
  Flash,  ///< flash_attention; a scaled_dot_product_attention call it cannot serve (dropout,
          ///< weights, a mask that needs a gradient) raises ValueError instead of falling
          ///< back; MultiheadAttention falls back (need_weights defaults to true, as torch's)
};

/// The backend this thread uses now (Auto unless set).
SDPBackend sdp_backend();
/// Sets this thread's backend; returns the previous one.
SDPBackend set_sdp_backend(SDPBackend backend);

/// While alive, this thread uses `backend` (torch.nn.attention.sdpa_kernel).
class SDPBackendGuard {
 public:
  explicit SDPBackendGuard(SDPBackend backend) : previous_(set_sdp_backend(backend)) {}
  ~SDPBackendGuard() { set_sdp_backend(previous_); }
  SDPBackendGuard(const SDPBackendGuard&) = delete;
  SDPBackendGuard& operator=(const SDPBackendGuard&) = delete;

 private:
  SDPBackend previous_;
};

/// Auto's rule for q [..., L, E] against S keys: flash whenever a memory budget is set for
/// the device, and without one on the CPU when a gradient is recorded and the probabilities
/// the composed path would keep reach 256 MiB; the composed path otherwise, which is as fast
/// or faster at short sequences (docs/benchmarks.md, "Attention").
bool flash_attention_preferred(const Tensor& q, const Tensor& k, const Tensor& v);

namespace functional {

/// softmax(q k^T * scale + mask) v by the flash kernels, for q [..., L, E], k [..., S, E],
/// v [..., S, Ev] with equal leading dims (float32, float64; float16/bfloat16 run in
/// float32 and return their own dtype). `attn_mask` broadcasts to [..., L, S]: bool (true =
/// may attend) or of q's dtype (added); it gets no gradient. `is_causal` masks j > i;
/// `scale` defaults to 1/sqrt(E). A row with every position masked gives NaN. Keeps O(L)
/// per row for backward; differentiable once (a second backward raises ValueError).
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& attn_mask = Tensor(), bool is_causal = false,
                       std::optional<double> scale = std::nullopt);

}  // namespace functional
}  // namespace kiln::nn
