#pragma once
// Multi-head attention and the Transformer encoder layer, with PyTorch's parameter names
// (in_proj_weight, in_proj_bias, out_proj.*; self_attn, linear1, linear2, norm1, norm2, ...).
#include <cstdint>
#include <memory>
#include <string>

#include "linear.h"
#include "module.h"
#include "normalization.h"

namespace kiln::nn {

/// What MultiheadAttention::forward returns: `auto [out, weights] = mha->forward(q, k, v);`.
struct AttentionOutput {
  Tensor output;   ///< [L, N, E] ([N, L, E] with batch_first; [L, E] unbatched)
  Tensor weights;  ///< [N, L, S] averaged over heads, [N, num_heads, L, S] otherwise;
                   ///< undefined unless need_weights. Lazy, but a held handle is computed
                   ///< with the next evaluation it overlaps: drop it when not needed.
};

/// softmax(Q K^T / sqrt(d)) V over num_heads heads of size d = embed_dim / num_heads, with
/// the input projection packed in in_proj_weight [3E, E] (xavier_uniform) and in_proj_bias
/// [3E] (zeros), and out_proj a Linear(E, E) whose bias starts at zero.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false);

  /// query [L, N, E], key and value [S, N, E] ([N, L, E] / [N, S, E] with batch_first, or
  /// unbatched [L, E] / [S, E]). key_padding_mask [N, S]: bool (true = ignore that key) or
  /// float (added). attn_mask [L, S] or [N*num_heads, L, S]: bool (true = not allowed) or
  /// float (added). is_causal masks keys after the query position.
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const Tensor& key_padding_mask = Tensor(), bool need_weights = true,
                          const Tensor& attn_mask = Tensor(), bool average_attn_weights = true,
                          bool is_causal = false);
  std::string extra_repr() const override;

  const int64_t embed_dim, num_heads, head_dim;
  const double dropout;
  const bool batch_first;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;
};

/// The feed-forward block's activation.
enum class Activation { ReLU, GELU };

/// Self-attention and a feed-forward block, each with a residual connection and LayerNorm
/// (after the residual, or before the block with norm_first), as torch's
/// TransformerEncoderLayer.
class TransformerEncoderLayer : public UnaryModule {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                          double dropout = 0.1, Activation activation = Activation::ReLU,
                          double layer_norm_eps = 1e-5, bool batch_first = false,
                          bool norm_first = false, bool bias = true);

  /// src [S, N, d_model] ([N, S, d_model] with batch_first); masks as MultiheadAttention.
  Tensor forward(const Tensor& src, const Tensor& src_mask,
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }

  const Activation activation;
  const bool norm_first;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;
};

}  // namespace kiln::nn
