// The memory plan on real training steps: liveness, in-place reuse, donation, recomputation
// under a budget, the infeasible-budget error, the run-time fallback and checkpoint().
// Results under a budget must be bit-identical to the unbudgeted step; the pool's measured
// peak must stay within the budget.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "memory/memory.h"

using namespace kiln;

namespace {

// Clears the budget and the plan margin when a test ends, whatever happens.
struct BudgetGuard {
  ~BudgetGuard() {
    memory::clear_budget();
    memory::set_plan_margin(0);
  }
};

memory::CachingPool& pool() { return memory::host_pool(); }

// A model, its optimizer and one batch; step() is forward, backward, update, read the loss.
struct Trainer {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<optim::Optimizer> opt;
  std::function<Tensor()> loss_fn;
  bool release_grads = false;  // zero_grad before the loss is read: the step keeps no gradient
  double step() {
    opt->zero_grad();
    Tensor loss = loss_fn();
    loss.backward();
    opt->step();
    if (release_grads) opt->zero_grad();
    return loss.item<double>();
  }
  // Every parameter's value, as raw bytes.
  std::vector<std::vector<char>> parameters() const {
    std::vector<std::vector<char>> out;
    for (const Tensor& p : model->parameters()) {
      std::vector<float> v = p.to_vector<float>();
      std::vector<char> bytes(v.size() * sizeof(float));
      std::memcpy(bytes.data(), v.data(), bytes.size());
      out.push_back(std::move(bytes));
    }
    return out;
  }
  // Every parameter's value and gradient, as raw bytes.
  std::vector<std::vector<char>> state() const {
    std::vector<std::vector<char>> out;
    for (const Tensor& p : model->parameters()) {
      for (const Tensor& t : {p, p.grad()}) {
        if (!t.defined()) continue;
        std::vector<float> v = t.to_vector<float>();
        std::vector<char> bytes(v.size() * sizeof(float));
        std::memcpy(bytes.data(), v.data(), bytes.size());
        out.push_back(std::move(bytes));
      }
    }
    return out;
  }
};

class SmallLSTM : public nn::Module {
 public:
  explicit SmallLSTM(int64_t hidden = 64) : nn::Module("SmallLSTM") {
    embed = register_module("embed", std::make_shared<nn::Embedding>(32, 32));
    lstm = register_module("lstm", std::make_shared<nn::LSTM>(32, hidden, 1, true, true));
    head = register_module("head", std::make_shared<nn::Linear>(hidden, 32));
  }
  Tensor forward(const Tensor& x) { return head->forward(lstm->forward(embed->forward(x)).output); }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::Linear> head;
};

class SmallGPT : public nn::Module {
 public:
  SmallGPT() : nn::Module("SmallGPT") {
    embed = register_module("embed", std::make_shared<nn::Embedding>(32, 64));
    auto list = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int i = 0; i < 2; ++i) {
      blocks.push_back(std::make_shared<nn::TransformerEncoderLayer>(
          64, 4, 128, 0.1, nn::Activation::ReLU, 1e-5, true, true));
      list->push_back(blocks.back());
    }
    head = register_module("head", std::make_shared<nn::Linear>(64, 32));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = embed->forward(x);
    for (auto& b : blocks) h = b->forward(h, Tensor(), Tensor(), true);
    return head->forward(h);
  }
  std::shared_ptr<nn::Embedding> embed;
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> blocks;
  std::shared_ptr<nn::Linear> head;
};

