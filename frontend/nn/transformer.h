#pragma once
// Multi-head attention, the Transformer encoder (layer and stack) and decoder layer, with
// PyTorch's parameter names (in_proj_weight, in_proj_bias, out_proj.*; self_attn, linear1,
// linear2, norm1, norm2, ...; layers.0.*).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
/// [3E] (zeros), and out_proj a Linear(E, E) whose bias starts at zero. When kdim or vdim
/// (the key's and value's feature sizes, embed_dim when omitted) differ from embed_dim the
/// projections are separate, as PyTorch's: q_proj_weight [E, E], k_proj_weight [E, kdim] and
/// v_proj_weight [E, vdim] (each xavier_uniform) and no in_proj_weight.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false, std::optional<int64_t> kdim = std::nullopt,
                     std::optional<int64_t> vdim = std::nullopt);

  /// query [L, N, E], key [S, N, kdim] and value [S, N, vdim] ([N, L, E] / [N, S, *] with
  /// batch_first, or unbatched [L, E] / [S, *]). key_padding_mask [N, S]: bool (true = ignore that
  /// key) or float (added). attn_mask [L, S] or [N*num_heads, L, S]: bool (true = not allowed) or
  /// float (added). is_causal masks keys after the query position. Without need_weights and
  /// dropout, the attention runs by flash_attention where sdp_backend() says so (Auto: large
  /// training steps or a memory budget; nn/flash_attention.h).
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const Tensor& key_padding_mask = Tensor(), bool need_weights = true,
                          const Tensor& attn_mask = Tensor(), bool average_attn_weights = true,
                          bool is_causal = false);
  std::string extra_repr() const override;

  const int64_t embed_dim, num_heads, head_dim, kdim, vdim;
  const double dropout;
  const bool batch_first;
  /// in_proj_weight when kdim == vdim == embed_dim; q/k/v_proj_weight otherwise.
  Tensor in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight;
  Tensor in_proj_bias;
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

/// num_layers encoder layers applied in turn, then `norm` when given, as torch's
/// TransformerEncoder: parameters layers.0.*, layers.1.*, ..., norm.*. As PyTorch (which
/// deep-copies its argument), every layer starts as a copy of `encoder_layer`'s settings and
/// values; the prototype itself is not part of the stack.
class TransformerEncoder : public UnaryModule {
 public:
  TransformerEncoder(const TransformerEncoderLayer& encoder_layer, int64_t num_layers,
                     std::shared_ptr<LayerNorm> norm = nullptr);

  /// src and masks as TransformerEncoderLayer::forward, passed to every layer.
  Tensor forward(const Tensor& src, const Tensor& mask,
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }

  const int64_t num_layers;
  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;  ///< null when not given
};

/// Self-attention over the target, attention to the encoder's output (memory) and a
/// feed-forward block, each with a residual connection and LayerNorm (after the residual, or
/// before the block with norm_first), as torch's TransformerDecoderLayer: submodules
/// self_attn, multihead_attn, linear1, linear2, norm1, norm2, norm3 (and dropouts).
class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048,
                          double dropout = 0.1, Activation activation = Activation::ReLU,
                          double layer_norm_eps = 1e-5, bool batch_first = false,
                          bool norm_first = false, bool bias = true);

  /// tgt [T, N, d_model] and memory [S, N, d_model] ([N, *, d_model] with batch_first, or
  /// unbatched). tgt_mask [T, T] and memory_mask [T, S] (or per head, [N*nhead, T, *]) and the
  /// key padding masks [N, T] / [N, S] as MultiheadAttention's; tgt_is_causal masks later
  /// target positions without a tgt_mask (generate_square_subsequent_mask gives one).
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                 const Tensor& memory_mask = Tensor(),
                 const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false,
                 bool memory_is_causal = false);

  const Activation activation;
  const bool norm_first;
  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
};

/// A float [size, size] mask with -inf above the diagonal and 0 elsewhere (torch's
/// nn.Transformer.generate_square_subsequent_mask): position i attends to positions <= i.
Tensor generate_square_subsequent_mask(int64_t size, DType dtype = DType::Float32);

}  // namespace kiln::nn
