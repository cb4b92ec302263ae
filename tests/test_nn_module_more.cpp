// ModuleList and ModuleDict (registration, PyTorch's names, printing), Module::apply's
// order, freezing with requires_grad_(false) through a training run, forward hooks and
// pre-hooks with removal, and load_state_dict(strict = false)'s missing/unexpected keys.
#include <map>
#include <sstream>

#include "test_nn_support.h"

using namespace nn_test;
namespace nn = kiln::nn;

namespace {

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, _] : named) out.push_back(n);
  return out;
}

// A model holding a ModuleList and a ModuleDict, as a PyTorch user would write one.
struct Heads : nn::UnaryModule {
  Heads() : nn::UnaryModule("Heads") {
    layers = register_module("layers", nn::make<nn::ModuleList>());
    layers->push_back(nn::make<nn::Linear>(3, 4));
    layers->push_back(nn::make<nn::ReLU>());
    layers->push_back(nn::make<nn::Linear>(4, 4));
    heads = register_module("heads", nn::make<nn::ModuleDict>());
    heads->insert("cls", nn::make<nn::Linear>(4, 2));
    heads->insert("reg", nn::make<nn::Linear>(4, 1, false));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (const auto& m : *layers) h = (*std::dynamic_pointer_cast<nn::UnaryModule>(m))(h);
    return kiln::concat(
        {heads->at<nn::Linear>("cls")->forward(h), heads->at<nn::Linear>("reg")->forward(h)}, 1);
  }
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::ModuleDict> heads;
};

}  // namespace

TEST_CASE("nn ModuleList and ModuleDict register their modules under PyTorch's names",
          "[nn][module]") {
  auto model = std::make_shared<Heads>();
  CHECK(names_of(model->named_parameters()) ==
        std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.2.weight",
                                 "layers.2.bias", "heads.cls.weight", "heads.cls.bias",
                                 "heads.reg.weight"});
  CHECK(model->state_dict().count("heads.reg.weight") == 1);
  CHECK(model->parameters().size() == 7);
  CHECK(model->layers->size() == 3);
  CHECK((*model->layers)[1]->name() == "ReLU");
  CHECK(model->layers->at<nn::Linear>(2)->out_features == 4);
  REQUIRE_THROWS_AS((*model->layers)[3], kiln::IndexError);
  REQUIRE_THROWS_AS(model->layers->at<nn::Linear>(1), kiln::ValueError);
  CHECK(model->heads->keys() == std::vector<std::string>{"cls", "reg"});
  CHECK(model->heads->contains("cls"));
  CHECK_FALSE(model->heads->contains("box"));
  REQUIRE_THROWS_WITH(
      (*model->heads)["box"],
      Catch::Contains("no module under key \"box\"; the keys are \"cls\", \"reg\""));
  CHECK(model->forward(kiln::randn({5, 3})).shape() == Shape{5, 3});

  // Assigning to an existing key replaces the module in place, as dict[key] = m.
  auto wider = nn::make<nn::Linear>(4, 6);
  model->heads->insert("cls", wider);
  CHECK(model->heads->keys() == std::vector<std::string>{"cls", "reg"});
  CHECK(model->heads->at<nn::Linear>("cls") == wider);
  CHECK(model->state_dict().at("heads.cls.weight").shape() == Shape{6, 4});
  REQUIRE_THROWS_AS(model->heads->insert("a.b", nn::make<nn::ReLU>()), kiln::ValueError);
  REQUIRE_THROWS_AS(model->heads->insert("x", nullptr), kiln::ValueError);
  REQUIRE_THROWS_AS(model->heads->insert("cls", nullptr), kiln::ValueError);
  CHECK(model->heads->at<nn::Linear>("cls") == wider);

  nn::ModuleList list{nn::make<nn::Linear>(2, 2), nn::make<nn::Tanh>()};
  list.extend({nn::make<nn::Linear>(2, 1)});
  std::ostringstream os;
  os << list;
  CHECK(os.str() ==
        "ModuleList(\n  (0): Linear(in_features=2, out_features=2, bias=true)\n  (1): Tanh()\n"
        "  (2): Linear(in_features=2, out_features=1, bias=true)\n)");
  nn::ModuleDict dict{{"enc", nn::make<nn::Linear>(2, 3)}, {"act", nn::make<nn::GELU>()}};
  CHECK(names_of(dict.named_parameters()) == std::vector<std::string>{"enc.weight", "enc.bias"});
  CHECK(dict.size() == 2);
}

