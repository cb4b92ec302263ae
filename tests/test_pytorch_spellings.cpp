// docs/user-guide.md's "Coming from PyTorch" table, kept true: the first test compiles and
// runs every kiln spelling of its right-hand column, written here verbatim; the second reads
// the table and checks that each of its code spans appears in this file (a span with "..."
// in pieces), so a row added to the table without a spelling here fails. Net is the guide's
// example of a module of one's own.
#include <catch2/catch.hpp>
#include <cstddef>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "test_files.h"

using namespace kiln;
using namespace kiln::indexing;

namespace {

// The module of the register_module row, as the guide's "Models" section writes it.
// clang-format off
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Tensor scale;
  Net() : nn::Module("Net") {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 2));
    scale = register_parameter("scale", ones({2}));          // requires_grad = true
    register_buffer("calls", zeros({}, DType::Int64));       // state, no gradient
  }
  Tensor forward(const Tensor& x) { return fc->forward(x) * scale; }
};
// clang-format on

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

// The spellings stay as the table writes them, one row per line where they fit.
// clang-format off
TEST_CASE("every kiln spelling of the Coming from PyTorch table compiles and runs",
          "[pytorch_spellings]") {
  manual_seed(0);
  { Tensor t = from_vector<float>({1.0f, 2.0f, 3.0f}); REQUIRE(t.numel() == 3); }
  { Tensor t = zeros({2, 3}), r = randn({2, 3}), s = arange(5); REQUIRE(s.numel() == 5); }
  Tensor x = randn({2, 3, 4});
  REQUIRE((x.size(0) == 2 && x.ndim() == 3 && x.numel() == 24));
  { Tensor x = tensor(2.0f); REQUIRE(x.item<float>() == 2.0f); REQUIRE(x.to_vector<float>().size() == 1); }
  { Tensor a1 = x.sum(), a2 = x.sum(1, true), a3 = sum(x, {1}, true); REQUIRE(a3.shape() == Shape{2, 1, 4}); }
  { Tensor m = x.mean(1), e = x.exp(), t = x.sum(0).t(), v = x.view({2, -1}); REQUIRE(v.shape() == Shape{2, 12}); }
  REQUIRE(x.to(DType::Float64).dtype() == DType::Float64);
  if (cuda::device_count() > 0) REQUIRE(x.to(Device::cuda(), DType::Float16).dtype() == DType::Float16);
  std::cout << x.shape() << x.dtype() << '\n';  // with using namespace kiln
  REQUIRE(x[0].shape() == Shape{3, 4});
  REQUIRE(x.index({Slice(1, None), 2, Ellipsis, None}).shape() == Shape{1, 4, 1});
  {
    Tensor idx = from_vector<int64_t>({1, 0}), mask = x > 0;
    REQUIRE(x.index({idx}).shape() == Shape{2, 3, 4});
    REQUIRE(x.index({mask}).ndim() == 1);
  }
  {
    Tensor x = zeros({2, 4});
    x.index_put_({0, Slice(1, 3)}, 5.0);
    x += 1;
    REQUIRE(x.to_vector<float>() == std::vector<float>{1, 6, 6, 1, 1, 1, 1, 1});
  }
  int64_t dim = 1, k = 2, n = 3;
  bool descending = true, replacement = true;
  { auto [values, indices] = max(x, dim); REQUIRE(indices.dtype() == DType::Int64); }
  REQUIRE(max(x, {dim}).shape() == Shape{2, 4});
  { auto [v, i] = sort(x, dim, descending); REQUIRE(v.shape() == x.shape()); }
  { auto [v, i] = topk(x, k, dim); REQUIRE(i.shape() == Shape{2, 2, 4}); }
  { Tensor c1 = cumsum(x, dim), c2 = cumprod(x, dim); REQUIRE(c2.shape() == x.shape()); }
  Tensor a = randn({2, 3}), b = randn({2, 3});
  REQUIRE(cat({a, b}, dim).shape() == Shape{2, 6});
  double lo = 0, hi = 1;
  REQUIRE(eye(n).shape() == Shape{3, 3});
  REQUIRE(linspace(lo, hi, n).to_vector<float>() == std::vector<float>{0, 0.5f, 1});
  REQUIRE(allclose(a, b) == false);
  { Tensor p = from_vector<float>({0.2f, 0.8f}); REQUIRE(multinomial(p, n, replacement).numel() == 3); }
  {
    const int threads = get_num_threads();
    set_num_threads(n);
    REQUIRE(get_num_threads() == 3);
    set_num_threads(threads);
  }
  { NoGradGuard g; REQUIRE_FALSE((x * 2).requires_grad()); }
  REQUIRE((x.clone().shape() == x.shape() && x.detach().shape() == x.shape()));

  // Autograd.
  {
    Tensor x = randn({3}).eval();
    x.requires_grad_();
    Tensor loss = sum(square(x));
    loss.backward();
    REQUIRE(x.grad().defined());
    Tensor y = sum(x * 3);
    REQUIRE(grad(y, {x})[0].to_vector<float>() == std::vector<float>{3, 3, 3});
    REQUIRE(relu(x).shape() == softmax(x, -1).shape());
  }

  // Modules.
  std::shared_ptr<nn::Linear> linear = std::make_shared<nn::Linear>(4, 2);
  nn::Sequential seq = nn::Sequential({std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>()});
  REQUIRE(seq.size() == 2);
  {
    auto conv = std::make_shared<nn::Conv2d>(3, 8, 3, 1, "same", 1, 1, true, nn::PaddingMode::Reflect);
    REQUIRE(conv->forward(randn({1, 3, 5, 6})).shape() == Shape{1, 8, 5, 6});
    Tensor x = randn({2, 3, 4});
    REQUIRE(nn::F::pad(x, {{0, 0}, {0, 0}, {1, 1}}, nn::PaddingMode::Replicate).shape() == Shape{2, 3, 6});
    nn::Linear m(4, 2);
    const float w0 = m.weight.to_vector<float>()[0];
    { NoGradGuard g; m.weight *= 0.5; }
    REQUIRE(m.weight.to_vector<float>()[0] == w0 * 0.5f);
  }
  {
    Net net;
    REQUIRE(net.forward(randn({3, 4})).shape() == Shape{3, 2});
    REQUIRE(net.state_dict().size() == 4);  // fc.weight, fc.bias, scale, calls
  }
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(linear);
  { Tensor x = randn({5, 4}); REQUIRE(model->forward(x).shape() == (*model)(x).shape()); }
  REQUIRE(model->parameters().size() == model->named_parameters().size());
  model->train();
  model->eval();
  {
    auto model = std::make_shared<nn::Linear>(4, 2);
    model->to(DType::BFloat16);
    if (cuda::device_count() > 0) model->to(Device::cuda(0));
    model->requires_grad_(false);
    REQUIRE(model->weight.dtype() == DType::BFloat16);
  }
  {
    test::TempDir dir("kiln_spellings");
    const std::string path = dir.file("model.safetensors");
    save_safetensors(path, model->state_dict());
    REQUIRE(model->load_state_dict(load_safetensors(path), false).missing_keys.empty());
  }

  // Losses, optimizers, schedules.
  Tensor logits = model->forward(randn({5, 4})), y = from_vector<int64_t>({0, 1, 1, 0, 1});
  Tensor pred = randn({4}), target = randn({4});
  REQUIRE(nn::MSELoss()(pred, target).ndim() == 0);
  std::vector<Tensor> params = model->parameters();
  optim::SGD sgd(params, {.lr = 0.1, .momentum = 0.9});
  optim::AdamW opt(params, {.lr = 1e-3, .weight_decay = 0.01});
  optim::StepLR sched(opt, 10, 0.5);
  {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(logits, y, {.label_smoothing = 0.1});
    loss.backward();
    Tensor norm = optim::clip_grad_norm(params, 1.0);
    opt.step();
    sched.step();
    REQUIRE(sched.get_last_lr().size() == 1);
    opt.set_lr(0, 0.01);
    REQUIRE(opt.lr(0) == 0.01);
    eval({loss, norm});
  }

  // Data, mixed precision, checkpointing.
  {
    Tensor x = randn({64, 4}), y = randint(0, 2, {64});
    data::DataLoader loader(data::TensorDataset(x, y), {.batch_size = 32, .shuffle = true});
    int batches = 0;
    for (const data::Batch& batch : loader) batches += batch.features().size(0) == batch.targets().size(0);
    REQUIRE(batches == 2);
  }
  { amp::autocast scope(Device::cpu(), DType::BFloat16); REQUIRE(matmul(a, b.t()).dtype() == DType::BFloat16); }
  amp::GradScaler scaler;
  REQUIRE(scaler.get_scale() == 65536.0);
  std::function<Tensor(const Tensor&)> fn = [](const Tensor& t) { return relu(t) * 2; };
  REQUIRE(checkpoint(fn, x).shape() == x.shape());
}
// clang-format on

