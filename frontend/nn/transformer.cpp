// Attention keeps the token rows of a batch as one 2-D matrix for the projections (so they
// and their gradients are plain GEMMs) and copies each of q, k, v once into a
// [N, heads, len, head_dim] layout for the two batched products.
#include "transformer.h"

#include <cmath>
#include <limits>

#include "../../ops/linalg.h"
#include "../../ops/reindex.h"
#include "../../ops/shape_ops.h"
#include "../../ops/sources.h"
#include "container.h"
#include "detail.h"
#include "flash_attention.h"
#include "functional.h"
#include "init.h"

namespace kiln::nn {

using detail::describe;
using detail::stored;

MultiheadAttention::MultiheadAttention(int64_t e, int64_t heads, double p, bool with_bias,
                                       bool first, std::optional<int64_t> kdim_,
                                       std::optional<int64_t> vdim_)
    : Module("MultiheadAttention"),
      embed_dim(e),
      num_heads(heads),
      head_dim(heads > 0 ? e / heads : 0),
      kdim(kdim_.value_or(e)),
      vdim(vdim_.value_or(e)),
      dropout(p),
      batch_first(first) {
  detail::require_positive(e, name(), "embed_dim");
  detail::require_positive(heads, name(), "num_heads");
  detail::require_positive(kdim, name(), "kdim");
  detail::require_positive(vdim, name(), "vdim");
  if (e % heads != 0) {
    throw ValueError("[MultiheadAttention] embed_dim " + std::to_string(e) +
                     " must be divisible by num_heads " + std::to_string(heads));
  }
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ValueError("[MultiheadAttention] dropout must be in [0, 1], got " + detail::num(p));
  }
  if (kdim == e && vdim == e) {
    in_proj_weight = register_parameter("in_proj_weight", init::xavier_uniform({3 * e, e}));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", init::xavier_uniform({e, e}));
    k_proj_weight = register_parameter("k_proj_weight", init::xavier_uniform({e, kdim}));
    v_proj_weight = register_parameter("v_proj_weight", init::xavier_uniform({e, vdim}));
  }
  if (with_bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * e}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, with_bias));
  if (with_bias) init::zeros_(out_proj->bias);
}

namespace {

IndexExpr var(int d) { return IndexExpr::var(d); }
IndexExpr cst(int64_t v) { return IndexExpr::constant(v); }

// The feed-forward block of both layer kinds: linear2(dropout(act(linear1(x)))).
Tensor feed_forward(const Tensor& x, Activation act, Linear& linear1, Dropout& dropout,
                    Linear& linear2) {
  Tensor hidden = linear1.forward(x);
  hidden = act == Activation::GELU ? F::gelu(hidden) : relu(hidden);
  return linear2.forward(dropout.forward(hidden));
}

}  // namespace

AttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                            const Tensor& value, const Tensor& key_padding_mask,
                                            bool need_weights, const Tensor& attn_mask,
                                            bool average_attn_weights, bool is_causal) {
  const std::string& op = name();
  const bool packed = in_proj_weight.defined();
  const DType dtype = packed ? in_proj_weight.dtype() : q_proj_weight.dtype();
  for (const Tensor* t : {&query, &key, &value}) detail::require_layer_input(*t, op, dtype);
  const bool unbatched = query.ndim() == 2;
  const int rank = unbatched ? 2 : 3;
  const char* layout = unbatched ? "[len, E]" : (batch_first ? "[N, len, E]" : "[len, N, E]");
  const std::string sizes = packed ? ""
                                   : " (key's E = kdim " + std::to_string(kdim) +
                                         ", value's vdim " + std::to_string(vdim) + ")";
  auto bad_shapes = [&](const std::string& why) {
    return ShapeError("[MultiheadAttention] expected query, key and value " + std::string(layout) +
                      " with E = embed_dim " + std::to_string(embed_dim) + sizes + " and " + why +
                      ", got query " + describe(query) + ", key " + describe(key) + ", value " +
                      describe(value));
  };
  const int64_t features[3] = {embed_dim, kdim, vdim};
  int which = 0;
  for (const Tensor* t : {&query, &key, &value}) {
    if ((t->ndim() != 2 && t->ndim() != 3) || t->ndim() != rank ||
        t->size(-1) != features[which++]) {
      throw bad_shapes("equal ranks");
    }
  }
  // Everything below is batch-agnostic on [len, N, E] or [N, len, E]; unbatched is N = 1.
  auto batched = [&](const Tensor& t) { return unbatched ? unsqueeze(t, batch_first ? 0 : 1) : t; };
  Tensor q_in = batched(query), k_in = batched(key), v_in = batched(value);
  const int len_axis = batch_first ? 1 : 0, batch_axis = batch_first ? 0 : 1;
  const int64_t n = q_in.size(batch_axis), l = q_in.size(len_axis), s = k_in.size(len_axis);
  if (k_in.size(batch_axis) != n || v_in.size(batch_axis) != n)
    throw bad_shapes("equal batch sizes");
  if (v_in.size(len_axis) != s) throw bad_shapes("key and value of equal length");

  const int64_t e = embed_dim, h = num_heads, d = head_dim;
  // Token rows as [len * N, E] in the input's own order, stored so the projection is a GEMM.
  auto rows = [&](const Tensor& t) { return stored(reshape(t, {-1, t.size(-1)})); };
  auto weight_rows = [&](int64_t from, int64_t to) {
    return from == 0 && to == 3 * e ? in_proj_weight : stored(slice(in_proj_weight, 0, from, to));
  };
  auto bias_rows = [&](int64_t from, int64_t to) {
    return in_proj_bias.defined() ? slice(in_proj_bias, 0, from, to) : Tensor();
  };
  // Self-attention (one tensor for q, k and v) projects once with the packed weight; shared
  // key/value (encoder memory) projects them together.
  Tensor q2, k2, v2;
  int64_t q_off = 0, k_off = 0, v_off = 0;
  if (!packed) {
    q2 = linear(rows(q_in), q_proj_weight, bias_rows(0, e));
    k2 = linear(rows(k_in), k_proj_weight, bias_rows(e, 2 * e));
    v2 = linear(rows(v_in), v_proj_weight, bias_rows(2 * e, 3 * e));
  } else if (query.node() == key.node() && key.node() == value.node()) {
    q2 = k2 = v2 = linear(rows(q_in), in_proj_weight, in_proj_bias);
    k_off = e, v_off = 2 * e;
  } else {
    q2 = linear(rows(q_in), weight_rows(0, e), bias_rows(0, e));
    if (key.node() == value.node()) {
      k2 = v2 = linear(rows(k_in), weight_rows(e, 3 * e), bias_rows(e, 3 * e));
      v_off = e;
    } else {
      k2 = linear(rows(k_in), weight_rows(e, 2 * e), bias_rows(e, 2 * e));
      v2 = linear(rows(v_in), weight_rows(2 * e, 3 * e), bias_rows(2 * e, 3 * e));
    }
  }
  // [rows, *] -> [N, heads, len, d]: row index of (batch b, position i) in the input order.
  auto heads = [&](const Tensor& t, int64_t len, int64_t off) {
    IndexExpr row = batch_first ? var(0) * cst(len) + var(2) : var(2) * cst(n) + var(0);
    return reindex(t, {n, h, len, d}, {row, cst(off) + var(1) * cst(d) + var(3)}, 0, {}, false,
                   "MultiheadAttention");
  };
  Tensor q = stored(heads(q2, l, q_off) * (1.0 / std::sqrt(static_cast<double>(d))));
  Tensor k = stored(heads(k2, s, k_off));
  Tensor v = stored(heads(v2, s, v_off));
  Tensor scores;  // [N, h, L, S]; the flash kernels never build it
  Tensor o;       // [N, h, L, d]
  // The flash kernels serve what needs no probabilities (no weights, no dropout) and no
  // gradient for a mask: masks become one additive [.., L, S] tensor (bool: true = -inf).
  const bool dropping = is_training() && dropout > 0.0;
  const bool mask_grads =
      grad_mode_enabled() && ((attn_mask.defined() && attn_mask.requires_grad()) ||
                              (key_padding_mask.defined() && key_padding_mask.requires_grad()));
  const SDPBackend backend = sdp_backend();
  const bool flash = !need_weights && !dropping && !mask_grads &&
                     (backend == SDPBackend::Flash ||
                      (backend == SDPBackend::Auto && flash_attention_preferred(q, k, v)));
  if (!flash) scores = matmul(q, transpose(k, 2, 3));
  Tensor additive;
  auto add_mask = [&](const Tensor& spread) {
    additive = additive.defined() ? additive + spread : spread;
  };

  auto apply_mask = [&](const Tensor& mask, const Tensor& spread, const char* what) {
    if (mask.dtype() != DType::Bool && mask.dtype() != dtype) {
      throw DTypeError("[MultiheadAttention] expected " + std::string(what) + " of dtype bool or " +
                       std::string(dtype_name(dtype)) + ", got " + describe(mask));
    }
    if (flash) {
      add_mask(mask.dtype() == DType::Bool
                   ? where(spread, full({}, -std::numeric_limits<double>::infinity(), dtype),
                           full({}, 0.0, dtype))
                   : spread);
      return scores;
    }
    if (mask.dtype() == DType::Bool)
      return where(spread, -std::numeric_limits<double>::infinity(), scores);
    return scores + spread;
  };
  if (attn_mask.defined()) {
    Shape two{l, s}, three{n * h, l, s};
    if (attn_mask.shape() == two) {
      scores = apply_mask(attn_mask, attn_mask, "attn_mask");
    } else if (attn_mask.shape() == three) {
      scores = apply_mask(attn_mask, reshape(attn_mask, {n, h, l, s}), "attn_mask");
    } else {
      throw ShapeError("[MultiheadAttention] expected attn_mask of shape " + shape_str(two) +
                       " or " + shape_str(three) + " [N*num_heads, L, S], got " +
                       describe(attn_mask));
    }
  }
  if (key_padding_mask.defined()) {
    Shape want = unbatched ? Shape{s} : Shape{n, s};
    if (key_padding_mask.shape() != want) {
      throw ShapeError("[MultiheadAttention] expected key_padding_mask of shape " +
                       shape_str(want) + " [N, S], got " + describe(key_padding_mask));
    }
    scores =
        apply_mask(key_padding_mask, reshape(key_padding_mask, {n, 1, 1, s}), "key_padding_mask");
  }
  Tensor p;
  if (flash) {
    // q is scaled already.
    o = F::flash_attention(q, k, v, additive.defined() ? additive.to(q.dtype()) : additive,
                           is_causal, 1.0);
  } else {
    if (is_causal)
      scores = where(index({l, s}, 1) > index({l, s}, 0), -std::numeric_limits<double>::infinity(),
                     scores);
    p = F::dropout(softmax(scores, -1), dropout, dropping);
    o = matmul(p, v);
  }
  // Back to token rows [L*N, E] (input order), stored for the output projection's GEMM.
  Tensor merged = reindex(
      o, {l * n, e},
      batch_first ? std::vector<IndexExpr>{floordiv(var(0), cst(l)), floordiv(var(1), cst(d)),
                                           mod(var(0), cst(l)), mod(var(1), cst(d))}
                  : std::vector<IndexExpr>{mod(var(0), cst(n)), floordiv(var(1), cst(d)),
                                           floordiv(var(0), cst(n)), mod(var(1), cst(d))},
      0, {}, false, "MultiheadAttention");
  Tensor out = linear(stored(merged), out_proj->weight, out_proj->bias);
  Shape out_shape = batch_first ? Shape{n, l, e} : Shape{l, n, e};
  AttentionOutput result{reshape(out, out_shape), Tensor()};
  if (unbatched) result.output = squeeze(result.output, batch_axis);
  if (need_weights) {
    result.weights = average_attn_weights ? mean(p, 1) : p;
    if (unbatched) result.weights = squeeze(result.weights, 0);
  }
  return result;
}

