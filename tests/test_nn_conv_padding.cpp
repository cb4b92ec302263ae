// Convolution padding as PyTorch spells it: padding "same" / "valid", padding_mode
// (reflect, replicate, circular) through F::pad, and ConvTranspose2d's output_size. Values
// against float64 loops written from PyTorch's definitions, errors, and PyTorch parity
// (outputs and gradients) where torch is importable.
#include "test_nn_support.h"
#include "torch_parity.h"

using namespace nn_test;
using Catch::Contains;
namespace nn = kiln::nn;
namespace F = kiln::nn::F;
using nn::PaddingMode;

namespace {

// The source index that torch.nn.functional.pad reads for output position j of an axis of
// size n padded by `before`.
int64_t source_index(int64_t j, int64_t before, int64_t n, PaddingMode mode) {
  int64_t i = j - before;
  switch (mode) {
    case PaddingMode::Reflect:
      while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
      return i;
    case PaddingMode::Replicate:
      return i < 0 ? 0 : (i >= n ? n - 1 : i);
    case PaddingMode::Circular:
      return ((i % n) + n) % n;
    case PaddingMode::Zeros:
      return i >= 0 && i < n ? i : -1;
  }
  return -1;
}

// Pads a row-major [a, b] matrix with loops: the reference for F::pad on two axes.
std::vector<double> pad_reference(const std::vector<double>& x, int64_t a, int64_t b,
                                  std::pair<int64_t, int64_t> pa, std::pair<int64_t, int64_t> pb,
                                  PaddingMode mode) {
  const int64_t oa = a + pa.first + pa.second, ob = b + pb.first + pb.second;
  std::vector<double> out(static_cast<size_t>(oa * ob));
  for (int64_t i = 0; i < oa; ++i)
    for (int64_t j = 0; j < ob; ++j) {
      const int64_t si = source_index(i, pa.first, a, mode);
      const int64_t sj = source_index(j, pb.first, b, mode);
      out[static_cast<size_t>(i * ob + j)] =
          si < 0 || sj < 0 ? 0.0 : x[static_cast<size_t>(si * b + sj)];
    }
  return out;
}

// conv2d of one image [c, h, w] with weight [o, c, kh, kw], stride 1, the given per-side
// pads filled by `mode`: float64 loops.
std::vector<double> conv_reference(const std::vector<double>& x, int64_t c, int64_t h, int64_t w,
                                   const std::vector<double>& wt, int64_t o, int64_t kh, int64_t kw,
                                   nn::Size2 dil, std::pair<int64_t, int64_t> ph,
                                   std::pair<int64_t, int64_t> pw, PaddingMode mode) {
  const int64_t hp = h + ph.first + ph.second, wp = w + pw.first + pw.second;
  const int64_t oh = hp - dil.h * (kh - 1), ow = wp - dil.w * (kw - 1);
  std::vector<double> out(static_cast<size_t>(o * oh * ow), 0.0);
  for (int64_t oc = 0; oc < o; ++oc)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double sum = 0;
        for (int64_t ic = 0; ic < c; ++ic)
          for (int64_t p = 0; p < kh; ++p)
            for (int64_t q = 0; q < kw; ++q) {
              const int64_t si = source_index(i + p * dil.h, ph.first, h, mode);
              const int64_t sj = source_index(j + q * dil.w, pw.first, w, mode);
              if (si < 0 || sj < 0) continue;
              sum += x[static_cast<size_t>((ic * h + si) * w + sj)] *
                     wt[static_cast<size_t>(((oc * c + ic) * kh + p) * kw + q)];
            }
        out[static_cast<size_t>((oc * oh + i) * ow + j)] = sum;
      }
  return out;
}

}  // namespace

TEST_CASE("F pad reflects, replicates and wraps as torch's pad", "[nn][conv]") {
  const int64_t a = 3, b = 5;
  const std::vector<double> xs = random_values(a * b, 91);
  const Tensor x = make(xs, {a, b}, DType::Float64);
  struct Case {
    PaddingMode mode;
    std::pair<int64_t, int64_t> pa, pb;
  };
  for (Case c :
       {Case{PaddingMode::Reflect, {2, 1}, {4, 3}}, Case{PaddingMode::Replicate, {0, 4}, {6, 1}},
        Case{PaddingMode::Circular, {3, 2}, {5, 5}}, Case{PaddingMode::Zeros, {1, 2}, {0, 3}}}) {
    INFO("mode " << static_cast<int>(c.mode));
    const Tensor y = F::pad(x, {c.pa, c.pb}, c.mode);
    REQUIRE(y.shape() == Shape{a + c.pa.first + c.pa.second, b + c.pb.first + c.pb.second});
    CHECK(values(y) == pad_reference(xs, a, b, c.pa, c.pb, c.mode));  // copies: exact
  }
  // Gradients: each input element receives the sum over the positions that read it.
  std::vector<Tensor> params{x.detach().requires_grad_()};
  const Tensor weights = make(random_values(7 * 11, 92), {7, 11}, DType::Float64);
  REQUIRE(gradient_check(
              [&] {
                return sum(F::pad(params[0], {{2, 2}, {3, 3}}, PaddingMode::Reflect) * weights);
              },
              params) == "");
}

