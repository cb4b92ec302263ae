// The caching pool (host instance, and over a test segment source): reuse, split/coalesce,
// statistics, limit, report, threads; memory sizes; the eviction policy of device placement.
// Each test makes its own HostPool so that counters start at zero and tests stay independent.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "memory/memory.h"
#include "memory/pools/host_pool.h"

using kiln::memory::HostPool;

namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

// Pseudo-random bytes from `seed`, none of them zero, so a block that was not written (or
// was overwritten by another block) does not verify by accident. Word-sized for speed:
// the thread test writes hundreds of megabytes under the sanitizers.
uint64_t next_word(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;  // splitmix64
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) | 0x0101010101010101ull;
}

void fill(void* ptr, size_t bytes, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(ptr);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t word = next_word(seed);
    std::memcpy(p + i, &word, std::min<size_t>(8, bytes - i));
  }
}

bool verify(const void* ptr, size_t bytes, uint64_t seed) {
  auto* p = static_cast<const unsigned char*>(ptr);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t word = next_word(seed);
    if (std::memcmp(p + i, &word, std::min<size_t>(8, bytes - i)) != 0) return false;
  }
  return true;
}

char* at(void* p, size_t offset) { return static_cast<char*>(p) + offset; }

}  // namespace

TEST_CASE("pool: a freed block is handed out again as a cache hit", "[pool]") {
  HostPool pool;
  void* p = pool.allocate(1000);
  fill(p, 1000, 1);
  pool.deallocate(p);
  CHECK(pool.stats().cache_hits == 0);

  void* q = pool.allocate(1000);
  CHECK(q == p);
  auto s = pool.stats();
  CHECK(s.cache_hits == 1);
  CHECK(s.os_allocs == 1);
  CHECK(s.reserved == 2 * kMiB);

  SECTION("a same-class block between live neighbours is reused in place") {
    void* a = pool.allocate(5000);
    void* b = pool.allocate(5000);
    void* c = pool.allocate(5000);
    pool.deallocate(b);
    void* d = pool.allocate(4500);  // 4500 and 5000 share the 5 KiB class
    CHECK(d == b);
    CHECK(pool.stats().os_allocs == 1);
    for (void* x : {a, c, d}) pool.deallocate(x);
  }
  pool.deallocate(q);
}

TEST_CASE("pool: blocks are 64-byte aligned and distinct for odd sizes", "[pool]") {
  HostPool pool;
  std::mt19937 rng(7);
  std::vector<size_t> sizes = {0,    0,    1,    3,     63,       64,   65,       127,
                               1023, 1025, 4097, 65537, kMiB - 1, kMiB, kMiB + 1, 3 * kMiB + 17};
  for (int i = 0; i < 200; ++i) sizes.push_back(rng() % (2 * kMiB) + 1);

  std::vector<void*> blocks;
  std::set<void*> distinct;
  for (size_t i = 0; i < sizes.size(); ++i) {
    void* p = pool.allocate(sizes[i]);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    fill(p, sizes[i], i);
    blocks.push_back(p);
    distinct.insert(p);
  }
  CHECK(distinct.size() == blocks.size());  // zero-byte blocks are unique too
  for (size_t i = 0; i < sizes.size(); ++i) {
    CHECK(verify(blocks[i], sizes[i], i));
    pool.deallocate(blocks[i]);
  }
  CHECK(pool.stats().allocated == 0);
}

TEST_CASE("pool: one large free block is split to serve two smaller requests", "[pool]") {
  HostPool pool;
  void* big = pool.allocate(8 * kMiB);
  pool.deallocate(big);
  const size_t reserved = pool.stats().reserved;

  void* a = pool.allocate(3 * kMiB);
  void* b = pool.allocate(3 * kMiB);
  CHECK(a == big);
  CHECK(b == at(big, 3 * kMiB));
  auto s = pool.stats();
  CHECK(s.reserved == reserved);
  CHECK(s.os_allocs == 1);
  CHECK(s.cache_hits == 2);
  CHECK(s.allocated == 6 * kMiB);
  pool.deallocate(a);
  pool.deallocate(b);
}

