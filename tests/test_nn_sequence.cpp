// LSTM, MultiheadAttention and TransformerEncoderLayer forward values against float64 loop
// implementations written here (tolerance 1e-5 absolute + 1e-5 relative on float32).
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;

namespace {


struct LstmResult {
  Matrix output, h, c;  // output [T, B, H]; h, c [layers, B, H]
};

// The LSTM recurrence written out, time-major.
LstmResult lstm_reference(const nn::LSTM& lstm, const Matrix& x, int64_t steps, int64_t batch,
                          Matrix h0, Matrix c0) {
  const int64_t hs = lstm.hidden_size;
  Matrix seq = x;
  int64_t in = lstm.input_size;
  LstmResult r;
  for (int64_t k = 0; k < lstm.num_layers; ++k) {
    const auto& l = lstm.layers()[static_cast<size_t>(k)];
    Matrix w_ih = values(l.w_ih), w_hh = values(l.w_hh);
    Matrix b_ih = l.b_ih.defined() ? values(l.b_ih) : Matrix(),
           b_hh = l.b_hh.defined() ? values(l.b_hh) : Matrix();
    Matrix h(h0.begin() + k * batch * hs, h0.begin() + (k + 1) * batch * hs);
    Matrix c(c0.begin() + k * batch * hs, c0.begin() + (k + 1) * batch * hs);
    Matrix out;
    for (int64_t t = 0; t < steps; ++t) {
      Matrix xt(seq.begin() + t * batch * in, seq.begin() + (t + 1) * batch * in);
      Matrix a = affine(xt, batch, in, w_ih, b_ih, 4 * hs),
             bb = affine(h, batch, hs, w_hh, b_hh, 4 * hs);
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t j = 0; j < hs; ++j) {
          auto gate = [&](int q) {
            size_t at = static_cast<size_t>(n * 4 * hs + q * hs + j);
            return a[at] + bb[at];
          };
          size_t at = static_cast<size_t>(n * hs + j);
          double i = sigmoid(gate(0)), f = sigmoid(gate(1)), g = std::tanh(gate(2)),
                 o = sigmoid(gate(3));
          c[at] = f * c[at] + i * g;
          h[at] = o * std::tanh(c[at]);
        }
      out.insert(out.end(), h.begin(), h.end());
    }
    r.h.insert(r.h.end(), h.begin(), h.end());
    r.c.insert(r.c.end(), c.begin(), c.end());
    seq = out;
    in = hs;
  }
  r.output = seq;
  return r;
}

// Swaps the first two dimensions of a [a, b, rest] array.
Matrix swap01(const Matrix& v, int64_t a, int64_t b, int64_t rest) {
  Matrix out(v.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < rest; ++k)
        out[static_cast<size_t>((j * a + i) * rest + k)] =
            v[static_cast<size_t>((i * b + j) * rest + k)];
  return out;
}

struct AttentionResult {
  Matrix output;   // [L, N, E]
  Matrix weights;  // [N, L, S] averaged over heads
};