TEST_CASE("F pad refuses pads its mode cannot fill", "[nn][conv][errors]") {
  const Tensor x = kiln::randn({2, 3});
  CHECK_THROWS_WITH(F::pad(x, {{0, 0}, {3, 0}}, PaddingMode::Reflect),
                    Contains("[pad] reflect padding must be smaller than the axis"));
  CHECK_THROWS_WITH(F::pad(x, {{0, 0}, {0, 4}}, PaddingMode::Circular),
                    Contains("circular padding must not exceed"));
  CHECK_THROWS_WITH(F::pad(x, {{0, 0}, {-1, 0}}, PaddingMode::Replicate), Contains("pads >= 0"));
  CHECK_THROWS_WITH(F::pad(x, {{1, 1}}, PaddingMode::Reflect),
                    Contains("one (before, after) pair per axis"));
  CHECK_THROWS_WITH(F::pad(kiln::randn({2, 0}), {{0, 0}, {1, 0}}, PaddingMode::Replicate),
                    Contains("non-empty axis"));
}

TEST_CASE("Conv2d with padding same and every padding mode matches float64 loops", "[nn][conv]") {
  kiln::manual_seed(93);
  const int64_t c = 2, h = 5, w = 6, o = 3;
  const std::vector<double> xs = random_values(c * h * w, 94);
  const Tensor x = make(xs, {1, c, h, w}, DType::Float64);
  struct Case {
    nn::Size2 kernel, dilation;
    nn::ConvPadding padding;
    PaddingMode mode;
  };
  for (Case k : {Case{{3, 3}, 1, "same", PaddingMode::Zeros},
                 Case{{2, 4}, {2, 1}, "same", PaddingMode::Zeros},  // odd totals: more after
                 Case{{3, 2}, 1, "same", PaddingMode::Reflect},
                 Case{{2, 3}, 1, {1, 2}, PaddingMode::Replicate},
                 Case{{3, 3}, {1, 2}, "same", PaddingMode::Circular},
                 Case{{2, 2}, 1, "valid", PaddingMode::Reflect}}) {
    INFO("kernel " << k.kernel.str() << " padding " << k.padding.str() << " mode "
                   << static_cast<int>(k.mode));
    nn::Conv2d conv(c, o, k.kernel, 1, k.padding, k.dilation, 1, false, k.mode);
    conv.to(DType::Float64);
    const auto ph = k.padding.along(k.padding.size.h, k.kernel.h, k.dilation.h);
    const auto pw = k.padding.along(k.padding.size.w, k.kernel.w, k.dilation.w);
    const std::vector<double> want = conv_reference(xs, c, h, w, values(conv.weight), o, k.kernel.h,
                                                    k.kernel.w, k.dilation, ph, pw, k.mode);
    const Tensor y = conv.forward(x);
    if (k.padding.same) REQUIRE(y.shape() == Shape{1, o, h, w});
    NN_REQUIRE_CLOSE(values(y), want, 1e-12, 1e-12);
  }
  // Conv1d is conv2d over a unit height: the same rule on one axis.
  nn::Conv1d line(c, o, 4, 1, "same", 1, 1, false, PaddingMode::Reflect);
  line.to(DType::Float64);
  const Tensor row = make(xs, {1, c, h * w}, DType::Float64);
  const std::vector<double> want = conv_reference(xs, c, 1, h * w, values(line.weight), o, 1, 4, 1,
                                                  {0, 0}, {1, 2}, PaddingMode::Reflect);
  REQUIRE(line.forward(row).shape() == Shape{1, o, h * w});
  NN_REQUIRE_CLOSE(values(line.forward(row)), want, 1e-12, 1e-12);
}

TEST_CASE("ConvTranspose2d output_size picks the output padding as PyTorch does", "[nn][conv]") {
  kiln::manual_seed(95);
  nn::ConvTranspose2d up(2, 3, 3, 2, 1);
  const Tensor x = kiln::randn({1, 2, 4, 5});
  // The formula gives 7 x 9; stride 2 allows one more in each direction.
  CHECK(up.forward(x, {7, 9}).shape() == Shape{1, 3, 7, 9});
  const Tensor y = up.forward(x, {8, 9});
  REQUIRE(y.shape() == Shape{1, 3, 8, 9});
  NN_REQUIRE_CLOSE(values(y),
                   values(F::conv_transpose2d(x, up.weight, up.bias, 2, 1, nn::Size2(1, 0))), 0, 0);
  CHECK_THROWS_WITH(up.forward(x, {9, 9}), Contains("must lie in [7, 8]"));
  CHECK_THROWS_WITH(up.forward(x, {7, 8}), Contains("must lie in [9, 10]"));
}

