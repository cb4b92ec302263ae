// The CUDA driver layer, device memory and cuBLAS.
//
// [driver] cases check what a machine without a usable driver does (clear DeviceErrors, CPU
// work unaffected); they skip where a GPU is present. [cuda] cases need a device and skip
// with a visible message without one. The driver is loaded once per process, so the cases
// that point KILN_CUDA_DRIVER elsewhere run `kiln info` as a child process.
#include <kiln/kiln.h>

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_driver.h"
#include "core/dtype.h"
#include "core/error.h"
#include "jit/cublas.h"
#include "memory/memory.h"
#include "test_files.h"

namespace cuda = kiln::cuda;
namespace memory = kiln::memory;
using Catch::Matchers::Contains;
using kiln::Buffer;
using kiln::Device;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool no_device() { return cuda::device_count() == 0; }

#define SKIP_WITHOUT_DEVICE()                                          \
  if (no_device()) {                                                   \
    WARN("skipped: no CUDA device (" << cuda::driver_status() << ")"); \
    return;                                                            \
  }
#define SKIP_WITH_DEVICE()                                                             \
  if (!no_device()) {                                                                  \
    WARN("skipped: this machine has a CUDA device (" << cuda::driver_status() << ")"); \
    return;                                                                            \
  }

// `kiln info --json` in a child process with KILN_CUDA_DRIVER=driver.
nlohmann::json info_with_driver(const std::string& driver) {
  kiln::test::TempDir dir("kiln_cuda_info");
  const std::string command = "KILN_CUDA_DRIVER='" + driver +
                              "' '" KILN_CLI_PATH "' --cache-dir '" + dir.file("cache") +
                              "' info --json 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  std::array<char, 4096> chunk{};
  size_t n;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0) out.append(chunk.data(), n);
  REQUIRE(::pclose(pipe) == 0);
  INFO(out);
  return nlohmann::json::parse(out);
}

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  return out;
}

// A buffer's bytes, read back from wherever its data is.
std::vector<unsigned char> read_back(const Buffer& b) {
  std::vector<unsigned char> out(b.bytes());
  cuda::copy_device_to_host(b.device().index, out.data(), b.data(), b.bytes());
  return out;
}

void write(const Buffer& b, const std::vector<unsigned char>& bytes) {
  cuda::copy_host_to_device(b.device().index, b.data(), bytes.data(), bytes.size());
}

}  // namespace

// ---- Without a driver -------------------------------------------------------------------

TEST_CASE("cuda driver: without a driver every CUDA request is a clear DeviceError", "[driver]") {
  SKIP_WITH_DEVICE();
  CHECK_FALSE(cuda::driver_loaded());
  CHECK(cuda::device_count() == 0);
  const std::string status = cuda::driver_status();
  INFO(status);
  CHECK(!status.empty());

  auto check_error = [&](auto&& call) {
    try {
      call();
      FAIL("no DeviceError");
    } catch (const kiln::DeviceError& e) {
      const std::string message = e.what();
      INFO(message);
      CHECK(message.rfind("[cuda] ", 0) == 0);
      CHECK_THAT(message, Contains(status));
      CHECK_THAT(message, Contains("CUDA devices are unavailable on this machine"));
    }
  };
  check_error([] { Buffer buffer(64, Device::cuda(0)); });
  check_error([] { cuda::properties(0); });
  check_error([] { cuda::load_module(0, std::vector<uint8_t>(16, 0)); });
  check_error([] { cuda::device_malloc(0, 64); });
  check_error([] { cuda::pinned_malloc(64); });
  check_error([] { cuda::synchronize(0); });
  check_error([] { cuda::StreamTimer timer(0); });
  check_error([] { memory::device_pool(0); });
  check_error([] { memory::pinned_pool(); });
  check_error([] { memory::set_device_memory_limit(0, kMiB); });
  // cuBLAS may be installed without a driver; the GEMM then fails on the device instead.
  CHECK_THROWS_AS(kiln::jit::cublas_gemm(0, kiln::DType::Float32, false, false, 2, 2, 2, nullptr, 2,
                                         4, nullptr, 2, 4, nullptr, 2, 4, 1, 1.0f, 0.0f),
                  kiln::DeviceError);
  // Freeing never throws, even without a driver.
  cuda::device_free(0, reinterpret_cast<void*>(64));
  cuda::pinned_free(reinterpret_cast<void*>(64));
}