TEST_CASE("pool: freed neighbours coalesce into a block of their combined size", "[pool]") {
  HostPool pool;

  SECTION("large blocks") {
    void* a = pool.allocate(6 * kMiB);  // shares one 20 MiB segment with b and c
    void* b = pool.allocate(6 * kMiB);
    void* c = pool.allocate(6 * kMiB);
    REQUIRE(b == at(a, 6 * kMiB));
    REQUIRE(c == at(a, 12 * kMiB));
    const size_t reserved = pool.stats().reserved;

    // Free in both orders across the two cases so merging into prev and next is covered.
    pool.deallocate(b);
    pool.deallocate(a);
    void* ab = pool.allocate(12 * kMiB);  // fits only if a and b were merged
    CHECK(ab == a);
    CHECK(pool.stats().reserved == reserved);
    CHECK(pool.stats().os_allocs == 1);

    pool.deallocate(ab);
    pool.deallocate(c);
    auto s = pool.stats();
    CHECK(s.allocated == 0);
    CHECK(s.largest_free == reserved);  // the whole segment is one block again
    CHECK(s.fragmentation() == 0.0);
  }

  SECTION("small blocks") {
    // Eight 256 KiB blocks fill one 2 MiB small segment exactly.
    std::vector<void*> q;
    for (int i = 0; i < 8; ++i) q.push_back(pool.allocate(256 * kKiB));
    REQUIRE(pool.stats().small_segments == 1);
    pool.deallocate(q[1]);
    pool.deallocate(q[2]);
    void* merged = pool.allocate(512 * kKiB);
    CHECK(merged == q[1]);
    CHECK(pool.stats().os_allocs == 1);

    pool.deallocate(merged);
    for (int i : {0, 3, 4, 5, 6, 7}) pool.deallocate(q[i]);
    void* whole = pool.allocate(kMiB);  // only fits once all eight have merged
    CHECK(whole == q[0]);
    CHECK(pool.stats().os_allocs == 1);
    pool.deallocate(whole);
  }
}

TEST_CASE("pool: statistics are exact", "[pool]") {
  HostPool pool;
  // Small sizes round up to classes: 100 -> 128, 1000 -> 1024, 3000 -> 3072.
  // Large sizes round up to 64 bytes and share a 20 MiB segment below 10 MiB.
  const size_t large = 2 * kMiB + 1;
  const size_t large_rounded = 2 * kMiB + 64;
  void* a = pool.allocate(100);
  void* b = pool.allocate(1000);
  void* c = pool.allocate(3000);
  void* d = pool.allocate(large);

  auto s = pool.stats();
  const size_t in_use = 128 + 1024 + 3072 + large_rounded;
  CHECK(s.allocated == in_use);
  CHECK(s.requested == 100 + 1000 + 3000 + large);
  CHECK(s.peak_allocated == in_use);
  CHECK(s.reserved == 2 * kMiB + 20 * kMiB);
  CHECK(s.peak_reserved == s.reserved);
  CHECK(s.num_allocs == 4);
  CHECK(s.cache_hits == 2);  // b and c are carved from a's segment without an OS call
  CHECK(s.num_frees == 0);
  CHECK(s.segments == 2);
  CHECK(s.small_segments == 1);
  CHECK(s.cached() == s.reserved - in_use);

  pool.deallocate(d);
  s = pool.stats();
  CHECK(s.allocated == in_use - large_rounded);
  CHECK(s.peak_allocated == in_use);
  CHECK(s.num_frees == 1);
  CHECK(s.largest_free == 20 * kMiB);
  CHECK(s.fragmentation() > 0.0);  // the small segment's tail is cached apart from it
  CHECK(s.fragmentation() < 0.1);

  pool.reset_peak_stats();
  s = pool.stats();
  CHECK(s.peak_allocated == s.allocated);
  CHECK(s.peak_reserved == s.reserved);

  void* e = pool.allocate(100);
  CHECK(pool.stats().cache_hits == 3);
  CHECK(pool.stats().num_allocs == 5);

  SECTION("a remainder of at most 1 MiB stays with a large block") {
    void* f = pool.allocate(19 * kMiB + 512 * kKiB);  // own 20 MiB segment, no split
    CHECK(pool.stats().allocated == 128 + 1024 + 3072 + 128 + 20 * kMiB);
    CHECK(pool.stats().requested == 100 + 1000 + 3000 + 100 + 19 * kMiB + 512 * kKiB);
    pool.deallocate(f);
  }
  for (void* p : {a, b, c, e}) pool.deallocate(p);
  CHECK(pool.stats().allocated == 0);
  CHECK(pool.stats().requested == 0);
}

