#pragma once
// A stable 128-bit content hash (MurmurHash3, x64 128-bit variant). The value depends only
// on the bytes and the seed — never on the platform, process or build — so it can name
// files that several processes and machines share (the kernel cache keys its entries with
// it) and check that bytes read back are the bytes written. It is not cryptographic: it
// detects corruption and accidental collisions, not deliberate forgery.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::jit {

/// A 128-bit hash value; `lo` holds the first 8 bytes of the canonical little-endian form.
struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128&) const = default;
  /// 32 lowercase hex digits: `lo` then `hi`, each as a big-endian 16-digit number.
  std::string hex() const;
};

/// Hashes `size` bytes at `data` with `seed`.
Hash128 hash128(const void* data, size_t size, uint64_t seed = 0);
inline Hash128 hash128(std::string_view bytes, uint64_t seed = 0) {
  return hash128(bytes.data(), bytes.size(), seed);
}

/// Builds the input of a hash from several fields without ambiguity: each field is written
/// with its length, so ("ab","c") and ("a","bc") give different hashes.
class HashInput {
 public:
  HashInput& add(std::string_view field);
  HashInput& add(uint64_t value);
  Hash128 finish(uint64_t seed = 0) const { return hash128(bytes_, seed); }

 private:
  std::string bytes_;
};

}  // namespace kiln::jit