TEST_CASE("cuda driver: CPU work and the memory report are unaffected", "[driver]") {
  SKIP_WITH_DEVICE();
  Buffer host(4096, Device::cpu());
  CHECK(host.placement() == kiln::Placement::Host);
  CHECK(host.host_data() == host.data());
  {
    Buffer::Use use(host);
    CHECK(use.data() == host.data());
  }

  kiln::Tensor x = kiln::reshape(kiln::arange(0, 6, 1, kiln::DType::Float32), {2, 3});
  std::vector<float> y = kiln::sum(x * 2.0f + 1.0f, {1}).to_vector<float>();
  CHECK(y == std::vector<float>{9.0f, 27.0f});

  const std::string report = memory::report();
  CHECK_THAT(report, Contains("[host pool] memory report"));
  CHECK_THAT(report, Contains("no CUDA devices (" + cuda::driver_status() + ")"));
}

TEST_CASE("cuda driver: KILN_CUDA_DRIVER names the library, and a bad one is reported",
          "[driver]") {
  SECTION("a file that does not exist") {
    nlohmann::json info = info_with_driver("/nonexistent/libcuda.so.1");
    const std::string status = info.at("cuda_driver");
    CHECK_THAT(status, Contains("no CUDA driver found (/nonexistent/libcuda.so.1"));
    CHECK(info.at("cuda_devices").empty());
  }
  SECTION("a shared library that is not a CUDA driver") {
    nlohmann::json info = info_with_driver("libm.so.6");
    const std::string status = info.at("cuda_driver");
    CHECK(status == "no CUDA driver found (libm.so.6 has no cuInit: not a CUDA driver)");
    CHECK(info.at("cuda_devices").empty());
  }
  SECTION("the toolkit's stub library, which refuses cuInit") {
    const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (!std::filesystem::exists(stub)) {
      WARN("skipped: no " << stub);
      return;
    }
    nlohmann::json info = info_with_driver(stub);
    const std::string status = info.at("cuda_driver");
    CHECK_THAT(status, Contains("cuInit failed: CUDA_ERROR_STUB_LIBRARY"));
    CHECK(info.at("cuda_devices").empty());
  }
}

// ---- With a device ----------------------------------------------------------------------

TEST_CASE("cuda driver: device properties and driver status", "[cuda]") {
  SKIP_WITHOUT_DEVICE();
  CHECK(cuda::driver_loaded());
  CHECK_THAT(cuda::driver_status(), Contains("CUDA driver "));
  cuda::DeviceProperties p = cuda::properties(0);
  CHECK(!p.name.empty());
  CHECK(p.major >= 5);
  CHECK(p.total_memory > 0);
  CHECK(p.multiprocessors > 0);
  auto [free, total] = cuda::memory_info(0);
  CHECK(total == p.total_memory);
  CHECK(free <= total);
  CHECK_THROWS_AS(cuda::properties(cuda::device_count()), kiln::DeviceError);
  CHECK_THROWS_AS(cuda::load_module(0, std::vector<uint8_t>{'n', 'o', 't'}), kiln::CompileError);
}

TEST_CASE("cuda memory: the device pool caches and counts", "[cuda][pool]") {
  SKIP_WITHOUT_DEVICE();
  kiln::memory::CachingPool& pool = memory::device_pool(0);
  CHECK(pool.name() == "cuda:0 pool");
  const auto before = pool.stats();
  void* p = pool.allocate(3 * kMiB + 5);
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  auto s = pool.stats();
  CHECK(s.allocated == before.allocated + 3 * kMiB + 64);
  CHECK(s.num_allocs == before.num_allocs + 1);
  pool.deallocate(p);
  void* q = pool.allocate(3 * kMiB + 5);
  CHECK(q == p);
  CHECK(pool.stats().cache_hits > s.cache_hits);
  pool.deallocate(q);
  CHECK(pool.stats().allocated == before.allocated);
  CHECK_THAT(pool.report(), Contains("[cuda:0 pool] memory report"));
  CHECK_THAT(memory::report(), Contains("[pinned pool] memory report"));
}

TEST_CASE("cuda memory: the pinned pool is host memory the copies can use", "[cuda][pool]") {
  SKIP_WITHOUT_DEVICE();
  kiln::memory::CachingPool& pinned = memory::pinned_pool();
  const size_t bytes = 2 * kMiB + 3;
  auto data = random_bytes(bytes, 5);
  auto* host = static_cast<unsigned char*>(pinned.allocate(bytes));
  std::memcpy(host, data.data(), bytes);
  Buffer device(bytes, Device::cuda(0));
  cuda::copy_host_to_device(0, device.data(), host, bytes);
  std::memset(host, 0, bytes);
  cuda::copy_device_to_host(0, host, device.data(), bytes);
  CHECK(std::memcmp(host, data.data(), bytes) == 0);
  pinned.deallocate(host);
}

