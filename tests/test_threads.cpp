// What kiln promises to multithreaded hosts (docs/threads.md), tested as stated there:
// threads that each own their tensors and models may build, train and evaluate at the same
// time and get bit for bit what the same work gives on one thread; evaluated tensors and
// models may be read (used as inputs) by several threads at once; the kernel cache, the
// statistics and the reports may be used from any thread during all of this; grad mode is
// per thread; random tensors drawn from the shared generator on several threads never share
// counter ranges. `make tsan` runs these cases under ThreadSanitizer.
//
// No result may depend on timing: every thread's work is a pure function of its index, and
// the cases compare against the same work done first on the calling thread.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "frontend/kiln.h"
#include "jit/compiler.h"

namespace {

using kiln::DType;
using kiln::Tensor;
namespace nn = kiln::nn;

// Runs work(0..n-1) on n threads started together; returns the first exception's message of
// each thread ("" when it finished).
std::vector<std::string> run_threads(int n, const std::function<void(int)>& work) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      try {
        work(t);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  return errors;
}

void require_no_errors(const std::vector<std::string>& errors) {
  for (size_t t = 0; t < errors.size(); ++t) {
    INFO("thread " << t);
    REQUIRE(errors[t] == "");
  }
}

// Bit-for-bit equality (so that -0 vs 0 or NaN payloads count as differences).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Values in [-1, 1) from a private generator: a pure function of `seed`, whatever other
// threads draw from the default generator meanwhile.
Tensor private_uniform(const kiln::Shape& shape, uint64_t seed) {
  kiln::Generator gen(seed);
  return (kiln::rand(shape, DType::Float32, gen) * 2.0f - 1.0f).eval();
}

// What one training run leaves behind: the loss read after each step and the final
// parameters, flattened.
struct TrainResult {
  std::vector<float> losses;
  std::vector<float> params;
};

// Trains model `k` (an MLP Linear-ReLU-Linear on a classification batch, SGD with
// momentum) for `steps` steps. The model is built here, but its initial values and the data
// come from private generators, so the run is a pure function of k.
TrainResult train_model(int k, int steps) {
  constexpr int64_t kBatch = 16, kIn = 8, kHidden = 12, kClasses = 4;
  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Linear>(kIn, kHidden), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(kHidden, kClasses)});
  // Linear's own initialisation draws from the default generator, which other threads share
  // (its values would depend on the order of draws): overwrite every parameter.
  uint64_t seed = 1000 * static_cast<uint64_t>(k + 1);
  for (Tensor& p : model->parameters()) p.assign(private_uniform(p.shape(), seed++) * 0.5f);
  Tensor x = private_uniform({kBatch, kIn}, seed++);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < kBatch; ++i) labels.push_back((i * 7 + k) % kClasses);
  Tensor y = kiln::from_vector(labels, {kBatch});
  kiln::optim::SGD opt(model->parameters(), {.lr = 0.2, .momentum = 0.9});
  TrainResult r;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
    r.losses.push_back(loss.item<float>());  // forward, backward and update in one evaluation
  }
  for (const Tensor& p : model->parameters()) {
    std::vector<float> v = p.to_vector<float>();
    r.params.insert(r.params.end(), v.begin(), v.end());
  }
  return r;
}

// A mixed graph (matmul, softmax, reductions, a private random draw, broadcasting) of a size
// that depends on k, so that threads also run different kernels; returns its values.
std::vector<float> disjoint_graph(int k) {
  const int64_t rows = 3 + k % 4, cols = 5 + k;
  Tensor a = private_uniform({rows, cols}, 50 + k);
  Tensor b = private_uniform({cols, rows}, 70 + k);
  kiln::Generator gen(90 + k);
  Tensor noise = kiln::rand({rows, rows}, DType::Float32, gen);
  Tensor m = kiln::matmul(a, b) + noise;
  Tensor s = kiln::softmax(m, -1) * kiln::exp(-kiln::abs(m));
  Tensor out = kiln::sum(s, {1}) + kiln::max(m, {1}) - kiln::mean(a, {1});
  return out.to_vector<float>();
}

}  // namespace

