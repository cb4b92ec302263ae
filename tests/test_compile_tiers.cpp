// Parallel compiles (KernelCache::get_many) and tiered compilation: a kernel first runs
// from a quick build and is swapped for its full build in the background (KILN_JIT_TIERS).
// Cache tests use their own directories and caches; the executor test uses the process's.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "jit/compiler.h"
#include "jit/kernel_cache.h"
#include "kiln/kiln.h"
#include "tests/cache_test_support.h"

using namespace kiln;
using namespace kiln::jit;
using namespace kiln::cache_test;

namespace {

// The process's LLVM compiler and its quick tier, counting the compiles of each.
class TieredCompiler final : public CpuCompiler {
 public:
  explicit TieredCompiler(CpuCompiler& base) : quick_(0, "", base.quick_compiler()), base_(base) {}
  std::string name() const override { return base_.name(); }
  std::string identity() const override { return base_.identity(); }
  std::vector<uint8_t> compile(const std::string& source, const std::string& hint) override {
    compiles++;
    return base_.compile(source, hint);
  }
  std::unique_ptr<LoadedModule> load(const std::vector<uint8_t>& image) override {
    return base_.load(image);
  }
  CpuCompiler* quick_compiler() override { return &quick_; }
  void warm_up() override {
    // Where and when: on the launching thread, before any background compile.
    warmed_on = std::this_thread::get_id();
    compiles_before_warm_up = compiles.load();
    warm_ups++;
    base_.warm_up();
  }
  std::atomic<int> compiles{0};
  std::atomic<int> warm_ups{0};
  int compiles_before_warm_up = -1;
  std::thread::id warmed_on;
  CountingCompiler quick_;  // counts the quick builds

