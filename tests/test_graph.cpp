// The lazy graph: building does not run anything, evaluation materializes what is asked
// (and held intermediates: weak sync), evaluated nodes drop their inputs so loops do not grow
// the graph or the pool, deep chains are handled without recursion, values read back in the
// requested type, independent graphs evaluate concurrently, executors can be chosen.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/evaluation_listener.h"
#include "frontend/kiln.h"
#include "memory/pools/host_pool.h"

using kiln::DType;
using kiln::Node;
using kiln::Shape;
using kiln::Tensor;

namespace {

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -4, float hi = 4) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = u(rng);
    while (std::fabs(x) < 0.125f);
  }
  return v;
}

size_t pool_allocated() { return kiln::memory::host_pool().stats().allocated; }

// Restores the executor choice when a test that changes it ends, even by an exception.
struct ExecutorGuard {
  std::string saved = kiln::current_executor();
  ~ExecutorGuard() { kiln::set_executor(saved.c_str()); }
};

}  // namespace

TEST_CASE("graph: building ops evaluates nothing until a value is read", "[graph]") {
  std::vector<float> v = random_floats(6, 1);
  Tensor x = kiln::from_vector<float>(v, {2, 3});
  CHECK(x.is_evaluated());  // constants hold their value from the start
  Tensor y = x * 2.0f + 1.0f;
  Tensor r = kiln::rand({2, 3});
  Tensor z = kiln::exp(y) - r;
  CHECK_FALSE(y.is_evaluated());
  CHECK_FALSE(r.is_evaluated());
  CHECK_FALSE(z.is_evaluated());
  CHECK(z.shape() == Shape{2, 3});  // shape and dtype are known without running
  CHECK(z.dtype() == DType::Float32);
  SECTION("item") {
    Tensor s = kiln::reindex(y, {}, {kiln::IndexExpr::constant(1), kiln::IndexExpr::constant(2)});
    CHECK_FALSE(s.is_evaluated());
    CHECK(s.item<float>() == Approx(v[5] * 2.0f + 1.0f));
    CHECK(s.is_evaluated());
  }
  SECTION("to_vector") {
    std::vector<float> got = y.to_vector<float>();
    CHECK(y.is_evaluated());
    for (size_t i = 0; i < v.size(); ++i) CHECK(got[i] == Approx(v[i] * 2.0 + 1.0).epsilon(1e-6));
  }
  SECTION("eval") {
    const Tensor& same = z.eval();
    CHECK(&same == &z);
    CHECK(z.is_evaluated());
    // y and r are held but consumed inside the evaluation: whether they are stored is
    // fusion's choice; their values are right either way (r is counter-based random, so
    // recomputing it gives the bits z saw).
    std::vector<float> zv = z.to_vector<float>(), rv = r.to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i)
      CHECK(zv[i] == Approx(std::exp(v[i] * 2.0 + 1.0) - rv[i]).epsilon(1e-5));
  }
}

TEST_CASE("graph: eval of several tensors together shares their common work", "[graph]") {
  std::vector<float> v = random_floats(10, 2);
  Tensor x = kiln::from_vector<float>(v);
  Tensor shared = kiln::exp(x);
  Tensor p = shared + 1.0f, q = shared * 3.0f, unrelated = x - 1.0f;
  kiln::eval({p, q});
  CHECK(p.is_evaluated());
  CHECK(q.is_evaluated());
  // `shared` is held but consumed inside the evaluation: fusion may recompute it per
  // consumer instead of storing it, so only its value is checked (below).
  CHECK_FALSE(unrelated.is_evaluated());
  std::vector<float> pv = p.to_vector<float>(), qv = q.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    CHECK(pv[i] == Approx(std::exp(double(v[i])) + 1.0).epsilon(1e-6));
    CHECK(qv[i] == Approx(std::exp(double(v[i])) * 3.0).epsilon(1e-6));
  }
  kiln::eval(std::vector<Tensor>{unrelated, p});  // one pending, one done
  CHECK(unrelated.is_evaluated());
  kiln::eval({});  // nothing to do
}

TEST_CASE("graph: an evaluated node drops its input edges", "[graph]") {
  Tensor x = kiln::from_vector<float>({1, 2, 3});
  Tensor y = kiln::sin(x) * x;
  CHECK(y.node()->inputs.size() == 2);
  y.eval();
  CHECK(y.node()->inputs.empty());
  Tensor r = kiln::randn({4});
  r.eval();
  CHECK(r.node()->inputs.empty());
  // The dropped history is freed: only the handles' nodes stay alive.
  int64_t before = Node::live_count();
  {
    Tensor a = kiln::from_vector<float>({1, 2});
    Tensor b = ((a + 1.0f) * 2.0f - 3.0f) / 4.0f;
    CHECK(Node::live_count() > before + 4);
    b.eval();
    CHECK(Node::live_count() <= before + 2);  // a and b
  }
  CHECK(Node::live_count() == before);
}

