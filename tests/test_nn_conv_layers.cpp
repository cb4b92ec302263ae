// Conv1d and ConvTranspose2d (modules and functionals): forward values against float64 loops
// written from PyTorch's definitions, the transpose as conv2d's adjoint, gradients against
// central differences, PyTorch's names, shapes and initialisation, errors, and PyTorch
// parity (outputs and gradients) where torch is importable.
#include "test_nn_support.h"
#include "torch_parity.h"

using namespace nn_test;
using Catch::Contains;
namespace nn = kiln::nn;
namespace F = kiln::nn::F;

namespace {


struct Conv1dArgs {
  int64_t stride, padding, dilation, groups;
};

// y[n, o, i] = b[o] + sum_{c in o's group, k} x[n, c, i s - p + k d] w[o, c', k].
Matrix conv1d_reference(const Matrix& x, int64_t n, int64_t c, int64_t l, const Matrix& w,
                        int64_t o, int64_t k, const Matrix& b, Conv1dArgs a, int64_t* out_len) {
  const int64_t cg = c / a.groups, og = o / a.groups;
  const int64_t ol = (l + 2 * a.padding - a.dilation * (k - 1) - 1) / a.stride + 1;
  *out_len = ol;
  Matrix y(static_cast<size_t>(n * o * ol));
  for (int64_t b_ = 0; b_ < n; ++b_)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < ol; ++i) {
        double acc = b.empty() ? 0.0 : b[static_cast<size_t>(oc)];
        const int64_t g = oc / og;
        for (int64_t ci = 0; ci < cg; ++ci)
          for (int64_t kk = 0; kk < k; ++kk) {
            int64_t at = i * a.stride - a.padding + kk * a.dilation;
            if (at < 0 || at >= l) continue;
            acc += x[static_cast<size_t>((b_ * c + g * cg + ci) * l + at)] *
                   w[static_cast<size_t>((oc * cg + ci) * k + kk)];
          }
        y[static_cast<size_t>((b_ * o + oc) * ol + i)] = acc;
      }
  return y;
}

struct TransposeArgs {
  int64_t stride, padding, output_padding, dilation, groups;
};

// y[n, g og + o', h s - p + a d, w s - p + b d] += x[n, g cg + c, h, w] w[g cg + c, o', a, b]:
// every input pixel scatters its kernel-weighted contribution (PyTorch's definition).
Matrix transpose_reference(const Matrix& x, int64_t n, int64_t c, int64_t h, int64_t wd,
                           const Matrix& w, int64_t og, int64_t kh, int64_t kw, const Matrix& b,
                           TransposeArgs a, int64_t* oh_out, int64_t* ow_out) {
  const int64_t cg = c / a.groups, o = og * a.groups;
  const int64_t oh =
      (h - 1) * a.stride - 2 * a.padding + a.dilation * (kh - 1) + a.output_padding + 1;
  const int64_t ow =
      (wd - 1) * a.stride - 2 * a.padding + a.dilation * (kw - 1) + a.output_padding + 1;
  *oh_out = oh;
  *ow_out = ow;
  Matrix y(static_cast<size_t>(n * o * oh * ow), 0.0);
  for (int64_t b_ = 0; b_ < n; ++b_)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < oh * ow; ++i)
        y[static_cast<size_t>((b_ * o + oc) * oh * ow + i)] =
            b.empty() ? 0.0 : b[static_cast<size_t>(oc)];
  for (int64_t b_ = 0; b_ < n; ++b_)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < wd; ++j)
          for (int64_t op = 0; op < og; ++op)
            for (int64_t p = 0; p < kh; ++p)
              for (int64_t q = 0; q < kw; ++q) {
                int64_t yi = i * a.stride - a.padding + p * a.dilation;
                int64_t yj = j * a.stride - a.padding + q * a.dilation;
                if (yi < 0 || yi >= oh || yj < 0 || yj >= ow) continue;
                int64_t oc = (ci / cg) * og + op;
                y[static_cast<size_t>(((b_ * o + oc) * oh + yi) * ow + yj)] +=
                    x[static_cast<size_t>(((b_ * c + ci) * h + i) * wd + j)] *
                    w[static_cast<size_t>(((ci * og + op) * kh + p) * kw + q)];
              }
  return y;
}

