// The CPU GEMM libraries behind library GEMM (jit/blas.h), called directly: every transpose,
// accumulation and leading-dimension case of both dtypes against a float64 triple loop, from
// one thread and from every pool thread at once, and what `kiln info` reports of the path.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "frontend/kiln.h"
#include "jit/blas.h"
#include "jit/executor.h"
#include "op_harness.h"

using namespace kiln;

namespace {

// C = op(A) @ op(B) (+ C), row-major, op transposes when asked; float64 throughout.
template <typename T>
std::vector<double> reference_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                   const std::vector<T>& a, int64_t lda, const std::vector<T>& b,
                                   int64_t ldb, const std::vector<T>& c0, int64_t ldc, bool acc) {
  std::vector<double> c(c0.begin(), c0.end());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = acc ? c[static_cast<size_t>(i * ldc + j)] : 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = a[static_cast<size_t>(ta ? p * lda + i : i * lda + p)];
        const double y = b[static_cast<size_t>(tb ? j * ldb + p : p * ldb + j)];
        s += x * y;
      }
      c[static_cast<size_t>(i * ldc + j)] = s;
    }
  return c;
}

// One random product's layout: sizes (every eighth case up to `big`), transposes,
// accumulation and leading dimensions with padding (kiln passes views of larger buffers).
struct Layout {
  int64_t m, n, k;
  bool ta, tb, acc;
  int64_t lda, ldb, ldc;
};
Layout random_layout(std::mt19937_64& rng, int t, int64_t big) {
  const int64_t top = t % 8 == 7 ? big : 40;
  Layout l{};
  l.m = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(top));
  l.n = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(top));
  l.k = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(top));
  l.ta = rng() % 2, l.tb = rng() % 2, l.acc = rng() % 2;
  l.lda = (l.ta ? l.m : l.k) + static_cast<int64_t>(rng() % 3);
  l.ldb = (l.tb ? l.k : l.n) + static_cast<int64_t>(rng() % 3);
  l.ldc = l.n + static_cast<int64_t>(rng() % 3);
  return l;
}

template <typename T>
void check_random_gemms(DType dtype, uint64_t seed, int cases, double tol) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> value(-1, 1);
  for (int t = 0; t < cases; ++t) {
    const auto [m, n, k, ta, tb, acc, lda, ldb, ldc] = random_layout(rng, t, 300);
    std::vector<T> a(static_cast<size_t>((ta ? k : m) * lda)),
        b(static_cast<size_t>((tb ? n : k) * ldb)), c(static_cast<size_t>(m * ldc));
    for (auto* v : {&a, &b, &c})
      for (T& x : *v) x = static_cast<T>(value(rng));
    const std::vector<double> expected =
        reference_gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc);
    jit::cpu_gemm(dtype, ta, tb, m, n, k, a.data(), lda, b.data(), ldb, acc, c.data(), ldc);
    INFO(dtype_name(dtype) << " case " << t << ": " << m << "x" << k << " @ " << k << "x" << n
                           << (ta ? " A^T" : "") << (tb ? " B^T" : "") << (acc ? " += " : ""));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const size_t at = static_cast<size_t>(i * ldc + j);
        // Each product's rounding is bounded by k units of the sum's magnitude (<= k here).
        REQUIRE(std::abs(c[at] - expected[at]) <= tol * static_cast<double>(k + 1));
      }
  }
}