TEST_CASE("convolution padding errors name the layer and what is allowed", "[nn][conv][errors]") {
  CHECK_THROWS_WITH(nn::Conv2d(2, 2, 3, 2, "same"), Contains("padding 'same' needs stride 1"));
  CHECK_THROWS_WITH(nn::Conv1d(2, 2, 3, 2, "same"), Contains("padding 'same' needs stride 1"));
  CHECK_THROWS_WITH(nn::Conv2d(2, 2, 3, 1, "full"), Contains("\"same\" or \"valid\""));
  CHECK_THROWS_WITH(nn::Conv1d(2, 2, 3, 1, {1, 2}), Contains("[Conv1d] expected one padding"));
  CHECK_THROWS_WITH(
      F::conv2d(kiln::randn({1, 2, 4, 4}), kiln::randn({2, 2, 3, 3}), Tensor(), 2, "same"),
      Contains("[conv2d] padding 'same' needs stride 1"));
  CHECK_THROWS_WITH(F::conv1d(kiln::randn({1, 2, 4}), kiln::randn({2, 2, 3}), Tensor(), 1, {1, 2}),
                    Contains("[conv1d] expected one padding size"));
  std::ostringstream repr;
  repr << nn::Conv2d(2, 4, 3, 1, "same", 1, 1, true, PaddingMode::Circular) << "\n"
       << nn::Conv1d(2, 4, 3, 1, 2, 1, 1, true, PaddingMode::Reflect);
  CHECK(repr.str() ==
        "Conv2d(2, 4, kernel_size=3, stride=1, padding='same', padding_mode='circular')\n"
        "Conv1d(2, 4, kernel_size=3, stride=1, padding=2, padding_mode='reflect')");
}

TEST_CASE("convolution padding modes and output_size match PyTorch", "[nn][conv][torch]") {
  kiln::manual_seed(96);
  std::vector<TorchCase> cases;
  std::vector<std::unique_ptr<nn::Module>> keep;
  auto add = [&](std::unique_ptr<nn::UnaryModule> m, const std::string& module, Shape xs,
                 uint64_t seed) {
    m->to(DType::Float64);
    TorchCase tc;
    tc.label = module;
    tc.module = module;
    tc.layer = m.get();
    tc.inputs = {make(random_values(kiln::numel(xs), seed), xs, DType::Float64)};
    tc.call = "m(x[0])";
    nn::UnaryModule* raw = m.get();
    tc.run = [raw](const std::vector<Tensor>& x) {
      return std::vector<Tensor>{raw->forward(x[0])};
    };
    cases.push_back(std::move(tc));
    keep.push_back(std::move(m));
  };
  add(std::make_unique<nn::Conv2d>(2, 3, nn::Size2(2, 3), 1, "same", nn::Size2(1, 2), 1, true,
                                   PaddingMode::Reflect),
      "nn.Conv2d(2, 3, (2, 3), padding='same', dilation=(1, 2), padding_mode='reflect')",
      {2, 2, 5, 7}, 97);
  add(std::make_unique<nn::Conv2d>(2, 4, 3, 1, 1, 1, 2, true, PaddingMode::Circular),
      "nn.Conv2d(2, 4, 3, padding=1, groups=2, padding_mode='circular')", {1, 2, 4, 4}, 98);
  add(std::make_unique<nn::Conv2d>(2, 2, 3, 2, nn::Size2(2, 1), 1, 1, false,
                                   PaddingMode::Replicate),
      "nn.Conv2d(2, 2, 3, stride=2, padding=(2, 1), bias=False, padding_mode='replicate')",
      {1, 2, 6, 5}, 99);
  add(std::make_unique<nn::Conv2d>(3, 2, nn::Size2(4, 2), 1, "same"),
      "nn.Conv2d(3, 2, (4, 2), padding='same')", {2, 3, 5, 4}, 100);
  add(std::make_unique<nn::Conv1d>(2, 3, 4, 1, "same", 2, 1, true, PaddingMode::Reflect),
      "nn.Conv1d(2, 3, 4, padding='same', dilation=2, padding_mode='reflect')", {2, 2, 9}, 101);
  add(std::make_unique<nn::Conv1d>(2, 2, 3, 1, "valid"), "nn.Conv1d(2, 2, 3, padding='valid')",
      {1, 2, 6}, 102);
  auto up = std::make_unique<nn::ConvTranspose2d>(2, 3, 3, nn::Size2(2, 3), 1);
  up->to(DType::Float64);
  TorchCase tc;
  tc.label = tc.module = "nn.ConvTranspose2d(2, 3, 3, stride=(2, 3), padding=1)";
  tc.layer = up.get();
  tc.inputs = {make(random_values(2 * 2 * 3 * 4, 103), {2, 2, 3, 4}, DType::Float64)};
  tc.call = "m(x[0], output_size=[6, 12])";
  nn::ConvTranspose2d* raw = up.get();
  tc.run = [raw](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{raw->forward(x[0], {6, 12})};
  };
  cases.push_back(std::move(tc));
  keep.push_back(std::move(up));
  NN_REQUIRE_TORCH_PARITY(cases);
}