TEST_CASE("graph: a 10,000-step loop keeps node count and pool memory flat", "[graph][memory]") {
  std::vector<float> v = random_floats(257, 3, -50, 50);
  Tensor x = kiln::from_vector<float>(v);
  int64_t live_warm = 0;
  size_t pool_warm = 0;
  for (int step = 1; step <= 10000; ++step) {
    x = x * 0.5f + 1.0f;
    x.eval();
    if (step == 5) {
      live_warm = Node::live_count();
      pool_warm = pool_allocated();
    }
    if (step <= 20) {
      // Closed form of x_{n+1} = x_n / 2 + 1: x_n = 2 + (x_0 - 2) / 2^n.
      std::vector<float> got = x.to_vector<float>();
      for (size_t i = 0; i < v.size(); i += 16) {
        double want = 2.0 + (double(v[i]) - 2.0) * std::ldexp(1.0, -step);
        CHECK(std::fabs(got[i] - want) <= 1e-5 * (1.0 + std::fabs(want)));
      }
    }
  }
  CHECK(Node::live_count() <= live_warm + 2);
  CHECK(pool_allocated() <= pool_warm + 1024);
  std::vector<float> final_values = x.to_vector<float>();
  for (float f : final_values) CHECK(f == 2.0f);
}

TEST_CASE("graph: held results are kept, unheld intermediates give their memory back",
          "[graph][memory]") {
  SECTION("a held pending result that overlaps the request is evaluated with it (weak sync)") {
    std::vector<float> v = random_floats(16, 5);
    Tensor x = kiln::from_vector<float>(v);
    Tensor shared = x * 3.0f;
    Tensor loss = kiln::sum(shared);
    Tensor update = shared + 1.0f;
    update.eval();
    CHECK(loss.is_evaluated());
    float want = 0;
    for (float f : v) want += f * 3.0f;
    CHECK(loss.item<float>() == Approx(want).epsilon(1e-5));
  }
  SECTION("a held intermediate reads back right after its consumer is evaluated") {
    std::vector<float> v = random_floats(16, 4);
    Tensor x = kiln::from_vector<float>(v);
    Tensor y = x * 2.0f;
    Tensor z = y + 1.0f;
    z.eval();
    std::vector<float> yv = y.to_vector<float>(), zv = z.to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      CHECK(yv[i] == v[i] * 2.0f);
      CHECK(zv[i] == v[i] * 2.0f + 1.0f);
    }
  }
  SECTION("a held random intermediate keeps the values its consumer saw") {
    kiln::manual_seed(17);
    Tensor r = kiln::rand({32});
    Tensor s = r * 10.0f;
    s.eval();
    // Recomputing r (if it was fused away) reproduces its bits: counter-based RNG.
    std::vector<float> rv = r.to_vector<float>(), sv = s.to_vector<float>();
    for (size_t i = 0; i < rv.size(); ++i) CHECK(sv[i] == rv[i] * 10.0f);
  }
  SECTION("unheld intermediates do not keep buffers") {
    const int64_t n = int64_t{1} << 20;  // 4 MiB per float32 value: large pool blocks
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    Tensor x = kiln::full({n}, 0.5f);
    x.eval();
    size_t before = pool_allocated();
    kiln::memory::host_pool().reset_peak_stats();
    Tensor z = ((x * 2.0f) + 1.0f) * 3.0f;
    z.eval();
    size_t after = pool_allocated();
    CHECK(after - before >= bytes);
    CHECK(after - before < 2 * bytes);  // only z's buffer stays
    CHECK(kiln::memory::host_pool().stats().peak_allocated - before <= 4 * bytes);
    CHECK(z.to_vector<float>()[static_cast<size_t>(n - 1)] == 6.0f);
    z = Tensor();
    CHECK(pool_allocated() == before);
  }
}