// One float16/bfloat16 product of layout `l` on random inputs against float64: inputs are
// exact halves, the reference sums them in float64, and the float32 accumulation is bounded by
// k units of float32 of the sum's magnitude (<= k + 1 here). Without accumulation the same
// product is also rounded once into a half result.
void check_half_gemm(DType dtype, const Layout& l, std::mt19937_64& rng) {
  const auto [m, n, k, ta, tb, acc, lda, ldb, ldc] = l;
  std::uniform_real_distribution<float> value(-1, 1);
  const bool bf16 = dtype == DType::BFloat16;
  auto to_half = [&](float v) { return bf16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v); };
  auto to_float = [&](uint16_t h) {
    return bf16 ? bfloat16_bits_to_float(h) : half_bits_to_float(h);
  };
  std::vector<uint16_t> a(static_cast<size_t>((ta ? k : m) * lda)),
      b(static_cast<size_t>((tb ? n : k) * ldb));
  std::vector<float> c(static_cast<size_t>(m * ldc));
  for (auto* v : {&a, &b})
    for (uint16_t& x : *v) x = to_half(value(rng));
  for (float& x : c) x = value(rng);
  std::vector<double> da(a.size()), db(b.size()), dc(c.begin(), c.end());
  for (size_t i = 0; i < a.size(); ++i) da[i] = to_float(a[i]);
  for (size_t i = 0; i < b.size(); ++i) db[i] = to_float(b[i]);
  const std::vector<double> expected =
      reference_gemm(ta, tb, m, n, k, da, lda, db, ldb, dc, ldc, acc);
  const std::vector<float> c0 = c;
  jit::cpu_gemm(dtype, ta, tb, m, n, k, a.data(), lda, b.data(), ldb, acc, c.data(), ldc);
  INFO(dtype_name(dtype) << " " << m << "x" << k << " @ " << k << "x" << n << (ta ? " A^T" : "")
                         << (tb ? " B^T" : "") << (acc ? " += " : "") << " lda " << lda << " ldb "
                         << ldb << " ldc " << ldc);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= n) {
        // Past the row: another part's columns, which the call must leave alone.
        REQUIRE(c[at] == c0[at]);
        continue;
      }
      const double want = expected[at], got = c[at];
      INFO("element " << i << ", " << j << ": " << got << " vs " << want);
      REQUIRE(std::abs(got - want) <= 1e-6 * static_cast<double>(k + 1));
    }
  if (acc) return;
  // The same product rounded once into a half result (autocast's layers): within half a
  // unit of the half's last place of the exact sum, plus the float32 accumulation.
  std::vector<uint16_t> h(static_cast<size_t>(m * ldc), 0x7e00);
  jit::cpu_gemm(dtype, ta, tb, m, n, k, a.data(), lda, b.data(), ldb, false, h.data(), ldc, true);
  const double unit = bf16 ? 1.0 / 256 : 1.0 / 2048;  // half an ulp, relative
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= n) {
        REQUIRE(h[at] == 0x7e00);
        continue;
      }
      const double want = expected[at], got = to_float(h[at]);
      INFO("rounded element " << i << ", " << j << ": " << got << " vs " << want);
      REQUIRE(std::abs(got - want) <=
              unit * std::abs(want) * 1.0001 + 1e-6 * static_cast<double>(k + 1));
    }
}

void check_random_half_gemms(DType dtype, uint64_t seed, int cases) {
  std::mt19937_64 rng(seed);
  for (int t = 0; t < cases; ++t) {
    INFO("case " << t);
    check_half_gemm(dtype, random_layout(rng, t, 200), rng);
  }
}

// Whether oneDNN has bfloat16 brgemm kernels on this CPU (AVX512-BF16 or AMX).
bool has_bf16_brgemm() {
  const jit::GemmPath p = jit::gemm_path(DType::BFloat16);
  return p.library == "oneDNN" && (p.kernels.rfind("avx512_core_bf16", 0) == 0 ||
                                   p.kernels.rfind("avx512_core_amx", 0) == 0);
}

}  // namespace

TEST_CASE("float16 and bfloat16 CPU GEMMs accumulate in float32", "[blas][matmul][dtype]") {
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    if (!jit::cpu_gemm_available(dtype)) {
      WARN("no GEMM library for " << dtype_name(dtype) << " in this build: skipped");
      continue;
    }
    INFO(dtype_name(dtype) << " on " << jit::gemm_path(dtype).library << " "
                           << jit::gemm_path(dtype).kernels);
    check_random_half_gemms(dtype, dtype == DType::BFloat16 ? 31 : 32, 80);
  }
}

