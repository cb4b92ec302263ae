// Thread pool: coverage of ranges, deterministic partitions, exceptions, nesting and
// concurrent callers.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/thread_pool.h"

using kiln::chunk_begin;
using kiln::chunk_count;
using kiln::ThreadPool;

namespace {

using Range = std::pair<int64_t, int64_t>;

// The chunks one parallel_for produced, sorted by start.
std::vector<Range> ranges_of(ThreadPool& pool, int64_t n, int64_t grain) {
  std::mutex mutex;
  std::vector<Range> ranges;
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mutex);
    ranges.emplace_back(b, e);
  });
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

}  // namespace

TEST_CASE("chunk_begin splits evenly and deterministically", "[threads]") {
  CHECK(chunk_begin(10, 3, 0) == 0);
  CHECK(chunk_begin(10, 3, 1) == 4);
  CHECK(chunk_begin(10, 3, 2) == 7);
  CHECK(chunk_begin(10, 3, 3) == 10);
  for (int64_t n : {1, 7, 64, 1000, 1001}) {
    for (int64_t parts = 1; parts <= std::min<int64_t>(n, 9); ++parts) {
      CHECK(chunk_begin(n, parts, parts) == n);
      for (int64_t k = 0; k < parts; ++k) {
        int64_t size = chunk_begin(n, parts, k + 1) - chunk_begin(n, parts, k);
        CHECK((size == n / parts || size == n / parts + 1));
      }
    }
  }
  CHECK(chunk_count(0, 1, 4) == 0);
  CHECK(chunk_count(-5, 1, 4) == 0);
  CHECK(chunk_count(3, 10, 4) == 1);
  CHECK(chunk_count(100, 10, 4) == 4);
  CHECK(chunk_count(25, 10, 4) == 2);
  CHECK(chunk_count(100, 0, 4) == 4);
}

TEST_CASE("parallel_for covers the range exactly once", "[threads]") {
  for (int threads : {1, 2, 4, 7}) {
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (int64_t n : {0, 1, 5, 100, 12345}) {
      for (int64_t grain : {1, 16, 1000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (auto& h : hits) REQUIRE(h.load() == 1);
        auto ranges = ranges_of(pool, n, grain);
        REQUIRE(static_cast<int64_t>(ranges.size()) == chunk_count(n, grain, threads));
        for (const auto& [b, e] : ranges) {
          if (ranges.size() > 1) CHECK(e - b >= std::max<int64_t>(grain, 1));
        }
      }
    }
  }
}

TEST_CASE("parallel_for sums match and partitions are deterministic", "[threads]") {
  ThreadPool pool(4);
  const int64_t n = 1'000'003;
  std::vector<double> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 1.0 / double(i + 1);
  // Per-chunk partials combined in chunk order: the same bits on every run.
  auto chunked_sum = [&] {
    int64_t parts = chunk_count(n, 4096, pool.size());
    std::vector<double> partial(static_cast<size_t>(parts), 0.0);
    pool.parallel_for(n, 4096, [&](int64_t b, int64_t e) {
      // Find this chunk's index from its start: the partition is a pure function.
      int64_t k = 0;
      while (chunk_begin(n, parts, k) != b) ++k;
      double s = 0;
      for (int64_t i = b; i < e; ++i) s += x[static_cast<size_t>(i)];
      partial[static_cast<size_t>(k)] = s;
    });
    return std::accumulate(partial.begin(), partial.end(), 0.0);
  };
  double first = chunked_sum();
  for (int run = 0; run < 20; ++run) REQUIRE(chunked_sum() == first);
  CHECK(first == Approx(std::accumulate(x.begin(), x.end(), 0.0)).epsilon(1e-12));

  auto expected = ranges_of(pool, n, 4096);
  for (int run = 0; run < 20; ++run) REQUIRE(ranges_of(pool, n, 4096) == expected);
  ThreadPool other(4);
  CHECK(ranges_of(other, n, 4096) == expected);
}

TEST_CASE("parallel_for rethrows the first exception and stays usable", "[threads]") {
  ThreadPool pool(4);
  for (int run = 0; run < 10; ++run) {
    CHECK_THROWS_WITH(pool.parallel_for(1000, 1,
                                        [&](int64_t b, int64_t) {
                                          if (b >= 500) throw std::runtime_error("chunk failed");
                                        }),
                      "chunk failed");
  }
  // Inline path (n <= grain) propagates too.
  CHECK_THROWS_AS(pool.parallel_for(10, 100, [](int64_t, int64_t) { throw std::logic_error("x"); }),
                  std::logic_error);
  std::atomic<int64_t> total{0};
  pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) { total += e - b; });
  CHECK(total == 1000);
}

TEST_CASE("small and empty ranges run inline on the caller", "[threads]") {
  ThreadPool pool(4);
  auto caller = std::this_thread::get_id();
  int calls = 0;
  pool.parallel_for(0, 1, [&](int64_t, int64_t) { ++calls; });
  CHECK(calls == 0);
  pool.parallel_for(50, 50, [&](int64_t b, int64_t e) {
    ++calls;
    CHECK(b == 0);
    CHECK(e == 50);
    CHECK(std::this_thread::get_id() == caller);
  });
  CHECK(calls == 1);
}

TEST_CASE("nested and concurrent parallel_for", "[threads]") {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(1000, 10, [&](int64_t ib, int64_t ie) { total += ie - ib; });
    }
  });
  CHECK(total == 8000);

  // Several host threads share one pool; each gets its own complete result.
  std::vector<int64_t> sums(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 200; ++rep) {
        std::atomic<int64_t> s{0};
        pool.parallel_for(10000, 100, [&](int64_t b, int64_t e) {
          int64_t local = 0;
          for (int64_t i = b; i < e; ++i) local += i;
          s += local;
        });
        if (s != 10000LL * 9999 / 2) return;
        sums[static_cast<size_t>(t)]++;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto s : sums) CHECK(s == 200);
}

TEST_CASE("global pool and launch overhead", "[threads]") {
  ThreadPool& pool = kiln::thread_pool();
  CHECK(pool.size() >= 1);
  CHECK(&pool == &kiln::thread_pool());
  std::atomic<int64_t> sink{0};
  const int launches = 20000;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i)
    pool.parallel_for(1 << 12, 256, [&](int64_t b, int64_t e) { sink += e - b; });
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
      launches;
  CHECK(sink == int64_t(launches) << 12);
  WARN("thread pool: " << pool.size() << " threads, " << us
                       << " us per parallel_for launch (4096 items, grain 256)");
}

// mpiexec binds each of up to two ranks to one core; the default pool follows the binding
// instead of putting hardware_concurrency() workers on that core.
TEST_CASE("usable_cpus follows the process affinity mask", "[threads]") {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  CHECK(kiln::usable_cpus() == CPU_COUNT(&mask));
  int first = 0;
  while (!CPU_ISSET(first, &mask)) ++first;
  // The narrowed mask lives in a child, so this process keeps its cores.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(2);
    _exit(kiln::usable_cpus() == 1 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