TEST_CASE("graph: a 100,000-node chain is destroyed and evaluated without recursion", "[graph]") {
  const int kSteps = 100000;
  int64_t live_before = Node::live_count();
  {
    Tensor c = kiln::from_vector<float>({1.0f});
    for (int i = 0; i < kSteps; ++i) c = c + 1.0f;
    CHECK(Node::live_count() >= live_before + kSteps);
    std::vector<Node*> order = kiln::pending_subgraph({c.node().get()});
    CHECK(order.size() >= static_cast<size_t>(kSteps));
    CHECK(order.back() == c.node().get());
  }  // destroyed unevaluated
  CHECK(Node::live_count() == live_before);
  {
    Tensor x = kiln::from_vector<float>({0.5f, -3.0f});
    Tensor c = x;
    for (int i = 0; i < kSteps; ++i) c = c + 1.0f;
    std::vector<float> got = c.to_vector<float>();
    CHECK(got[0] == 100000.5f);
    CHECK(got[1] == 99997.0f);
    CHECK(c.node()->inputs.empty());
  }
  CHECK(Node::live_count() == live_before);
}

TEST_CASE("graph: item, to_vector and data convert or check the element type", "[graph]") {
  Tensor i = kiln::from_vector<int32_t>({-7, 3, 250}, {3});
  Tensor f = kiln::from_vector<float>({-2.75f, 0.5f, 3.25f});
  SECTION("to_vector converts") {
    CHECK(i.to_vector<double>() == std::vector<double>{-7, 3, 250});
    CHECK(i.to_vector<int8_t>() == std::vector<int8_t>{-7, 3, static_cast<int8_t>(250)});
    CHECK(f.to_vector<int64_t>() == std::vector<int64_t>{-2, 0, 3});
    CHECK(f.to_vector<bool>() == std::vector<bool>{true, true, true});
    std::vector<kiln::Half> h = f.to_vector<kiln::Half>();
    CHECK(static_cast<float>(h[0]) == -2.75f);
    CHECK(kiln::from_vector<int64_t>({int64_t{1} << 62}).to_vector<int64_t>()[0] == int64_t{1}
                                                                                        << 62);
  }
  SECTION("item converts a single element") {
    CHECK(kiln::tensor(int32_t{-7}).item<float>() == -7.0f);
    CHECK(kiln::tensor(2.75).item<int>() == 2);
    CHECK(kiln::from_vector<float>({1.5f}, {1, 1}).item<double>() == 1.5);
    CHECK(kiln::tensor(true).item<int>() == 1);
    CHECK((kiln::tensor(3.0f) * 2.0f).item<float>() == 6.0f);
  }
  SECTION("data<T> needs the exact type") {
    const int32_t* p = i.data<int32_t>();
    CHECK(p[0] == -7);
    CHECK(p[2] == 250);
    Tensor doubled = f * 2.0f;  // the pointer lives as long as the tensor
    const float* q = doubled.data<float>();
    CHECK(q[1] == 1.0f);
    CHECK_THROWS_AS(i.data<float>(), kiln::DTypeError);
    CHECK_THROWS_AS(i.data<int64_t>(), kiln::DTypeError);
    CHECK_THROWS_AS(f.data<double>(), kiln::DTypeError);
    CHECK_THROWS_AS(kiln::cast(f, DType::Float16).data<float>(), kiln::DTypeError);
    CHECK(kiln::cast(f, DType::Float16).data<kiln::Half>()[0].bits == kiln::Half(-2.75f).bits);
  }
  SECTION("str shows values, shape and dtype") {
    std::string s = i.str();
    CHECK(s.find("-7") != std::string::npos);
    CHECK(s.find("int32") != std::string::npos);
  }
}

TEST_CASE("graph: independent graphs evaluate correctly from 4 threads", "[graph][threads]") {
  constexpr int kThreads = 4, kRounds = 50;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures, &errors] {
      try {
        kiln::Generator gen(100 + t);
        for (int round = 0; round < kRounds; ++round) {
          std::vector<float> av = random_floats(300, 1000 * t + round);
          Tensor a = kiln::from_vector<float>(av, {10, 30});
          Tensor r = kiln::rand({10, 30}, DType::Float32, gen);
          Tensor y = kiln::maximum(a * r + 1.0f, 0.0f) - kiln::tanh(a);
          std::vector<float> rv = r.to_vector<float>();  // held: y's evaluation reuses it
          std::vector<float> yv = y.to_vector<float>();
          for (size_t i = 0; i < av.size(); ++i) {
            double want = std::max(double(av[i]) * rv[i] + 1.0, 0.0) - std::tanh(double(av[i]));
            if (std::fabs(yv[i] - want) > 1e-5 * (1 + std::fabs(want))) ++failures[t];
          }
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t);
    CHECK(failures[t] == 0);
    CHECK(errors[t] == "");
  }
}