TEST_CASE("half GEMMs run on two threads at once repeat the products of one thread bit for bit",
          "[blas][matmul][dtype][threads]") {
  // oneDNN's primitives are cached and run from any thread; each execution must bring its
  // own scratchpad (a shared one let concurrent products write into each other's partial
  // sums). Layouts of a training step's products, a long k among them.
  struct Product {
    int64_t m, n, k;
    bool ta, tb, rounded;
  };
  const std::vector<Product> products{{2048, 256, 256, false, true, false},
                                      {256, 256, 2048, true, false, false},
                                      {2048, 256, 256, false, false, true},
                                      {64, 1024, 4096, false, true, false},
                                      {512, 512, 512, true, true, true}};
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    if (!jit::cpu_gemm_available(dtype)) continue;
    INFO(dtype_name(dtype) << " on " << jit::gemm_path(dtype).kernels);
    std::mt19937 rng(8);
    std::uniform_real_distribution<float> value(-1, 1);
    std::vector<std::vector<uint16_t>> as, bs;
    for (const Product& p : products) {
      as.emplace_back(static_cast<size_t>(p.m * p.k));
      bs.emplace_back(static_cast<size_t>(p.k * p.n));
      for (auto* v : {&as.back(), &bs.back()})
        for (uint16_t& x : *v)
          x = dtype == DType::BFloat16 ? float_to_bfloat16_bits(value(rng))
                                       : float_to_half_bits(value(rng));
    }
    // Each product's result bytes (float32, or the rounded half).
    auto run = [&](size_t i) {
      const Product& p = products[i];
      std::vector<char> c(static_cast<size_t>(p.m * p.n) * (p.rounded ? 2 : 4));
      jit::cpu_gemm(dtype, p.ta, p.tb, p.m, p.n, p.k, as[i].data(), p.ta ? p.m : p.k, bs[i].data(),
                    p.tb ? p.k : p.n, false, c.data(), p.n, p.rounded);
      return c;
    };
    std::vector<std::vector<char>> alone;
    for (size_t i = 0; i < products.size(); ++i) alone.push_back(run(i));
    std::atomic<int> differ{0};
    auto worker = [&](size_t first) {
      for (int round = 0; round < 6; ++round)
        for (size_t j = 0; j < products.size(); ++j) {
          const size_t i = (first + j) % products.size();
          if (run(i) != alone[i]) ++differ;
        }
    };
    std::thread t1(worker, 0), t2(worker, 1);
    t1.join();
    t2.join();
    CHECK(differ.load() == 0);
  }
}

TEST_CASE("CPU GEMMs match a float64 triple loop in every layout", "[blas][matmul]") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    if (!jit::cpu_gemm_available(dtype)) {
      WARN("no GEMM library for " << dtype_name(dtype) << " in this build: skipped");
      continue;
    }
    if (dtype == DType::Float32)
      check_random_gemms<float>(dtype, 17, 120, 1e-6);
    else
      check_random_gemms<double>(dtype, 18, 120, 1e-14);
  }
}

TEST_CASE("CPU GEMMs from every pool thread at once give each thread's own product",
          "[blas][matmul][threads]") {
  if (!jit::cpu_gemm_available(DType::Float32)) {
    WARN("no float32 GEMM library in this build: skipped");
    return;
  }
  const int64_t parts = 4 * thread_pool().size();
  const int64_t m = 48, n = 64, k = 96;
  std::vector<std::vector<float>> a(static_cast<size_t>(parts)), c(static_cast<size_t>(parts));
  std::vector<float> b(static_cast<size_t>(k * n));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-1, 1);
  for (float& x : b) x = value(rng);
  for (int64_t p = 0; p < parts; ++p) {
    a[static_cast<size_t>(p)].resize(static_cast<size_t>(m * k));
    for (float& x : a[static_cast<size_t>(p)]) x = value(rng);
    c[static_cast<size_t>(p)].assign(static_cast<size_t>(m * n), 0.0f);
  }
  thread_pool().parallel_for(parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p)
      jit::cpu_gemm(DType::Float32, false, false, m, n, k, a[static_cast<size_t>(p)].data(), k,
                    b.data(), n, false, c[static_cast<size_t>(p)].data(), n);
  });
  for (int64_t p = 0; p < parts; ++p) {
    const std::vector<double> expected =
        reference_gemm(false, false, m, n, k, a[static_cast<size_t>(p)], k, b, n,
                       c[static_cast<size_t>(p)], n, false);
    for (size_t i = 0; i < expected.size(); ++i)
      REQUIRE(std::abs(c[static_cast<size_t>(p)][i] - expected[i]) <= 1e-6 * (k + 1));
  }
}

