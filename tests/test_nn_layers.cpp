// Forward values of the nn layers against float64 loop references written here: Linear,
// Conv2d (stride, padding, dilation, groups), pooling, BatchNorm (train/eval and running
// statistics), LayerNorm, Embedding, Dropout and the activations. Inputs are random float32
// values; the reference reads the same float32 values as doubles. Tolerance: 1e-5 absolute
// plus 1e-5 relative unless stated.
#include "jit/blas.h"
#include "jit/fuse.h"
#include "jit/kernel_ir.h"
#include "jit/library_conv.h"
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;
namespace F = kiln::nn::F;

namespace {

// x [N, C, H, W] as doubles, indexable as x(n, c, h, w) with zero outside.
struct Image {
  std::vector<double> v;
  int64_t n, c, h, w;
  explicit Image(const Tensor& t)
      : v(values(t)), n(t.size(0)), c(t.size(1)), h(t.size(2)), w(t.size(3)) {}
  double at(int64_t in, int64_t ic, int64_t ih, int64_t iw, double fill = 0) const {
    if (ih < 0 || ih >= h || iw < 0 || iw >= w) return fill;
    return v[static_cast<size_t>(((in * c + ic) * h + ih) * w + iw)];
  }
};

std::vector<double> conv_reference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   nn::Size2 s, nn::Size2 p, nn::Size2 d, int64_t groups) {
  Image img(x);
  std::vector<double> w = values(weight);
  std::vector<double> b = bias.defined() ? values(bias) : std::vector<double>(weight.size(0), 0.0);
  int64_t o = weight.size(0), cg = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  int64_t oh = (img.h + 2 * p.h - d.h * (kh - 1) - 1) / s.h + 1;
  int64_t ow = (img.w + 2 * p.w - d.w * (kw - 1) - 1) / s.w + 1;
  int64_t og = o / groups;
  std::vector<double> out;
  for (int64_t n = 0; n < img.n; ++n)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = b[static_cast<size_t>(oc)];
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t e = 0; e < kw; ++e)
                acc +=
                    img.at(n, oc / og * cg + c, i * s.h - p.h + a * d.h, j * s.w - p.w + e * d.w) *
                    w[static_cast<size_t>(((oc * cg + c) * kh + a) * kw + e)];
          out.push_back(acc);
        }
  return out;
}

}  // namespace

TEST_CASE("nn Linear matches a float64 loop for 2-D and 3-D inputs", "[nn][linear]") {
  kiln::manual_seed(1);
  nn::Linear lin(7, 5);
  for (Shape shape : {Shape{4, 7}, Shape{2, 3, 7}, Shape{7}}) {
    Tensor x = kiln::randn(shape);
    Tensor y = lin.forward(x);
    Shape want_shape = shape;
    want_shape.back() = 5;
    REQUIRE(y.shape() == want_shape);
    std::vector<double> xv = values(x), w = values(lin.weight), b = values(lin.bias), want;
    for (int64_t r = 0; r < x.numel() / 7; ++r)
      for (int64_t o = 0; o < 5; ++o) {
        double acc = b[static_cast<size_t>(o)];
        for (int64_t k = 0; k < 7; ++k)
          acc += xv[static_cast<size_t>(r * 7 + k)] * w[static_cast<size_t>(o * 7 + k)];
        want.push_back(acc);
      }
    NN_REQUIRE_CLOSE(values(y), want, 1e-5, 1e-5);
  }
  nn::Linear no_bias(3, 2, false);
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.parameters().size() == 1);
}