TEST_CASE("nn Module::apply visits children before their parent", "[nn][module]") {
  auto model = std::make_shared<Heads>();
  std::vector<std::string> order;
  model->apply([&](nn::Module& m) { order.push_back(m.name()); });
  CHECK(order == std::vector<std::string>{"Linear", "ReLU", "Linear", "ModuleList", "Linear",
                                          "Linear", "ModuleDict", "Heads"});
  // The usual use: a custom initialisation of every Linear.
  model->apply([](nn::Module& m) {
    if (auto* linear = dynamic_cast<nn::Linear*>(&m)) {
      kiln::NoGradGuard no_grad;
      linear->weight.assign(kiln::full(linear->weight.shape(), 0.5));
    }
  });
  for (const auto& [n, p] : model->named_parameters()) {
    if (n.ends_with("weight")) CHECK(values(p) == std::vector<double>(p.numel(), 0.5));
  }
}

TEST_CASE("nn requires_grad_(false) freezes parameters through training", "[nn][module]") {
  kiln::manual_seed(4);
  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          nn::make<nn::Linear>(3, 5), nn::make<nn::Tanh>(), nn::make<nn::Linear>(5, 2)});
  model->at<nn::Linear>(0)->requires_grad_(false);
  for (const auto& [n, p] : model->named_parameters())
    CHECK(p.requires_grad() == !n.starts_with("0."));
  std::map<std::string, std::vector<double>> before;
  for (const auto& [n, p] : model->state_dict()) before[n] = values(p);
  Tensor x = kiln::randn({8, 3}), y = kiln::randn({8, 2});
  // Weight decay and momentum would move a frozen parameter if the optimizer touched it.
  kiln::optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
  kiln::optim::Adam adam(model->parameters(), {.lr = 0.01, .weight_decay = 0.1});
  for (kiln::optim::Optimizer* opt :
       {static_cast<kiln::optim::Optimizer*>(&sgd), static_cast<kiln::optim::Optimizer*>(&adam)}) {
    for (int step = 0; step < 3; ++step) {
      opt->zero_grad();
      Tensor loss = nn::mse_loss(model->forward(x), y);
      loss.backward();
      opt->step();
      loss.eval();
    }
  }
  for (const auto& [n, p] : model->state_dict()) {
    INFO(n);
    const bool frozen = n.starts_with("0.");
    CHECK((values(p) == before.at(n)) == frozen);
    if (frozen) CHECK_FALSE(p.grad().defined());
  }
  CHECK(adam.step_count(0) == 0);  // 0.weight: never stepped
  CHECK(adam.step_count(2) == 3);
  // Unfreezing gives gradients again.
  model->requires_grad_(true);
  model->zero_grad();
  nn::mse_loss(model->forward(x), y).backward();
  CHECK(model->at<nn::Linear>(0)->weight.grad().defined());
}