TEST_CASE("the GEMM path names its library, version and kernels", "[blas]") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const jit::GemmPath p = jit::gemm_path(dtype);
    INFO(dtype_name(dtype) << ": " << p.library << " " << p.version << " " << p.kernels);
    CHECK_FALSE(p.kernels.empty());
    if (p.library == "none") {
      CHECK_FALSE(jit::cpu_gemm_available(dtype));
      continue;
    }
    CHECK(jit::cpu_gemm_available(dtype));
    // "major.minor.patch": read from the library at run time, not from its headers.
    CHECK(std::count(p.version.begin(), p.version.end(), '.') == 2);
    if (p.library == "oneDNN") CHECK(dtype == DType::Float32);
  }
#if defined(__x86_64__)
  // A generic path is only ever reported on a CPU with AVX2: that is what makes it a fault.
  for (DType dtype : {DType::Float32, DType::Float64})
    if (jit::gemm_path(dtype).generic) CHECK(__builtin_cpu_supports("avx2"));
#endif
}

TEST_CASE("oneDNN runs each pool thread's part on that thread alone", "[blas][threads]") {
  // kiln's pool splits a product; a oneDNN call that started an OpenMP team of its own in
  // every part would put two teams on the same cores (no speed-up for twice the CPU time).
  using MaxThreads = int (*)();
  const auto max_threads =
      reinterpret_cast<MaxThreads>(::dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  if (jit::gemm_path(DType::Float32).library != "oneDNN" || max_threads == nullptr) {
    WARN("float32 GEMMs do not run on an OpenMP oneDNN in this build: skipped");
    return;
  }
  const int64_t parts = 2 * thread_pool().size();
  std::vector<float> a(16 * 16, 1.0f), b(16 * 16, 1.0f);
  std::vector<std::vector<float>> c(static_cast<size_t>(parts), std::vector<float>(16 * 16));
  std::atomic<int> wider{0};
  thread_pool().parallel_for(parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      jit::cpu_gemm(DType::Float32, false, false, 16, 16, 16, a.data(), 16, b.data(), 16, false,
                    c[static_cast<size_t>(p)].data(), 16);
      if (max_threads() != 1) wider.fetch_add(1);
    }
  });
  CHECK(wider.load() == 0);
  for (const auto& part : c) CHECK(part[0] == 16.0f);
}

TEST_CASE("half-precision matmuls run as library GEMMs and match the reference",
          "[blas][matmul][dtype]") {
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    if (!jit::cpu_gemm_available(dtype)) continue;
    INFO(dtype_name(dtype));
    const double tol = dtype == DType::BFloat16 ? 1.0 / 128 : 1.0 / 1024;
    manual_seed(11);
    Tensor a = cast(rand({3, 37, 50}) - 0.5, dtype).eval();
    Tensor b = cast(rand({3, 50, 29}) - 0.5, dtype).eval();
    Tensor w = cast(rand({29, 50}) - 0.5, dtype).eval();
    // `kernels`: the generated kernels beside the GEMMs. The halves go to the library as
    // they are (no kernel widens an operand) and the library rounds its result itself; what
    // is left: a transposed copy of w the library reads as stored, and in the weight
    // gradient a sum over batches (several calls, so one kernel rounds the float32 total)
    // and the reshaped product it reads.
    struct Case {
      const char* name;
      std::function<Tensor()> build;
      size_t kernels;
    };
    const std::vector<Case> cases = {
        {"batched", [&] { return matmul(a, b); }, 0},
        {"transposed weight (a linear layer)", [&] { return matmul(a, transpose(w, 0, 1)); }, 1},
        {"weight gradient (A^T, summed over the batch)",
         [&] {
           return matmul(transpose(reshape(a, {111, 50}), 0, 1), reshape(matmul(a, b), {111, 29}));
         },
         2},
    };
    for (const Case& c : cases) {
      INFO(c.name);
      std::vector<double> want;
      {
        kiln::test::ExecutorScope ref("reference");
        want = c.build().to_vector<double>();
      }
      Tensor got_t = c.build();
      got_t.eval();
      const jit::EvalStats stats = jit::last_eval_stats();
      CHECK(stats.library_calls >= 1);
      CHECK(stats.kernels <= c.kernels);
      const std::vector<double> got = got_t.to_vector<double>();
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("element " << i << ": " << got[i] << " vs " << want[i]);
        REQUIRE(std::abs(got[i] - want[i]) <= tol * (std::abs(want[i]) + 0.5));
      }
    }
  }
}