TEST_CASE("cuda memory: host to device, device to device, device to host round trip", "[cuda]") {
  SKIP_WITHOUT_DEVICE();
  for (size_t bytes : {size_t{1}, size_t{1000}, 5 * kMiB + 7}) {
    auto data = random_bytes(bytes, static_cast<uint32_t>(bytes));
    Buffer a(bytes, Device::cuda(0));
    Buffer b(bytes, Device::cuda(0));
    CHECK(a.placement() == kiln::Placement::Device);
    write(a, data);
    cuda::copy_device_to_device(0, b.data(), a.data(), bytes);
    CHECK(read_back(b) == data);
    cuda::memset_device(0, b.data(), 0xAB, bytes);
    CHECK(read_back(b) == std::vector<unsigned char>(bytes, 0xAB));
    // host_data() keeps a host copy; a write through data() drops it.
    auto* host = static_cast<unsigned char*>(a.host_data());
    CHECK(std::memcmp(host, data.data(), bytes) == 0);
    CHECK(a.placement() == kiln::Placement::Both);
    a.data();
    CHECK(a.placement() == kiln::Placement::Device);
  }
  cuda::StreamTimer timer(0);
  timer.start();
  Buffer big(64 * kMiB, Device::cuda(0));
  cuda::memset_device(0, big.data(), 1, big.bytes());
  CHECK(timer.stop() >= 0.0f);
}

TEST_CASE("cuda memory: under a small limit buffers move to host memory and come back intact",
          "[cuda][placement]") {
  SKIP_WITHOUT_DEVICE();
  kiln::memory::CachingPool& pool = memory::device_pool(0);
  const size_t old_limit = pool.limit();
  pool.empty_cache();
  const size_t base = pool.stats().reserved;
  // Room for three 16 MiB buffers (each gets its own segment), not four.
  memory::set_device_memory_limit(0, base + 48 * kMiB);
  const auto stats0 = memory::placement_stats(0);

  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<std::vector<unsigned char>> contents;
  for (int i = 0; i < 4; ++i) {
    buffers.push_back(std::make_unique<Buffer>(16 * kMiB, Device::cuda(0)));
    contents.push_back(random_bytes(16 * kMiB, 100 + i));
    write(*buffers.back(), contents.back());
  }
  // The fourth pushed out the least recently used one, the first.
  CHECK(buffers[0]->placement() == kiln::Placement::Host);
  CHECK(buffers[3]->placement() == kiln::Placement::Device);
  auto stats1 = memory::placement_stats(0);
  CHECK(stats1.evictions == stats0.evictions + 1);
  CHECK(pool.stats().reserved <= base + 48 * kMiB);

  // Reading each brings it back (pushing out another); data is unchanged throughout.
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i) CHECK(read_back(*buffers[i]) == contents[i]);
  }
  CHECK(memory::placement_stats(0).restores > stats1.restores);

  // Buffers in use by the running kernel are never moved: pinning three brings them in
  // and pushes out the fourth, which then has no room to come back.
  {
    std::vector<Buffer::Use> uses;
    for (int i = 1; i < 4; ++i) uses.emplace_back(*buffers[i], /*write=*/false);
    CHECK(buffers[0]->placement() == kiln::Placement::Host);
    try {
      buffers[0]->data();
      FAIL("no OutOfMemoryError");
    } catch (const kiln::OutOfMemoryError& e) {
      CHECK_THAT(std::string(e.what()), Contains("could be moved to host memory"));
      CHECK_THAT(std::string(e.what()), Contains("[cuda:0 pool] memory report"));
    }
  }
  for (int i = 0; i < 4; ++i) CHECK(read_back(*buffers[i]) == contents[i]);
  buffers.clear();
  memory::set_device_memory_limit(0, old_limit);
  CHECK(memory::placement_stats(0).host_bytes == stats0.host_bytes);
}