TEST_CASE("graph: the executor can be chosen by name", "[graph]") {
  ExecutorGuard guard;
  kiln::set_executor("reference");
  CHECK(std::string(kiln::current_executor()) == "reference");
  Tensor y = kiln::from_vector<float>({1.5f, -2.0f}) * 2.0f;
  CHECK(y.to_vector<float>() == std::vector<float>{3.0f, -4.0f});
  kiln::set_executor("nope");
  Tensor z = kiln::from_vector<float>({1.0f}) + 1.0f;
  CHECK_THROWS_AS(z.eval(), kiln::ValueError);
  CHECK_FALSE(z.is_evaluated());
  kiln::set_executor("reference");
  CHECK(z.item<float>() == 2.0f);  // the failed attempt left the graph usable
}

TEST_CASE("graph: evaluating in one thread while others build and drop pending tensors",
          "[graph][threads]") {
  // Evaluation looks at other held pending tensors (weak sync); tensors that other threads
  // create and drop meanwhile must neither be touched after they die nor change results.
  // Runs in a child process so that a crash fails this test instead of ending the suite.
  fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Die by the signal itself rather than through Catch's handler, which belongs to the parent.
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) std::signal(sig, SIG_DFL);
    constexpr int kThreads = 4, kRounds = 5000;
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([t, &failures] {
        try {
          for (int round = 0; round < kRounds; ++round) {
            float base = static_cast<float>(t * 10000 + round);
            Tensor a = kiln::from_vector<float>({base, -base});
            Tensor held = a + 1.0f;
            {
              Tensor dropped = held * 3.0f - 1.0f;  // pending, held for a moment, never evaluated
              Tensor other = kiln::exp(a * 0.0f);
            }
            Tensor c = held * 2.0f;
            std::vector<float> v = c.to_vector<float>();
            if (v[0] != (base + 1.0f) * 2.0f || v[1] != (1.0f - base) * 2.0f) ++failures;
          }
        } catch (const std::exception&) {
          failures += 1000000;
        }
      });
    }
    for (auto& th : threads) th.join();
    _exit(failures == 0 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("child: exited " << WIFEXITED(status) << " status " << WEXITSTATUS(status) << ", signal "
                        << (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// dist::DataParallel starts a bucket's all-reduce from these announcements, while the
// rest of the backward pass runs.
TEST_CASE("an evaluation listener hears of each requested value once its kernel has run",
          "[graph]") {
  using namespace kiln;
  struct Recorder : EvaluationListener {
    size_t kernels = 0;
    std::vector<const Node*> nodes;
    std::vector<size_t> kernels_before;
    std::vector<std::vector<float>> values;
    void value_ready(const Node& n, const std::shared_ptr<Buffer>& v) override {
      nodes.push_back(&n);
      kernels_before.push_back(kernels);
      const auto* f = static_cast<const float*>(v->host_data());
      values.emplace_back(f, f + n.numel());
    }
    void kernel_done() override { ++kernels; }
  };
  manual_seed(3);
  const Tensor x = randn({64, 32}).eval();
  const Tensor a = exp(x * 0.5f);
  const Tensor b = sum(a * a, {1});             // a reduction reading a: a later kernel
  const Tensor c = reshape(a + 0.f, {32, 64});  // simplify may answer it with a's value
  Recorder r;
  {
    ScopedEvaluationListener listen(r);
    eval({a, b, c});
  }
  REQUIRE(r.kernels >= 2);
  const std::vector<Tensor> wanted{a, b, c};
  for (const Tensor& t : wanted) {
    const auto it = std::find(r.nodes.begin(), r.nodes.end(), t.node().get());
    if (it == r.nodes.end()) continue;  // attached at the end only: allowed
    CHECK(std::count(r.nodes.begin(), r.nodes.end(), t.node().get()) == 1);
    const size_t k = static_cast<size_t>(it - r.nodes.begin());
    CHECK(r.values[k] == t.to_vector<float>());  // the final value, bit for bit
  }
  // a and b are kernels' results: announced, a before the kernel that reduces it.
  const auto at = std::find(r.nodes.begin(), r.nodes.end(), a.node().get());
  REQUIRE(at != r.nodes.end());
  REQUIRE(std::find(r.nodes.begin(), r.nodes.end(), b.node().get()) != r.nodes.end());
  CHECK(r.kernels_before[static_cast<size_t>(at - r.nodes.begin())] < r.kernels);
  // Outside the scope nothing is told.
  const size_t heard = r.nodes.size();
  (exp(x) + 1.f).eval();
  CHECK(r.nodes.size() == heard);
  CHECK(evaluation_listener() == nullptr);
}