TEST_CASE("bfloat16 products with a transposed A run on brgemm in every part of a split",
          "[blas][matmul][dtype]") {
  // kiln's pool splits a product by rows or columns, so a part's A (transposed: rows of a
  // weight gradient dY^T), B or C has a leading dimension wider than the part. oneDNN 2.6.3
  // runs such strides on gemm:jit, up to 2-3x slower than brgemm with a transposed A and a
  // short k; those parts are copied dense first. The parts of an MLP step's weight gradients (dW =
  // dY^T X, the batch of 128 summed) on two threads, by rows and by columns, rounded or float32,
  // accumulated, with and without padding.
  if (!jit::cpu_gemm_available(DType::BFloat16)) {
    WARN("no bfloat16 GEMM library in this build: skipped");
    return;
  }
  const bool brgemm = has_bf16_brgemm();
  if (!brgemm)
    WARN("oneDNN has no bfloat16 brgemm kernels on this CPU (" +
         jit::gemm_path(DType::BFloat16).kernels +
         "): values are checked, the implementation is not");
  struct Part {
    const char* what;
    Layout l;
  };
  // Layout: m, n, k, ta, tb, acc, lda, ldb, ldc.
  const std::vector<Part> parts{
      {"dW2 by rows", {512, 1024, 128, true, false, false, 1024, 1024, 1024}},
      {"dW1 by rows", {512, 784, 128, true, false, false, 1024, 784, 784}},
      {"dW1 by columns", {1024, 392, 128, true, false, false, 1024, 784, 784}},
      {"dW3 by columns", {10, 512, 128, true, false, false, 10, 1024, 1024}},
      {"odd sizes by rows, B^T", {37, 45, 29, true, true, false, 80, 29, 45}},
      {"accumulated, by columns", {96, 40, 64, true, false, true, 96, 81, 83}},
  };
  std::mt19937_64 rng(41);
  for (const Part& p : parts) {
    INFO(p.what);
    const auto& l = p.l;
    check_half_gemm(DType::BFloat16, l, rng);
    for (bool rounded : {false, true}) {
      if (rounded && l.acc) continue;
      const jit::HalfGemmKernel kernel = jit::half_gemm_kernel(
          DType::BFloat16, l.ta, l.tb, l.m, l.n, l.k, l.lda, l.ldb, l.ldc, l.acc, rounded);
      INFO("oneDNN implementation: " << kernel.implementation << (rounded ? " (rounded)" : ""));
      if (!brgemm) continue;
      CHECK(kernel.implementation.rfind("brg:", 0) == 0);
      // The parts that needed them, and only those, are copied.
      CHECK(kernel.dense_a == (l.lda != l.m));
      CHECK(kernel.dense_b == (l.ldb != (l.tb ? l.k : l.n)));
      CHECK(kernel.dense_c == (l.ldc != l.n));
    }
  }
  // A long k (a Transformer's weight gradient summed over 16 x 128 tokens) stays on gemm:jit,
  // which is faster there than brgemm with the copies.
  {
    const Layout l{512, 256, 2048, true, false, false, 1024, 256, 256};
    const jit::HalfGemmKernel kernel = jit::half_gemm_kernel(DType::BFloat16, l.ta, l.tb, l.m, l.n,
                                                             l.k, l.lda, l.ldb, l.ldc, l.acc, true);
    INFO("long k: " << kernel.implementation);
    check_half_gemm(DType::BFloat16, l, rng);
    CHECK_FALSE((kernel.dense_a || kernel.dense_b || kernel.dense_c));
  }
  // Dense layouts of the same step (a part split by rows of a plain A, a whole product) go
  // to brgemm as they are, with no copies.
  for (const Layout& l : {Layout{64, 1024, 784, false, true, false, 784, 784, 1024},
                          Layout{1024, 1024, 128, true, false, false, 1024, 1024, 1024}}) {
    const jit::HalfGemmKernel kernel = jit::half_gemm_kernel(DType::BFloat16, l.ta, l.tb, l.m, l.n,
                                                             l.k, l.lda, l.ldb, l.ldc, l.acc, true);
    INFO(l.m << "x" << l.n << "x" << l.k << ": " << kernel.implementation);
    check_half_gemm(DType::BFloat16, l, rng);
    if (!brgemm) continue;
    CHECK(kernel.implementation.rfind("brg:", 0) == 0);
    CHECK_FALSE((kernel.dense_a || kernel.dense_b || kernel.dense_c));
  }
}

