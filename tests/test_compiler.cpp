// CPU compilers: both compile and run kernels, report errors with the compiler log and the
// source path, load one image several times, and keep working after a failure.
// The LLVM compiler is skipped (with a warning) in builds without LLVM.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "frontend/kiln.h"
#include "jit/compiler.h"
#include "jit/fuse.h"
#include "jit/kernel_ir.h"
#include "jit/printer_cpp.h"
#include "test_files.h"
#include "test_nn_support.h"

using kiln::CompileError;
using kiln::jit::CpuCompiler;

namespace {

using UnaryKernel = void (*)(float*, const float*, long);

const char* kScaleSource = R"(
extern "C" void k(float* __restrict o, const float* __restrict a, long n) {
  for (long i = 0; i < n; ++i) o[i] = a[i] * 2.f + 1.f;
}
)";

// Calls into libm through builtins: the JIT must resolve expf/tanhf/logf from the process.
const char* kMathSource = R"(
extern "C" void k(float* __restrict o, const float* __restrict a, long n) {
  for (long i = 0; i < n; ++i) {
    float x = a[i];
    o[i] = __builtin_expf(x) + __builtin_tanhf(x) + __builtin_logf(__builtin_fabsf(x) + 1.f) +
           __builtin_sqrtf(__builtin_fabsf(x));
  }
}
)";

std::vector<std::string> available_compilers() {
  std::vector<std::string> names = {"external"};
  if (kiln::jit::have_llvm()) {
    names.insert(names.begin(), "llvm");
  } else {
    WARN("kiln built without LLVM (-DKILN_WITH_LLVM=OFF): LLVM compiler tests skipped");
  }
  return names;
}

std::vector<float> random_nonzero(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = dist(rng);
    while (std::fabs(x) < 1e-3f);
  }
  return v;
}

// CPU time of the calling thread: compile cost independent of machine load.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A source with a distinct kernel body per `salt`, so that nothing can be reused.
std::string salted_source(int salt) {
  return "extern \"C\" void k(float* __restrict o, const float* __restrict a, long n) {\n"
         "  for (long i = 0; i < n; ++i) o[i] = a[i] * " +
         std::to_string(salt + 2) + ".f + " + std::to_string(salt) + ".f;\n}\n";
}

}  // namespace

TEST_CASE("compilers compile and run an elementwise kernel", "[compiler]") {
  for (const auto& name : available_compilers()) {
    INFO("compiler: " << name);
    auto compiler = kiln::jit::make_cpu_compiler(name);
    REQUIRE(compiler);
    CHECK(compiler->name() == name);
    auto image = compiler->compile(kScaleSource, "/cache/scale.cpp");
    REQUIRE(!image.empty());
    auto module = compiler->load(image);
    auto fn = reinterpret_cast<UnaryKernel>(module->symbol("k"));
    // An odd length exercises the vector loop's remainder.
    auto a = random_nonzero(1037, 1);
    std::vector<float> out(a.size(), 0.f);
    fn(out.data(), a.data(), static_cast<long>(a.size()));
    for (size_t i = 0; i < a.size(); ++i) REQUIRE(out[i] == a[i] * 2.f + 1.f);
  }
}

TEST_CASE("compilers resolve libm builtins", "[compiler]") {
  for (const auto& name : available_compilers()) {
    INFO("compiler: " << name);
    auto compiler = kiln::jit::make_cpu_compiler(name);
    auto module = compiler->load(compiler->compile(kMathSource, "/cache/math.cpp"));
    auto fn = reinterpret_cast<UnaryKernel>(module->symbol("k"));
    auto a = random_nonzero(515, 2);
    std::vector<float> out(a.size(), 0.f);
    fn(out.data(), a.data(), static_cast<long>(a.size()));
    for (size_t i = 0; i < a.size(); ++i) {
      float x = a[i];
      float ref =
          std::exp(x) + std::tanh(x) + std::log(std::fabs(x) + 1.f) + std::sqrt(std::fabs(x));
      REQUIRE(out[i] == Approx(ref).epsilon(1e-5));
    }
  }
}