TEST_CASE("nn Conv2d matches a float64 loop across stride, padding, dilation and groups",
          "[nn][conv]") {
  struct Case {
    int64_t in, out;
    nn::Size2 k, s, p, d;
    int64_t groups;
    bool bias;
    int64_t h, w;
  };
  std::vector<Case> cases = {
      {3, 4, 3, 1, 0, 1, 1, true, 6, 7},                      // plain valid convolution
      {3, 4, 3, 2, 1, 1, 1, true, 7, 6},                      // strided, padded
      {2, 3, 3, 1, 2, 2, 1, false, 6, 6},                     // dilated, no bias
      {4, 6, 3, 1, 1, 1, 2, true, 5, 5},                      // two groups
      {4, 4, 3, 1, 1, 1, 4, true, 5, 6},                      // depthwise
      {3, 2, {3, 2}, {2, 1}, {1, 0}, {1, 2}, 1, true, 7, 8},  // rectangular everything
      {2, 2, 1, 1, 0, 1, 1, true, 3, 3},                      // 1x1
  };
  kiln::manual_seed(7);
  for (const Case& c : cases) {
    INFO("in " << c.in << " out " << c.out << " kernel " << c.k.str() << " stride " << c.s.str()
               << " padding " << c.p.str() << " dilation " << c.d.str() << " groups " << c.groups);
    nn::Conv2d conv(c.in, c.out, c.k, c.s, c.p, c.d, c.groups, c.bias);
    Tensor x = kiln::randn({2, c.in, c.h, c.w});
    Tensor y = conv.forward(x);
    int64_t oh = (c.h + 2 * c.p.h - c.d.h * (c.k.h - 1) - 1) / c.s.h + 1;
    int64_t ow = (c.w + 2 * c.p.w - c.d.w * (c.k.w - 1) - 1) / c.s.w + 1;
    REQUIRE(y.shape() == Shape{2, c.out, oh, ow});
    NN_REQUIRE_CLOSE(values(y), conv_reference(x, conv.weight, conv.bias, c.s, c.p, c.d, c.groups),
                     1e-5, 1e-5);
  }
  // An unbatched [C, H, W] input gives [O, H', W'].
  nn::Conv2d conv(2, 3, 3, 1, 1);
  Tensor x = kiln::randn({2, 5, 5});
  Tensor y = conv.forward(x);
  REQUIRE(y.shape() == Shape{3, 5, 5});
  NN_REQUIRE_CLOSE(values(y),
                   conv_reference(kiln::unsqueeze(x, 0), conv.weight, conv.bias, 1, 1, 1, 1), 1e-5,
                   1e-5);
}

TEST_CASE("nn max and average pooling match float64 loops", "[nn][pool]") {
  kiln::manual_seed(3);
  Tensor x = kiln::randn({2, 3, 7, 6});
  Image img(x);
  struct Case {
    nn::Size2 k, s, p;
    bool ceil;
  };
  for (Case c : {Case{2, 2, 0, false}, Case{3, 2, 1, false}, Case{3, 2, 1, true},
                 Case{{3, 2}, {1, 2}, {1, 0}, false}, Case{2, 2, 0, true}}) {
    INFO("kernel " << c.k.str() << " stride " << c.s.str() << " padding " << c.p.str() << " ceil "
                   << c.ceil);
    auto size = [&](int64_t in, int64_t k, int64_t s, int64_t p) {
      int64_t span = in + 2 * p - k;
      int64_t out = (c.ceil ? (span + s - 1) / s : span / s) + 1;
      if (c.ceil && (out - 1) * s >= in + p) --out;
      return out;
    };
    int64_t oh = size(7, c.k.h, c.s.h, c.p.h), ow = size(6, c.k.w, c.s.w, c.p.w);
    for (bool include_pad : {true, false}) {
      std::vector<double> want_max, want_avg;
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t ch = 0; ch < 3; ++ch)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              double m = -INFINITY, s = 0;
              int64_t h0 = i * c.s.h - c.p.h, w0 = j * c.s.w - c.p.w;
              int64_t h1 = std::min(h0 + c.k.h, 7 + c.p.h), w1 = std::min(w0 + c.k.w, 6 + c.p.w);
              int64_t count = (h1 - h0) * (w1 - w0);
              if (!include_pad) {
                count = (std::min<int64_t>(h1, 7) - std::max<int64_t>(h0, 0)) *
                        (std::min<int64_t>(w1, 6) - std::max<int64_t>(w0, 0));
              }
              for (int64_t a = 0; a < c.k.h; ++a)
                for (int64_t b = 0; b < c.k.w; ++b) {
                  m = std::max(m, img.at(n, ch, h0 + a, w0 + b, -INFINITY));
                  s += img.at(n, ch, h0 + a, w0 + b);
                }
              want_max.push_back(m);
              want_avg.push_back(s / static_cast<double>(count));
            }
      Tensor avg = nn::AvgPool2d(c.k, c.s, c.p, c.ceil, include_pad).forward(x);
      REQUIRE(avg.shape() == Shape{2, 3, oh, ow});
      NN_REQUIRE_CLOSE(values(avg), want_avg, 1e-6, 1e-5);
      if (include_pad) {
        Tensor mx = nn::MaxPool2d(c.k, c.s, c.p, 1, c.ceil).forward(x);
        REQUIRE(mx.shape() == Shape{2, 3, oh, ow});
        NN_REQUIRE_CLOSE(values(mx), want_max, 0, 0);
      }
    }
  }
  // Adaptive average pooling: windows [floor(i*H/o), ceil((i+1)*H/o)).
  for (nn::Size2 out : {nn::Size2{3, 4}, nn::Size2{1, 1}, nn::Size2{7, 3}}) {
    INFO("output " << out.str());
    std::vector<double> want;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t i = 0; i < out.h; ++i)
          for (int64_t j = 0; j < out.w; ++j) {
            int64_t h0 = i * 7 / out.h, h1 = ((i + 1) * 7 + out.h - 1) / out.h;
            int64_t w0 = j * 6 / out.w, w1 = ((j + 1) * 6 + out.w - 1) / out.w;
            double s = 0;
            for (int64_t a = h0; a < h1; ++a)
              for (int64_t b = w0; b < w1; ++b) s += img.at(n, ch, a, b);
            want.push_back(s / static_cast<double>((h1 - h0) * (w1 - w0)));
          }
    NN_REQUIRE_CLOSE(values(nn::AdaptiveAvgPool2d(out).forward(x)), want, 1e-6, 1e-5);
  }
}