Trainer make_trainer(const std::string& kind, bool checkpointed = false) {
  manual_seed(1234);
  Trainer t;
  if (kind == "mlp" || kind == "mlp_wide" || kind == "mlp_narrow") {
    // Six hidden layers, dropout after the first. The wide batch makes activations most of
    // the step's memory (checkpoint's case), the narrow one its gradients.
    const int64_t batch = kind == "mlp_wide" ? 2048 : kind == "mlp_narrow" ? 16 : 256;
    std::vector<std::shared_ptr<nn::Linear>> layers{std::make_shared<nn::Linear>(64, 256)};
    for (int i = 0; i < 6; ++i) layers.push_back(std::make_shared<nn::Linear>(256, 256));
    layers.push_back(std::make_shared<nn::Linear>(256, 10));
    auto drop = std::make_shared<nn::Dropout>(0.1);
    auto seq = std::make_shared<nn::Sequential>();
    for (size_t i = 0; i < layers.size(); ++i) {
      seq->push_back(layers[i]);
      if (i + 1 == layers.size()) break;
      seq->push_back(std::make_shared<nn::ReLU>());
      if (i == 0) seq->push_back(drop);
    }
    t.model = seq;
    t.opt = std::make_shared<optim::SGD>(seq->parameters(),
                                         optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    Tensor x = randn({batch, 64}).eval(), y = randint(0, 10, {batch}).eval();
    t.loss_fn = [=] {
      if (!checkpointed) return nn::cross_entropy(seq->forward(x), y);
      // The same computation with the hidden layers checkpointed in pairs (as
      // torch.utils.checkpoint is used per block): the activation inside each pair is not
      // kept for the backward.
      Tensor h = drop->forward(relu(layers[0]->forward(x)));
      for (size_t i = 1; i + 2 < layers.size(); i += 2) {
        auto first = layers[i], second = layers[i + 1];
        h = checkpoint(
            [first, second](const Tensor& in) {
              return relu(second->forward(relu(first->forward(in))));
            },
            h);
      }
      return nn::cross_entropy(layers.back()->forward(h), y);
    };
  } else if (kind == "lstm" || kind == "lstm_medium") {
    // The medium one's step is big enough (tens of MiB) that the pool's segments are a small
    // part of its reserve.
    const bool medium = kind == "lstm_medium";
    const int64_t batch = medium ? 32 : 8, steps = medium ? 96 : 64;
    auto m = std::make_shared<SmallLSTM>(medium ? 256 : 64);
    t.model = m;
    t.opt = std::make_shared<optim::Adam>(m->parameters(), optim::AdamOptions{.lr = 1e-3});
    Tensor x = randint(0, 32, {batch, steps}).eval(), y = randint(0, 32, {batch * steps}).eval();
    t.loss_fn = [=] { return nn::cross_entropy(reshape(m->forward(x), {batch * steps, 32}), y); };
  } else {
    auto m = std::make_shared<SmallGPT>();
    t.model = m;
    t.opt = std::make_shared<optim::AdamW>(m->parameters(),
                                           optim::AdamWOptions{.lr = 3e-4, .weight_decay = 0.01});
    Tensor x = randint(0, 32, {4, 32}).eval(), y = randint(0, 32, {4 * 32}).eval();
    t.loss_fn = [=] { return nn::cross_entropy(reshape(m->forward(x), {4 * 32, 32}), y); };
  }
  return t;
}

struct Reference {
  double loss = 0;
  std::vector<std::vector<char>> state;
  size_t step_bytes = 0;    // the unbudgeted step's peak above what it started with
  size_t output_bytes = 0;  // of those, what the step keeps (gradients, new states)
  // The budget that leaves `fraction` of the releasable bytes (the step's peak above its
  // start, less what it keeps): what a planner can save at best.
  size_t budget(size_t start, double fraction) const {
    return start + output_bytes +
           static_cast<size_t>(fraction * static_cast<double>(step_bytes - output_bytes));
  }
};

// Two unbudgeted steps; the second is the one compared and measured.
Reference reference(const std::string& kind, bool checkpointed = false) {
  Trainer t = make_trainer(kind, checkpointed);
  t.step();
  const size_t start = pool().allocated();
  pool().reset_peak_stats();
  Reference r;
  r.loss = t.step();
  r.step_bytes = pool().stats().peak_allocated - start;
  r.output_bytes = memory::last_plan().output_bytes;
  r.state = t.state();
  return r;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("budgeted training steps are bit-identical and stay within the budget", "[plan]") {
  BudgetGuard guard;
  // The fractions the planner reaches on each model today (docs/memory.md, "Known limits").
  // This MLP keeps its gradients (1.7 MB of the 2.4 MB the step adds) and one activation
  // per layer, which leaves too little to release below about 0.65 (0.55 before its dropout
  // mask was drawn again in the backward kernel and its first relu kept as bits: the
  // releasable bytes shrank, the floor in bytes did not). Unbudgeted, the LSTM
  // stores its gates and its releasable bytes are 0.6x what they were when it held 0.2;
  // budgeted, it inlines them as then, so its floor (the stacking of its outputs), the same
  // in bytes, is about 0.3 of the new releasable bytes.
  const std::vector<std::pair<const char*, std::vector<double>>> cases{
      {"mlp", {0.8, 0.65}}, {"lstm", {0.8, 0.5, 0.33}}, {"transformer", {0.5, 0.33, 0.2}}};
  for (const auto& [kind, fractions] : cases) {
    const Reference ref = reference(kind);
    REQUIRE(ref.step_bytes > 0);
    for (double fraction : fractions) {
      INFO(kind << " at " << fraction << " of the releasable bytes (" << ref.step_bytes << " - "
                << ref.output_bytes << ")");
      Trainer t = make_trainer(kind);
      t.step();
      const size_t start = pool().allocated();
      const size_t budget = ref.budget(start, fraction);
      memory::set_budget(budget);
      pool().reset_peak_stats();
      double loss = 0;
      try {
        loss = t.step();
      } catch (const OutOfMemoryError& e) {
        memory::clear_budget();
        FAIL_CHECK(e.what());
        continue;
      }
      const size_t peak = pool().stats().peak_allocated;
      memory::clear_budget();
      memory::PlanSummary plan = memory::last_plan();
      INFO(memory::plan_report());
      CHECK(same_bits(loss, ref.loss));
      CHECK(t.state() == ref.state);
      // Slack: the pool's rounding of blocks the plan sized exactly (stated in docs/memory.md).
      CHECK(peak <= budget + budget / 100);
      CHECK(plan.within_budget);
      CHECK(plan.recomputes > 0);
      CHECK(plan.lower_bound <= budget);
    }
  }
}

TEST_CASE("values placed in the step's arena compute what pool blocks compute", "[plan]") {
  BudgetGuard guard;
  struct ArenaOff {
    ArenaOff() { ::setenv("KILN_DISABLE_ARENA", "1", 1); }
    ~ArenaOff() { ::unsetenv("KILN_DISABLE_ARENA"); }
  };
  // Eight steps each. The step's tables settle after the optimizer's first steps (they
  // create its state), and the plan made once their kernels have been timed three times is
  // run again by the steps after it.
  auto run = [](const char* kind, double fraction, bool arena) {
    std::unique_ptr<ArenaOff> off;
    if (!arena) off = std::make_unique<ArenaOff>();
    Trainer t = make_trainer(kind);
    t.release_grads = true;
    t.step();
    if (fraction > 0) {
      const size_t start = pool().allocated();
      memory::set_budget(start + static_cast<size_t>(fraction * 1.6e6));
    }
    std::vector<double> losses;
    std::vector<memory::PlanSummary> plans;
    for (int i = 0; i < 8; ++i) {
      losses.push_back(t.step());
      plans.push_back(memory::last_plan());
    }
    memory::clear_budget();
    return std::tuple{losses, t.parameters(), plans};
  };
  for (const char* kind : {"lstm", "transformer"}) {
    for (double fraction : {0.0, 0.5}) {
      INFO(kind << (fraction > 0 ? " under a budget" : " without a budget"));
      const auto [pool_losses, pool_params, pool_plans] = run(kind, fraction, false);
      const auto [losses, params, plans] = run(kind, fraction, true);
      INFO(memory::plan_report());
      for (size_t i = 0; i < losses.size(); ++i) CHECK(same_bits(losses[i], pool_losses[i]));
      CHECK(params == pool_params);
      CHECK(pool_plans.back().arena_bytes == 0);
      for (const memory::PlanSummary& s : plans) {
        CHECK(s.arena_bytes > 0);
        CHECK(s.arena_values > 0);
        CHECK(s.arena_misses == 0);
        CHECK(s.arena_strayed_at == 0);  // execution ran the plan's runs, reused or not
        CHECK(s.arena_bytes >= s.arena_live_peak);
        CHECK(s.within_budget);
        if (fraction > 0) CHECK(s.recomputes > 0);
      }
      CHECK(plans.back().plan_reused);
    }
  }
}

TEST_CASE("once a step's plan is fixed the pool's measured reserve stays within the budget",
          "[plan]") {
  BudgetGuard guard;
  // The plan is made for less than the budget by what the arena's packing, the blocks beside
  // it and the pool's segments need (memory/planner/arena_fit.h), then values are kept in the
  // arena's gaps. On these models that can cost more than the default limit of 5% more work, so
  // here it may cost anything.
  struct LimitGuard {
    double was = memory::reserve_work_limit();
    ~LimitGuard() { memory::set_reserve_work_limit(was); }
  } limit_guard;
  CHECK(limit_guard.was == 0.05);
  CHECK_THROWS_AS(memory::set_reserve_work_limit(-1), ValueError);
  memory::set_reserve_work_limit(std::numeric_limits<double>::infinity());
  for (const char* kind : {"lstm_medium", "lstm", "transformer"}) {
    const Reference ref = reference(kind);
    // The small models' steps are a fraction of one of the pool's 2 MiB segments: their
    // reserve cannot be held, and the plan has to say so rather than claim it (it did
    // before the plan counted the pool's segments).
    const bool medium = std::string(kind) == "lstm_medium";
    // Unbudgeted, the LSTMs store their gates, so their releasable bytes are 0.6x what they
    // were when these fractions were 0.5 and 0.33 (test above): for the small one's step
    // with its gradients released, 0.45 is then the tightest budget here, and the medium one
    // holds its reserve at 0.7. In bytes both are below the old fractions' budgets.
    const bool small_lstm = std::string(kind) == "lstm";
    const double held = medium ? 0.7 : 0.5;
    for (double fraction : {held, small_lstm ? 0.45 : 0.33}) {
      INFO(kind << " at " << fraction);
      Trainer t = make_trainer(kind);
      t.release_grads = true;
      t.step();
      const size_t start = pool().allocated();
      const size_t budget = ref.budget(start, fraction);
      memory::set_budget(budget);
      for (int i = 0; i < 5; ++i) t.step();  // timed three times, then fixed
      // No empty_cache(): the unbudgeted step's bigger arena was cached, and the budgeted
      // steps must not have kept it (CachingPool::open_arena's `exact`). The small models'
      // pools also hold other tests' cached segments, which the plan does not count.
      if (!medium) pool().empty_cache();
      pool().reset_peak_stats();
      const double loss = t.step();
      const memory::PoolStats st = pool().stats();
      const memory::PlanSummary plan = memory::last_plan();
      memory::clear_budget();
      INFO(memory::plan_report() << pool().report());
      CHECK(std::isfinite(loss));
      CHECK(plan.plan_reused);
      CHECK(plan.arena_bytes > 0);
      CHECK(plan.planned_reserve > plan.arena_bytes);  // the blocks beside it: parameters, state
      CHECK(plan.planned_reserve >= plan.arena_bytes + plan.reserve_pinned);
      // The small models' parameters share 2 MiB segments that are mostly free.
      if (!medium) CHECK(plan.reserve_pinned > 0);
      CHECK(plan.planned_for <= budget);
      CHECK(st.peak_allocated <= budget);
      // What the plan counts is what the pool reserves, to within its alignment.
      CHECK(static_cast<double>(st.peak_reserved) <=
            1.01 * static_cast<double>(plan.planned_reserve));
      CHECK(plan.reserve_over_budget == (plan.planned_reserve > budget));
      // Where the plan holds the reserve, the pool's does not exceed the budget. Whether it
      // can hold depends on the free space that blocks of earlier tests pin in the pool's
      // segments; at 0.7 the medium model's budget leaves room for it.
      if (!plan.reserve_over_budget) CHECK(st.peak_reserved <= budget);
      if (medium && fraction == held) CHECK_FALSE(plan.reserve_over_budget);
      if (!medium) CHECK(plan.reserve_over_budget);
    }
  }
}

TEST_CASE("under the default reserve limit the report says why a reserve is over the budget",
          "[plan]") {
  BudgetGuard guard;
  for (const char* kind : {"lstm", "transformer"}) {
    const Reference ref = reference(kind);
    INFO(kind);
    Trainer t = make_trainer(kind);
    t.release_grads = true;
    t.step();
    const size_t budget = ref.budget(pool().allocated(), 0.5);
    memory::set_budget(budget);
    for (int i = 0; i < 6; ++i) t.step();
    const memory::PlanSummary plan = memory::last_plan();
    memory::clear_budget();
    INFO(memory::plan_report());
    CHECK(plan.plan_reused);
    CHECK(plan.planned_reserve > 0);
    CHECK(plan.reserve_over_budget == (plan.planned_reserve > budget));
    const double limit = memory::reserve_work_limit();
    if (plan.reserve_over_budget) {
      // Over only when no tighter plan fits, or the one that does costs more than the limit.
      CHECK(plan.planned_for == budget);
      CHECK((plan.reserve_cost == 0 || plan.reserve_cost > limit * plan.base_cost));
      CHECK_THAT(memory::plan_report(), Catch::Contains("over the budget"));
    } else {
      CHECK(plan.reserve_cost <= limit * plan.base_cost + 1e-12);
      CHECK_THAT(memory::plan_report(), Catch::Contains("releases kept in gaps"));
    }
  }
}

TEST_CASE("a stored plan runs again only for the same start and budget", "[plan]") {
  BudgetGuard guard;
  Trainer t = make_trainer("lstm");
  t.release_grads = true;
  t.step();
  memory::set_budget(pool().allocated() + 800'000);
  auto reused = [&] {
    t.step();
    return memory::last_plan().plan_reused;
  };
  for (int i = 0; i < 7; ++i) reused();
  CHECK(reused());
  {
    // More resident at the start: the stored plan's peak would be off by as much.
    Tensor held = randn({16384}).eval();
    CHECK_FALSE(reused());
    CHECK(reused());
  }
  CHECK_FALSE(reused());
  CHECK(reused());
  // Another margin plans against another budget.
  memory::set_plan_margin(0.25);
  CHECK_FALSE(reused());
  CHECK(reused());
  CHECK(memory::last_plan().within_budget);
}

TEST_CASE("a step that keeps no gradient frees each one after its update", "[plan]") {
  BudgetGuard guard;
  // Released before the step is evaluated, gradients are intermediates: the planner's kernel
  // order runs each update once its gradient is complete and frees the gradient there, so
  // they are never all resident together.
  auto run = [](bool release, size_t budget, std::vector<std::vector<char>>* params) {
    Trainer t = make_trainer("mlp_narrow");
    t.release_grads = release;
    t.step();
    const size_t start = pool().allocated();
    pool().reset_peak_stats();
    memory::set_budget(budget);
    const double loss = t.step();
    memory::clear_budget();
    if (params) *params = t.parameters();
    (void)loss;
    return std::pair<size_t, memory::PlanSummary>{pool().stats().peak_allocated - start,
                                                  memory::last_plan()};
  };
  std::vector<std::vector<char>> kept_params, released_params, budget_params;
  const auto [kept_peak, kept_plan] = run(false, 0, &kept_params);
  const auto [released_peak, released_plan] = run(true, 0, &released_params);
  INFO("peak above the start: " << kept_peak << " with gradients kept, " << released_peak
                                << " released; " << memory::plan_report());
  // With a batch of 16 the gradients (1.6 MB: seven 256x256 and one 64x256 weights) are
  // most of the step; released, at least half of them are gone before the last is made.
  size_t grads = 0;
  for (const Tensor& p : make_trainer("mlp_narrow").model->parameters())
    grads += static_cast<size_t>(p.numel()) * sizeof(float);
  CHECK(kept_plan.output_bytes >= grads);
  CHECK(released_plan.output_bytes < 4096);
  CHECK(released_peak + grads / 2 < kept_peak);
  // The order changes nothing computed.
  CHECK(released_params == kept_params);
  // And under a budget halfway between the lower bound and the peak, the same parameters.
  const size_t start = released_plan.start_bytes;
  const size_t lb = released_plan.lower_bound;
  REQUIRE(start + released_peak > lb);
  const size_t budget = lb + (start + released_peak - lb) / 2;
  const auto [budget_peak, budget_plan] = run(true, budget, &budget_params);
  INFO(memory::plan_report());
  CHECK(budget_params == kept_params);
  CHECK(start + budget_peak <= budget + budget / 100);
  CHECK(budget_plan.within_budget);
}

TEST_CASE("an unbudgeted step frees at last use, reuses dying inputs and donates parameters",
          "[plan]") {
  Trainer t = make_trainer("mlp");
  t.step();
  t.step();
  memory::PlanSummary s = memory::last_plan();
  INFO(memory::plan_report());
  CHECK(s.budget == 0);
  CHECK(s.recomputes == 0);
  CHECK(s.evictions == 0);
  CHECK(s.in_place > 0);
  // Eight weights and eight biases, each with a momentum buffer: every replaced value is
  // freed within the step, most by the update that replaces it (in place).
  CHECK(s.released_leaves == 32);
  CHECK(s.donated >= 16);
  CHECK(s.measured_peak >= s.lower_bound);
}

TEST_CASE("a value built from a parameter before the step still reads the old value", "[plan]") {
  Trainer t = make_trainer("mlp");
  t.step();
  Tensor w = t.model->parameters()[0];
  const std::vector<float> before = w.to_vector<float>();
  Tensor doubled = w * 2.0;  // pending, reads the parameter's current value
  t.step();
  std::vector<float> got = doubled.to_vector<float>();
  REQUIRE(got.size() == before.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == before[i] * 2.0f);
}

TEST_CASE("differentiating a step's graph again after its update is refused at backward",
          "[plan]") {
  manual_seed(7);
  auto layer = std::make_shared<nn::Linear>(64, 32);
  optim::SGD opt(layer->parameters(), optim::SGDOptions{.lr = 0.1});
  Tensor x = randn({8, 64}).eval();
  x.requires_grad_(true);
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    Tensor loss = sum(layer->forward(x) * layer->forward(x));
    loss.backward();
    opt.step();
    loss.item<double>();
    if (step == 0) continue;
    REQUIRE(memory::last_plan().donated > 0);
    // The old graph reads the weight the update took over: backward says so when called,
    // before anything is built or evaluated, and the parameters stay readable.
    x.set_grad(Tensor());
    try {
      loss.backward();
      FAIL("expected a ValueError");
    } catch (const ValueError& e) {
      CHECK_THAT(e.what(), Catch::Contains("[backward]") && Catch::Contains("updated"));
    }
    CHECK_FALSE(x.grad().defined());
    CHECK(layer->parameters()[0].to_vector<float>().size() == 32 * 64);
  }
}

TEST_CASE("a budget below the lower bound raises OutOfMemoryError before anything runs", "[plan]") {
  BudgetGuard guard;
  const Reference ref = reference("mlp");
  Trainer t = make_trainer("mlp");
  t.step();
  const size_t start = pool().allocated();
  memory::set_budget(start + 1024);
  t.opt->zero_grad();
  Tensor loss = t.loss_fn();
  loss.backward();
  t.opt->step();
  try {
    loss.item<double>();
    FAIL("expected OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("lower bound"));
    CHECK_THAT(what, Catch::Contains("smallest budget"));
    CHECK_THAT(what, Catch::Contains("host pool"));
  }
  // Nothing ran: without the budget the same step gives the reference's bits.
  memory::clear_budget();
  CHECK(same_bits(loss.item<double>(), ref.loss));
  CHECK(t.state() == ref.state);
}

TEST_CASE("the run-time fallback holds the budget when the plan was made for more", "[plan]") {
  BudgetGuard guard;
  const Reference ref = reference("transformer");
  Trainer t = make_trainer("transformer");
  t.step();
  const size_t start = pool().allocated();
  const size_t budget = ref.budget(start, 0.33);
  memory::set_budget(budget);
  memory::set_plan_margin(0.5);  // the static plan believes in 1.5x the budget
  pool().reset_peak_stats();
  const double loss = t.step();
  const size_t peak = pool().stats().peak_allocated;
  memory::PlanSummary s = memory::last_plan();
  INFO(memory::plan_report());
  CHECK(s.fallback_evictions > 0);
  // The runs left the plan where the fallback first evicted: the arena placed values up
  // to there and none after.
  CHECK(s.arena_values > 0);
  CHECK(s.arena_strayed_at > 0);
  CHECK(peak <= budget + budget / 100);
  CHECK(same_bits(loss, ref.loss));
  CHECK(t.state() == ref.state);
}

TEST_CASE("checkpoint releases the function's intermediates and rebuilds them", "[plan]") {
  const Reference plain = reference("mlp_wide");
  const Reference ck = reference("mlp_wide", true);
  memory::PlanSummary s = memory::last_plan();
  INFO(memory::plan_report());
  INFO("peak above start: " << ck.step_bytes << " checkpointed, " << plain.step_bytes << " plain");
  CHECK(same_bits(ck.loss, plain.loss));
  CHECK(ck.state == plain.state);
  CHECK(s.recomputes > 0);
  // Three activations of 2 MiB (one inside each pair) are not kept for the backward; the
  // backward rebuilds one pair's at a time, so the peak is lower by two of them.
  CHECK(ck.step_bytes + (3u << 20) < plain.step_bytes);
}

TEST_CASE("memory budgets parse sizes and percentages", "[plan]") {
  BudgetGuard guard;
  memory::set_budget(std::string("512MiB"));
  CHECK(memory::budget() == 512ull << 20);
  memory::set_budget(std::string("2GB"));
  CHECK(memory::budget() == 2000000000ull);
  memory::set_budget(std::string("50%"));
  const size_t half = memory::budget();
  memory::set_budget(std::string("25%"));
  CHECK(memory::budget() > 0);
  CHECK(half / 2 - memory::budget() <= 4096);
  CHECK_THAT(memory::budget_description(), Catch::Contains("25% of device memory"));
  // After a step the report says what the fraction came to on the pool the step ran on.
  (void)sum(randn({64, 64})).item<float>();  // any evaluation sets the last plan
  CHECK_THAT(memory::report(),
             Catch::Contains("[plan] budget 25% of device memory (" +
                             memory::format_bytes(memory::budget()) + " of the host pool)"));
  CHECK_THROWS_AS(memory::set_budget(std::string("1.5")), ValueError);
  CHECK_THROWS_AS(memory::set_budget(std::string("0.5")), ValueError);
  CHECK_THROWS_AS(memory::set_budget(std::string("lots")), ValueError);
  // The message names the spec and every accepted form, percentages included.
  CHECK_THROWS_WITH(memory::set_budget(std::string("lots")),
                    Catch::Matchers::Contains("'lots'") && Catch::Matchers::Contains("512MiB") &&
                        Catch::Matchers::Contains("a percentage of device memory"));
  memory::clear_budget();
  CHECK(memory::budget() == 0);
  CHECK_THAT(memory::report(), Catch::Contains("[plan] budget none"));
}