Tensor f64(const Matrix& v, const Shape& s) { return make(v, s, DType::Float64); }

}  // namespace

TEST_CASE("nn conv1d matches the definition over strides, paddings, dilations and groups",
          "[nn][conv]") {
  const int64_t n = 2, c = 4, l = 9, o = 8;
  for (Conv1dArgs a :
       {Conv1dArgs{1, 0, 1, 1}, {2, 1, 1, 2}, {1, 3, 2, 1}, {3, 2, 2, 2}, {2, 0, 1, 4}}) {
    for (int64_t k : {1, 3}) {
      INFO("stride " << a.stride << " padding " << a.padding << " dilation " << a.dilation
                     << " groups " << a.groups << " kernel " << k);
      Matrix x = random_values(n * c * l, 1), w = random_values(o * c / a.groups * k, 2),
             b = random_values(o, 3);
      int64_t ol = 0;
      Matrix want = conv1d_reference(x, n, c, l, w, o, k, b, a, &ol);
      Tensor got = F::conv1d(f64(x, {n, c, l}), f64(w, {o, c / a.groups, k}), f64(b, {o}), a.stride,
                             a.padding, a.dilation, a.groups);
      REQUIRE(got.shape() == Shape{n, o, ol});
      NN_REQUIRE_CLOSE(values(got), want, 1e-12, 1e-12);
      NN_REQUIRE_CLOSE(values(F::conv1d(make(x, {n, c, l}), make(w, {o, c / a.groups, k}),
                                        make(b, {o}), a.stride, a.padding, a.dilation, a.groups)),
                       want, 1e-5, 1e-5);
      // Unbatched [C, L] and no bias.
      Matrix x1(x.begin(), x.begin() + c * l);
      Matrix want1 = conv1d_reference(x1, 1, c, l, w, o, k, {}, a, &ol);
      Tensor got1 = F::conv1d(f64(x1, {c, l}), f64(w, {o, c / a.groups, k}), Tensor(), a.stride,
                              a.padding, a.dilation, a.groups);
      REQUIRE(got1.shape() == Shape{o, ol});
      NN_REQUIRE_CLOSE(values(got1), want1, 1e-12, 1e-12);
    }
  }
  // The module runs the functional on its parameters.
  kiln::manual_seed(81);
  nn::Conv1d conv(4, 6, 3, 2, 1, 1, 2);
  conv.to(DType::Float64);
  Matrix x = random_values(2 * 4 * 7, 4);
  int64_t ol = 0;
  Matrix want =
      conv1d_reference(x, 2, 4, 7, values(conv.weight), 6, 3, values(conv.bias), {2, 1, 1, 2}, &ol);
  NN_REQUIRE_CLOSE(values(conv.forward(f64(x, {2, 4, 7}))), want, 1e-12, 1e-12);
}