TEST_CASE("nn BatchNorm training, running statistics and eval match PyTorch semantics",
          "[nn][batchnorm]") {
  kiln::manual_seed(9);
  // BatchNorm2d on [N, C, H, W] and BatchNorm1d on [N, C] and [N, C, L]: the same per-channel rule.
  for (Shape shape : {Shape{4, 3, 2, 5}, Shape{6, 3}, Shape{4, 3, 5}}) {
    INFO("input " << kiln::shape_str(shape));
    std::shared_ptr<nn::BatchNorm> bn;
    if (shape.size() == 4) {
      bn = std::make_shared<nn::BatchNorm2d>(3, 1e-5, 0.1);
    } else {
      bn = std::make_shared<nn::BatchNorm1d>(3, 1e-5, 0.1);
    }
    nn::init::uniform_(bn->weight, 0.5, 1.5);
    nn::init::uniform_(bn->bias, -1, 1);
    std::vector<double> w = values(bn->weight), b = values(bn->bias);
    std::vector<double> rm(3, 0.0), rv(3, 1.0);
    const int64_t n = shape[0], inner = kiln::numel(shape) / (shape[0] * 3);
    auto idx = [&](int64_t i, int64_t c, int64_t k) {
      return static_cast<size_t>((i * 3 + c) * inner + k);
    };
    for (int step = 0; step < 2; ++step) {
      Tensor x = kiln::randn(shape) * 2.0 + 0.5;
      std::vector<double> xv = values(x), want(xv.size());
      for (int64_t c = 0; c < 3; ++c) {
        double m = 0, v = 0, count = static_cast<double>(n * inner);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < inner; ++k) m += xv[idx(i, c, k)];
        m /= count;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < inner; ++k) v += (xv[idx(i, c, k)] - m) * (xv[idx(i, c, k)] - m);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < inner; ++k)
            want[idx(i, c, k)] = (xv[idx(i, c, k)] - m) / std::sqrt(v / count + 1e-5) * w[c] + b[c];
        rm[c] = 0.9 * rm[c] + 0.1 * m;
        rv[c] = 0.9 * rv[c] + 0.1 * v / (count - 1);  // unbiased for the running estimate
      }
      NN_REQUIRE_CLOSE(values(bn->forward(x)), want, 1e-5, 1e-5);
    }
    NN_REQUIRE_CLOSE(values(bn->running_mean), rm, 1e-6, 1e-5);
    NN_REQUIRE_CLOSE(values(bn->running_var), rv, 1e-6, 1e-5);
    CHECK(bn->num_batches_tracked.item<int64_t>() == 2);

    bn->eval();
    Tensor x = kiln::randn(shape);
    std::vector<double> xv = values(x), want(xv.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t k = 0; k < inner; ++k)
          want[idx(i, c, k)] = (xv[idx(i, c, k)] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c];
    NN_REQUIRE_CLOSE(values(bn->forward(x)), want, 1e-5, 1e-5);
    // Eval mode leaves the statistics alone.
    NN_REQUIRE_CLOSE(values(bn->running_mean), rm, 1e-6, 1e-5);
    CHECK(bn->num_batches_tracked.item<int64_t>() == 2);
  }
  // Without running statistics, eval mode still normalises by the batch.
  nn::BatchNorm1d plain(2, 1e-5, 0.1, false, false);
  CHECK(plain.parameters().empty());
  CHECK(plain.buffers().empty());
  plain.eval();
  Tensor y = plain.forward(make({1, 2, 3, 6}, {2, 2}));
  NN_REQUIRE_CLOSE(values(y), (std::vector<double>{-1, -1, 1, 1}), 1e-4, 0);
}