TEST_CASE("every code span of the Coming from PyTorch table appears in its test",
          "[pytorch_spellings]") {
  const std::string guide = read_file(KILN_SOURCE_DIR "/docs/user-guide.md");
  const std::string source = read_file(KILN_SOURCE_DIR "/tests/test_pytorch_spellings.cpp");
  REQUIRE_FALSE(source.empty());
  const size_t start = guide.find("## Coming from PyTorch");
  REQUIRE(start != std::string::npos);
  const size_t end = guide.find("\n## ", start + 1);
  std::istringstream table(guide.substr(start, end == std::string::npos ? end : end - start));
  size_t rows = 0, spans = 0;
  for (std::string line; std::getline(table, line);) {
    // A row of the table, not its header or separator: "| torch | kiln |".
    if (line.rfind("| `", 0) != 0) continue;
    ++rows;
    const size_t split = line.find(" | ");
    REQUIRE(split != std::string::npos);
    const std::string kiln = line.substr(split + 3);
    for (size_t open = kiln.find('`'); open != std::string::npos;) {
      const size_t close = kiln.find('`', open + 1);
      REQUIRE(close != std::string::npos);
      const std::string span = kiln.substr(open + 1, close - open - 1);
      ++spans;
      // "{ NoGradGuard g; ... }": each piece around "..." must appear.
      size_t from = 0;
      while (from <= span.size()) {
        size_t dots = span.find("...", from);
        if (dots == std::string::npos) dots = span.size();
        std::string piece = span.substr(from, dots - from);
        while (!piece.empty() && piece.front() == ' ') piece.erase(piece.begin());
        while (!piece.empty() && piece.back() == ' ') piece.pop_back();
        INFO("table row: " << line);
        INFO("code: " << piece);
        if (!piece.empty()) REQUIRE(source.find(piece) != std::string::npos);
        from = dots + 3;
      }
      open = kiln.find('`', close + 1);
    }
  }
  REQUIRE(rows >= 50);
  REQUIRE(spans > rows);
}