TEST_CASE("threads: models trained on 6 threads match single-threaded training bit for bit",
          "[threads]") {
  constexpr int kModels = 6, kSteps = 4;
  std::vector<TrainResult> want;
  for (int k = 0; k < kModels; ++k) want.push_back(train_model(k, kSteps));
  // The runs must differ from one another, or matching them would prove little.
  CHECK_FALSE(same_bits(want[0].params, want[1].params));
  for (int round = 0; round < 2; ++round) {
    std::vector<TrainResult> got(kModels);
    require_no_errors(run_threads(kModels, [&](int k) { got[k] = train_model(k, kSteps); }));
    for (int k = 0; k < kModels; ++k) {
      INFO("round " << round << ", model " << k);
      CHECK(same_bits(got[k].losses, want[k].losses));
      CHECK(same_bits(got[k].params, want[k].params));
    }
  }
}

TEST_CASE("threads: disjoint graphs evaluated concurrently match single-threaded values",
          "[threads]") {
  constexpr int kThreads = 8, kRounds = 3;
  std::vector<std::vector<float>> want;
  for (int k = 0; k < kThreads; ++k) want.push_back(disjoint_graph(k));
  std::vector<std::vector<std::vector<float>>> got(kThreads);
  require_no_errors(run_threads(kThreads, [&](int k) {
    for (int round = 0; round < kRounds; ++round) got[k].push_back(disjoint_graph(k));
  }));
  for (int k = 0; k < kThreads; ++k)
    for (int round = 0; round < kRounds; ++round) {
      INFO("thread " << k << ", round " << round);
      CHECK(same_bits(got[k][round], want[k]));
    }
}

TEST_CASE("threads: an evaluated model is shared for inference by 4 threads", "[threads]") {
  // Read-only sharing: the parameters are evaluated before the threads start, and nobody
  // trains or reassigns them while the threads run.
  constexpr int kThreads = 4, kRounds = 3;
  nn::Linear layer(6, 5);
  uint64_t seed = 7;
  for (Tensor& p : layer.parameters()) p.assign(private_uniform(p.shape(), seed++));
  Tensor shared_input = private_uniform({3, 6}, 99);  // one evaluated input read by all
  auto infer = [&](int k) {
    kiln::NoGradGuard no_grad;
    Tensor x = private_uniform({2 + k, 6}, 200 + k);
    Tensor y =
        kiln::sum(kiln::tanh(layer.forward(x)), {1}) * kiln::mean(layer.forward(shared_input));
    return y.to_vector<float>();
  };
  std::vector<std::vector<float>> want;
  for (int k = 0; k < kThreads; ++k) want.push_back(infer(k));
  std::vector<std::vector<std::vector<float>>> got(kThreads);
  require_no_errors(run_threads(kThreads, [&](int k) {
    for (int round = 0; round < kRounds; ++round) got[k].push_back(infer(k));
  }));
  for (int k = 0; k < kThreads; ++k)
    for (int round = 0; round < kRounds; ++round) {
      INFO("thread " << k << ", round " << round);
      CHECK(same_bits(got[k][round], want[k]));
    }
}

TEST_CASE("threads: statistics and reports are read while other threads train", "[threads]") {
  constexpr int kModels = 3, kSteps = 3;
  std::vector<TrainResult> want;
  for (int k = 0; k < kModels; ++k) want.push_back(train_model(k, kSteps));
  std::vector<TrainResult> got(kModels);
  std::atomic<int> training{kModels};
  std::atomic<int64_t> reads{0};
  // Thread kModels is the observer: it reads everything a host would poll, until the
  // trainers are done (at least once, whatever the scheduling).
  require_no_errors(run_threads(kModels + 1, [&](int k) {
    if (k < kModels) {
      got[k] = train_model(k, kSteps);
      training--;
      return;
    }
    do {
      kiln::jit::CacheStats stats = kiln::jit::cache_stats();
      std::vector<kiln::jit::KernelRecord> records = kiln::jit::kernel_records();
      std::string report = kiln::memory::report() + kiln::memory::plan_report();
      kiln::jit::EvalStats eval = kiln::jit::last_eval_stats();
      kiln::memory::PlanSummary plan = kiln::memory::last_plan();
      REQUIRE(!report.empty());
      (void)stats, (void)eval, (void)plan;
      uint64_t launches = 0;
      for (const auto& r : records) launches += r.launches;
      (void)launches;
      reads++;
    } while (training.load() > 0);
  }));
  CHECK(reads.load() >= 1);
  for (int k = 0; k < kModels; ++k) {
    INFO("model " << k);
    CHECK(same_bits(got[k].losses, want[k].losses));
    CHECK(same_bits(got[k].params, want[k].params));
  }
  // The launches the executor counted are visible in the records.
  uint64_t launches = 0;
  for (const auto& r : kiln::jit::kernel_records()) launches += r.launches;
  CHECK(launches > 0);
}