TEST_CASE("pool: the limit raises OutOfMemoryError and the pool stays usable", "[pool]") {
  HostPool pool;
  CHECK(pool.limit() == 0);
  pool.set_limit(8 * kMiB);
  CHECK(pool.limit() == 8 * kMiB);

  void* a = pool.allocate(4 * kMiB);  // a 20 MiB segment would not fit: exact one instead
  fill(a, 4 * kMiB, 3);
  CHECK(pool.stats().reserved == 4 * kMiB);

  try {
    pool.allocate(5 * kMiB);
    FAIL("allocation over the limit did not throw");
  } catch (const kiln::OutOfMemoryError& e) {
    std::string message = e.what();
    CHECK(message.rfind("[host pool]", 0) == 0);
    CHECK(message.find("5.0 MiB (5242880 bytes)") != std::string::npos);
    CHECK(message.find("limit of 8.0 MiB (8388608 bytes)") != std::string::npos);
    CHECK(message.find("reserved") != std::string::npos);  // the report follows
    CHECK(message.find("cache hits") != std::string::npos);
  }
  CHECK_THROWS_AS(pool.allocate(9 * kMiB), kiln::OutOfMemoryError);
  CHECK(pool.stats().num_ooms == 2);

  // Still usable, and live data is intact.
  CHECK(verify(a, 4 * kMiB, 3));
  void* small = pool.allocate(1000);
  CHECK(pool.stats().reserved == 6 * kMiB);

  // Cached memory is given back before the pool gives up: 2 + 4 cached + 6 > 8.
  pool.deallocate(a);
  void* b = pool.allocate(6 * kMiB);
  auto s = pool.stats();
  CHECK(s.reserved == 8 * kMiB);
  CHECK(s.os_frees == 1);

  // Lowering the limit below the reservation drops what is cached.
  pool.deallocate(b);
  pool.set_limit(4 * kMiB);
  CHECK(pool.stats().reserved == 2 * kMiB);

  pool.set_limit(0);
  void* huge = pool.allocate(64 * kMiB);
  pool.deallocate(huge);
  pool.deallocate(small);
}

TEST_CASE("pool: empty_cache returns fully free segments to the OS", "[pool]") {
  HostPool pool;
  void* small = pool.allocate(1000);       // 2 MiB small segment, stays in use
  void* shared = pool.allocate(3 * kMiB);  // 20 MiB segment, freed below
  void* own = pool.allocate(24 * kMiB);    // too big for the 17 MiB left: own segment
  fill(small, 1000, 11);
  fill(own, 24 * kMiB, 12);
  pool.deallocate(shared);
  CHECK(pool.stats().reserved == 46 * kMiB);

  pool.empty_cache();
  auto s = pool.stats();
  CHECK(s.reserved == 26 * kMiB);
  CHECK(s.segments == 2);
  CHECK(s.os_frees == 1);
  CHECK(s.allocated == 1024 + 24 * kMiB);
  CHECK(verify(small, 1000, 11));
  CHECK(verify(own, 24 * kMiB, 12));

  pool.deallocate(small);
  pool.deallocate(own);
  pool.empty_cache();
  CHECK(pool.stats().reserved == 0);
  CHECK(pool.stats().segments == 0);
  CHECK(pool.stats().peak_reserved == 46 * kMiB);
}