TEST_CASE("a compile error carries the log and the source path, and the compiler recovers",
          "[compiler]") {
  const std::string bad = "extern \"C\" void k(float* o) { o[0] = 1.f }\n";  // missing ';'
  const std::string hint = "/home/user/.cache/kiln/ab12cd.cpp";
  for (const auto& name : available_compilers()) {
    INFO("compiler: " << name);
    auto compiler = kiln::jit::make_cpu_compiler(name);
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        compiler->compile(bad, hint);
        FAIL("a syntax error compiled");
      } catch (const CompileError& e) {
        std::string message = e.what();
        INFO(message);
        CHECK(message.find(hint) != std::string::npos);
        CHECK(message.find("expected") != std::string::npos);
        CHECK(message.find("error") != std::string::npos);
      }
    }
    // Still usable.
    auto module = compiler->load(compiler->compile(kScaleSource, "/cache/scale.cpp"));
    auto fn = reinterpret_cast<UnaryKernel>(module->symbol("k"));
    float a = 3.f, o = 0.f;
    fn(&o, &a, 1);
    CHECK(o == 7.f);
  }
}

TEST_CASE("one image loads into independent modules", "[compiler]") {
  for (const auto& name : available_compilers()) {
    INFO("compiler: " << name);
    auto compiler = kiln::jit::make_cpu_compiler(name);
    auto image = compiler->compile(kScaleSource, "/cache/scale.cpp");
    auto first = compiler->load(image);
    auto second = compiler->load(image);
    auto f1 = reinterpret_cast<UnaryKernel>(first->symbol("k"));
    auto f2 = reinterpret_cast<UnaryKernel>(second->symbol("k"));
    CHECK(reinterpret_cast<void*>(f1) != reinterpret_cast<void*>(f2));
    float a = 2.f, o = 0.f;
    f1(&o, &a, 1);
    CHECK(o == 5.f);
    first.reset();  // unloading one leaves the other intact
    f2(&o, &a, 1);
    CHECK(o == 5.f);

    // Equal symbol names in different images do not clash.
    auto other = compiler->load(compiler->compile(salted_source(5), "/cache/salted5.cpp"));
    auto f3 = reinterpret_cast<UnaryKernel>(other->symbol("k"));
    f3(&o, &a, 1);
    CHECK(o == 2.f * 7.f + 5.f);
    f2(&o, &a, 1);
    CHECK(o == 5.f);
  }
}

TEST_CASE("missing symbols and bad images raise CompileError", "[compiler]") {
  for (const auto& name : available_compilers()) {
    INFO("compiler: " << name);
    auto compiler = kiln::jit::make_cpu_compiler(name);
    auto module = compiler->load(compiler->compile(kScaleSource, "/cache/scale.cpp"));
    CHECK_THROWS_AS(module->symbol("no_such_kernel"), CompileError);
    CHECK_THROWS_AS(compiler->load({}), CompileError);
    std::vector<uint8_t> garbage(4096);
    for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 131 + 7);
    CHECK_THROWS_AS(compiler->load(garbage), CompileError);
    // A kernel calling an undefined function: fails at load or at lookup, never crashes.
    const char* unresolved = R"(
extern "C" float kiln_no_such_function(float);
extern "C" void k(float* o) { o[0] = kiln_no_such_function(o[0]); }
)";
    auto image = compiler->compile(unresolved, "/cache/unresolved.cpp");
    CHECK_THROWS_AS(compiler->load(image)->symbol("k"), CompileError);
    // And the compiler is still fine afterwards.
    auto again = compiler->load(compiler->compile(kScaleSource, "/cache/scale.cpp"));
    CHECK(again->symbol("k") != nullptr);
  }
}

