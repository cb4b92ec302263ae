#include "core/philox.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace kiln {

// Philox is a function of the counter only; check at compile time that the header
// implementation reproduces the Random123 known-answer vector, so a change that breaks
// cross-device bit equality cannot even build.
static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
              std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});

Generator::Generator(uint64_t seed) : seed_(seed) {}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offset_;
}

// The offset is the high half of the Philox counter and the element index the low half,
// so ranges reserved here never overlap as long as fewer than 2^64 draws are made per seed;
// wrapping past 2^64 would reuse streams, which no realistic program reaches.
uint64_t Generator::reserve(uint64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t start = offset_;
  offset_ += n;
  return start;
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

namespace {

// A malformed KILN_SEED is a user error that would otherwise silently give unseeded
// (seed 0) runs, so it throws rather than falling back.
uint64_t seed_from_environment() {
  const char* text = std::getenv("KILN_SEED");
  if (text == nullptr || *text == '\0') return 0;
  const std::string value(text);
  errno = 0;
  char* end = nullptr;
  // Decimal or 0x-hex; base 0 would read a leading zero as octal, which surprises.
  const bool hex = value.size() > 2 && value[0] == '0' && (value[1] == 'x' || value[1] == 'X');
  const unsigned long long parsed = std::strtoull(value.c_str(), &end, hex ? 16 : 10);
  if (value.find('-') != std::string::npos || errno == ERANGE || end == value.c_str() ||
      *end != '\0') {
    throw Error("[manual_seed] KILN_SEED='" + value +
                "' is not an unsigned 64-bit integer (expected e.g. KILN_SEED=42 or 0x2a)");
  }
  return static_cast<uint64_t>(parsed);
}

}  // namespace

Generator& default_generator() {
  // Function-local static: initialised once, thread-safely, on first use, so reading
  // KILN_SEED does not depend on static initialisation order across translation units.
  static Generator generator(seed_from_environment());
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kiln