TEST_CASE("nn forward hooks see and may replace inputs and outputs, and can be removed",
          "[nn][module][hooks]") {
  auto first = nn::make<nn::Linear>(3, 3);
  auto act = nn::make<nn::ReLU>();
  auto model = std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::UnaryModule>>{first, act});
  Tensor x = kiln::randn({2, 3});
  std::vector<std::string> calls;
  Shape seen;
  auto h1 = first->register_forward_hook(
      [&](nn::Module& m, const Tensor& in, const Tensor& out) -> std::optional<Tensor> {
        calls.push_back("hook " + m.name());
        seen = out.shape();
        CHECK(in.shape() == Shape{2, 3});
        return std::nullopt;
      });
  // The output replacement reaches the next module: ReLU of -|y| is 0.
  auto h2 = first->register_forward_hook(
      [&](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
        calls.push_back("negate");
        return -kiln::abs(out);
      });
  auto pre =
      act->register_forward_pre_hook([&](nn::Module& m, const Tensor&) -> std::optional<Tensor> {
        calls.push_back("pre " + m.name());
        return std::nullopt;
      });
  Tensor y = (*model)(x);
  CHECK(calls == std::vector<std::string>{"hook Linear", "negate", "pre ReLU"});
  CHECK(seen == Shape{2, 3});
  CHECK(values(y) == std::vector<double>(6, 0.0));
  // forward() called directly runs no hooks of the module itself (PyTorch's rule); Sequential
  // still calls its children through operator().
  calls.clear();
  model->forward(x);
  CHECK(calls.size() == 3);
  calls.clear();
  first->forward(x);
  CHECK(calls.empty());

  h2.remove();
  h2.remove();  // twice is harmless
  calls.clear();
  Tensor z = (*model)(x);
  CHECK(calls == std::vector<std::string>{"hook Linear", "pre ReLU"});
  NN_REQUIRE_CLOSE(values(z), values(kiln::relu(first->forward(x))), 0, 0);
  h1.remove();
  pre.remove();
  calls.clear();
  (*model)(x);
  CHECK(calls.empty());

  // A pre-hook's replacement input is what forward and the forward hooks see.
  auto lin = nn::make<nn::Linear>(3, 1);
  lin->register_forward_pre_hook(
      [](nn::Module&, const Tensor& in) -> std::optional<Tensor> { return in * 0.0; });
  Tensor seen_input;
  lin->register_forward_hook(
      [&](nn::Module&, const Tensor& in, const Tensor&) -> std::optional<Tensor> {
        seen_input = in;
        return std::nullopt;
      });
  NN_REQUIRE_CLOSE(values((*lin)(x)), std::vector<double>(2, lin->bias.item<double>()), 0, 0);
  CHECK(values(seen_input) == std::vector<double>(6, 0.0));

  // A hook that removes itself while running; a handle outliving its module.
  auto self = nn::make<nn::Tanh>();
  nn::HookHandle handle;
  int runs = 0;
  handle = self->register_forward_hook(
      [&](nn::Module&, const Tensor&, const Tensor&) -> std::optional<Tensor> {
        ++runs;
        handle.remove();
        return std::nullopt;
      });
  (*self)(x);
  (*self)(x);
  CHECK(runs == 1);
  nn::HookHandle orphan = act->register_forward_hook(
      [](nn::Module&, const Tensor&, const Tensor&) -> std::optional<Tensor> { return {}; });
  model.reset();
  act.reset();
  orphan.remove();
  REQUIRE_THROWS_AS(first->register_forward_hook(nullptr), kiln::ValueError);
}

TEST_CASE("nn load_state_dict(strict = false) returns the missing and unexpected keys",
          "[nn][module][state_dict]") {
  auto model = std::make_shared<Heads>();
  auto sd = model->state_dict();
  sd.erase("heads.reg.weight");
  sd.erase("layers.0.bias");
  sd["heads.box.weight"] = kiln::zeros({4, 4});
  sd["layers.2.weight"] = kiln::full({4, 4}, 0.75);
  nn::LoadStateDictResult r = model->load_state_dict(sd, false);
  CHECK(r.missing_keys == std::vector<std::string>{"heads.reg.weight", "layers.0.bias"});
  CHECK(r.unexpected_keys == std::vector<std::string>{"heads.box.weight"});
  CHECK(values(model->layers->at<nn::Linear>(2)->weight) == std::vector<double>(16, 0.75));
  // A full dict reports nothing, strict or not.
  nn::LoadStateDictResult clean = model->load_state_dict(model->state_dict());
  CHECK(clean.missing_keys.empty());
  CHECK(clean.unexpected_keys.empty());
  // strict keeps raising, naming the keys.
  REQUIRE_THROWS_WITH(model->load_state_dict(sd),
                      Catch::Contains("missing keys: \"heads.reg.weight\", \"layers.0.bias\"") &&
                          Catch::Contains("unexpected keys: \"heads.box.weight\""));
}