TEST_CASE("nn conv_transpose2d matches the definition and is conv2d's adjoint", "[nn][conv]") {
  const int64_t n = 2, c = 4, h = 4, w = 5;
  for (TransposeArgs a : {TransposeArgs{1, 0, 0, 1, 1},
                          {2, 0, 0, 1, 1},
                          {2, 1, 1, 1, 2},
                          {3, 1, 2, 1, 1},
                          {1, 2, 0, 2, 1},
                          {2, 1, 1, 2, 4},
                          {1, 0, 1, 2, 2}}) {
    for (auto [kh, kw] : {std::pair<int64_t, int64_t>{3, 3}, {2, 3}, {1, 1}}) {
      // Settings whose output would be empty are errors (tested below).
      if ((h - 1) * a.stride - 2 * a.padding + a.dilation * (std::min(kh, kw) - 1) +
              a.output_padding + 1 <
          1)
        continue;
      INFO("stride " << a.stride << " padding " << a.padding << " output_padding "
                     << a.output_padding << " dilation " << a.dilation << " groups " << a.groups
                     << " kernel " << kh << "x" << kw);
      const int64_t og = 3;
      Matrix x = random_values(n * c * h * w, 5), wt = random_values(c * og * kh * kw, 6),
             b = random_values(og * a.groups, 7);
      int64_t oh = 0, ow = 0;
      Matrix want = transpose_reference(x, n, c, h, w, wt, og, kh, kw, b, a, &oh, &ow);
      Tensor xt = f64(x, {n, c, h, w}), weight = f64(wt, {c, og, kh, kw});
      Tensor got = F::conv_transpose2d(xt, weight, f64(b, {og * a.groups}), a.stride, a.padding,
                                       a.output_padding, a.groups, a.dilation);
      REQUIRE(got.shape() == Shape{n, og * a.groups, oh, ow});
      NN_REQUIRE_CLOSE(values(got), want, 1e-12, 1e-12);
      // float32 runs its own kernels (and products): the same values to float32 precision.
      auto f32 = [](const Tensor& t) { return kiln::cast(t, DType::Float32); };
      NN_REQUIRE_CLOSE(
          values(F::conv_transpose2d(f32(xt), f32(weight), f32(f64(b, {og * a.groups})), a.stride,
                                     a.padding, a.output_padding, a.groups, a.dilation)),
          want, 1e-5, 1e-5);
      // With output_padding >= stride (allowed when < dilation) conv2d of the output has
      // an extra row: the adjoint identity below is for the other settings.
      if (a.output_padding >= a.stride) continue;
      // Adjoint: <conv2d(y, W), x> = <y, conv_transpose2d(x, W)> for y of the transpose's
      // output shape (conv2d's weight [O, C/g, kh, kw] is the transpose's [C, O/g, kh, kw]
      // read the other way: here C = 4 transposed channels are conv2d's outputs).
      Tensor y = f64(random_values(n * og * a.groups * oh * ow, 8), {n, og * a.groups, oh, ow});
      Tensor forward = F::conv2d(y, weight, Tensor(), a.stride, a.padding, a.dilation, a.groups);
      REQUIRE(forward.shape() == Shape{n, c, h, w});
      Tensor no_bias = F::conv_transpose2d(xt, weight, Tensor(), a.stride, a.padding,
                                           a.output_padding, a.groups, a.dilation);
      double lhs = kiln::sum(forward * xt).item<double>(),
             rhs = kiln::sum(y * no_bias).item<double>();
      CHECK(lhs == Approx(rhs).epsilon(1e-12));
    }
  }
  // Unbatched input and rectangular strides, paddings and output paddings.
  Matrix x = random_values(2 * 3 * 4, 9), wt = random_values(2 * 2 * 3 * 2, 10);
  Tensor got = F::conv_transpose2d(f64(x, {2, 3, 4}), f64(wt, {2, 2, 3, 2}), Tensor(),
                                   nn::Size2(2, 3), nn::Size2(1, 0), nn::Size2(1, 2));
  REQUIRE(got.shape() == Shape{2, (3 - 1) * 2 - 2 + 2 + 1 + 1, (4 - 1) * 3 + 1 + 2 + 1});
}

TEST_CASE("nn Conv1d and ConvTranspose2d have PyTorch's names, shapes and initialisation",
          "[nn][conv]") {
  kiln::manual_seed(82);
  nn::ConvTranspose2d up(6, 8, {3, 2}, 2, 1, 1, 2);
  REQUIRE(up.weight.shape() == Shape{6, 4, 3, 2});
  REQUIRE(up.bias.shape() == Shape{8});
  std::vector<std::string> names;
  for (auto& [name, _] : up.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"weight", "bias"});
  // PyTorch's bound 1/sqrt(fan_in) with fan_in = weight.size(1) * kernel area = 4 * 6.
  auto check_bound = [](const Tensor& t, double bound) {
    std::vector<double> v = values(t);
    double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    CHECK(hi - lo > bound);
  };
  check_bound(up.weight, 1 / std::sqrt(24.0));
  check_bound(up.bias, 1 / std::sqrt(24.0));
  nn::Conv1d conv(6, 3, 5, 1, 0, 1, 3);
  REQUIRE(conv.weight.shape() == Shape{3, 2, 5});
  check_bound(conv.weight, 1 / std::sqrt(10.0));
  CHECK_FALSE(nn::Conv1d(2, 2, 3, 1, 0, 1, 1, false).bias.defined());
  CHECK(nn::ConvTranspose2d(2, 2, 3, 1, 0, 0, 1, false).parameters().size() == 1);
  std::ostringstream repr;
  repr << up << "\n" << conv;
  CHECK(repr.str() ==
        "ConvTranspose2d(6, 8, kernel_size=(3, 2), stride=2, padding=1, output_padding=1, "
        "groups=2)\nConv1d(6, 3, kernel_size=5, stride=1, groups=3)");
  // Shapes of the module forward, batched and not.
  REQUIRE(up.forward(kiln::randn({2, 6, 4, 5})).shape() == Shape{2, 8, 8, 9});
  REQUIRE(up.forward(kiln::randn({6, 4, 5})).shape() == Shape{8, 8, 9});
  REQUIRE(conv.forward(kiln::randn({3, 6, 9})).shape() == Shape{3, 3, 5});
}