 private:
  CpuCompiler& base_;
};

// A float map kernel shaped like the printed ones (restrict pointers, a loop the vectorizer
// takes at -O3), with division, sqrt and a polynomial, so that the quick and full builds
// run very different code for the same IEEE operations.
const char* const kMapEntry = "kiln_tier_test";
std::string map_source(int variant) {
  return "extern \"C\" void kiln_tier_test(const float* __restrict a, const float* __restrict "
         "b, float* __restrict out, long long n) {\n"
         "#pragma clang loop vectorize(assume_safety)\n"
         "  for (long long i = 0; i < n; ++i) {\n"
         "    float x = a[i], y = b[i];\n"
         "    float p = ((x * 0.25f + 1.5f) * x - 2.0f) * x + " +
         std::to_string(variant) +
         ".0f;\n"
         "    out[i] = p / (y * y + 1.0f) + __builtin_sqrtf(y * y + x * x) - (x < y ? x : y);\n"
         "  }\n"
         "}\n";
}
using MapFn = void (*)(const float*, const float*, float*, long long);

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-8.0f, 8.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

std::vector<float> run_map(void* fn, const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  reinterpret_cast<MapFn>(fn)(a.data(), b.data(), out.data(), static_cast<long long>(a.size()));
  return out;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

KernelRequest map_request(int variant) { return {map_source(variant), kMapEntry, {"map"}, true}; }

// Launches `h` as the executor does (count_use per launch) until its rebuild is queued.
void launch_until_rebuild(const KernelHandle& h) {
  for (uint64_t i = 0; i < KernelCache::kRebuildAfterLaunches; ++i)
    count_use(h.record, h.record_mutex, 0, 1, 0.0);
}

}  // namespace

TEST_CASE("get_many compiles distinct kernels in parallel with the results of serial gets",
          "[cache][tiers]") {
  TempDir tmp;
  CountingCompiler parallel_compiler, serial_compiler;
  KernelCache parallel(tmp.root() + "/parallel", 0), serial(tmp.root() + "/serial", 0);
  std::vector<KernelRequest> requests;
  for (int i = 0; i < 16; ++i) requests.push_back({kernel_source(500 + i), kEntry, {"add"}, false});
  requests.push_back(requests[3]);  // a repeated key compiles once
  std::vector<KernelHandle> got = parallel.get_many(requests, parallel_compiler);
  REQUIRE(got.size() == requests.size());
  CHECK(parallel_compiler.compiles == 16);
  CHECK(got[16].fn == got[3].fn);
  for (size_t i = 0; i < requests.size(); ++i) {
    KernelHandle s = serial.get(requests[i].source, kEntry, {"add"}, serial_compiler);
    for (long long x : {-7LL, 0LL, 12345LL}) CHECK(run(got[i], x) == run(s, x));
  }
  CHECK(parallel.stats().kernels_compiled == 16);
  CHECK(parallel.stats().memory_hits == 1);
}

TEST_CASE("a tiered kernel gives the same bits before and after its full build is swapped in",
          "[cache][tiers]") {
  if (!have_llvm()) return;
  TempDir tmp;
  auto llvm = make_cpu_compiler("llvm");
  TieredCompiler compiler(*llvm);
  KernelCache cache(tmp.cache(), 0);
  cache.set_tiers(true);
  KernelHandle h = cache.get(map_request(1), compiler);
  CHECK(compiler.quick_.compiles == 1);
  CHECK(compiler.compiles == 0);
  CHECK(cache.stats().quick_builds == 1);
  void* quick_fn = h.entry();
  // Random inputs of a length that leaves a vector remainder at -O3.
  const std::vector<float> a = random_floats(4099, 1), b = random_floats(4099, 2);
  const std::vector<float> before = run_map(quick_fn, a, b);

  launch_until_rebuild(h);
  cache.wait_for_rebuilds();
  CHECK(compiler.compiles == 1);
  CacheStats s = cache.stats();
  CHECK(s.full_rebuilds == 1);
  CHECK(s.swaps == 1);
  CHECK(s.kernels_compiled == 1);  // the quick build; the rebuild is counted apart
  REQUIRE(h.entry() != quick_fn);
  // Fast-math is off and contraction too (-ffp-contract=off at both levels): bit-exact.
  CHECK(same_bits(before, run_map(h.entry(), a, b)));
  // The quick build stays loaded (a launch might still be running it).
  CHECK(same_bits(before, run_map(quick_fn, a, b)));
  CHECK(h.record->compiler == llvm->identity());
  CHECK(h.record->launches == KernelCache::kRebuildAfterLaunches);
}

TEST_CASE("after a tiered run the disk holds the full build, which a new cache loads",
          "[cache][tiers]") {
  if (!have_llvm()) return;
  TempDir tmp;
  auto llvm = make_cpu_compiler("llvm");
  const std::string key = KernelCache::key_for(map_source(2), *llvm);
  {
    TieredCompiler compiler(*llvm);
    KernelCache cache(tmp.cache(), 0);
    cache.set_tiers(true);
    KernelHandle h = cache.get(map_request(2), compiler);
    // The quick build is stored under its own key; the full build's key has nothing yet.
    const std::string quick_key = KernelCache::key_for(map_source(2), *llvm->quick_compiler());
    CHECK(fs::exists(tmp.cache() + "/" + quick_key + ".kk"));
    CHECK_FALSE(fs::exists(tmp.cache() + "/" + key + ".kk"));
    launch_until_rebuild(h);
    cache.wait_for_rebuilds();
    REQUIRE(fs::exists(tmp.cache() + "/" + key + ".kk"));
    // The full build replaces the quick one on disk.
    CHECK_FALSE(fs::exists(tmp.cache() + "/" + quick_key + ".kk"));
    std::vector<KernelRecord> on_disk = cache.disk_records();
    REQUIRE(on_disk.size() == 1);
    CHECK(on_disk[0].compiler == llvm->identity());
  }
  // Another cache (as another process would) loads the full build, compiling nothing,
  // with tiers on: the disk's full build is preferred to a quick build.
  TieredCompiler compiler(*llvm);
  KernelCache cache(tmp.cache(), 0);
  cache.set_tiers(true);
  KernelHandle h = cache.get(map_request(2), compiler);
  CHECK(compiler.compiles == 0);
  CHECK(compiler.quick_.compiles == 0);
  CacheStats s = cache.stats();
  CHECK(s.disk_hits == 1);
  CHECK(s.kernels_compiled == 0);
  CHECK(s.quick_builds == 0);
  CHECK(h.record->compiler == llvm->identity());
  const std::vector<float> a = random_floats(300, 3), b = random_floats(300, 4);
  CHECK(run_map(h.entry(), a, b).size() == 300);
}

TEST_CASE("a damaged disk entry met by a background rebuild costs one warning and a compile",
          "[cache][tiers]") {
  if (!have_llvm()) return;
  TempDir tmp;
  auto llvm = make_cpu_compiler("llvm");
  const std::string key = KernelCache::key_for(map_source(3), *llvm);
  TieredCompiler compiler(*llvm);
  KernelCache cache(tmp.cache(), 0);
  cache.set_tiers(true);
  KernelHandle h = cache.get(map_request(3), compiler);
  const std::vector<float> a = random_floats(1000, 5), b = random_floats(1000, 6);
  const std::vector<float> before = run_map(h.entry(), a, b);
  // Another process's entry, damaged, appears before the rebuild looks for one.
  write_bytes(tmp.cache() + "/" + key + ".kk", "KILNKC01 but not an entry at all");
  StderrCapture capture(tmp.root());
  launch_until_rebuild(h);
  cache.wait_for_rebuilds();
  const std::string err = capture.finish();
  CHECK(count(err, "kiln: warning: discarding corrupt kernel cache entry") == 1);
  CHECK(compiler.compiles == 1);
  CacheStats s = cache.stats();
  CHECK(s.disk_errors == 1);
  CHECK(s.swaps == 1);
  CHECK(same_bits(before, run_map(h.entry(), a, b)));
  // The rebuild stored a good entry in its place.
  KernelCache again(tmp.cache(), 0);
  TieredCompiler fresh(*llvm);
  again.get(map_request(3), fresh);
  CHECK(fresh.compiles == 0);
  CHECK(again.stats().disk_hits == 1);
}

TEST_CASE("a cache destroyed with rebuilds queued drops them and keeps its kernels valid",
          "[cache][tiers]") {
  if (!have_llvm()) return;
  TempDir tmp;
  auto llvm = make_cpu_compiler("llvm");
  TieredCompiler compiler(*llvm);
  {
    KernelCache cache(tmp.cache(), 0);
    cache.set_tiers(true);
    for (int v = 10; v < 14; ++v) launch_until_rebuild(cache.get(map_request(v), compiler));
  }  // the destructor stops the rebuild thread before the entries go
  CHECK(compiler.quick_.compiles == 4);
  CHECK(compiler.compiles <= 4);
}

TEST_CASE("executor: a tiered kernel's values do not change when its full build arrives",
          "[cache][tiers]") {
  if (!have_llvm() || cpu_compiler().name() != "llvm") return;
  KernelCache& cache = kernel_cache();
  cache.set_tiers(true);
  const uint64_t quick_before = cache.stats().quick_builds;
  std::vector<float> xs = random_floats(3001, 7), ys = random_floats(3001, 8);
  Tensor x = from_vector(xs, {3001}), y = from_vector(ys, {3001});
  // A structure no other test builds, so its kernel is new to this process.
  auto graph = [&] { return tanh(x * 0.37f) * exp(y * 0.11f) - sqrt(abs(x - y) + 0.5f); };
  const std::vector<float> first = graph().to_vector<float>();
  CHECK(cache.stats().quick_builds > quick_before);
  for (uint64_t i = 0; i < KernelCache::kRebuildAfterLaunches; ++i) graph().eval();
  cache.wait_for_rebuilds();
  CHECK(cache.stats().swaps >= 1);
  CHECK(same_bits(first, graph().to_vector<float>()));
  // Exact against the reference evaluator is not expected (its exp/tanh are libm's); the
  // kernel must agree with itself across builds, which is checked above.
}

TEST_CASE("the full compiler is warmed up on the launching thread before its first rebuild",
          "[cache][tiers]") {
  if (!have_llvm()) return;
  TempDir tmp;
  auto llvm = make_cpu_compiler("llvm");
  TieredCompiler compiler(*llvm);
  KernelCache cache(tmp.cache(), 0);
  cache.set_tiers(true);
  launch_until_rebuild(cache.get(map_request(20), compiler));
  // Synchronous: done when the third launch returns, before the rebuild thread compiled.
  CHECK(compiler.warm_ups == 1);
  CHECK(compiler.warmed_on == std::this_thread::get_id());
  CHECK(compiler.compiles_before_warm_up == 0);
  launch_until_rebuild(cache.get(map_request(21), compiler));
  cache.wait_for_rebuilds();
  CHECK(compiler.warm_ups == 1);  // once per thread start, not per rebuild
  CHECK(compiler.compiles == 2);
}

// Body of the child process of the next test; does nothing unless run by it: six graphs
// no other case builds, each evaluated three times, so that each quick build's rebuild is
// queued at its third launch, and the process exits at once. The exit lets the rebuild in
// flight finish and drops the queued ones, so a second run in the same cache directory
// loads most quick builds from disk, compiles nothing itself, and exits while the first
// -O3 compile of its process runs on the rebuild thread.
TEST_CASE("tiers exit child: exit while rebuilds compile", "[.][tiers_exit_child]") {
  if (!std::getenv("TIERS_EXIT_CHILD")) return;
  const Tensor x = from_vector(random_floats(1000, 3), {1000});
  const std::vector<std::function<Tensor()>> graphs = {
      [&] { return ((x * 0.37f + 1.5f) * x - 2.0f) * x; },
      [&] { return (x + 0.5f) * (x - 0.25f) * 3.0f; },
      [&] { return abs(x) * 0.75f + x * x; },
      [&] { return maximum(x, x * 0.5f) * 1.25f - x; },
      [&] { return (x * x - x) * (x + 2.0f); },
      [&] { return -x * 0.125f + abs(x - 1.0f); }};
  for (const auto& graph : graphs)
    for (uint64_t i = 0; i < KernelCache::kRebuildAfterLaunches; ++i) graph().eval();
  // The parent sweeps this delay so that some exit falls in the rebuild's code generation.
  if (const char* delay = std::getenv("TIERS_EXIT_CHILD_DELAY_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(delay)));
}

TEST_CASE("a process that exits while its first background rebuild compiles exits cleanly",
          "[cache][tiers]") {
  if (!have_llvm() || cpu_compiler().name() != "llvm") return;
  // When every kernel of a process came from disk, its first -O3 compile used to run on the
  // rebuild thread; the code generator's statics it made then died at exit under it (a
  // segfault at exit in about one second run in six). Each pair of runs shares a fresh cache.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  TempDir tmp;
  for (int pair = 0; pair < 16; ++pair) {
    const std::string dir = tmp.root() + "/pair" + std::to_string(pair);
    for (int run = 0; run < 2; ++run) {
      const std::string command = "KILN_JIT_TIERS=1 KILN_CACHE_DIR='" + dir +
                                  "' TIERS_EXIT_CHILD=1 TIERS_EXIT_CHILD_DELAY_MS=" +
                                  std::to_string(run * pair * 4) + " '" + self +
                                  "' '[tiers_exit_child]' >/dev/null 2>&1";
      INFO("run " << run << " of pair " << pair << ": " << command);
      REQUIRE(std::system(command.c_str()) == 0);
    }
  }
}