std::string MultiheadAttention::extra_repr() const {
  std::string s = "embed_dim=" + std::to_string(embed_dim) +
                  ", num_heads=" + std::to_string(num_heads) + ", dropout=" + detail::num(dropout) +
                  ", batch_first=" + (batch_first ? "true" : "false");
  if (kdim != embed_dim) s += ", kdim=" + std::to_string(kdim);
  if (vdim != embed_dim) s += ", vdim=" + std::to_string(vdim);
  return s;
}

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead,
                                                 int64_t dim_feedforward, double p, Activation act,
                                                 double layer_norm_eps, bool batch_first,
                                                 bool norm_first_, bool bias)
    : UnaryModule("TransformerEncoderLayer"), activation(act), norm_first(norm_first_) {
  detail::require_positive(dim_feedforward, name(), "dim_feedforward");
  self_attn = register_module(
      "self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, p, bias, batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, dim_feedforward, bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
  linear2 = register_module("linear2", std::make_shared<Linear>(dim_feedforward, d_model, bias));
  norm1 = register_module("norm1",
                          std::make_shared<LayerNorm>(Shape{d_model}, layer_norm_eps, true, bias));
  norm2 = register_module("norm2",
                          std::make_shared<LayerNorm>(Shape{d_model}, layer_norm_eps, true, bias));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  auto attend = [&](const Tensor& x) {
    return dropout1->forward(
        self_attn->forward(x, x, x, src_key_padding_mask, false, src_mask, true, is_causal).output);
  };
  auto ff_block = [&](const Tensor& x) {
    return dropout2->forward(feed_forward(x, activation, *linear1, *dropout, *linear2));
  };
  Tensor x = src;
  if (norm_first) {
    x = x + attend(norm1->forward(x));
    return x + ff_block(norm2->forward(x));
  }
  x = norm1->forward(x + attend(x));
  return norm2->forward(x + ff_block(x));
}

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& proto, int64_t n,
                                       std::shared_ptr<LayerNorm> final_norm)
    : UnaryModule("TransformerEncoder"), num_layers(n), norm(std::move(final_norm)) {
  detail::require_positive(n, name(), "num_layers");
  // PyTorch's container, so parameters are layers.<i>.* and printing matches.
  auto list = register_module("layers", std::make_shared<ModuleList>());
  const MultiheadAttention& attn = *proto.self_attn;
  const StateDict values = proto.state_dict();
  for (int64_t i = 0; i < n; ++i) {
    auto layer = std::make_shared<TransformerEncoderLayer>(
        attn.embed_dim, attn.num_heads, proto.linear1->out_features, proto.dropout->p,
        proto.activation, proto.norm1->eps, attn.batch_first, proto.norm_first,
        proto.linear1->bias.defined());
    // The prototype's dtypes, devices and values, as PyTorch's deep copies: each layer then
    // trains on its own. Module::to keeps the norms in float32 in a half model, as the
    // prototype's own to() did.
    const Tensor& w = proto.linear1->weight;
    if (w.dtype() != DType::Float32) layer->to(w.dtype());
    if (!(layer->linear1->weight.device() == w.device())) layer->to(w.device());
    layer->load_state_dict(values);
    if (!proto.is_training()) layer->eval();
    list->push_back(layer);
    layers.push_back(layer);
  }
  if (norm) register_module("norm", norm);
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask, bool is_causal) {
  Tensor x = src;
  for (const auto& layer : layers) x = layer->forward(x, mask, src_key_padding_mask, is_causal);
  return norm ? norm->forward(x) : x;
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead,
                                                 int64_t dim_feedforward, double p, Activation act,
                                                 double layer_norm_eps, bool batch_first,
                                                 bool norm_first_, bool bias)
    : Module("TransformerDecoderLayer"), activation(act), norm_first(norm_first_) {
  detail::require_positive(dim_feedforward, name(), "dim_feedforward");
  // Registration order is PyTorch's, so named_parameters() lists the same keys in order.
  self_attn = register_module(
      "self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, p, bias, batch_first));
  multihead_attn = register_module(
      "multihead_attn", std::make_shared<MultiheadAttention>(d_model, nhead, p, bias, batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, dim_feedforward, bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
  linear2 = register_module("linear2", std::make_shared<Linear>(dim_feedforward, d_model, bias));
  auto layer_norm = [&] {
    return std::make_shared<LayerNorm>(Shape{d_model}, layer_norm_eps, true, bias);
  };
  norm1 = register_module("norm1", layer_norm());
  norm2 = register_module("norm2", layer_norm());
  norm3 = register_module("norm3", layer_norm());
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(p));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const Tensor& tgt_mask, const Tensor& memory_mask,
                                        const Tensor& tgt_key_padding_mask,
                                        const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                                        bool memory_is_causal) {
  detail::require_defined(memory, name(), "memory");
  // With its mask given, a causal flag is only a hint in PyTorch (the mask decides), so it
  // masks here only where no mask is given.
  auto self_block = [&](const Tensor& x) {
    return dropout1->forward(self_attn
                                 ->forward(x, x, x, tgt_key_padding_mask, false, tgt_mask, true,
                                           tgt_is_causal && !tgt_mask.defined())
                                 .output);
  };
  auto cross_block = [&](const Tensor& x) {
    return dropout2->forward(multihead_attn
                                 ->forward(x, memory, memory, memory_key_padding_mask, false,
                                           memory_mask, true,
                                           memory_is_causal && !memory_mask.defined())
                                 .output);
  };
  auto ff_block = [&](const Tensor& x) {
    return dropout3->forward(feed_forward(x, activation, *linear1, *dropout, *linear2));
  };
  Tensor x = tgt;
  if (norm_first) {
    x = x + self_block(norm1->forward(x));
    x = x + cross_block(norm2->forward(x));
    return x + ff_block(norm3->forward(x));
  }
  x = norm1->forward(x + self_block(x));
  x = norm2->forward(x + cross_block(x));
  return norm3->forward(x + ff_block(x));
}

Tensor generate_square_subsequent_mask(int64_t size, DType dtype) {
  detail::require_positive(size, "generate_square_subsequent_mask", "size");
  if (!is_floating(dtype)) {
    throw DTypeError("[generate_square_subsequent_mask] expected a floating dtype, got " +
                     std::string(dtype_name(dtype)));
  }
  return cast(where(index({size, size}, 1) > index({size, size}, 0),
                    -std::numeric_limits<double>::infinity(), 0.0),
              dtype);
}

}  // namespace kiln::nn