TEST_CASE("half_gemm_kernel names the implementation only of half products", "[blas][dtype]") {
  CHECK_THROWS_AS(jit::half_gemm_kernel(DType::Float32, false, false, 4, 4, 4, 4, 4, 4, false),
                  DTypeError);
  const jit::HalfGemmKernel k =
      jit::half_gemm_kernel(DType::BFloat16, false, false, 8, 8, 8, 8, 8, 8, false);
  // Named exactly where oneDNN runs bfloat16 products.
  CHECK(k.implementation.empty() ==
        (jit::gemm_path(DType::BFloat16).kernels.find("matmul primitive") == std::string::npos));
}

TEST_CASE("a half GEMM keeps its oneDNN primitive while the layout cache is emptied",
          "[blas][dtype][threads]") {
  // The cache of primitives is bounded (it empties itself at 1024 layouts); a product that
  // another thread is running at that moment must keep its primitive until it returns (the
  // cache used to destroy them all; AddressSanitizer builds catch a use after free).
  if (jit::half_gemm_kernel(DType::BFloat16, false, false, 8, 8, 8, 8, 8, 8, false)
          .implementation.empty()) {
    WARN("bfloat16 GEMMs do not run on oneDNN here: skipped");
    return;
  }
  const int64_t m = 96, n = 80, k = 72;
  std::vector<uint16_t> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> value(-1, 1);
  for (auto* v : {&a, &b})
    for (uint16_t& x : *v) x = float_to_bfloat16_bits(value(rng));
  auto product = [&] {
    std::vector<float> c(static_cast<size_t>(m * n));
    jit::cpu_gemm(DType::BFloat16, false, false, m, n, k, a.data(), k, b.data(), n, false, c.data(),
                  n);
    return c;
  };
  const std::vector<float> want = product();
  std::atomic<bool> done{false};
  std::atomic<int> differ{0}, runs{0};
  std::thread runner([&] {
    while (!done.load()) {
      if (product() != want) ++differ;
      ++runs;
    }
  });
  // More new layouts than the cache holds: tiny products with a leading dimension of their
  // own each.
  std::vector<uint16_t> x(8 * 1200, float_to_bfloat16_bits(1.0f));
  std::vector<float> y(8 * 1200);
  for (int64_t ld = 8; ld < 8 + 1100; ++ld)
    jit::cpu_gemm(DType::BFloat16, false, false, 2, 8, 8, x.data(), ld, x.data(), 8, false,
                  y.data(), 8);
  done = true;
  runner.join();
  CHECK(runs.load() > 0);
  CHECK(differ.load() == 0);
  CHECK(y[0] == 8.0f);
}