namespace {

// Row-major GEMM through cuBLAS against a float64 host reference on the same (rounded)
// inputs, with trans flags, padded leading dimensions and a batch. C is the result's type: T,
// or float for half operands (mixed precision, the result not rounded to half).
template <typename T, typename C = T>
void check_gemm(kiln::DType dtype, bool trans_a, bool trans_b, double tolerance) {
  const int64_t m = 37, n = 45, k = 29, batch = 3;
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = n + 2;
  const int64_t sa = a_rows * lda, sb = b_rows * ldb, sc = m * ldc;
  std::mt19937 rng(static_cast<uint32_t>(trans_a * 2 + trans_b));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> a(static_cast<size_t>(sa * batch)), b(static_cast<size_t>(sb * batch));
  std::vector<C> c(static_cast<size_t>(sc * batch));
  for (auto& x : a) x = T(dist(rng));
  for (auto& x : b) x = T(dist(rng));
  for (auto& x : c) x = C(dist(rng));
  const float alpha = 1.5f, beta = 0.5f;

  auto upload = [](const auto& host) {
    auto buffer = std::make_unique<Buffer>(host.size() * sizeof(host[0]), Device::cuda(0));
    cuda::copy_host_to_device(0, buffer->data(), host.data(), buffer->bytes());
    return buffer;
  };
  auto da = upload(a), db = upload(b), dc = upload(c);
  kiln::jit::cublas_gemm(0, dtype, trans_a, trans_b, m, n, k, da->data(), lda, sa, db->data(), ldb,
                         sb, dc->data(), ldc, sc, batch, alpha, beta,
                         std::is_same_v<C, float> ? kiln::DType::Float32 : dtype);
  std::vector<C> out(c.size());
  cuda::copy_device_to_host(0, out.data(), dc->data(), dc->bytes());

  double worst = 0.0;
  for (int64_t q = 0; q < batch; ++q) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0, scale = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          double av = static_cast<double>(static_cast<float>(
              a[static_cast<size_t>(q * sa + (trans_a ? p * lda + i : i * lda + p))]));
          double bv = static_cast<double>(static_cast<float>(
              b[static_cast<size_t>(q * sb + (trans_b ? j * ldb + p : p * ldb + j))]));
          acc += av * bv;
          scale += std::fabs(av * bv);
        }
        const size_t ci = static_cast<size_t>(q * sc + i * ldc + j);
        const double c0 = static_cast<double>(static_cast<float>(c[ci]));
        const double expected = alpha * acc + beta * c0;
        const double got = static_cast<double>(static_cast<float>(out[ci]));
        worst = std::max(
            worst, std::fabs(got - expected) / (alpha * scale + beta * std::fabs(c0) + 1e-30));
      }
    }
    // Padding between rows is left alone.
    const size_t pad = static_cast<size_t>(q * sc + n);
    CHECK(static_cast<float>(out[pad]) == static_cast<float>(c[pad]));
  }
  INFO(kiln::dtype_name(dtype) << " trans_a=" << trans_a << " trans_b=" << trans_b);
  CHECK(worst <= tolerance);
}

}  // namespace

TEST_CASE("cublas: strided batched GEMM matches a float64 reference", "[cuda][cublas]") {
  SKIP_WITHOUT_DEVICE();
  if (!kiln::jit::cublas_available()) {
    WARN("skipped: " << kiln::jit::cublas_status());
    return;
  }
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_gemm<float>(kiln::DType::Float32, ta, tb, 1e-5);
      check_gemm<double>(kiln::DType::Float64, ta, tb, 1e-12);
      check_gemm<kiln::Half>(kiln::DType::Float16, ta, tb, 2e-3);
      check_gemm<kiln::BFloat16>(kiln::DType::BFloat16, ta, tb, 1.5e-2);
      // Half operands, float32 result (autocast's products): only the operands are rounded.
      check_gemm<kiln::Half, float>(kiln::DType::Float16, ta, tb, 1e-5);
      check_gemm<kiln::BFloat16, float>(kiln::DType::BFloat16, ta, tb, 1e-5);
    }
  }
  CHECK_THROWS_AS(
      kiln::jit::cublas_gemm(0, kiln::DType::Float32, false, false, 2, 2, 2, nullptr, 2, 4, nullptr,
                             2, 4, nullptr, 2, 4, 1, 1.0f, 0.0f, kiln::DType::Float16),
      kiln::DTypeError);
  CHECK_THROWS_AS(kiln::jit::cublas_gemm(0, kiln::DType::Int32, false, false, 2, 2, 2, nullptr, 2,
                                         4, nullptr, 2, 4, nullptr, 2, 4, 1, 1.0f, 0.0f),
                  kiln::DTypeError);
}
