// TransformerEncoder, TransformerDecoderLayer and MultiheadAttention's kdim/vdim: PyTorch's
// names, the forward passes against their compositions written with the submodules,
// causality, gradients against central differences, errors, and PyTorch parity (outputs and
// gradients) where torch is importable.
#include "test_nn_support.h"
#include "torch_parity.h"

using namespace nn_test;
using Catch::Contains;
namespace nn = kiln::nn;
namespace F = kiln::nn::F;

namespace {


Tensor f64(const Matrix& v, const Shape& s) { return make(v, s, DType::Float64); }

std::vector<std::string> names(const nn::Module& m) {
  std::vector<std::string> out;
  for (auto& [n, _] : m.named_parameters()) out.push_back(n);
  return out;
}

// Every parameter of m drawn again from U(lo, hi), so no two layers or norms coincide.
void scramble(nn::Module& m, double lo = -0.5, double hi = 0.5) {
  for (Tensor p : m.parameters()) nn::init::uniform_(p, lo, hi);
}

}  // namespace

TEST_CASE("nn MultiheadAttention with kdim and vdim projects keys and values separately",
          "[nn][attention]") {
  kiln::manual_seed(101);
  const int64_t e = 6, heads = 2, kdim = 4, vdim = 5, l = 3, s = 4, n = 2;
  nn::MultiheadAttention mha(e, heads, 0.0, true, false, kdim, vdim);
  CHECK(names(mha) == std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight",
                                               "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  CHECK_FALSE(mha.in_proj_weight.defined());
  REQUIRE(mha.k_proj_weight.shape() == Shape{e, kdim});
  REQUIRE(mha.v_proj_weight.shape() == Shape{e, vdim});
  // xavier_uniform bounds: sqrt(6 / (fan_in + fan_out)).
  for (auto [t, fan] : {std::pair<Tensor, int64_t>{mha.q_proj_weight, e + e},
                        {mha.k_proj_weight, e + kdim},
                        {mha.v_proj_weight, e + vdim}}) {
    for (double v : values(t)) REQUIRE(std::fabs(v) <= std::sqrt(6.0 / static_cast<double>(fan)));
  }
  mha.to(DType::Float64);
  nn::init::uniform_(mha.in_proj_bias, -0.5, 0.5);
  nn::init::uniform_(mha.out_proj->bias, -0.5, 0.5);
  // The same attention written with kiln's functional pieces: per-head projections and
  // scaled_dot_product_attention, then the output projection.
  for (bool batch_first : {false, true}) {
    INFO("batch_first " << batch_first);
    nn::MultiheadAttention m(e, heads, 0.0, true, batch_first, kdim, vdim);
    m.to(DType::Float64);
    m.load_state_dict(mha.state_dict());
    auto layout = [&](int64_t len, int64_t feat, uint64_t seed) {
      return f64(random_values(len * n * feat, seed),
                 batch_first ? Shape{n, len, feat} : Shape{len, n, feat});
    };
    Tensor q = layout(l, e, 1), k = layout(s, kdim, 2), v = layout(s, vdim, 3);
    auto [out, weights] = m.forward(q, k, v, Tensor(), true, Tensor(), false);
    REQUIRE(out.shape() == (batch_first ? Shape{n, l, e} : Shape{l, n, e}));
    REQUIRE(weights.shape() == Shape{n, heads, l, s});
    Tensor b = mha.in_proj_bias;
    auto project = [&](const Tensor& x, const Tensor& w, int64_t from, int64_t len) {
      Tensor nle = batch_first ? x : kiln::transpose(x, 0, 1);  // [N, len, *]
      Tensor p = kiln::linear(nle, w, kiln::slice(b, 0, from, from + e));
      return kiln::transpose(kiln::reshape(p, {n, len, heads, e / heads}), 1, 2);
    };
    Tensor probs;
    Tensor o = F::scaled_dot_product_attention(
        project(q, mha.q_proj_weight, 0, l), project(k, mha.k_proj_weight, e, s),
        project(v, mha.v_proj_weight, 2 * e, s), Tensor(), 0.0, false, std::nullopt, &probs);
    Tensor merged = kiln::reshape(kiln::transpose(o, 1, 2), {n, l, e});
    Tensor want = kiln::linear(merged, mha.out_proj->weight, mha.out_proj->bias);
    if (!batch_first) want = kiln::transpose(want, 0, 1);
    NN_REQUIRE_CLOSE(values(out), values(want), 1e-12, 1e-10);
    NN_REQUIRE_CLOSE(values(weights), values(probs), 1e-12, 1e-10);
  }
  // Keys of the wrong feature size are named in the error.
  REQUIRE_THROWS_AS(
      mha.forward(kiln::zeros({l, n, e}, DType::Float64), kiln::zeros({s, n, e}, DType::Float64),
                  kiln::zeros({s, n, vdim}, DType::Float64)),
      kiln::ShapeError);
  REQUIRE_THROWS_WITH(
      mha.forward(kiln::zeros({l, n, e}, DType::Float64), kiln::zeros({s, n, e}, DType::Float64),
                  kiln::zeros({s, n, vdim}, DType::Float64)),
      Contains("[MultiheadAttention] expected query, key and value [len, N, E] "
               "with E = embed_dim 6 (key's E = kdim 4, value's vdim 5)"));
  REQUIRE_THROWS_WITH(nn::MultiheadAttention(6, 2, 0.0, true, false, 0),
                      Contains("[MultiheadAttention] kdim must be >= 1, got 0"));
  std::ostringstream repr;
  repr << mha;
  CHECK(repr.str().find("kdim=4, vdim=5") != std::string::npos);
}

TEST_CASE("nn TransformerEncoder stacks copies of its layer and a final norm",
          "[nn][transformer]") {
  kiln::manual_seed(102);
  nn::TransformerEncoderLayer proto(8, 2, 16, 0.0);
  scramble(proto);
  nn::TransformerEncoder enc(proto, 3, nn::make<nn::LayerNorm>(8));
  std::vector<std::string> got = names(enc);
  REQUIRE(got.size() == 3 * 12 + 2);
  CHECK(got.front() == "layers.0.self_attn.in_proj_weight");
  CHECK(got[12] == "layers.1.self_attn.in_proj_weight");
  CHECK(got[35] == "layers.2.norm2.bias");
  CHECK(got[36] == "norm.weight");
  CHECK(got[37] == "norm.bias");
  // Every layer starts with the prototype's values (PyTorch deep-copies it) but owns them.
  kiln::StateDict want = proto.state_dict();
  for (const auto& layer : enc.layers)
    for (auto& [name, t] : layer->state_dict()) REQUIRE(values(t) == values(want.at(name)));
  scramble(*enc.layers[1]);
  CHECK(values(enc.layers[0]->linear1->weight) == values(proto.linear1->weight));
  CHECK(values(enc.layers[1]->linear1->weight) != values(proto.linear1->weight));
  // The forward is the layers in turn, then the norm, with masks passed to every layer.
  Tensor src = kiln::randn({5, 2, 8});
  std::vector<bool> pad = {false, false, false, true, true, false, false, false, false, true};
  Tensor kpm = kiln::from_vector(pad, {2, 5});
  Tensor x = src;
  for (const auto& layer : enc.layers) x = layer->forward(x, Tensor(), kpm, true);
  NN_REQUIRE_CLOSE(values(enc.forward(src, Tensor(), kpm, true)), values(enc.norm->forward(x)),
                   1e-6, 1e-6);
  // Without a norm the stack ends at the last layer; the UnaryModule form takes no masks.
  nn::TransformerEncoder bare(proto, 2);
  CHECK(names(bare).size() == 24);
  CHECK_FALSE(bare.norm);
  Tensor y = proto.forward(proto.forward(src));
  NN_REQUIRE_CLOSE(values(bare.forward(src)), values(y), 1e-6, 1e-6);
  std::ostringstream repr;
  repr << bare;
  CHECK(repr.str().find("(layers): ModuleList(") != std::string::npos);
  // A prototype in float64 gives a float64 stack with its values.
  nn::TransformerEncoderLayer wide(8, 2, 16, 0.0);
  wide.to(DType::Float64);
  scramble(wide);
  nn::TransformerEncoder wide_stack(wide, 2);
  for (const Tensor& p : wide_stack.parameters()) REQUIRE(p.dtype() == DType::Float64);
  CHECK(values(wide_stack.layers[1]->norm2->bias) == values(wide.norm2->bias));
  REQUIRE_THROWS_WITH(nn::TransformerEncoder(proto, 0),
                      Contains("[TransformerEncoder] num_layers must be >= 1, got 0"));
}

TEST_CASE("nn TransformerDecoderLayer is PyTorch's composition and respects causal masks",
          "[nn][transformer]") {
  kiln::manual_seed(103);
  nn::TransformerDecoderLayer layer(8, 2, 16, 0.1);
  CHECK(names(layer) ==
        std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                 "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                 "multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias",
                                 "multihead_attn.out_proj.weight", "multihead_attn.out_proj.bias",
                                 "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
                                 "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                                 "norm3.weight", "norm3.bias"});
  scramble(layer);
  Tensor tgt = kiln::randn({4, 2, 8}), memory = kiln::randn({6, 2, 8});
  Tensor a = layer.forward(tgt, memory), b = layer.forward(tgt, memory);
  CHECK(values(a) != values(b));  // dropout draws fresh masks in training
  layer.eval();
  Tensor mask = nn::generate_square_subsequent_mask(4);
  Tensor out = layer.forward(tgt, memory, mask);
  REQUIRE(out.shape() == Shape{4, 2, 8});
  // Post-norm: x = norm1(x + sa(x)); x = norm2(x + mha(x, mem)); norm3(x + ff(x)).
  auto& sa = *layer.self_attn;
  auto& ca = *layer.multihead_attn;
  Tensor x = layer.norm1->forward(tgt + sa.forward(tgt, tgt, tgt, Tensor(), false, mask).output);
  x = layer.norm2->forward(x + ca.forward(x, memory, memory, Tensor(), false).output);
  Tensor ff = layer.linear2->forward(kiln::relu(layer.linear1->forward(x)));
  NN_REQUIRE_CLOSE(values(out), values(layer.norm3->forward(x + ff)), 1e-5, 1e-5);
  // tgt_is_causal without a mask is the same as the causal mask.
  NN_REQUIRE_CLOSE(values(layer.forward(tgt, memory, Tensor(), Tensor(), Tensor(), Tensor(), true)),
                   values(out), 1e-6, 1e-6);
  // The mask: 0 on and below the diagonal, -inf above.
  std::vector<double> m = values(mask);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j)
      CHECK(m[static_cast<size_t>(i * 4 + j)] == (j > i ? -INFINITY : 0.0));
  // Causality: changing the last target token leaves the earlier outputs unchanged (pre-norm,
  // GELU, batch-first variant).
  nn::TransformerDecoderLayer pre(8, 4, 32, 0.0, nn::Activation::GELU, 1e-5, true, true);
  scramble(pre);
  pre.eval();
  Tensor t1 = kiln::randn({1, 5, 8}), mem = kiln::randn({1, 3, 8});
  Tensor t2 = kiln::concat({kiln::slice(t1, 1, 0, 4), kiln::randn({1, 1, 8})}, 1);
  Tensor causal = nn::generate_square_subsequent_mask(5);
  std::vector<double> o1 = values(pre.forward(t1, mem, causal)),
                      o2 = values(pre.forward(t2, mem, causal));
  NN_REQUIRE_CLOSE(Matrix(o2.begin(), o2.begin() + 32), Matrix(o1.begin(), o1.begin() + 32), 1e-6,
                   1e-6);
  CHECK(o2[36] != o1[36]);
  // Without the mask the earlier positions see the change.
  std::vector<double> u1 = values(pre.forward(t1, mem)), u2 = values(pre.forward(t2, mem));
  CHECK(u1[0] != u2[0]);
  REQUIRE_THROWS_AS(pre.forward(t1, Tensor()), kiln::ValueError);
  REQUIRE_THROWS_AS(pre.forward(t1, kiln::randn({1, 3, 6})), kiln::ShapeError);
  REQUIRE_THROWS_AS(nn::generate_square_subsequent_mask(3, DType::Int32), kiln::DTypeError);
}

TEST_CASE("nn gradient check of TransformerDecoderLayer and MultiheadAttention with kdim/vdim",
          "[nn][grad][transformer]") {
  kiln::manual_seed(104);
  auto leaf = [](const Shape& s, uint64_t seed) {
    Tensor t = f64(random_values(kiln::numel(s), seed), s);
    t.requires_grad_();
    return t;
  };
  auto project = [](const Tensor& y, uint64_t seed) {
    return kiln::sum(y * f64(random_values(y.numel(), seed), y.shape()));
  };
  nn::TransformerDecoderLayer layer(4, 2, 6, 0.0, nn::Activation::GELU, 1e-5, true, true);
  layer.to(DType::Float64);
  scramble(layer);
  Tensor tgt = leaf({2, 3, 4}, 1), memory = leaf({2, 4, 4}, 2);
  Tensor mask = nn::generate_square_subsequent_mask(3, DType::Float64);
  std::vector<Tensor> params = layer.parameters();
  params.push_back(tgt);
  params.push_back(memory);
  REQUIRE(gradient_check([&] { return project(layer.forward(tgt, memory, mask), 3); }, params) ==
          "");
  nn::MultiheadAttention mha(4, 2, 0.0, true, false, 3, 5);
  mha.to(DType::Float64);
  scramble(mha);
  Tensor q = leaf({2, 2, 4}, 4), k = leaf({3, 2, 3}, 5), v = leaf({3, 2, 5}, 6);
  params = mha.parameters();
  for (const Tensor& t : {q, k, v}) params.push_back(t);
  REQUIRE(gradient_check([&] { return project(mha.forward(q, k, v).output, 7); }, params) == "");
}

TEST_CASE("nn transformer layers match PyTorch outputs and gradients", "[nn][transformer][torch]") {
  kiln::manual_seed(105);
  std::vector<std::shared_ptr<nn::Module>> keep;
  std::vector<TorchCase> cases;
  {
    nn::TransformerEncoderLayer proto(8, 2, 16, 0.0);
    auto enc = nn::make<nn::TransformerEncoder>(proto, 2, nn::make<nn::LayerNorm>(8));
    enc->to(DType::Float64);
    scramble(*enc);
    keep.push_back(enc);
    TorchCase tc;
    tc.label = "TransformerEncoder post-norm";
    tc.module =
        "nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, 0.0), 2, "
        "norm=nn.LayerNorm(8), enable_nested_tensor=False)";
    tc.layer = enc.get();
    tc.call = "m(x[0], src_key_padding_mask=x[1])";
    std::vector<bool> pad = {false, false, true, false, false, false, false, true};
    tc.inputs = {f64(random_values(4 * 2 * 8, 1), {4, 2, 8}), kiln::from_vector(pad, {2, 4})};
    auto* raw = enc.get();
    tc.run = [raw](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{raw->forward(x[0], Tensor(), x[1])};
    };
    cases.push_back(std::move(tc));
  }
  {
    nn::TransformerEncoderLayer proto(8, 4, 12, 0.0, nn::Activation::GELU, 1e-4, true, true);
    auto enc = nn::make<nn::TransformerEncoder>(proto, 2);
    enc->to(DType::Float64);
    scramble(*enc);
    keep.push_back(enc);
    TorchCase tc;
    tc.label = "TransformerEncoder pre-norm, GELU, batch-first, causal mask";
    tc.module =
        "nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 4, 12, 0.0, 'gelu', 1e-4, "
        "batch_first=True, norm_first=True), 2, enable_nested_tensor=False)";
    tc.layer = enc.get();
    tc.call = "m(x[0], mask=x[1])";
    tc.grad_inputs = 1;
    tc.inputs = {f64(random_values(2 * 5 * 8, 2), {2, 5, 8}),
                 nn::generate_square_subsequent_mask(5, DType::Float64)};
    auto* raw = enc.get();
    tc.run = [raw](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{raw->forward(x[0], x[1])};
    };
    cases.push_back(std::move(tc));
  }
  for (bool norm_first : {false, true}) {
    auto dec = nn::make<nn::TransformerDecoderLayer>(
        8, 2, 16, 0.0, norm_first ? nn::Activation::GELU : nn::Activation::ReLU, 1e-5, norm_first,
        norm_first);
    dec->to(DType::Float64);
    scramble(*dec);
    keep.push_back(dec);
    TorchCase tc;
    tc.label = std::string("TransformerDecoderLayer") + (norm_first ? " pre-norm" : " post-norm");
    tc.module = std::string("nn.TransformerDecoderLayer(8, 2, 16, 0.0, ") +
                (norm_first ? "'gelu', batch_first=True, norm_first=True)" : "'relu')");
    tc.layer = dec.get();
    tc.call = "m(x[0], x[1], tgt_mask=x[2], memory_key_padding_mask=x[3])";
    tc.grad_inputs = 2;
    Shape ts = norm_first ? Shape{2, 4, 8} : Shape{4, 2, 8},
          ms = norm_first ? Shape{2, 3, 8} : Shape{3, 2, 8};
    std::vector<bool> pad = {false, true, false, false, false, true};
    tc.inputs = {f64(random_values(64, 3), ts), f64(random_values(48, 4), ms),
                 nn::generate_square_subsequent_mask(4, DType::Float64),
                 kiln::from_vector(pad, {2, 3})};
    auto* raw = dec.get();
    tc.run = [raw](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{raw->forward(x[0], x[1], x[2], Tensor(), Tensor(), x[3])};
    };
    cases.push_back(std::move(tc));
  }
  {
    auto mha = nn::make<nn::MultiheadAttention>(6, 3, 0.0, true, true, 4, 2);
    mha->to(DType::Float64);
    scramble(*mha);
    keep.push_back(mha);
    TorchCase tc;
    tc.label = "MultiheadAttention kdim/vdim";
    tc.module = "nn.MultiheadAttention(6, 3, kdim=4, vdim=2, batch_first=True)";
    tc.layer = mha.get();
    tc.call = "m(x[0], x[1], x[2])";
    tc.inputs = {f64(random_values(2 * 3 * 6, 5), {2, 3, 6}),
                 f64(random_values(2 * 5 * 4, 6), {2, 5, 4}),
                 f64(random_values(2 * 5 * 2, 7), {2, 5, 2})};
    auto* raw = mha.get();
    tc.run = [raw](const std::vector<Tensor>& x) {
      auto [out, weights] = raw->forward(x[0], x[1], x[2]);
      return std::vector<Tensor>{out, weights};
    };
    cases.push_back(std::move(tc));
  }
  {
    TorchCase tc;
    tc.label = "generate_square_subsequent_mask";
    tc.call = "nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)";
    tc.run = [](const std::vector<Tensor>&) {
      return std::vector<Tensor>{nn::generate_square_subsequent_mask(5, DType::Float64)};
    };
    cases.push_back(std::move(tc));
  }
  NN_REQUIRE_TORCH_PARITY(cases);
}