TEST_CASE(
    "bfloat16 products split into parts as 1, 2 or 3 pool threads split them agree bit for bit",
    "[blas][matmul][dtype][threads]") {
  // library_gemm splits a product's rows (m >= n) or columns into one part per thread, and a
  // part may run on another oneDNN implementation than the whole (gemm:jit, or brgemm after
  // dense copies): a training step must not change with the thread count. The products of
  // an MLP step (784-1024-1024-10, batch 128), float32 and rounded results.
  if (!jit::cpu_gemm_available(DType::BFloat16)) {
    WARN("no bfloat16 GEMM library in this build: skipped");
    return;
  }
  struct Product {
    const char* what;
    int64_t m, n, k;
    bool ta, tb;
  };
  const std::vector<Product> products{{"forward x W1^T", 128, 1024, 784, false, true},
                                      {"dX2 = dY W2", 128, 1024, 1024, false, false},
                                      {"dW2 = dY^T X", 1024, 1024, 128, true, false},
                                      {"dW1 = dY^T X", 1024, 784, 128, true, false},
                                      {"dW3 = dY^T X", 10, 1024, 128, true, false},
                                      {"forward h W3^T", 128, 10, 1024, false, true}};
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> value(-1, 1);
  for (const Product& p : products) {
    INFO(p.what);
    std::vector<uint16_t> a(static_cast<size_t>(p.m * p.k)), b(static_cast<size_t>(p.k * p.n));
    for (auto* v : {&a, &b})
      for (uint16_t& x : *v) x = float_to_bfloat16_bits(value(rng));
    const int64_t lda = p.ta ? p.m : p.k, ldb = p.tb ? p.k : p.n;
    for (bool rounded : {false, true}) {
      const size_t elem = rounded ? 2 : 4;
      // The result of the product in `parts` parts, split as library_gemm splits it.
      auto run = [&](int64_t parts) {
        std::vector<char> c(static_cast<size_t>(p.m * p.n) * elem);
        const bool rows = p.m >= p.n;
        const int64_t extent = rows ? p.m : p.n, grain = (extent + parts - 1) / parts;
        for (int64_t lo = 0; lo < extent; lo += grain) {
          const int64_t hi = std::min(extent, lo + grain);
          const int64_t r0 = rows ? lo : 0, r1 = rows ? hi : p.m;
          const int64_t c0 = rows ? 0 : lo, c1 = rows ? p.n : hi;
          const uint16_t* pa = a.data() + (p.ta ? r0 : r0 * lda);
          const uint16_t* pb = b.data() + (p.tb ? c0 * ldb : c0);
          jit::cpu_gemm(DType::BFloat16, p.ta, p.tb, r1 - r0, c1 - c0, p.k, pa, lda, pb, ldb, false,
                        c.data() + static_cast<size_t>(r0 * p.n + c0) * elem, p.n, rounded);
        }
        return c;
      };
      const std::vector<char> whole = run(1);
      INFO((rounded ? "rounded" : "float32") << " result");
      CHECK(run(2) == whole);
      CHECK(run(3) == whole);
    }
  }
}

TEST_CASE("a dot product per row or over a sliced operand is a generated reduction",
          "[blas][matmul]") {
  // sum(x * y) over a row matches the GEMM pattern with m = n = 1: as a library GEMM it was
  // one 1 x 1 call per row (flash attention's rowsum(dO * O): 16384 calls at batch 8,
  // 4 heads, sequence 512), and over a slice whose dims do not flatten, one call per run.
  manual_seed(3);
  Tensor x = randn({64, 200, 33}).eval(), y = randn({64, 200, 33}).eval();
  // The slices are made afresh each time: a view another evaluation stored is no operand.
  auto xs = [&] { return slice(x, 2, 0, 32); };
  auto ys = [&] { return slice(y, 2, 0, 32); };
  const std::vector<std::pair<const char*, std::function<Tensor()>>> cases = {
      {"per row", [&] { return sum(xs() * ys(), {2}); }},
      {"whole sliced tensors", [&] { return sum(xs() * ys()); }},
  };
  for (const auto& [name, build] : cases) {
    INFO(name);
    std::vector<double> want;
    {
      kiln::test::ExecutorScope ref("reference");
      want = build().to_vector<double>();
    }
    Tensor got_t = build();
    got_t.eval();
    CHECK(jit::last_eval_stats().library_calls == 0);
    const std::vector<double> got = got_t.to_vector<double>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
      REQUIRE(std::abs(got[i] - want[i]) <= 1e-4 * (std::abs(want[i]) + 1.0));
  }
}