// Multi-head attention written out for sequence-first inputs. `mask(n, h, l, s)` gives the
// additive mask (-inf for a forbidden position).
AttentionResult attention_reference(
    const nn::MultiheadAttention& mha, const Matrix& q_in, const Matrix& k_in, const Matrix& v_in,
    int64_t l_len, int64_t s_len, int64_t batch,
    const std::function<double(int64_t, int64_t, int64_t, int64_t)>& mask) {
  const int64_t e = mha.embed_dim, heads = mha.num_heads, d = e / heads;
  Matrix w = values(mha.in_proj_weight), b = values(mha.in_proj_bias);
  auto part = [&](const Matrix& m, int64_t from, int64_t count) {
    return Matrix(m.begin() + from, m.begin() + from + count);
  };
  Matrix q = affine(q_in, l_len * batch, e, part(w, 0, e * e), part(b, 0, e), e);
  Matrix k = affine(k_in, s_len * batch, e, part(w, e * e, e * e), part(b, e, e), e);
  Matrix v = affine(v_in, s_len * batch, e, part(w, 2 * e * e, e * e), part(b, 2 * e, e), e);
  Matrix merged(static_cast<size_t>(l_len * batch * e), 0.0);
  AttentionResult r;
  r.weights.assign(static_cast<size_t>(batch * l_len * s_len), 0.0);
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < l_len; ++i) {
        std::vector<double> score(static_cast<size_t>(s_len));
        double m = -INFINITY;
        for (int64_t j = 0; j < s_len; ++j) {
          double acc = 0;
          for (int64_t t = 0; t < d; ++t)
            acc += q[static_cast<size_t>((i * batch + n) * e + h * d + t)] *
                   k[static_cast<size_t>((j * batch + n) * e + h * d + t)];
          score[static_cast<size_t>(j)] =
              acc / std::sqrt(static_cast<double>(d)) + mask(n, h, i, j);
          m = std::max(m, score[static_cast<size_t>(j)]);
        }
        double z = 0;
        for (double& sc : score) z += (sc = std::exp(sc - m));
        for (int64_t j = 0; j < s_len; ++j) {
          double p = score[static_cast<size_t>(j)] / z;
          r.weights[static_cast<size_t>((n * l_len + i) * s_len + j)] +=
              p / static_cast<double>(heads);
          for (int64_t t = 0; t < d; ++t)
            merged[static_cast<size_t>((i * batch + n) * e + h * d + t)] +=
                p * v[static_cast<size_t>((j * batch + n) * e + h * d + t)];
        }
      }
  r.output =
      affine(merged, l_len * batch, e, values(mha.out_proj->weight), values(mha.out_proj->bias), e);
  return r;
}

}  // namespace

TEST_CASE("nn LSTM matches a loop implementation with initial states and two layers",
          "[nn][lstm]") {
  kiln::manual_seed(31);
  const int64_t steps = 5, batch = 2, in = 3, hs = 4;
  for (bool batch_first : {false, true}) {
    INFO("batch_first " << batch_first);
    nn::LSTM lstm(in, hs, 2, true, batch_first);
    Matrix x = random_values(steps * batch * in, 5), h0 = random_values(2 * batch * hs, 6),
           c0 = random_values(2 * batch * hs, 7);
    LstmResult want = lstm_reference(lstm, x, steps, batch, h0, c0);
    Tensor input = batch_first ? make(swap01(x, steps, batch, in), {batch, steps, in})
                               : make(x, {steps, batch, in});
    auto [output, h_n, c_n] =
        lstm.forward(input, make(h0, {2, batch, hs}), make(c0, {2, batch, hs}));
    REQUIRE(output.shape() == (batch_first ? Shape{batch, steps, hs} : Shape{steps, batch, hs}));
    REQUIRE(h_n.shape() == Shape{2, batch, hs});
    NN_REQUIRE_CLOSE(values(output),
                     batch_first ? swap01(want.output, steps, batch, hs) : want.output, 1e-5, 1e-5);
    NN_REQUIRE_CLOSE(values(h_n), want.h, 1e-5, 1e-5);
    NN_REQUIRE_CLOSE(values(c_n), want.c, 1e-5, 1e-5);
  }
  // Zero initial states by default, one layer without bias, and unbatched input.
  nn::LSTM single(in, hs, 1, false);
  CHECK(single.parameters().size() == 2);
  Matrix x = random_values(steps * in, 8);
  LstmResult want = lstm_reference(single, x, steps, 1, Matrix(hs, 0.0), Matrix(hs, 0.0));
  auto out = single.forward(make(x, {steps, in}));
  REQUIRE(out.output.shape() == Shape{steps, hs});
  REQUIRE(out.h_n.shape() == Shape{1, hs});
  NN_REQUIRE_CLOSE(values(out.output), want.output, 1e-5, 1e-5);
  NN_REQUIRE_CLOSE(values(out.c_n), want.c, 1e-5, 1e-5);
  // PyTorch's parameter names.
  std::vector<std::string> names;
  for (auto& [n, _] : nn::LSTM(2, 3, 2).named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
                                          "bias_hh_l0", "weight_ih_l1", "weight_hh_l1",
                                          "bias_ih_l1", "bias_hh_l1"});
}

