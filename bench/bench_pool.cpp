// Times alloc/free patterns of mixed sizes through HostPool and through malloc/free, and
// prints the median nanoseconds per allocate+deallocate pair and the ratio pool/malloc.
//
// Each allocated block has one byte written per 4 KiB page, as a kernel writing the tensor
// would: fresh pages from the OS then cost their page faults, which is most of what a
// cache saves for large blocks. The pool is warmed by the first repetition, as it is by a
// program's first step.
//
// Usage: bench_pool [repetitions]   (default 15)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "examples/common/flags.h"
#include "memory/pools/host_pool.h"

namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kPage = 4 * kKiB;

// One alloc/free pattern: blocks are allocated in `sizes` order, in batches of `batch`
// live blocks, each batch freed in the shuffled order `free_order`.
struct Pattern {
  std::string name;
  std::vector<size_t> sizes;
  size_t batch;
  std::vector<size_t> free_order;  // a permutation of [0, batch)
};

Pattern make_pattern(std::string name, size_t lo, size_t hi, size_t count, size_t batch,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  // Log-uniform sizes: tensor sizes spread over orders of magnitude.
  std::uniform_real_distribution<double> log_size(std::log2(static_cast<double>(lo)),
                                                  std::log2(static_cast<double>(hi)));
  Pattern p{std::move(name), {}, batch, {}};
  for (size_t i = 0; i < count; ++i) {
    p.sizes.push_back(static_cast<size_t>(std::exp2(log_size(rng))));
  }
  for (size_t i = 0; i < batch; ++i) p.free_order.push_back(i);
  std::shuffle(p.free_order.begin(), p.free_order.end(), rng);
  return p;
}

// Writes one byte per page; the sum is returned so the writes cannot be optimised away.
inline unsigned touch(void* ptr, size_t bytes) {
  auto* p = static_cast<volatile unsigned char*>(ptr);
  unsigned sum = 0;
  for (size_t i = 0; i < bytes; i += kPage) {
    p[i] = static_cast<unsigned char>(i);
    sum += p[i];
  }
  return sum;
}

template <typename Alloc, typename Free>
double ns_per_pair(const Pattern& pattern, Alloc alloc, Free release, unsigned& sink) {
  std::vector<void*> live(pattern.batch);
  auto start = std::chrono::steady_clock::now();
  for (size_t base = 0; base + pattern.batch <= pattern.sizes.size(); base += pattern.batch) {
    for (size_t i = 0; i < pattern.batch; ++i) {
      size_t bytes = pattern.sizes[base + i];
      live[i] = alloc(bytes);
      sink += touch(live[i], bytes);
    }
    for (size_t i : pattern.free_order) release(live[i]);
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  size_t pairs = pattern.sizes.size() / pattern.batch * pattern.batch;
  return std::chrono::duration<double, std::nano>(elapsed).count() / static_cast<double>(pairs);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags("bench_pool",
                       "Allocate/free patterns of mixed sizes through kiln's host pool and "
                       "through malloc (prints its own table).");
  flags.add("repetitions", "15", "timed repetitions of each pattern (median reported)");
  int code = 0;
  if (!flags.parse(argc, argv, &code)) return code;
  int repetitions = 15;
  try {
    repetitions = static_cast<int>(std::max<int64_t>(1, flags.integer("repetitions")));
  } catch (const example::UsageError& e) {
    std::fprintf(stderr, "bench_pool: %s\n", e.what());
    return 2;
  }
  const std::vector<Pattern> patterns = {
      make_pattern("small 16 B - 4 KiB, 64 live", 16, 4 * kKiB, 64 * 1024, 64, 1),
      make_pattern("mixed 16 B - 1 MiB, 32 live", 16, kMiB, 32 * 256, 32, 2),
      make_pattern("medium 64 KiB - 1 MiB, 16 live", 64 * kKiB, kMiB, 16 * 128, 16, 3),
      make_pattern("large 2 - 64 MiB, 4 live", 2 * kMiB, 64 * kMiB, 4 * 16, 4, 4),
  };

  unsigned sink = 0;
  std::printf("%-34s %14s %14s %12s %10s\n", "pattern", "pool ns/op", "malloc ns/op", "pool/malloc",
              "pool hits");
  for (const Pattern& pattern : patterns) {
    kiln::memory::HostPool pool;
    std::vector<double> pool_ns, malloc_ns;
    // Interleaved so that drifts in machine load hit both sides alike.
    for (int r = 0; r <= repetitions; ++r) {
      double p = ns_per_pair(
          pattern, [&](size_t n) { return pool.allocate(n); },
          [&](void* ptr) { pool.deallocate(ptr); }, sink);
      double m = ns_per_pair(
          pattern, [](size_t n) { return std::malloc(n); }, [](void* ptr) { std::free(ptr); },
          sink);
      if (r == 0) continue;  // warm-up
      pool_ns.push_back(p);
      malloc_ns.push_back(m);
    }
    double pool_median = median(pool_ns);
    double malloc_median = median(malloc_ns);
    kiln::memory::PoolStats s = pool.stats();
    std::printf("%-34s %14.1f %14.1f %12.2f %9.1f%%\n", pattern.name.c_str(), pool_median,
                malloc_median, pool_median / malloc_median,
                100.0 * static_cast<double>(s.cache_hits) / static_cast<double>(s.num_allocs));
  }
  std::printf("(median of %d repetitions; op = one allocate + one deallocate; checksum %u)\n",
              repetitions, sink & 0xff);
  return 0;
}
