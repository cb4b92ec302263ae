#pragma once
// Counter-based random numbers: Philox 4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel
// random numbers: as easy as 1, 2, 3", SC 2011). A random value is a pure function of
// (seed, offset, element index), so a random op fuses like any elementwise op, the CPU and
// CUDA kernels produce the same bits, and a recomputed dropout mask equals the original.
//
// The per-element functions are header-only and free of library state so that the
// reference evaluator and generated kernels can call them directly; the generated CUDA
// source must keep the same arithmetic (only 32x32->64 multiplies, xor and adds).
#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>

namespace kiln {

namespace philox_detail {
inline constexpr uint32_t kM0 = 0xD2511F53u;
inline constexpr uint32_t kM1 = 0xCD9E8D57u;
inline constexpr uint32_t kW0 = 0x9E3779B9u;                      // golden ratio
inline constexpr uint32_t kW1 = 0xBB67AE85u;                      // sqrt(3) - 1
inline constexpr float kTwoPow24Inv = 1.0f / 16777216.0f;         // 2^-24
inline constexpr double kTwoPow53Inv = 1.0 / 9007199254740992.0;  // 2^-53
inline constexpr double kTwoPi = 6.283185307179586476925286766559;

/// Top 53 bits of the 64-bit word (hi << 32 | lo), as an integer in [0, 2^53).
constexpr uint64_t top53(uint32_t hi, uint32_t lo) {
  return ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
}
}  // namespace philox_detail

/// Philox 4x32 with 10 rounds: maps a 128-bit counter and a 64-bit key to 128 random bits.
constexpr std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                                std::array<uint32_t, 2> key) {
  using namespace philox_detail;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // Weyl key schedule: the key is bumped before every round but the first.
      key[0] += kW0;
      key[1] += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * counter[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * counter[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
  }
  return counter;
}

/// The 128 random bits for element `index` of the draw at `offset` under `seed`
/// (counter = {lo(index), hi(index), lo(offset), hi(offset)}, key = {lo(seed), hi(seed)}).
constexpr std::array<uint32_t, 4> philox_block(uint64_t seed, uint64_t offset, uint64_t index) {
  return philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                        static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

/// The 32 random bits of element `index` of a draw that takes at most 32 bits per element
/// (float32, float16, bfloat16): word index % 4 of the block of index / 4. One Philox call
/// serves four consecutive elements, so a generated loop makes a dropout mask with a
/// quarter of the rounds (jit/cpp_prelude.inc, philox_words).
constexpr uint32_t philox_word(uint64_t seed, uint64_t offset, uint64_t index) {
  return philox_block(seed, offset, index >> 2)[index & 3];
}

/// Uniform float in [0, 1) with 24 random bits: (philox_word >> 8) * 2^-24.
inline float uniform_float(uint64_t seed, uint64_t offset, uint64_t index) {
  // Exact in float: a 24-bit integer times a power of two; the largest value is 1 - 2^-24.
  return static_cast<float>(philox_word(seed, offset, index) >> 8) * philox_detail::kTwoPow24Inv;
}

/// Uniform double in [0, 1) with 53 random bits: ((x0 << 32 | x1) >> 11) * 2^-53.
inline double uniform_double(uint64_t seed, uint64_t offset, uint64_t index) {
  const auto x = philox_block(seed, offset, index);
  return static_cast<double>(philox_detail::top53(x[0], x[1])) * philox_detail::kTwoPow53Inv;
}

/// Standard normal double by Box-Muller: u1 in (0, 1] from (x0, x1), u2 in [0, 1) from (x2, x3),
/// z = sqrt(-2 ln u1) * cos(2 pi u2). Finite for every input since u1 > 0.
inline double normal_double(uint64_t seed, uint64_t offset, uint64_t index) {
  using namespace philox_detail;
  const auto x = philox_block(seed, offset, index);
  const double u1 = static_cast<double>(top53(x[0], x[1]) + 1) * kTwoPow53Inv;
  const double u2 = static_cast<double>(top53(x[2], x[3])) * kTwoPow53Inv;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

/// A seed plus a running offset. Each random op reserves a range of offsets at build time,
/// so its values do not depend on when, where or how often it is evaluated.
class Generator {
 public:
  /// Creates a generator with the given seed and offset 0.
  explicit Generator(uint64_t seed = 0);
  /// The current seed.
  uint64_t seed() const;
  /// The next offset that reserve() will hand out.
  uint64_t offset() const;
  /// Returns the current offset and advances it by n (thread-safe).
  uint64_t reserve(uint64_t n);
  /// The seed and a reserved range of n values, read together (thread-safe): a
  /// manual_seed on another thread can never pair the old seed with the new offsets.
  struct Draw {
    uint64_t seed, offset;
  };
  Draw draw(uint64_t n);
  /// Sets the seed and resets the offset to 0, restarting the stream.
  void manual_seed(uint64_t seed);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The process-wide generator; its initial seed is KILN_SEED from the environment, else 0.
Generator& default_generator();

/// Reseeds the process-wide generator: default_generator().manual_seed(seed).
void manual_seed(uint64_t seed);

}  // namespace kiln