TEST_CASE("nn MultiheadAttention matches a loop reference with masks", "[nn][attention]") {
  kiln::manual_seed(41);
  const int64_t e = 8, heads = 2, l_len = 3, s_len = 4, batch = 2;
  nn::MultiheadAttention mha(e, heads);
  nn::init::uniform_(mha.in_proj_bias, -0.5, 0.5);
  nn::init::uniform_(mha.out_proj->bias, -0.5, 0.5);
  Matrix q = random_values(l_len * batch * e, 1), k = random_values(s_len * batch * e, 2),
         v = random_values(s_len * batch * e, 3);
  Tensor tq = make(q, {l_len, batch, e}), tk = make(k, {s_len, batch, e}),
         tv = make(v, {s_len, batch, e});
  auto none = [](int64_t, int64_t, int64_t, int64_t) { return 0.0; };

  SECTION("no mask, cross attention") {
    auto want = attention_reference(mha, q, k, v, l_len, s_len, batch, none);
    auto [out, weights] = mha.forward(tq, tk, tv);
    REQUIRE(out.shape() == Shape{l_len, batch, e});
    REQUIRE(weights.shape() == Shape{batch, l_len, s_len});
    NN_REQUIRE_CLOSE(values(out), want.output, 1e-5, 1e-5);
    NN_REQUIRE_CLOSE(values(weights), want.weights, 1e-6, 1e-5);
    auto per_head = mha.forward(tq, tk, tv, Tensor(), true, Tensor(), false).weights;
    REQUIRE(per_head.shape() == Shape{batch, heads, l_len, s_len});
    CHECK_FALSE(mha.forward(tq, tk, tv, Tensor(), false).weights.defined());
  }
  SECTION("key padding mask and boolean attention mask") {
    std::vector<bool> pad = {false, false, true, false, false, true, false, true};  // [N, S]
    std::vector<bool> forbid = {false, true,  false, false, true,  false,
                                false, false, false, false, false, true};  // [L, S]
    auto mask = [&](int64_t n, int64_t, int64_t i, int64_t j) {
      return pad[static_cast<size_t>(n * s_len + j)] || forbid[static_cast<size_t>(i * s_len + j)]
                 ? -INFINITY
                 : 0.0;
    };
    auto want = attention_reference(mha, q, k, v, l_len, s_len, batch, mask);
    auto got = mha.forward(tq, tk, tv, kiln::from_vector(pad, {batch, s_len}), true,
                           kiln::from_vector(forbid, {l_len, s_len}));
    NN_REQUIRE_CLOSE(values(got.output), want.output, 1e-5, 1e-5);
    NN_REQUIRE_CLOSE(values(got.weights), want.weights, 1e-6, 1e-5);
  }
  SECTION("float attention mask per batch and head") {
    Matrix add = random_values(batch * heads * l_len * s_len, 9);
    auto mask = [&](int64_t n, int64_t h, int64_t i, int64_t j) {
      return static_cast<double>(
          static_cast<float>(add[static_cast<size_t>(((n * heads + h) * l_len + i) * s_len + j)]));
    };
    auto want = attention_reference(mha, q, k, v, l_len, s_len, batch, mask);
    auto got = mha.forward(tq, tk, tv, Tensor(), true, make(add, {batch * heads, l_len, s_len}));
    NN_REQUIRE_CLOSE(values(got.output), want.output, 1e-5, 1e-5);
  }
  SECTION("causal self-attention, batch first, packed projection") {
    nn::MultiheadAttention bf(e, heads, 0.0, true, true);
    nn::init::uniform_(bf.in_proj_bias, -0.5, 0.5);
    Matrix x = random_values(s_len * batch * e, 4);
    auto causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -INFINITY : 0.0; };
    auto want = attention_reference(bf, x, x, x, s_len, s_len, batch, causal);
    Tensor tx = make(swap01(x, s_len, batch, e), {batch, s_len, e});
    auto got = bf.forward(tx, tx, tx, Tensor(), true, Tensor(), true, true);
    REQUIRE(got.output.shape() == Shape{batch, s_len, e});
    NN_REQUIRE_CLOSE(values(got.output), swap01(want.output, s_len, batch, e), 1e-5, 1e-5);
    NN_REQUIRE_CLOSE(values(got.weights), want.weights, 1e-6, 1e-5);
    // Key and value shared (encoder memory) takes the two-way packed path: same result.
    Tensor txq = make(swap01(x, s_len, batch, e), {batch, s_len, e});
    auto shared_kv = bf.forward(txq, tx, tx, Tensor(), false, Tensor(), true, true);
    NN_REQUIRE_CLOSE(values(shared_kv.output), values(got.output), 1e-6, 1e-6);
  }
  SECTION("a fully masked row gives NaN, as PyTorch") {
    std::vector<bool> pad(static_cast<size_t>(batch * s_len), false);
    for (int64_t j = 0; j < s_len; ++j)
      pad[static_cast<size_t>(s_len + j)] = true;  // batch 1: every key
    auto got = mha.forward(tq, tk, tv, kiln::from_vector(pad, {batch, s_len}));
    std::vector<double> out = values(got.output);
    CHECK(std::isfinite(out[0]));
    CHECK(std::isnan(out[static_cast<size_t>(e)]));  // (l 0, n 1)
  }
}

