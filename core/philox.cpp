#include "core/philox.h"

#include "core/settings.h"

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

Generator::Draw Generator::draw(uint64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Draw d{seed_, offset_};
  offset_ += n;
  return d;
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

namespace {

// A malformed KILN_SEED would otherwise give silently unseeded runs, so it throws (a
// ValueError from the registry); the generator then stays unbuilt and every call that needs
// it raises again.
uint64_t seed_from_environment() { return settings::unsigned64("KILN_SEED").value_or(0); }

}  // namespace

Generator& default_generator() {
  // Function-local static: initialised once, thread-safely, on first use, so reading
  // KILN_SEED does not depend on static initialisation order across translation units.
  static Generator generator(seed_from_environment());
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kiln
