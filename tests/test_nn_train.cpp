// Convergence of each layer family on a small synthetic task with plain SGD written inline
// (p <- p - lr * grad under NoGradGuard): an MLP, a conv net, an LSTM and an attention
// model. Each step's forward, backward and update are evaluated as one graph when the loss
// is read. The loss must fall by the stated factor; seeds are fixed.
#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;

namespace {

// Runs `steps` SGD steps of `loss_fn` and returns the losses read after each step.
std::vector<double> train(const std::function<Tensor()>& loss_fn, const std::vector<Tensor>& params,
                          int steps, double lr) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = loss_fn();
    loss.backward();
    sgd_step(params, lr);
    // Reading the loss evaluates forward, backward and the update together.
    losses.push_back(loss.item<double>());
  }
  return losses;
}

double first_mean(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += v[i];
  return s / static_cast<double>(n);
}

double last_mean(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

}  // namespace

TEST_CASE("nn an MLP learns four gaussian blobs with SGD", "[nn][train]") {
  kiln::manual_seed(81);
  const int64_t n = 128;
  std::vector<double> xs, centres = {-2, -2, -2, 2, 2, -2, 2, 2};
  std::vector<int64_t> ys;
  std::vector<double> noise = values(kiln::randn({n, 2}, DType::Float64));
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = i % 4;
    ys.push_back(c);
    for (int64_t d = 0; d < 2; ++d)
      xs.push_back(centres[static_cast<size_t>(2 * c + d)] +
                   0.8 * noise[static_cast<size_t>(2 * i + d)]);
  }
  Tensor x = make(xs, {n, 2}), y = kiln::from_vector(ys, {n});
  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Linear>(2, 32), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(32, 4)});
  auto losses =
      train([&] { return nn::cross_entropy(model->forward(x), y); }, model->parameters(), 60, 0.3);
  INFO("loss " << losses.front() << " -> " << losses.back());
  CHECK(last_mean(losses, 5) < first_mean(losses, 1) / 4);
  Tensor predicted = kiln::argmax(model->forward(x), 1);
  CHECK(kiln::sum(predicted == y).item<int64_t>() > n * 9 / 10);
}

TEST_CASE("nn a conv net tells horizontal from vertical bars", "[nn][train][conv]") {
  kiln::manual_seed(82);
  const int64_t n = 32;
  std::vector<double> noise = values(kiln::rand({n, 8, 8}, DType::Float64));
  std::vector<double> images(static_cast<size_t>(n * 64));
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    int64_t label = i % 2, line = (i * 5 / 2) % 8;
    labels.push_back(label);
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t c = 0; c < 8; ++c) {
        bool on = label == 0 ? r == line : c == line;
        images[static_cast<size_t>(i * 64 + r * 8 + c)] =
            (on ? 1.0 : 0.0) + 0.3 * noise[static_cast<size_t>(i * 64 + r * 8 + c)];
      }
  }
  Tensor x = make(images, {n, 1, 8, 8}), y = kiln::from_vector(labels, {n});
  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(4),
          std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
          std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(64, 2)});
  auto losses =
      train([&] { return nn::cross_entropy(model->forward(x), y); }, model->parameters(), 30, 0.1);
  INFO("loss " << losses.front() << " -> " << losses.back());
  CHECK(last_mean(losses, 3) < first_mean(losses, 1) / 5);
  model->eval();
  CHECK(kiln::sum(kiln::argmax(model->forward(x), 1) == y).item<int64_t>() == n);
}

TEST_CASE("nn an LSTM learns the running mean of a sequence", "[nn][train][lstm]") {
  kiln::manual_seed(83);
  const int64_t steps = 6, batch = 32;
  Tensor seq = kiln::rand({steps, batch, 1}) * 2.0 - 1.0;
  Tensor target = kiln::reshape(kiln::mean(seq, 0) * 2.0, {batch, 1});  // needs every step
  seq.eval();
  target.eval();
  nn::LSTM lstm(1, 12);
  nn::Linear head(12, 1);
  std::vector<Tensor> params = lstm.parameters();
  for (const Tensor& p : head.parameters()) params.push_back(p);
  auto loss_fn = [&] {
    auto out = lstm.forward(seq);
    Tensor last = kiln::squeeze(kiln::slice(out.output, 0, steps - 1, steps), 0);
    return nn::mse_loss(head.forward(last), target);
  };
  auto losses = train(loss_fn, params, 80, 0.3);
  INFO("loss " << losses.front() << " -> " << losses.back());
  CHECK(last_mean(losses, 5) < first_mean(losses, 1) / 3);
}

TEST_CASE("nn self-attention learns to copy the first token to every position",
          "[nn][train][attention]") {
  kiln::manual_seed(84);
  const int64_t batch = 32, len = 5, vocab = 4, dim = 16;
  Tensor tokens = kiln::randint(0, vocab, {batch, len});
  tokens.eval();
  Tensor target = kiln::broadcast_to(kiln::slice(tokens, 1, 0, 1), {batch, len});
  nn::Embedding embed(vocab, dim);
  Tensor position = nn::init::normal({len, dim});
  position.requires_grad_();
  nn::MultiheadAttention attn(dim, 2, 0.0, true, true);
  nn::Linear head(dim, vocab);
  std::vector<Tensor> params = {position};
  for (nn::Module* m : std::initializer_list<nn::Module*>{&embed, &attn, &head})
    for (const Tensor& p : m->parameters()) params.push_back(p);
  auto loss_fn = [&] {
    Tensor h = embed.forward(tokens) + position;  // [B, L, D]
    Tensor a = attn.forward(h, h, h, Tensor(), false).output;
    Tensor logits = head.forward(a);  // [B, L, V]
    return nn::cross_entropy(kiln::reshape(logits, {batch * len, vocab}),
                             kiln::reshape(target, {batch * len}));
  };
  auto losses = train(loss_fn, params, 60, 0.5);
  INFO("loss " << losses.front() << " -> " << losses.back());
  CHECK(last_mean(losses, 5) < first_mean(losses, 1) / 2);
}