TEST_CASE("pool: an arena hands out planned parts and refuses overlapping ones", "[pool]") {
  HostPool pool;
  void* base = pool.open_arena(12 * kMiB);
  REQUIRE(base != nullptr);
  auto s = pool.stats();
  CHECK(s.allocated == 0);  // reserved, not allocated, until parts are handed out
  CHECK(s.reserved == 12 * kMiB);

  void* a = pool.allocate_in_arena(base, 0, 1000);  // rounded to 1024
  void* b = pool.allocate_in_arena(base, 1024, 3 * kMiB);
  REQUIRE(a == base);
  REQUIRE(b == at(base, 1024));
  s = pool.stats();
  CHECK(s.allocated == 1024 + 3 * kMiB);
  CHECK(s.peak_allocated == 1024 + 3 * kMiB);
  CHECK(s.requested == 1000 + 3 * kMiB);
  CHECK(s.num_allocs == 2);
  CHECK(s.cache_hits == 2);  // parts never ask the source
  fill(a, 1000, 21);
  fill(b, 3 * kMiB, 22);
  // Overlapping a live part (from below, inside, from above), misaligned, or past the end.
  CHECK(pool.allocate_in_arena(base, 960, 128) == nullptr);
  CHECK(pool.allocate_in_arena(base, 2048, 64) == nullptr);
  CHECK(pool.allocate_in_arena(base, 0, 64) == nullptr);
  CHECK(pool.allocate_in_arena(base, 1024 + 3 * kMiB - 64, 128) == nullptr);
  CHECK(pool.allocate_in_arena(base, 1000, 8) == nullptr);
  CHECK(pool.allocate_in_arena(base, 12 * kMiB - 64, 128) == nullptr);
  CHECK(pool.allocate_in_arena(base, 0, ~size_t{0}) == nullptr);
  CHECK(pool.stats().allocated == 1024 + 3 * kMiB);
  CHECK_THROWS_AS(pool.allocate_in_arena(at(base, 64), 0, 64), kiln::ValueError);

  // A freed part's place can be handed out again; its neighbours keep their data.
  pool.deallocate(a);
  void* c = pool.allocate_in_arena(base, 0, 1024);
  CHECK(c == base);
  fill(c, 1024, 23);
  CHECK(verify(b, 3 * kMiB, 22));
  // Parts are ordinary buffers to the pool's callers.
  {
    void* part = pool.allocate_in_arena(base, 4 * kMiB, 4096);
    REQUIRE(part != nullptr);
    kiln::Buffer buffer(part, 4096, pool);
    fill(buffer.data(), 4096, 24);
    CHECK(pool.stats().allocated == 2048 + 3 * kMiB + 4096 - 1024);
  }
  CHECK(pool.stats().allocated == 1024 + 3 * kMiB);

  // Closing with parts still out keeps the block until the last one is freed.
  pool.close_arena(base);
  CHECK_THROWS_AS(pool.allocate_in_arena(base, 8 * kMiB, 64), kiln::ValueError);
  CHECK_THROWS_AS(pool.close_arena(base), kiln::ValueError);
  CHECK(verify(b, 3 * kMiB, 22));
  pool.deallocate(c);
  pool.empty_cache();  // the arena's block is not free yet
  CHECK(pool.stats().reserved == 12 * kMiB);
  pool.deallocate(b);
  s = pool.stats();
  CHECK(s.allocated == 0);
  CHECK(s.requested == 0);
  CHECK(s.num_allocs == s.num_frees);

  // The next step's arena of the same size is the same block, from the cache.
  void* again = pool.open_arena(12 * kMiB);
  CHECK(again == base);
  CHECK(pool.stats().os_allocs == 1);
  pool.close_arena(again);
  pool.empty_cache();
  CHECK(pool.stats().reserved == 0);
}

TEST_CASE("pool: a pool ends with arenas open or still in use", "[pool]") {
  // Nothing to check but that the segments go back once (ASan and LSan watch this).
  {
    HostPool pool;
    void* base = pool.open_arena(3 * kMiB);
    REQUIRE(pool.allocate_in_arena(base, 64, 100) != nullptr);
  }
  {
    HostPool pool;
    void* base = pool.open_arena(3 * kMiB);
    void* part = pool.allocate_in_arena(base, 0, 100);
    REQUIRE(part != nullptr);
    pool.close_arena(base);
    void* other = pool.allocate(5 * kMiB);
    fill(other, 5 * kMiB, 31);  // in a segment of its own: the arena's is just its size
    CHECK(verify(other, 5 * kMiB, 31));
    CHECK(pool.stats().segments == 2);
  }
}

