// RNN, GRU and LSTM (bidirectional, proj_size): forward values against a float64 loop
// written here from PyTorch's equations, gradients against central differences, parameter
// names, shapes and initialisation, dropout between layers, errors, and PyTorch parity
// (outputs and gradients) where torch is importable.
#include "test_nn_support.h"
#include "torch_parity.h"

using namespace nn_test;
using Catch::Contains;
namespace nn = kiln::nn;

namespace {


enum class Kind { RnnTanh, RnnRelu, Gru, Lstm };

struct Reference {
  Matrix output, h, c;  // output [T, B, D*H_out]; h [L*D, B, H_out]; c [L*D, B, H]
};

// PyTorch's recurrences written out, time-major; h0/c0 [L*D, B, *] (c0 only for LSTM).
Reference reference(const nn::RNNBase& m, Kind kind, const Matrix& x, int64_t steps, int64_t batch,
                    const Matrix& h0, const Matrix& c0) {
  const int64_t hs = m.hidden_size, ho = m.output_size(), dirs = m.num_directions();
  Matrix seq = x;
  int64_t in = m.input_size;
  Reference r;
  for (int64_t k = 0; k < m.num_layers; ++k) {
    Matrix next(static_cast<size_t>(steps * batch * dirs * ho));
    for (int64_t d = 0; d < dirs; ++d) {
      const auto& l = m.layers()[static_cast<size_t>(k * dirs + d)];
      Matrix w_ih = values(l.w_ih), w_hh = values(l.w_hh);
      Matrix b_ih = l.b_ih.defined() ? values(l.b_ih) : Matrix(),
             b_hh = l.b_hh.defined() ? values(l.b_hh) : Matrix();
      const int64_t at = k * dirs + d;
      Matrix h(h0.begin() + at * batch * ho, h0.begin() + (at + 1) * batch * ho);
      Matrix c = kind == Kind::Lstm
                     ? Matrix(c0.begin() + at * batch * hs, c0.begin() + (at + 1) * batch * hs)
                     : Matrix();
      const int64_t gates = kind == Kind::Lstm ? 4 : kind == Kind::Gru ? 3 : 1;
      for (int64_t i = 0; i < steps; ++i) {
        const int64_t t = d == 0 ? i : steps - 1 - i;
        Matrix xt(seq.begin() + t * batch * in, seq.begin() + (t + 1) * batch * in);
        Matrix a = affine(xt, batch, in, w_ih, b_ih, gates * hs),
               g = affine(h, batch, ho, w_hh, b_hh, gates * hs);
        Matrix hn(static_cast<size_t>(batch * hs));
        for (int64_t n = 0; n < batch; ++n)
          for (int64_t j = 0; j < hs; ++j) {
            auto ga = [&](int q) { return a[static_cast<size_t>(n * gates * hs + q * hs + j)]; };
            auto gg = [&](int q) { return g[static_cast<size_t>(n * gates * hs + q * hs + j)]; };
            size_t s = static_cast<size_t>(n * hs + j);
            if (kind == Kind::RnnTanh) {
              hn[s] = std::tanh(ga(0) + gg(0));
            } else if (kind == Kind::RnnRelu) {
              hn[s] = std::max(0.0, ga(0) + gg(0));
            } else if (kind == Kind::Gru) {
              double rr = sigmoid(ga(0) + gg(0)), z = sigmoid(ga(1) + gg(1));
              double nn_ = std::tanh(ga(2) + rr * gg(2));
              hn[s] = (1 - z) * nn_ + z * h[s];
            } else {
              double ig = sigmoid(ga(0) + gg(0)), f = sigmoid(ga(1) + gg(1)),
                     cg = std::tanh(ga(2) + gg(2)), o = sigmoid(ga(3) + gg(3));
              c[s] = f * c[s] + ig * cg;
              hn[s] = o * std::tanh(c[s]);
            }
          }
        h = l.w_hr.defined() ? affine(hn, batch, hs, values(l.w_hr), Matrix(), ho) : hn;
        for (int64_t n = 0; n < batch; ++n)
          for (int64_t j = 0; j < ho; ++j)
            next[static_cast<size_t>(((t * batch + n) * dirs + d) * ho + j)] =
                h[static_cast<size_t>(n * ho + j)];
      }
      r.h.insert(r.h.end(), h.begin(), h.end());
      r.c.insert(r.c.end(), c.begin(), c.end());
    }
    seq = next;
    in = dirs * ho;
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

std::shared_ptr<nn::RNNBase> build(Kind kind, int64_t in, int64_t hs, int64_t layers, bool bias,
                                   bool batch_first, bool bidi, int64_t proj = 0) {
  switch (kind) {
    case Kind::RnnTanh:
      return nn::make<nn::RNN>(in, hs, layers, nn::RNNNonlinearity::Tanh, bias, batch_first, 0.0,
                               bidi);
    case Kind::RnnRelu:
      return nn::make<nn::RNN>(in, hs, layers, nn::RNNNonlinearity::ReLU, bias, batch_first, 0.0,
                               bidi);
    case Kind::Gru:
      return nn::make<nn::GRU>(in, hs, layers, bias, batch_first, 0.0, bidi);
    case Kind::Lstm:
      return nn::make<nn::LSTM>(in, hs, layers, bias, batch_first, 0.0, bidi, proj);
  }
  return nullptr;
}

// Runs any of the three with optional initial states: {output, h_n[, c_n]}.
std::vector<Tensor> forward(nn::RNNBase& m, const Tensor& x, const Tensor& h0 = Tensor(),
                            const Tensor& c0 = Tensor()) {
  if (auto* lstm = dynamic_cast<nn::LSTM*>(&m)) {
    auto [o, h, c] = lstm->forward(x, h0, c0);
    return {o, h, c};
  }
  if (auto* gru = dynamic_cast<nn::GRU*>(&m)) {
    auto [o, h] = gru->forward(x, h0);
    return {o, h};
  }
  auto [o, h] = dynamic_cast<nn::RNN&>(m).forward(x, h0);
  return {o, h};
}

const char* kind_name(Kind k) {
  return k == Kind::RnnTanh   ? "RNN tanh"
         : k == Kind::RnnRelu ? "RNN relu"
         : k == Kind::Gru     ? "GRU"
                              : "LSTM";
}

}  // namespace

TEST_CASE("nn RNN, GRU and LSTM match PyTorch's equations over layers, directions and layouts",
          "[nn][rnn]") {
  kiln::manual_seed(61);
  const int64_t steps = 4, batch = 3, in = 3, hs = 5;
  for (Kind kind : {Kind::RnnTanh, Kind::RnnRelu, Kind::Gru, Kind::Lstm}) {
    for (auto [layers, bidi, batch_first, bias, proj] :
         {std::tuple<int64_t, bool, bool, bool, int64_t>{1, false, false, true, 0},
          {2, false, true, true, 0},
          {2, true, false, true, 0},
          {1, true, true, false, 0},
          {2, true, true, true, 3},
          {1, false, false, true, 2}}) {
      if (proj > 0 && kind != Kind::Lstm) continue;
      INFO(kind_name(kind) << " layers " << layers << " bidirectional " << bidi << " batch_first "
                           << batch_first << " bias " << bias << " proj_size " << proj);
      auto m = build(kind, in, hs, layers, bias, batch_first, bidi, proj);
      m->to(DType::Float64);
      const int64_t dirs = bidi ? 2 : 1, ho = proj > 0 ? proj : hs;
      Matrix x = random_values(steps * batch * in, 5),
             h0 = random_values(layers * dirs * batch * ho, 6),
             c0 = random_values(layers * dirs * batch * hs, 7);
      Reference want = reference(*m, kind, x, steps, batch, h0, c0);
      Tensor input = batch_first
                         ? make(swap01(x, steps, batch, in), {batch, steps, in}, DType::Float64)
                         : make(x, {steps, batch, in}, DType::Float64);
      std::vector<Tensor> got = forward(
          *m, input, make(h0, {layers * dirs, batch, ho}, DType::Float64),
          kind == Kind::Lstm ? make(c0, {layers * dirs, batch, hs}, DType::Float64) : Tensor());
      REQUIRE(got[0].shape() ==
              (batch_first ? Shape{batch, steps, dirs * ho} : Shape{steps, batch, dirs * ho}));
      REQUIRE(got[1].shape() == Shape{layers * dirs, batch, ho});
      NN_REQUIRE_CLOSE(values(got[0]),
                       batch_first ? swap01(want.output, steps, batch, dirs * ho) : want.output,
                       1e-12, 1e-10);
      NN_REQUIRE_CLOSE(values(got[1]), want.h, 1e-12, 1e-10);
      if (kind == Kind::Lstm) {
        REQUIRE(got[2].shape() == Shape{layers * dirs, batch, hs});
        NN_REQUIRE_CLOSE(values(got[2]), want.c, 1e-12, 1e-10);
      }
      // Omitted initial states are zeros; unbatched input drops the batch dimension.
      Matrix x1 = random_values(steps * in, 8);
      Reference want1 = reference(*m, kind, x1, steps, 1, Matrix(layers * dirs * ho, 0.0),
                                  Matrix(layers * dirs * hs, 0.0));
      std::vector<Tensor> got1 = forward(*m, make(x1, {steps, in}, DType::Float64));
      REQUIRE(got1[0].shape() == Shape{steps, dirs * ho});
      REQUIRE(got1[1].shape() == Shape{layers * dirs, ho});
      NN_REQUIRE_CLOSE(values(got1[0]), want1.output, 1e-12, 1e-10);
      NN_REQUIRE_CLOSE(values(got1[1]), want1.h, 1e-12, 1e-10);
      // float32 (the usual case) runs its own kernels: the same values to its precision.
      m->to(DType::Float32);
      std::vector<Tensor> got32 =
          forward(*m, kiln::cast(input, DType::Float32), make(h0, {layers * dirs, batch, ho}),
                  kind == Kind::Lstm ? make(c0, {layers * dirs, batch, hs}) : Tensor());
      NN_REQUIRE_CLOSE(values(got32[0]), values(got[0]), 1e-5, 1e-5);
      NN_REQUIRE_CLOSE(values(got32[1]), want.h, 1e-5, 1e-5);
    }
  }
}

TEST_CASE("nn recurrent layers have PyTorch's parameter names, shapes and initialisation",
          "[nn][rnn]") {
  kiln::manual_seed(62);
  auto names = [](const nn::Module& m) {
    std::vector<std::string> out;
    for (auto& [n, t] : m.named_parameters()) out.push_back(n + kiln::shape_str(t.shape()));
    return out;
  };
  CHECK(names(nn::GRU(3, 4, 1, true, false, 0.0, true)) ==
        std::vector<std::string>{"weight_ih_l0[12, 3]", "weight_hh_l0[12, 4]", "bias_ih_l0[12]",
                                 "bias_hh_l0[12]", "weight_ih_l0_reverse[12, 3]",
                                 "weight_hh_l0_reverse[12, 4]", "bias_ih_l0_reverse[12]",
                                 "bias_hh_l0_reverse[12]"});
  CHECK(names(nn::RNN(3, 4, 2, nn::RNNNonlinearity::ReLU, false)) ==
        std::vector<std::string>{"weight_ih_l0[4, 3]", "weight_hh_l0[4, 4]", "weight_ih_l1[4, 4]",
                                 "weight_hh_l1[4, 4]"});
  CHECK(names(nn::LSTM(3, 6, 2, true, false, 0.0, true, 2)) ==
        std::vector<std::string>{"weight_ih_l0[24, 3]",
                                 "weight_hh_l0[24, 2]",
                                 "bias_ih_l0[24]",
                                 "bias_hh_l0[24]",
                                 "weight_hr_l0[2, 6]",
                                 "weight_ih_l0_reverse[24, 3]",
                                 "weight_hh_l0_reverse[24, 2]",
                                 "bias_ih_l0_reverse[24]",
                                 "bias_hh_l0_reverse[24]",
                                 "weight_hr_l0_reverse[2, 6]",
                                 "weight_ih_l1[24, 4]",
                                 "weight_hh_l1[24, 2]",
                                 "bias_ih_l1[24]",
                                 "bias_hh_l1[24]",
                                 "weight_hr_l1[2, 6]",
                                 "weight_ih_l1_reverse[24, 4]",
                                 "weight_hh_l1_reverse[24, 2]",
                                 "bias_ih_l1_reverse[24]",
                                 "bias_hh_l1_reverse[24]",
                                 "weight_hr_l1_reverse[2, 6]"});
  // Every parameter U(-1/sqrt(H), 1/sqrt(H)): within the bound and spread over it.
  nn::GRU gru(8, 16, 2, true, false, 0.0, true);
  const double bound = 0.25;
  for (auto& [n, t] : gru.named_parameters()) {
    INFO(n);
    std::vector<double> v = values(t);
    double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    CHECK(hi - lo > (v.size() > 100 ? 1.8 : 1.0) * bound);
  }
  std::ostringstream repr;
  repr << nn::LSTM(3, 6, 2, true, true, 0.0, true, 2);
  CHECK(repr.str() ==
        "LSTM(3, 6, num_layers=2, batch_first=true, bidirectional=true, proj_size=2)");
}

TEST_CASE("nn recurrent dropout applies between layers in training only", "[nn][rnn]") {
  kiln::manual_seed(63);
  // With p = 1 the second layer sees zeros in training, so its output ignores the input;
  // in eval mode (and in the single-layer case, where dropout never applies) it does not.
  nn::GRU gru(3, 4, 2, true, false, 1.0);
  Tensor a = kiln::randn({5, 2, 3}), b = kiln::randn({5, 2, 3});
  CHECK(values(gru.forward(a).output) == values(gru.forward(b).output));
  gru.eval();
  CHECK(values(gru.forward(a).output) != values(gru.forward(b).output));
  nn::RNN single(3, 4, 1, nn::RNNNonlinearity::Tanh, true, false, 1.0);
  CHECK(values(single.forward(a).output) != values(single.forward(b).output));
}

TEST_CASE("nn gradient check of RNN, GRU and bidirectional projected LSTM", "[nn][grad][rnn]") {
  kiln::manual_seed(64);
  for (Kind kind : {Kind::RnnTanh, Kind::RnnRelu, Kind::Gru, Kind::Lstm}) {
    INFO(kind_name(kind));
    auto m = build(kind, 2, 3, 2, true, true, true, kind == Kind::Lstm ? 2 : 0);
    m->to(DType::Float64);
    const int64_t ho = m->output_size();
    Tensor x = make(random_values(2 * 3 * 2, 11), {2, 3, 2}, DType::Float64);
    Tensor h0 = make(random_values(4 * 2 * ho, 12), {4, 2, ho}, DType::Float64);
    Tensor c0 = make(random_values(4 * 2 * 3, 13), {4, 2, 3}, DType::Float64);
    std::vector<Tensor> params = m->parameters();
    for (Tensor* t : {&x, &h0, &c0}) {
      if (t == &c0 && kind != Kind::Lstm) continue;
      t->requires_grad_();
      params.push_back(*t);
    }
    auto loss = [&] {
      std::vector<Tensor> out = forward(*m, x, h0, kind == Kind::Lstm ? c0 : Tensor());
      Tensor total;
      for (size_t i = 0; i < out.size(); ++i) {
        Tensor r = make(random_values(out[i].numel(), 20 + i), out[i].shape(), DType::Float64);
        Tensor term = kiln::sum(out[i] * r);
        total = total.defined() ? total + term : term;
      }
      return total;
    };
    REQUIRE(gradient_check(loss, params) == "");
  }
}

TEST_CASE("nn recurrent layers reject bad settings, inputs and states", "[nn][errors][rnn]") {
  REQUIRE_THROWS_AS(nn::LSTM(4, 6, 1, true, false, 0.0, false, 6), kiln::ValueError);
  REQUIRE_THROWS_WITH(nn::LSTM(4, 6, 1, true, false, 0.0, false, 6),
                      Contains("[LSTM] proj_size must be 0 (no projection) or in [1, hidden_size "
                               "6), got 6"));
  REQUIRE_THROWS_WITH(nn::GRU(4, 0), Contains("[GRU] hidden_size must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(nn::RNN(4, 6, 1, nn::RNNNonlinearity::Tanh, true, false, -0.5),
                      Contains("[RNN] dropout must be in [0, 1], got -0.5"));
  nn::GRU gru(4, 6, 2, true, true, 0.0, true);
  REQUIRE_THROWS_AS(gru.forward(kiln::zeros({2, 5, 3})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(gru.forward(kiln::zeros({2, 5, 3})),
                      Contains("[GRU] expected input [B, T, 4] (or unbatched [T, 4]) with "
                               "input_size 4, got float32[2, 5, 3]"));
  REQUIRE_THROWS_WITH(gru.forward(kiln::zeros({2, 5, 4}), kiln::zeros({2, 2, 6})),
                      Contains("[GRU] expected initial states of shape [4, 2, 6] [2*num_layers, "
                               "B, hidden_size], got float32[2, 2, 6] (h0)"));
  REQUIRE_THROWS_AS(gru.forward(kiln::zeros({2, 5, 4}, DType::Float64)), kiln::DTypeError);
  REQUIRE_THROWS_AS(gru.forward(kiln::zeros({2, 0, 4})), kiln::ShapeError);
  nn::LSTM proj(4, 6, 1, true, false, 0.0, false, 2);
  REQUIRE_THROWS_WITH(
      proj.forward(kiln::zeros({5, 2, 4}), kiln::zeros({1, 2, 6}), kiln::zeros({1, 2, 6})),
      Contains("[LSTM] expected initial states of shape [1, 2, 2] [num_layers, B, proj_size], got "
               "float32[1, 2, 6] (h0)"));
  REQUIRE_THROWS_WITH(
      proj.forward(kiln::zeros({5, 2, 4}), kiln::zeros({1, 2, 2}), kiln::zeros({1, 2, 2})),
      Contains("[LSTM] expected initial states of shape [1, 2, 6] [num_layers, B, hidden_size], "
               "got float32[1, 2, 2] (c0)"));
}

TEST_CASE("nn recurrent layers match PyTorch outputs and gradients", "[nn][rnn][torch]") {
  kiln::manual_seed(65);
  std::vector<std::shared_ptr<nn::Module>> keep;
  std::vector<TorchCase> cases;
  struct Config {
    Kind kind;
    int64_t layers;
    bool bias, batch_first, bidi;
    int64_t proj;
    bool with_state, unbatched;
  };
  for (Config c : {Config{Kind::RnnTanh, 2, true, false, true, 0, true, false},
                   Config{Kind::RnnRelu, 1, false, true, false, 0, false, false},
                   Config{Kind::Gru, 2, true, true, true, 0, true, false},
                   Config{Kind::Gru, 1, true, false, false, 0, false, true},
                   Config{Kind::Lstm, 2, true, false, true, 3, true, false},
                   Config{Kind::Lstm, 2, false, true, false, 2, false, false},
                   Config{Kind::Lstm, 1, true, false, true, 0, true, true}}) {
    const int64_t in = 3, hs = 4, t = 5, b = 2, dirs = c.bidi ? 2 : 1;
    auto m = build(c.kind, in, hs, c.layers, c.bias, c.batch_first, c.bidi, c.proj);
    m->to(DType::Float64);
    keep.push_back(m);
    const int64_t ho = m->output_size();
    auto tf = [](bool v) { return v ? "True" : "False"; };
    std::string args = std::to_string(in) + ", " + std::to_string(hs) +
                       ", num_layers=" + std::to_string(c.layers) + ", bias=" + tf(c.bias) +
                       ", batch_first=" + tf(c.batch_first) + ", bidirectional=" + tf(c.bidi);
    std::string module =
        c.kind == Kind::Lstm  ? "nn.LSTM(" + args + ", proj_size=" + std::to_string(c.proj) + ")"
        : c.kind == Kind::Gru ? "nn.GRU(" + args + ")"
                              : "nn.RNN(" + args + ", nonlinearity='" +
                                    (c.kind == Kind::RnnRelu ? "relu" : "tanh") + "')";
    Shape xs = c.unbatched ? Shape{t, in} : (c.batch_first ? Shape{b, t, in} : Shape{t, b, in});
    auto state = [&](int64_t size, uint64_t seed) {
      Shape s = c.unbatched ? Shape{c.layers * dirs, size} : Shape{c.layers * dirs, b, size};
      return make(random_values(kiln::numel(s), seed), s, DType::Float64);
    };
    TorchCase tc;
    tc.label = module;
    tc.module = module;
    tc.layer = m.get();
    tc.inputs = {make(random_values(kiln::numel(xs), 3), xs, DType::Float64)};
    if (c.with_state) {
      tc.inputs.push_back(state(ho, 4));
      if (c.kind == Kind::Lstm) tc.inputs.push_back(state(hs, 5));
    }
    tc.call = !c.with_state          ? "m(x[0])"
              : c.kind == Kind::Lstm ? "m(x[0], (x[1], x[2]))"
                                     : "m(x[0], x[1])";
    nn::RNNBase* raw = m.get();
    const bool with_state = c.with_state;
    tc.run = [raw, with_state](const std::vector<Tensor>& x) {
      return with_state ? forward(*raw, x[0], x[1], x.size() > 2 ? x[2] : Tensor())
                        : forward(*raw, x[0]);
    };
    cases.push_back(std::move(tc));
  }
  NN_REQUIRE_TORCH_PARITY(cases);
}

TEST_CASE("nn GRU and bidirectional LSTM run under autocast close to float32", "[nn][rnn][amp]") {
  kiln::manual_seed(66);
  Tensor x = kiln::randn({4, 2, 3});
  nn::GRU gru(3, 5, 2);
  nn::LSTM lstm(3, 5, 1, true, false, 0.0, true, 2);
  std::vector<double> gru32 = values(gru.forward(x).output),
                      lstm32 = values(lstm.forward(x).output);
  kiln::amp::autocast scope;  // CPU: bfloat16 products
  NN_REQUIRE_CLOSE(values(gru.forward(x).output), gru32, 5e-2, 5e-2);
  NN_REQUIRE_CLOSE(values(lstm.forward(x).output), lstm32, 5e-2, 5e-2);
}