TEST_CASE("nn TransformerEncoderLayer has PyTorch names, shapes and eval determinism",
          "[nn][transformer]") {
  kiln::manual_seed(51);
  nn::TransformerEncoderLayer layer(8, 2, 16, 0.1);
  std::vector<std::string> names;
  for (auto& [n, _] : layer.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                          "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                          "linear1.weight", "linear1.bias", "linear2.weight",
                                          "linear2.bias", "norm1.weight", "norm1.bias",
                                          "norm2.weight", "norm2.bias"});
  Tensor src = kiln::randn({5, 3, 8});
  Tensor train_a = layer.forward(src), train_b = layer.forward(src);
  REQUIRE(train_a.shape() == Shape{5, 3, 8});
  CHECK(values(train_a) != values(train_b));  // dropout draws fresh masks
  layer.eval();
  Tensor eval_a = layer.forward(src), eval_b = layer.forward(src);
  CHECK(values(eval_a) == values(eval_b));
  // Post-norm output: every token normalised (norm2 has unit weight and zero bias here).
  std::vector<double> y = values(eval_a);
  for (size_t t = 0; t < 15; ++t) {
    double m = 0, v = 0;
    for (size_t k = 0; k < 8; ++k) m += y[t * 8 + k] / 8;
    for (size_t k = 0; k < 8; ++k) v += (y[t * 8 + k] - m) * (y[t * 8 + k] - m) / 8;
    CHECK(m == Approx(0).margin(1e-5));
    CHECK(v == Approx(1).epsilon(1e-3));
  }
  // The eval forward equals the composition written out with the submodules.
  auto attn = layer.self_attn->forward(src, src, src, Tensor(), false).output;
  Tensor x = layer.norm1->forward(src + attn);
  Tensor ff = layer.linear2->forward(kiln::relu(layer.linear1->forward(x)));
  NN_REQUIRE_CLOSE(values(eval_a), values(layer.norm2->forward(x + ff)), 1e-5, 1e-5);

  // Pre-norm, GELU, batch-first, with a causal mask: shapes and finite values.
  nn::TransformerEncoderLayer pre(8, 4, 32, 0.0, nn::Activation::GELU, 1e-5, true, true);
  pre.eval();
  Tensor out = pre.forward(kiln::randn({2, 6, 8}), Tensor(), Tensor(), true);
  REQUIRE(out.shape() == Shape{2, 6, 8});
  for (double v : values(out)) REQUIRE(std::isfinite(v));
  // Causality: changing the last token leaves the earlier outputs unchanged.
  Tensor in = kiln::randn({1, 6, 8});
  Tensor changed = kiln::concat({kiln::slice(in, 1, 0, 5), kiln::randn({1, 1, 8})}, 1);
  std::vector<double> a = values(pre.forward(in, Tensor(), Tensor(), true));
  std::vector<double> b = values(pre.forward(changed, Tensor(), Tensor(), true));
  NN_REQUIRE_CLOSE(std::vector<double>(b.begin(), b.begin() + 40),
                   std::vector<double>(a.begin(), a.begin() + 40), 1e-6, 1e-6);
  CHECK(b[45] != a[45]);
}