TEST_CASE("nn gradient check of Conv1d and ConvTranspose2d", "[nn][grad][conv]") {
  kiln::manual_seed(83);
  auto leaf = [](const Shape& s, uint64_t seed) {
    Tensor t = f64(random_values(kiln::numel(s), seed), s);
    t.requires_grad_();
    return t;
  };
  auto project = [](const Tensor& y, uint64_t seed) {
    return kiln::sum(y * f64(random_values(y.numel(), seed), y.shape()));
  };
  for (auto [stride, padding, dilation, groups] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 1, 1, 2}, {1, 2, 2, 1}}) {
    INFO("conv1d stride " << stride << " padding " << padding << " dilation " << dilation);
    nn::Conv1d conv(4, 4, 3, stride, padding, dilation, groups);
    conv.to(DType::Float64);
    Tensor x = leaf({2, 4, 7}, 1);
    std::vector<Tensor> params = conv.parameters();
    params.push_back(x);
    REQUIRE(gradient_check([&] { return project(conv.forward(x), 2); }, params) == "");
  }
  for (TransposeArgs a : {TransposeArgs{2, 1, 1, 1, 2}, {1, 0, 0, 2, 1}, {3, 2, 1, 1, 1}}) {
    INFO("transpose stride " << a.stride << " padding " << a.padding << " output_padding "
                             << a.output_padding << " dilation " << a.dilation);
    nn::ConvTranspose2d up(4, 2, 3, a.stride, a.padding, a.output_padding, a.groups, true,
                           a.dilation);
    up.to(DType::Float64);
    Tensor x = leaf({2, 4, 3, 4}, 3);
    std::vector<Tensor> params = up.parameters();
    params.push_back(x);
    REQUIRE(gradient_check([&] { return project(up.forward(x), 4); }, params) == "");
  }
}

