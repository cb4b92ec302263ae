// MurmurHash3_x64_128 (Austin Appleby's public-domain algorithm), written out here so that
// kiln's cache keys do not depend on a third-party library's version. Blocks are read as
// little-endian explicitly, so the result is the same on every host.
#include "jit/hash.h"

#include <cstdio>

namespace kiln::jit {
namespace {

constexpr uint64_t kC1 = 0x87c37b91114253d5ULL;
constexpr uint64_t kC2 = 0x4cf5ad432745937fULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline uint64_t fmix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

Hash128 hash128(const void* data, size_t size, uint64_t seed) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  const size_t blocks = size / 16;
  uint64_t h1 = seed, h2 = seed;

  for (size_t b = 0; b < blocks; ++b) {
    uint64_t k1 = load_le64(bytes + 16 * b);
    uint64_t k2 = load_le64(bytes + 16 * b + 8);
    k1 *= kC1; k1 = rotl(k1, 31); k1 *= kC2; h1 ^= k1;
    h1 = rotl(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
    k2 *= kC2; k2 = rotl(k2, 33); k2 *= kC1; h2 ^= k2;
    h2 = rotl(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
  }

  const unsigned char* tail = bytes + 16 * blocks;
  const size_t rest = size & 15;
  uint64_t k1 = 0, k2 = 0;
  for (size_t i = rest; i > 8; --i) k2 ^= uint64_t(tail[i - 1]) << (8 * (i - 9));
  if (rest > 8) {
    k2 *= kC2; k2 = rotl(k2, 33); k2 *= kC1; h2 ^= k2;
  }
  for (size_t i = rest < 8 ? rest : 8; i > 0; --i) k1 ^= uint64_t(tail[i - 1]) << (8 * (i - 1));
  if (rest > 0) {
    k1 *= kC1; k1 = rotl(k1, 31); k1 *= kC2; h1 ^= k1;
  }

  h1 ^= size; h2 ^= size;
  h1 += h2; h2 += h1;
  h1 = fmix(h1); h2 = fmix(h2);
  h1 += h2; h2 += h1;
  return {h1, h2};
}

std::string Hash128::hex() const {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(lo),
                static_cast<unsigned long long>(hi));
  return text;
}

HashInput& HashInput::add(std::string_view field) {
  add(static_cast<uint64_t>(field.size()));
  bytes_.append(field);
  return *this;
}

HashInput& HashInput::add(uint64_t value) {
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return *this;
}

}  // namespace kiln::jit