TEST_CASE("pool: an arena reserves its size and reserved_in_use leaves out free segments",
          "[pool]") {
  HostPool pool;
  CHECK(HostPool::arena_segment(3 * kMiB + 100) == 3 * kMiB + 128);  // the pool's alignment
  CHECK(HostPool::arena_segment(100) == kMiB + 64);                  // a large block at least
  // Sizes a 2 MiB or 20 MiB segment would round up are reserved to the byte the plan
  // counts (memory/planner/arena_fit.h).
  for (size_t bytes : {3 * kMiB + 100, 700 * kKiB, 37 * kMiB + 4096}) {
    INFO(bytes);
    void* base = pool.open_arena(bytes);
    REQUIRE(base != nullptr);
    CHECK(pool.stats().reserved == HostPool::arena_segment(bytes));
    CHECK(pool.reserved_in_use() == HostPool::arena_segment(bytes));
    pool.close_arena(base);
    CHECK(pool.reserved_in_use() == 0);  // closed and free: empty_cache would return it
    pool.empty_cache();
    CHECK(pool.stats().reserved == 0);
  }
  // Exact (a budgeted step's arena): a bigger cached block is not taken; the cache is
  // emptied and the arena gets its own size. Otherwise best fit takes the bigger block.
  {
    void* big = pool.open_arena(20 * kMiB);
    REQUIRE(big != nullptr);
    pool.close_arena(big);
    void* exact = pool.open_arena(8 * kMiB, true);
    REQUIRE(exact != nullptr);
    CHECK(pool.stats().reserved == HostPool::arena_segment(8 * kMiB));
    pool.close_arena(exact);
    const size_t os_allocs = pool.stats().os_allocs;
    void* same = pool.open_arena(8 * kMiB, true);  // the cached block of just that size
    CHECK(same == exact);
    CHECK(pool.stats().os_allocs == os_allocs);
    pool.close_arena(same);
    void* loose = pool.open_arena(4 * kMiB);
    CHECK(loose == exact);
    CHECK(pool.stats().reserved == HostPool::arena_segment(8 * kMiB));
    pool.close_arena(loose);
    pool.empty_cache();
  }
  // A live block pins its segment's free space; a fully free segment does not count.
  void* small = pool.allocate(1000);
  void* large = pool.allocate(5 * kMiB);
  const size_t both = pool.stats().reserved;
  CHECK(pool.reserved_in_use() == both);
  CHECK(pool.reserved_in_use() > pool.allocated());
  pool.deallocate(large);
  CHECK(pool.stats().reserved == both);  // cached, not returned
  CHECK(pool.reserved_in_use() == both - 20 * kMiB);
  pool.deallocate(small);
  CHECK(pool.reserved_in_use() == 0);
  pool.empty_cache();
  CHECK(pool.stats().reserved == 0);
}

TEST_CASE("pool: report is a readable table with the key rows", "[pool]") {
  HostPool pool;
  pool.set_limit(1536 * kKiB + 20 * kMiB);
  void* p = pool.allocate(1000);
  std::string report = pool.report();
  INFO(report);
  for (const char* key :
       {"[host pool]", "current", "peak", "allocated", "reserved", "requested", "cached",
        "fragmentation", "limit", "allocations", "cache hits", "frees", "segments"}) {
    CHECK(report.find(key) != std::string::npos);
  }
  CHECK(report.find("1.0 KiB") != std::string::npos);   // allocated
  CHECK(report.find("2.0 MiB") != std::string::npos);   // reserved
  CHECK(report.find("21.5 MiB") != std::string::npos);  // limit
  pool.deallocate(p);
  pool.set_limit(0);
  CHECK(pool.report().find("unlimited") != std::string::npos);
}

TEST_CASE("pool: foreign and null pointers", "[pool]") {
  HostPool pool;
  pool.deallocate(nullptr);
  int local = 0;
  CHECK_THROWS_AS(pool.deallocate(&local), kiln::ValueError);
  void* p = pool.allocate(10);
  pool.deallocate(p);
  CHECK_THROWS_AS(pool.deallocate(p), kiln::ValueError);  // double free
  CHECK(pool.stats().num_frees == 1);
}