TEST_CASE("threads: one kernel cache serves 8 threads asking for the same and different kernels",
          "[threads]") {
  namespace fs = std::filesystem;
  using kiln::jit::KernelCache;
  using Fn = long long (*)(long long);
  constexpr int kThreads = 8, kKernels = 5;
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_threads_cache_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto source = [](int add) {
    return "extern \"C\" long long kiln_threads_test(long long x) { return x * 3 + " +
           std::to_string(add) + "; }\n";
  };
  // Every thread asks for every kernel, each starting at another one, and runs what it got.
  auto use = [&](KernelCache& cache, std::vector<int>& wrong) {
    return run_threads(kThreads, [&](int t) {
      for (int i = 0; i < kKernels; ++i) {
        int add = (t + i) % kKernels;
        auto h = cache.get(source(add), "kiln_threads_test", {"test"}, kiln::jit::cpu_compiler());
        if (h.fn == nullptr || reinterpret_cast<Fn>(h.fn)(t) != 3 * t + add) wrong[t]++;
      }
    });
  };
  {
    KernelCache cache(dir.string(), size_t{64} << 20);
    std::vector<int> wrong(kThreads, 0);
    require_no_errors(use(cache, wrong));
    CHECK(wrong == std::vector<int>(kThreads, 0));
    kiln::jit::CacheStats s = cache.stats();
    CHECK(s.kernels_compiled == kKernels);  // each compiled once, whoever asked first
    CHECK(s.memory_hits == kThreads * kKernels - kKernels);
    CHECK(cache.loaded_records().size() == kKernels);
  }
  {
    // A second cache over the same directory (as a new process would) loads from disk.
    KernelCache cache(dir.string(), size_t{64} << 20);
    std::vector<int> wrong(kThreads, 0);
    require_no_errors(use(cache, wrong));
    CHECK(wrong == std::vector<int>(kThreads, 0));
    kiln::jit::CacheStats s = cache.stats();
    CHECK(s.kernels_compiled == 0);
    CHECK(s.disk_hits == kKernels);
    CHECK(s.memory_hits == kThreads * kKernels - kKernels);
  }
  fs::remove_all(dir);
}

TEST_CASE("threads: grad mode is per thread", "[threads]") {
  Tensor w = private_uniform({3}, 5);
  w.requires_grad_(true);
  std::latch guarded(1), checked(1);
  bool inside_requires_grad = true;
  std::thread other([&] {
    kiln::NoGradGuard no_grad;
    guarded.count_down();
    inside_requires_grad = (w * 2.0f).requires_grad();
    checked.wait();
  });
  guarded.wait();
  // The other thread is inside its NoGradGuard now; this thread still records gradients.
  bool here_requires_grad = (w * 2.0f).requires_grad();
  checked.count_down();
  other.join();
  CHECK(here_requires_grad);
  CHECK_FALSE(inside_requires_grad);
}

TEST_CASE("threads: random tensors drawn on 6 threads get disjoint counter ranges", "[threads]") {
  // The default generator is shared: which range a thread gets depends on scheduling, but
  // the ranges never overlap and together cover exactly what was drawn.
  constexpr int kThreads = 6, kDraws = 20;
  kiln::manual_seed(4242);
  const uint64_t first = kiln::default_generator().offset();
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(kThreads);  // (offset, size)
  std::vector<std::vector<uint64_t>> seeds(kThreads);
  require_no_errors(run_threads(kThreads, [&](int t) {
    for (int d = 0; d < kDraws; ++d) {
      const int64_t n = 1 + (t * kDraws + d) % 7;
      Tensor r = d % 2 ? kiln::rand({n}) : kiln::randn({n});
      ranges[t].push_back({r.node()->offset, static_cast<uint64_t>(n)});
      seeds[t].push_back(r.node()->seed);
    }
  }));
  std::vector<std::pair<uint64_t, uint64_t>> all;
  for (int t = 0; t < kThreads; ++t) {
    all.insert(all.end(), ranges[t].begin(), ranges[t].end());
    for (uint64_t s : seeds[t]) CHECK(s == 4242);
  }
  std::sort(all.begin(), all.end());
  uint64_t next = first;
  for (const auto& [offset, size] : all) {
    CHECK(offset == next);
    next = offset + size;
  }
  CHECK(kiln::default_generator().offset() == next);
}