TEST_CASE("compiler identities and CPU features", "[compiler]") {
  auto external = kiln::jit::make_cpu_compiler("external");
  REQUIRE(external);
  CHECK(!external->identity().empty());
  CHECK(external->identity().find("-O3") != std::string::npos);
  CHECK(kiln::jit::make_cpu_compiler("no-such-compiler") == nullptr);
  if (kiln::jit::have_llvm()) {
    auto llvm = kiln::jit::make_cpu_compiler("llvm");
    REQUIRE(llvm);
    CHECK(llvm->identity().find("clang 16") == 0);
    CHECK(llvm->identity() != external->identity());
  } else {
    CHECK(kiln::jit::make_cpu_compiler("llvm") == nullptr);
    WARN("kiln built without LLVM: the llvm compiler is absent");
  }
  const std::string& features = kiln::jit::host_cpu_features();
  CHECK(!features.empty());
  CHECK(features.find('+') != std::string::npos);
  CHECK(&features == &kiln::jit::host_cpu_features());
  // Default selection (KILN_CPU_COMPILER unset in the test environment).
  if (!std::getenv("KILN_CPU_COMPILER"))
    CHECK(kiln::jit::cpu_compiler().name() == (kiln::jit::have_llvm() ? "llvm" : "external"));
  WARN("host CPU: " << features.substr(0, 120) << (features.size() > 120 ? "..." : ""));
  WARN("identity (external): " << external->identity());
  if (kiln::jit::have_llvm())
    WARN("identity (llvm): " << kiln::jit::make_cpu_compiler("llvm")->identity());
}

TEST_CASE("compilers build for the host CPU's vector features", "[compiler]") {
#if defined(__x86_64__)
  // The widest vector extension the host has must be on in the code generator: a CPU
  // LLVM does not know by name (reported as "generic") got baseline SSE2 code when only
  // the name reached it, 3-5x slower kernels.
  const char* source = R"(
extern "C" int k() {
#if defined(__AVX512F__)
  return 3;
#elif defined(__AVX2__)
  return 2;
#elif defined(__AVX__)
  return 1;
#else
  return 0;
#endif
}
)";
  const std::string& features = kiln::jit::host_cpu_features();
  auto has = [&](const std::string& f) {
    return (features + ",").find("+" + f + ",") != std::string::npos;
  };
  const int expected = has("avx512f") ? 3 : has("avx2") ? 2 : has("avx") ? 1 : 0;
  for (const auto& name : available_compilers()) {
    INFO("compiler: " << name << ", host: " << features);
    auto compiler = kiln::jit::make_cpu_compiler(name);
    auto module = compiler->load(compiler->compile(source, "/cache/features.cpp"));
    auto fn = reinterpret_cast<int (*)()>(module->symbol("k"));
    CHECK(fn() == expected);
  }
#else
  WARN("not an x86-64 host: vector feature check skipped");
#endif
}

TEST_CASE("compilers are safe to use from several threads", "[compiler]") {
  for (const auto& name : available_compilers()) {
    INFO("compiler: " << name);
    auto compiler = kiln::jit::make_cpu_compiler(name);
    constexpr int kThreads = 3;
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          for (int j = 0; j < 2; ++j) {
            int salt = 10 * t + j;
            auto module = compiler->load(compiler->compile(salted_source(salt), "/cache/t.cpp"));
            auto fn = reinterpret_cast<UnaryKernel>(module->symbol("k"));
            float a = 1.f, o = 0.f;
            fn(&o, &a, 1);
            if (o != float(salt + 2) + float(salt)) errors[t] = "wrong result";
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const auto& e : errors) CHECK(e.empty());
  }
}

TEST_CASE("compile and load times", "[compiler]") {
  for (const auto& name : available_compilers()) {
    auto compiler = kiln::jit::make_cpu_compiler(name);
    // Warm-up: first use initialises targets, the JIT, libm lookups.
    auto warm = compiler->load(compiler->compile(salted_source(100), "/cache/warm.cpp"));
    warm->symbol("k");
    const int compiles = name == "llvm" ? 10 : 3;
    std::vector<double> compile_ms, compile_cpu_ms;
    std::vector<std::vector<uint8_t>> images;
    for (int i = 0; i < compiles; ++i) {
      auto start = std::chrono::steady_clock::now();
      double cpu_start = thread_cpu_ms();
      images.push_back(compiler->compile(salted_source(200 + i), "/cache/timed.cpp"));
      compile_cpu_ms.push_back(thread_cpu_ms() - cpu_start);
      compile_ms.push_back(elapsed_ms(start));
    }
    std::vector<double> load_ms;
    std::vector<std::unique_ptr<kiln::jit::LoadedModule>> modules;
    for (int i = 0; i < 50; ++i) {
      auto start = std::chrono::steady_clock::now();
      modules.push_back(compiler->load(images[i % images.size()]));
      void* fn = modules.back()->symbol("k");
      load_ms.push_back(elapsed_ms(start));
      REQUIRE(fn != nullptr);
    }
    // The external compiler's work happens in a child process: its thread CPU time is
    // only the spawn and the wait.
    WARN(name << ": compile (elementwise kernel, -O3) median " << median(compile_ms) << " ms wall, "
              << median(compile_cpu_ms)
              << " ms CPU of this thread; load + symbol lookup of a compiled image median "
              << median(load_ms) << " ms (" << images[0].size() << "-byte image)");
  }
}

