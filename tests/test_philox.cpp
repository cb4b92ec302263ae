// Philox 4x32-10: known-answer vectors, distribution sanity, determinism and the
// thread-safety of offset reservation.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "core/philox.h"

using kiln::philox4x32_10;
using Block = std::array<uint32_t, 4>;

namespace {

struct Moments {
  double mean;
  double variance;
};

template <typename Sample>
Moments moments(int n, Sample sample) {
  double sum = 0.0, sum_sq = 0.0;
  for (int i = 0; i < n; ++i) {
    const double x = sample(static_cast<uint64_t>(i));
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / n;
  return {mean, sum_sq / n - mean * mean};
}

}  // namespace

TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors", "[rng]") {
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
        Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                      {0xffffffffu, 0xffffffffu}) ==
        Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                      {0xa4093822u, 0x299f31d0u}) ==
        Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
  // Usable in constant expressions, so kernels and tables can be checked at compile time.
  static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
}

TEST_CASE("philox_block packs index, offset and seed into counter and key", "[rng]") {
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t offset = 0x0370734413198a2eull;
  const uint64_t index = 0x85a308d3243f6a88ull;
  CHECK(kiln::philox_block(seed, offset, index) ==
        Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
  CHECK(kiln::philox_block(0, 0, 0) == philox4x32_10({0, 0, 0, 0}, {0, 0}));
}

TEST_CASE("uniform values lie in the half-open unit interval", "[rng]") {
  for (uint64_t seed : {0ull, 1ull, 0xffffffffffffffffull}) {
    for (uint64_t i = 0; i < 20000; ++i) {
      const float f = kiln::uniform_float(seed, 7, i);
      const double d = kiln::uniform_double(seed, 7, i);
      REQUIRE(f >= 0.0f);
      REQUIRE(f < 1.0f);
      REQUIRE(d >= 0.0);
      REQUIRE(d < 1.0);
    }
  }
}

TEST_CASE("uniform conversions use the documented bits", "[rng]") {
  const Block x = kiln::philox_block(3, 5, 11);
  // Floats take one word each, four consecutive elements from one block: element 11 is
  // word 3 of block 2, elements 8..11 are block 2's words in order.
  const Block b2 = kiln::philox_block(3, 5, 2);
  CHECK(kiln::uniform_float(3, 5, 11) == static_cast<float>(b2[3] >> 8) / 16777216.0f);
  for (uint64_t w = 0; w < 4; ++w) CHECK(kiln::philox_word(3, 5, 8 + w) == b2[w]);
  CHECK(kiln::philox_word(3, 5, 12) == kiln::philox_block(3, 5, 3)[0]);
  // Doubles take a block each.
  const uint64_t top53 = ((static_cast<uint64_t>(x[0]) << 32) | x[1]) >> 11;
  CHECK(kiln::uniform_double(3, 5, 11) == std::ldexp(static_cast<double>(top53), -53));
}

TEST_CASE("uniform mean and variance", "[rng]") {
  const int n = 100000;
  const Moments f = moments(n, [](uint64_t i) { return kiln::uniform_float(42, 0, i); });
  CHECK(f.mean == Approx(0.5).margin(0.01));
  CHECK(f.variance == Approx(1.0 / 12.0).margin(0.01));
  const Moments d = moments(n, [](uint64_t i) { return kiln::uniform_double(42, 1, i); });
  CHECK(d.mean == Approx(0.5).margin(0.01));
  CHECK(d.variance == Approx(1.0 / 12.0).margin(0.01));
}

TEST_CASE("normal mean and variance", "[rng]") {
  const int n = 100000;
  const Moments z = moments(n, [](uint64_t i) { return kiln::normal_double(42, 0, i); });
  CHECK(z.mean == Approx(0.0).margin(0.02));
  CHECK(z.variance == Approx(1.0).margin(0.03));
  for (uint64_t i = 0; i < 1000; ++i) REQUIRE(std::isfinite(kiln::normal_double(9, 9, i)));
}

TEST_CASE("the same (seed, offset, index) gives the same bits", "[rng]") {
  for (uint64_t i = 0; i < 1000; ++i) {
    REQUIRE(kiln::philox_block(123, 456, i) == kiln::philox_block(123, 456, i));
    REQUIRE(kiln::uniform_double(123, 456, i) == kiln::uniform_double(123, 456, i));
    REQUIRE(kiln::normal_double(123, 456, i) == kiln::normal_double(123, 456, i));
  }
}

TEST_CASE("distinct offsets, seeds and indices give different streams", "[rng]") {
  const int n = 1000;
  int same_offset = 0, same_seed = 0, same_index = 0;
  for (uint64_t i = 0; i < n; ++i) {
    same_offset += kiln::philox_block(1, 0, i) == kiln::philox_block(1, 1, i);
    same_seed += kiln::philox_block(1, 0, i) == kiln::philox_block(2, 0, i);
    same_index += kiln::philox_block(1, 0, i) == kiln::philox_block(1, 0, i + 1);
  }
  CHECK(same_offset == 0);
  CHECK(same_seed == 0);
  CHECK(same_index == 0);
  // Offsets only in the high word must still separate streams.
  CHECK(kiln::philox_block(1, uint64_t{1} << 32, 0) != kiln::philox_block(1, 0, 0));
  CHECK(kiln::philox_block(uint64_t{1} << 32, 0, 0) != kiln::philox_block(0, 0, 0));
}

TEST_CASE("Generator.reserve advances the offset", "[rng]") {
  kiln::Generator gen(77);
  CHECK(gen.seed() == 77);
  CHECK(gen.offset() == 0);
  CHECK(gen.reserve(10) == 0);
  CHECK(gen.reserve(5) == 10);
  CHECK(gen.reserve(0) == 15);
  CHECK(gen.offset() == 15);
  gen.manual_seed(5);
  CHECK(gen.seed() == 5);
  CHECK(gen.offset() == 0);
  CHECK(gen.reserve(3) == 0);
  CHECK(kiln::Generator().seed() == 0);
}

TEST_CASE("Generator.reserve hands out disjoint ranges across threads", "[rng]") {
  kiln::Generator gen(1);
  const int threads = 8, per_thread = 2000;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&gen, &ranges, t] {
      for (int k = 0; k < per_thread; ++k) {
        const uint64_t n = 1 + static_cast<uint64_t>((t * 31 + k) % 17);
        ranges[t].emplace_back(gen.reserve(n), n);
      }
    });
  }
  for (auto& th : pool) th.join();

  std::vector<std::pair<uint64_t, uint64_t>> all;
  for (const auto& r : ranges) all.insert(all.end(), r.begin(), r.end());
  std::sort(all.begin(), all.end());
  REQUIRE(all.size() == static_cast<size_t>(threads * per_thread));
  // Sorted by start, consecutive ranges must tile [0, total) with no gap and no overlap.
  uint64_t expected_start = 0;
  for (const auto& [start, n] : all) {
    REQUIRE(start == expected_start);
    expected_start += n;
  }
  CHECK(gen.offset() == expected_start);
}

TEST_CASE("manual_seed reseeds the default generator", "[rng]") {
  kiln::Generator& gen = kiln::default_generator();
  const uint64_t saved_seed = gen.seed();
  kiln::manual_seed(1234);
  CHECK(gen.seed() == 1234);
  CHECK(gen.offset() == 0);
  CHECK(gen.reserve(8) == 0);
  CHECK(&kiln::default_generator() == &gen);
  kiln::manual_seed(saved_seed);
}