TEST_CASE("nn LayerNorm matches a float64 loop over the trailing dimensions", "[nn][layernorm]") {
  kiln::manual_seed(4);
  nn::LayerNorm ln({3, 4}, 1e-5);
  nn::init::uniform_(ln.weight, 0.5, 1.5);
  nn::init::uniform_(ln.bias, -1, 1);
  Tensor x = kiln::randn({2, 5, 3, 4}) * 3.0 + 1.0;
  std::vector<double> xv = values(x), w = values(ln.weight), b = values(ln.bias), want(xv.size());
  for (size_t r = 0; r < 10; ++r) {
    double m = 0, v = 0;
    for (size_t k = 0; k < 12; ++k) m += xv[r * 12 + k];
    m /= 12;
    for (size_t k = 0; k < 12; ++k) v += (xv[r * 12 + k] - m) * (xv[r * 12 + k] - m);
    v /= 12;
    for (size_t k = 0; k < 12; ++k)
      want[r * 12 + k] = (xv[r * 12 + k] - m) / std::sqrt(v + 1e-5) * w[k] + b[k];
  }
  NN_REQUIRE_CLOSE(values(ln.forward(x)), want, 1e-5, 1e-5);
  nn::LayerNorm bare({4}, 1e-5, false);
  CHECK(nn::LayerNorm(4).weight.shape() == Shape{4});
  CHECK(bare.parameters().empty());
}

TEST_CASE("nn Embedding looks up rows and checks indices at evaluation", "[nn][embedding]") {
  kiln::manual_seed(6);
  nn::Embedding emb(10, 3, -1);
  CHECK(emb.padding_idx == 9);
  Tensor idx = kiln::from_vector<int64_t>({1, 9, 4, 1, 0, 7}, {2, 3});
  Tensor y = emb.forward(idx);
  REQUIRE(y.shape() == Shape{2, 3, 3});
  std::vector<double> w = values(emb.weight), want;
  for (int64_t i : {1, 9, 4, 1, 0, 7})
    for (int64_t j = 0; j < 3; ++j) want.push_back(w[static_cast<size_t>(i * 3 + j)]);
  NN_REQUIRE_CLOSE(values(y), want, 0, 0);
  for (int64_t j = 0; j < 3; ++j) CHECK(w[static_cast<size_t>(27 + j)] == 0.0);
  // Int32 indices work too; an index out of range fails when evaluated.
  Tensor y32 = emb.forward(kiln::from_vector<int32_t>({4}, {1}));
  NN_REQUIRE_CLOSE(values(y32), (std::vector<double>{w[12], w[13], w[14]}), 0, 0);
  Tensor bad = emb.forward(kiln::from_vector<int64_t>({3, 10}, {2}));
  REQUIRE_THROWS_AS(bad.eval(), kiln::IndexError);
  // The padding row gets no gradient; the others accumulate one per use.
  kiln::sum(emb.forward(idx)).backward();
  std::vector<double> g = values(emb.weight.grad());
  std::vector<double> counts = {1, 2, 0, 0, 1, 0, 0, 1, 0, 0};
  for (size_t r = 0; r < 10; ++r)
    for (size_t j = 0; j < 3; ++j) CHECK(g[r * 3 + j] == counts[r]);
}

TEST_CASE("nn Dropout rate, scaling, eval identity and reproducibility", "[nn][dropout]") {
  const int64_t n = 200000;
  Tensor x = kiln::full({n}, 3.0);
  nn::Dropout drop(0.3);
  kiln::manual_seed(21);
  std::vector<double> y = values(drop.forward(x));
  int64_t zeros = 0;
  for (double v : y) {
    if (v == 0.0) {
      ++zeros;
    } else {
      REQUIRE(v == static_cast<double>(3.0f * static_cast<float>(1.0 / 0.7)));
    }
  }
  // Binomial standard deviation here is about 0.001: 0.01 is ten of them.
  CHECK(std::fabs(static_cast<double>(zeros) / n - 0.3) < 0.01);
  kiln::manual_seed(21);
  CHECK(values(drop.forward(x)) == y);
  kiln::manual_seed(22);
  CHECK(values(drop.forward(x)) != y);
  // Two draws in a row differ (the generator advances).
  kiln::manual_seed(21);
  Tensor a = drop.forward(x), b = drop.forward(x);
  CHECK(values(a) != values(b));
  drop.eval();
  CHECK(drop.forward(x).node() == x.node());
  drop.train();
  CHECK(values(nn::Dropout(1.0).forward(x)) == std::vector<double>(n, 0.0));
  CHECK(nn::Dropout(0.0).forward(x).node() == x.node());
}