TEST_CASE("nn Conv1d and ConvTranspose2d reject bad settings and inputs", "[nn][errors][conv]") {
  REQUIRE_THROWS_WITH(nn::Conv1d(5, 4, 3, 1, 0, 1, 2),
                      Contains("[Conv1d] in_channels 5 is not divisible by groups 2"));
  REQUIRE_THROWS_WITH(nn::Conv1d(4, 4, 0), Contains("[Conv1d] kernel_size must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(nn::ConvTranspose2d(4, 6, 3, 1, 0, 0, 4),
                      Contains("[ConvTranspose2d] out_channels 6 is not divisible by groups 4"));
  REQUIRE_THROWS_AS(nn::ConvTranspose2d(4, 4, 3, 2, 0, 2), kiln::ValueError);
  REQUIRE_THROWS_WITH(nn::ConvTranspose2d(4, 4, 3, 2, 0, 2),
                      Contains("[ConvTranspose2d] output_padding 2 must be smaller than either "
                               "stride 2 or dilation 1"));
  nn::Conv1d conv(4, 4, 3);
  REQUIRE_THROWS_AS(conv.forward(kiln::zeros({2, 3, 8})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(conv.forward(kiln::zeros({2, 3, 8})),
                      Contains("[Conv1d] expected input with 4 channels (in_channels) in "
                               "dimension 1, got float32[2, 3, 8]"));
  REQUIRE_THROWS_WITH(conv.forward(kiln::zeros({2, 4, 8, 8})),
                      Contains("[Conv1d] expected a 3-D input [N, C, L] or 2-D [C, L], got "
                               "float32[2, 4, 8, 8]"));
  REQUIRE_THROWS_AS(conv.forward(kiln::zeros({2, 4, 2})), kiln::ShapeError);
  REQUIRE_THROWS_AS(conv.forward(kiln::zeros({2, 4, 8}, DType::Float64)), kiln::DTypeError);
  nn::ConvTranspose2d up(4, 2, 3);
  REQUIRE_THROWS_WITH(up.forward(kiln::zeros({1, 2, 5, 5})),
                      Contains("[ConvTranspose2d] expected input with 4 channels (in_channels) "
                               "in dimension 1, got float32[1, 2, 5, 5]"));
  REQUIRE_THROWS_AS(up.forward(kiln::zeros({4, 5})), kiln::ShapeError);
  REQUIRE_THROWS_WITH(F::conv_transpose2d(kiln::zeros({1, 4, 5, 5}), kiln::zeros({3, 2, 3, 3})),
                      Contains("[conv_transpose2d] expected input with 3 channels"));
  REQUIRE_THROWS_WITH(
      F::conv_transpose2d(kiln::zeros({1, 4, 1, 1}), kiln::zeros({4, 2, 1, 1}), Tensor(), 1, 1),
      Contains("[conv_transpose2d] input float32[1, 4, 1, 1] with padding 1 gives an empty "
               "output"));
  REQUIRE_THROWS_WITH(F::conv1d(kiln::zeros({1, 4, 5}), kiln::zeros({4, 4, 3, 3})),
                      Contains("[conv1d] expected a 3-D weight"));
  REQUIRE_THROWS_WITH(F::conv1d(kiln::zeros({1, 4, 5}), kiln::zeros({4, 4, 3}), kiln::zeros({3})),
                      Contains("[conv1d] expected a bias of shape [4], got float32[3]"));
  REQUIRE_THROWS_WITH(
      F::conv1d(kiln::zeros({1, 4, 5}), kiln::zeros({4, 4, 3}, DType::Float64)),
      Contains("[conv1d] expected weight of dtype float32 (the input's), got float64[4, 4, 3]"));
  REQUIRE_THROWS_WITH(
      F::conv1d(kiln::zeros({1, 4, 5}), kiln::zeros({3, 2, 3}), Tensor(), 1, 0, 1, 2),
      Contains("[conv1d] out_channels 3 is not divisible by groups 2"));
  REQUIRE_THROWS_WITH(F::conv1d(kiln::zeros({1, 4, 5}), kiln::zeros({4, 4, 3}), Tensor(), 0),
                      Contains("[conv1d] stride must be >= 1, got 0"));
}

TEST_CASE("nn Conv1d and ConvTranspose2d match PyTorch outputs and gradients",
          "[nn][conv][torch]") {
  kiln::manual_seed(84);
  std::vector<std::shared_ptr<nn::Module>> keep;
  std::vector<TorchCase> cases;
  for (auto [k, s, p, d, g, bias] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>{3, 1, 0, 1, 1, true},
        {3, 2, 1, 1, 2, true},
        {2, 3, 2, 2, 1, false},
        {5, 1, 2, 1, 4, true}}) {
    auto conv = nn::make<nn::Conv1d>(4, 8, k, s, p, d, g, bias);
    conv->to(DType::Float64);
    keep.push_back(conv);
    TorchCase tc;
    tc.module = "nn.Conv1d(4, 8, " + std::to_string(k) + ", stride=" + std::to_string(s) +
                ", padding=" + std::to_string(p) + ", dilation=" + std::to_string(d) +
                ", groups=" + std::to_string(g) + ", bias=" + (bias ? "True" : "False") + ")";
    tc.label = tc.module;
    tc.layer = conv.get();
    tc.call = "m(x[0])";
    tc.inputs = {f64(random_values(2 * 4 * 11, 1), {2, 4, 11})};
    nn::Conv1d* raw = conv.get();
    tc.run = [raw](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{raw->forward(x[0])};
    };
    cases.push_back(std::move(tc));
  }
  for (auto [kh, kw, s, p, op, d, g, bias] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>{
            3, 3, 1, 0, 0, 1, 1, true},
        {4, 4, 2, 1, 0, 1, 1, true},
        {3, 2, 2, 1, 1, 1, 2, false},
        {3, 3, 3, 2, 2, 2, 1, true},
        {2, 3, 1, 1, 1, 2, 4, true}}) {
    auto up = nn::make<nn::ConvTranspose2d>(4, 8, nn::Size2(kh, kw), s, p, op, g, bias, d);
    up->to(DType::Float64);
    keep.push_back(up);
    TorchCase tc;
    tc.module = "nn.ConvTranspose2d(4, 8, (" + std::to_string(kh) + ", " + std::to_string(kw) +
                "), stride=" + std::to_string(s) + ", padding=" + std::to_string(p) +
                ", output_padding=" + std::to_string(op) + ", groups=" + std::to_string(g) +
                ", bias=" + (bias ? "True" : "False") + ", dilation=" + std::to_string(d) + ")";
    tc.label = tc.module;
    tc.layer = up.get();
    tc.call = "m(x[0])";
    tc.inputs = {f64(random_values(2 * 4 * 5 * 6, 2), {2, 4, 5, 6})};
    nn::ConvTranspose2d* raw = up.get();
    tc.run = [raw](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{raw->forward(x[0])};
    };
    cases.push_back(std::move(tc));
  }
  // The functionals, weight and bias differentiated as inputs; unbatched inputs.
  TorchCase f1;
  f1.label = "F.conv_transpose2d unbatched";
  f1.call =
      "F.conv_transpose2d(x[0], x[1], x[2], stride=(2, 1), padding=(0, 1), "
      "output_padding=(1, 0), groups=2, dilation=(1, 2))";
  f1.inputs = {f64(random_values(4 * 3 * 5, 3), {4, 3, 5}),
               f64(random_values(4 * 3 * 2 * 3, 4), {4, 3, 2, 3}), f64(random_values(6, 5), {6})};
  f1.run = [](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{F::conv_transpose2d(
        x[0], x[1], x[2], nn::Size2(2, 1), nn::Size2(0, 1), nn::Size2(1, 0), 2, nn::Size2(1, 2))};
  };
  cases.push_back(std::move(f1));
  TorchCase f2;
  f2.label = "F.conv1d unbatched";
  f2.call = "F.conv1d(x[0], x[1], x[2], stride=2, padding=1, dilation=2, groups=2)";
  f2.inputs = {f64(random_values(4 * 9, 6), {4, 9}), f64(random_values(6 * 2 * 3, 7), {6, 2, 3}),
               f64(random_values(6, 8), {6})};
  f2.run = [](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{F::conv1d(x[0], x[1], x[2], 2, 1, 2, 2)};
  };
  cases.push_back(std::move(f2));
  NN_REQUIRE_TORCH_PARITY(cases);
}

TEST_CASE("nn conv1d and conv_transpose2d run in bfloat16 under autocast", "[nn][conv][amp]") {
  kiln::manual_seed(85);
  Tensor seq = kiln::randn({2, 4, 9}), k1 = kiln::randn({6, 2, 3}), b1 = kiln::randn({6});
  Tensor img = kiln::randn({2, 4, 5, 5}), kt = kiln::randn({4, 3, 3, 3}), bt = kiln::randn({3});
  std::vector<double> want1 = values(F::conv1d(seq, k1, b1, 2, 1, 1, 2));
  std::vector<double> want2 = values(F::conv_transpose2d(img, kt, bt, 2, 1, 1));
  kiln::amp::autocast scope;  // CPU: bfloat16
  Tensor got1 = F::conv1d(seq, k1, b1, 2, 1, 1, 2),
         got2 = F::conv_transpose2d(img, kt, bt, 2, 1, 1);
  CHECK(got1.dtype() == DType::BFloat16);
  CHECK(got2.dtype() == DType::BFloat16);
  NN_REQUIRE_CLOSE(values(got1), want1, 1e-1, 3e-2);
  NN_REQUIRE_CLOSE(values(got2), want2, 1e-1, 3e-2);
}