TEST_CASE("pool: the process-wide pool is the host allocator", "[pool]") {
  CHECK(&kiln::host_allocator() == &kiln::memory::host_pool());
  kiln::Buffer buffer(4096, kiln::Device::cpu());
  CHECK(reinterpret_cast<uintptr_t>(buffer.data()) % 64 == 0);
  CHECK(kiln::memory::host_pool().stats().allocated >= 4096);
}

TEST_CASE("pool: concurrent allocate and free from 4 threads keep data intact", "[pool]") {
  HostPool pool;
  constexpr int kThreads = 4;
  constexpr int kIterations = 800;
  std::vector<int> failures(kThreads, 0);

  auto work = [&](int thread) {
    struct Live {
      void* ptr;
      size_t bytes;
      uint64_t seed;
    };
    std::mt19937 rng(100 + thread);
    std::vector<Live> live;
    auto release = [&](size_t index) {
      if (!verify(live[index].ptr, live[index].bytes, live[index].seed)) ++failures[thread];
      pool.deallocate(live[index].ptr);
      live[index] = live.back();
      live.pop_back();
    };
    for (int i = 0; i < kIterations; ++i) {
      uint32_t kind = rng() % 100;
      size_t bytes = kind < 80   ? rng() % (64 * kKiB)
                     : kind < 97 ? rng() % (256 * kKiB) + 1
                                 : rng() % (2 * kMiB) + kMiB + 1;
      uint64_t seed = rng();
      void* p = pool.allocate(bytes);
      if (reinterpret_cast<uintptr_t>(p) % 64 != 0) ++failures[thread];
      fill(p, bytes, seed);
      live.push_back({p, bytes, seed});
      if (live.size() > 24) release(rng() % live.size());
    }
    while (!live.empty()) release(live.size() - 1);
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (auto& t : threads) t.join();

  for (int t = 0; t < kThreads; ++t) CHECK(failures[t] == 0);
  auto s = pool.stats();
  CHECK(s.allocated == 0);
  CHECK(s.requested == 0);
  CHECK(s.num_allocs == uint64_t{kThreads} * kIterations);
  CHECK(s.num_frees == s.num_allocs);
  CHECK(s.cache_hits > s.num_allocs / 2);
  pool.empty_cache();
  CHECK(pool.stats().reserved == 0);
}

// ---- The same pool over other segment sources --------------------------------------------

namespace {

// A source with a fixed capacity that records what it hands out, standing in for device
// memory: the pool must free its cache and retry before giving up, and return everything.
class CountingSource final : public kiln::memory::SegmentSource {
 public:
  CountingSource(size_t capacity, size_t* in_use) : capacity_(capacity), in_use_(in_use) {}
  void* reserve(size_t bytes) override {
    if (*in_use_ + bytes > capacity_) return nullptr;
    *in_use_ += bytes;
    return std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  }
  void release(void* ptr, size_t bytes) noexcept override {
    *in_use_ -= bytes;
    std::free(ptr);
  }
  bool host_addressable() const override { return true; }
  const char* who() const override { return "the test device"; }

 private:
  size_t capacity_;
  size_t* in_use_;
};

}  // namespace

TEST_CASE("pool: any segment source, named in messages and the report", "[pool]") {
  size_t in_use = 0;
  {
    kiln::memory::CachingPool pool("test:0 pool",
                                   std::make_unique<CountingSource>(24 * kMiB, &in_use));
    void* a = pool.allocate(4 * kMiB);  // a shared 20 MiB segment
    CHECK(in_use == 20 * kMiB);
    pool.deallocate(a);
    // 22 MiB needs its own segment; the source has room only after the cache is freed.
    void* b = pool.allocate(22 * kMiB);
    CHECK(in_use == 22 * kMiB);
    CHECK(pool.stats().os_frees == 1);

    // try_allocate reports a refusal as nullptr and leaves the OOM counter alone.
    CHECK(pool.try_allocate(4 * kMiB) == nullptr);
    CHECK(pool.stats().num_ooms == 0);
    try {
      pool.allocate(4 * kMiB);
      FAIL("no OutOfMemoryError");
    } catch (const kiln::OutOfMemoryError& e) {
      std::string message = e.what();
      CHECK(message.rfind("[test:0 pool] cannot allocate 4.0 MiB", 0) == 0);
      CHECK(message.find("the test device refused") != std::string::npos);
      CHECK(message.find("[test:0 pool] memory report") != std::string::npos);
    }
    CHECK(pool.stats().num_ooms == 1);
    void* c = pool.allocate(1000);  // a 2 MiB small segment still fits
    CHECK(in_use == 24 * kMiB);
    pool.deallocate(c);
    pool.deallocate(b);
  }
  CHECK(in_use == 0);  // the destructor returned every segment
}

TEST_CASE("pool: memory sizes parse with decimal and binary units", "[pool]") {
  using kiln::memory::parse_memory_size;
  CHECK(parse_memory_size("4096") == 4096);
  CHECK(parse_memory_size("2GB") == 2000000000);
  CHECK(parse_memory_size("512MiB") == 512 * kMiB);
  CHECK(parse_memory_size("1.5GiB") == 1536 * kMiB);
  CHECK(parse_memory_size(" 64 kib ") == 64 * kKiB);
  CHECK(parse_memory_size("3mb") == 3000000);
  CHECK(parse_memory_size("7B") == 7);
  for (const char* bad : {"", "GB", "2XB", "1.2.3GB", "-5MB", "12 MB extra", "1e3"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_memory_size(bad, "KILN_DEVICE_MEMORY_LIMIT"), kiln::ValueError);
  }
  try {
    parse_memory_size("lots", "KILN_DEVICE_MEMORY_LIMIT");
  } catch (const kiln::ValueError& e) {
    CHECK(std::string(e.what()).find("KILN_DEVICE_MEMORY_LIMIT 'lots'") != std::string::npos);
  }
}

TEST_CASE("placement: eviction takes old and large buffers first, never pinned ones",
          "[placement]") {
  using kiln::memory::choose_evictions;
  using kiln::memory::ResidentBuffer;
  // bytes, last_use, pinned, has_host_copy
  std::vector<ResidentBuffer> resident = {
      {10 * kMiB, 90, false, false},  // 0: recent
      {10 * kMiB, 10, false, false},  // 1: old
      {40 * kMiB, 50, false, false},  // 2: large, middle-aged
      {100 * kMiB, 5, true, false},   // 3: oldest and largest, but in use
      {1 * kMiB, 1, false, false},    // 4: oldest, tiny
  };
  const uint64_t now = 100;
  // Scores (age+1) x MiB: 0 -> 110, 1 -> 910, 2 -> 2040, 4 -> 100.
  CHECK(choose_evictions(resident, 0, now).empty());
  CHECK(choose_evictions(resident, 5 * kMiB, now) == std::vector<size_t>{2});
  CHECK(choose_evictions(resident, 45 * kMiB, now) == std::vector<size_t>{2, 1});
  // Everything evictable, still short: all unpinned ones, best first.
  CHECK(choose_evictions(resident, 500 * kMiB, now) == std::vector<size_t>{2, 1, 0, 4});

  SECTION("a valid host copy makes a buffer cheaper to move out") {
    resident[1].has_host_copy = true;
    resident[1].last_use = 0;   // score 101 x 10 x 2 = 2020
    resident[2].last_use = 51;  // score 50 x 40 = 2000
    CHECK(choose_evictions(resident, 5 * kMiB, now) == std::vector<size_t>{1});
  }
  SECTION("a small early choice that a later one made unnecessary is dropped") {
    std::vector<ResidentBuffer> r = {
        {2 * kMiB, 0, false, false},    // score 202: chosen first
        {30 * kMiB, 95, false, false},  // score 180: chosen second, covers it alone
    };
    CHECK(choose_evictions(r, 20 * kMiB, now) == std::vector<size_t>{1});
  }
  SECTION("ties go to the older buffer") {
    // (100-59+1) x 4 = 168 = (100-80+1) x 8
    std::vector<ResidentBuffer> r = {{8 * kMiB, 80, false, false}, {4 * kMiB, 59, false, false}};
    CHECK(choose_evictions(r, kMiB, now) == std::vector<size_t>{1});
  }
  SECTION("every buffer pinned: nothing to move") {
    for (auto& r : resident) r.pinned = true;
    CHECK(choose_evictions(resident, kMiB, now).empty());
  }
}