TEST_CASE("nn activations match their float64 formulas", "[nn][activation]") {
  std::vector<double> v = random_values(200, 17);
  for (double& e : v) e *= 6;
  Tensor x = make(v, {200});
  auto check = [&](nn::UnaryModule&& m, const std::function<double(double)>& f) {
    INFO(m.name());
    std::vector<double> want;
    for (double e : v) want.push_back(f(static_cast<float>(e)));
    NN_REQUIRE_CLOSE(values(m.forward(x)), want, 2e-6, 2e-6);
  };
  check(nn::ReLU(), [](double e) { return e > 0 ? e : 0.0; });
  check(nn::GELU(), [](double e) { return 0.5 * e * (1 + std::erf(e / std::sqrt(2.0))); });
  check(nn::GELU(F::GeluApproximation::Tanh), [](double e) {
    return 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)));
  });
  check(nn::SiLU(), [](double e) { return e / (1 + std::exp(-e)); });
  check(nn::Tanh(), [](double e) { return std::tanh(e); });
  check(nn::Sigmoid(), [](double e) { return 1 / (1 + std::exp(-e)); });
  check(nn::LeakyReLU(0.2), [](double e) { return e > 0 ? e : 0.2 * e; });
  // Softmax over the last dimension of [20, 10].
  Tensor s = nn::Softmax(-1).forward(kiln::reshape(x, {20, 10}));
  std::vector<double> sv = values(s);
  for (size_t r = 0; r < 20; ++r) {
    double m = -INFINITY, z = 0;
    for (size_t k = 0; k < 10; ++k)
      m = std::max(m, static_cast<double>(static_cast<float>(v[r * 10 + k])));
    for (size_t k = 0; k < 10; ++k) z += std::exp(static_cast<float>(v[r * 10 + k]) - m);
    for (size_t k = 0; k < 10; ++k)
      CHECK(sv[r * 10 + k] ==
            Approx(std::exp(static_cast<float>(v[r * 10 + k]) - m) / z).margin(1e-6));
  }
}

TEST_CASE("conv2d gathers its patches without divisions and multiplies them on the library",
          "[nn][conv][matmul]") {
  // float64: float32 convolutions run on the library convolution where it is built in
  // (tests/test_conv_library.cpp), which stores no patches.
  const kiln::DType dtype = kiln::jit::cpu_conv_available(kiln::DType::Float32)
                                ? kiln::DType::Float64
                                : kiln::DType::Float32;
  if (!kiln::jit::cpu_gemm_available(dtype)) {
    WARN("no GEMM library in this build: skipped");
    return;
  }
  for (int64_t groups : {1, 2}) {
    INFO("groups " << groups);
    kiln::manual_seed(6);
    kiln::Tensor x = kiln::randn({2, 4, 9, 9}, dtype).eval();
    kiln::Tensor w = kiln::randn({6, 4 / groups, 3, 3}, dtype).eval();
    kiln::Tensor y = kiln::nn::F::conv2d(x, w, kiln::Tensor(), {2, 2}, {1, 1}, {1, 1}, groups);
    // The patches' kernel reads x at affine coordinates: its index maps hold no // or %
    // (the flat [M, K] map needed four per element, at integer-division speed).
    std::vector<kiln::Node*> outs{y.node().get()};
    kiln::jit::FusionPlan plan = kiln::jit::fuse(kiln::pending_subgraph(outs), {outs[0]});
    bool saw_patches = false;
    for (const kiln::jit::FusionGroup& g : plan.groups) {
      if (g.library || g.root->shape.size() < 6) continue;
      saw_patches = true;
      const kiln::jit::KernelIR ir = kiln::jit::lower(g).ir;
      for (const kiln::jit::IrValue& v : ir.values) {
        INFO(v.index.str());
        CHECK(v.index.str().find("//") == std::string::npos);
        CHECK(v.index.str().find(" % ") == std::string::npos);
      }
    }
    CHECK(saw_patches);
    y.eval();
    CHECK(kiln::jit::last_eval_stats().library_calls >= 1);
  }
}