TEST_CASE("a gather's index checks leave its row loops to the vectorizer", "[compiler][rows]") {
#if defined(__x86_64__)
  // An embedding's IndexError check reads the index of the row, not of the element, yet it
  // was printed inside the row loop: a call there, and clang vectorized none of the loops of
  // a Transformer's embedding + layer-norm kernels (bfloat16: 10 ms a launch against 3.8 ms
  // in float32, both scalar). The checks now run once ahead of the loop.
  if (std::system("command -v clang++-16 >/dev/null 2>&1") != 0) {
    WARN("clang++-16 not on PATH: vectorizer check skipped");
    return;
  }
  kiln::Tensor table = kiln::randn({11, 48}).eval();
  kiln::Tensor ids = kiln::randint(0, 11, {6, 5}).eval();
  kiln::Tensor shift = kiln::randn({48}).eval();
  kiln::Tensor table_h = kiln::cast(table, kiln::DType::BFloat16).eval();
  kiln::Tensor shift_h = kiln::cast(shift, kiln::DType::BFloat16).eval();
  std::vector<std::function<kiln::Tensor()>> cases = {
      // A map: the gathered row, scaled and shifted.
      [&] { return kiln::nn::F::embedding(ids, table) * 2.0f + shift; },
      // A row stage (the mean) and the row's stores both gather.
      [&] {
        kiln::Tensor x = kiln::nn::F::embedding(ids, table) + shift;
        return x - kiln::mean(x, -1, true);
      },
      // bfloat16 rows, rounded per op as under autocast.
      [&] {
        kiln::Tensor x = kiln::nn::F::embedding(ids, table_h) + shift_h;
        return x - kiln::mean(x, -1, true);
      }};
  for (size_t k = 0; k < cases.size(); ++k) {
    INFO("case " << k);
    kiln::Tensor y = cases[k]();
    std::vector<kiln::Node*> outs{y.node().get()};
    kiln::jit::FusionPlan plan = kiln::jit::fuse(kiln::pending_subgraph(outs), {outs[0]});
    REQUIRE(plan.groups.size() == 1);
    const std::string source = kiln::jit::print_cpp(kiln::jit::lower(plan.groups[0]).ir).source;
    REQUIRE(source.find("kiln_index_error(err, ") != std::string::npos);
    kiln::test::TempDir dir("kiln_vec");
    const std::string src = dir.file("k.cpp"), log = dir.file("k.log");
    kiln::test::write_bytes(src, source);
    const std::string cmd =
        "clang++-16 -std=c++17 -O3 -march=native -ffp-contract=off -fwrapv "
        "-S -o /dev/null -Rpass=loop-vectorize -Rpass-missed=loop-vectorize " +
        src + " > " + log + " 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string remarks = kiln::test::read_bytes(log);
    INFO(source << remarks);
    CHECK(remarks.find("vectorized loop") != std::string::npos);
    CHECK(remarks.find("loop not vectorized") == std::string::npos);
    // What the kernel computes, against the reference executor.
    const std::vector<double> got = kiln::cast(y, kiln::DType::Float64).to_vector<double>();
    kiln::Tensor again = cases[k]();
    const std::vector<double> want = [&] {
      nn_test::ExecutorGuard ref("reference");
      return kiln::cast(again, kiln::DType::Float64).to_vector<double>();
    }();
    REQUIRE(got.size() == want.size());
    const double tol = k == 2 ? 2e-2 : 1e-5;
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
  // An index out of range still raises from the hoisted check, naming the op.
  kiln::Tensor bad = kiln::full({2, 3}, int64_t{11}, kiln::DType::Int64).eval();
  CHECK_THROWS_AS((kiln::nn::F::embedding(bad, table) * 2.0f + shift).eval(), kiln::IndexError);
#else
  WARN("not an x86-64 host: vectorizer check skipped");
#endif
}

TEST_CASE("float16 and bfloat16 loads and stores compile to vector instructions",
          "[compiler][dtype]") {
#if defined(__x86_64__)
  // The printed kernel of `a * b + c` in each half dtype, compiled as the in-process
  // compiler does (clang 16, -O3, the host's features) but to assembly, where the row loop
  // must convert with vector instructions: vcvtph2ps/vcvtps2ph (F16C) for float16 (or
  // compute in native float16 vector instructions, AVX512-FP16), vector integer shifts and
  // packs for bfloat16, and do its arithmetic on ymm/zmm registers.
  if (std::system("command -v clang++-16 >/dev/null 2>&1") != 0) {
    WARN("clang++-16 not on PATH: assembly check skipped");
    return;
  }
  const std::string& features = kiln::jit::host_cpu_features();
  auto has = [&](const std::string& f) {
    return (features + ",").find("+" + f + ",") != std::string::npos;
  };
  if (!has("avx2") || !has("f16c")) {
    WARN("host without AVX2 and F16C: assembly check skipped");
    return;
  }
  for (kiln::DType dtype : {kiln::DType::Float16, kiln::DType::BFloat16}) {
    INFO(kiln::dtype_name(dtype));
    kiln::Tensor a = kiln::cast(kiln::randn({8, 64}), dtype).eval();
    kiln::Tensor b = kiln::cast(kiln::randn({8, 64}), dtype).eval();
    kiln::Tensor c = kiln::cast(kiln::randn({8, 64}), dtype).eval();
    kiln::Tensor y = a * b + c;
    std::vector<kiln::Node*> outs{y.node().get()};
    kiln::jit::FusionPlan plan = kiln::jit::fuse(kiln::pending_subgraph(outs), {outs[0]});
    REQUIRE(plan.groups.size() == 1);
    const std::string source = kiln::jit::print_cpp(kiln::jit::lower(plan.groups[0]).ir).source;
    kiln::test::TempDir dir("kiln_asm");
    const std::string src = dir.file("k.cpp"), out = dir.file("k.s");
    kiln::test::write_bytes(src, source);
    const std::string cmd = "clang++-16 -std=c++17 -O3 -march=native -fno-math-errno -S -o " + out +
                            " " + src + " 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string asm_text = kiln::test::read_bytes(out);
    auto vector_op = [&](const std::string& op) {
      for (const char* reg : {"%ymm", "%zmm"}) {
        for (size_t at = asm_text.find(op); at != std::string::npos;
             at = asm_text.find(op, at + 1)) {
          const size_t eol = asm_text.find('\n', at);
          if (asm_text.substr(at, eol - at).find(reg) != std::string::npos) return true;
        }
      }
      return false;
    };
    // With AVX512-FP16 clang computes a float16 product or sum rounded back to float16 as
    // the native half instruction (exact: float32 holds every product of two halves), so the
    // loop needs no conversions at all: vmulph/vaddph on ymm/zmm.
    const bool native_half =
        dtype == kiln::DType::Float16 && vector_op("vmulph") && vector_op("vaddph");
    INFO((native_half ? "native float16 arithmetic" : "converted to float32"));
    CHECK((native_half || vector_op("vfmadd") || vector_op("vmulps")));
    if (dtype == kiln::DType::Float16) {
      // vcvtph2psx/vcvtps2phx are AVX512-FP16's forms of the same conversions.
      CHECK((native_half || vector_op("vcvtph2ps")));
      CHECK((native_half || vector_op("vcvtps2ph")));
    } else {
      CHECK((vector_op("vpmovzxwd") || vector_op("vpunpcklwd") || vector_op("vpslld")));
      CHECK((vector_op("vpmovdw") || vector_op("vpackusdw") || vector_op("vpsrld")));
    }
  }
#else
  WARN("not an x86-64 host: assembly check skipped");
#endif
}
