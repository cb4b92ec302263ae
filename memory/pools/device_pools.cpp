#include "device_pools.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../../core/cuda_driver.h"
#include "../../core/error.h"
#include "../../core/settings.h"

namespace kiln::memory {
namespace {

class DeviceSource final : public SegmentSource {
 public:
  explicit DeviceSource(int device) : device_(device) {}
  void* reserve(size_t bytes) override {
    // A full device is the pool's business (free the cache, or let placement make room);
    // any other driver error is not.
    try {
      return cuda::device_malloc(device_, bytes);
    } catch (const OutOfMemoryError&) {
      return nullptr;
    }
  }
  // Blocks of the segment may still be read by kernels queued on kiln's stream (buffers are
  // freed right after their last launch); the driver does not promise that cuMemFree waits.
  void release(void* ptr, size_t) noexcept override {
    try {
      cuda::synchronize(device_);
    } catch (const Error&) {
    }
    cuda::device_free(device_, ptr);
  }
  bool host_addressable() const override { return false; }
  const char* who() const override { return "the CUDA driver"; }

 private:
  int device_;
};

class PinnedSource final : public SegmentSource {
 public:
  void* reserve(size_t bytes) override {
    try {
      return cuda::pinned_malloc(bytes);
    } catch (const OutOfMemoryError&) {
      return nullptr;
    }
  }
  void release(void* ptr, size_t) noexcept override { cuda::pinned_free(ptr); }
  bool host_addressable() const override { return true; }
  const char* who() const override { return "the CUDA driver (pinned host memory)"; }
};

// One slot per device, filled on first use. Leaked like the host pool: buffers freed during
// static destruction must still find their pool.
struct DevicePools {
  std::mutex mutex;
  std::vector<CachingPool*> pools;
};

DevicePools& device_pools() {
  static DevicePools* const pools = [] {
    auto* p = new DevicePools();
    p->pools.assign(static_cast<size_t>(cuda::device_count()), nullptr);
    return p;
  }();
  return *pools;
}

}  // namespace

CachingPool& device_pool(int device) {
  cuda::check_device(device);
  DevicePools& all = device_pools();
  std::lock_guard lock(all.mutex);
  CachingPool*& pool = all.pools[static_cast<size_t>(device)];
  if (pool == nullptr) {
    size_t limit = 0;
    if (std::optional<std::string> text = settings::text("KILN_DEVICE_MEMORY_LIMIT")) {
      try {
        limit = parse_memory_size(*text, "KILN_DEVICE_MEMORY_LIMIT");
      } catch (const ValueError&) {
        settings::reject("KILN_DEVICE_MEMORY_LIMIT", *text);
      }
    }
    pool = new CachingPool("cuda:" + std::to_string(device) + " pool",
                           std::make_unique<DeviceSource>(device));
    pool->set_limit(limit);
  }
  return *pool;
}

CachingPool& pinned_pool() {
  if (cuda::device_count() == 0) cuda::check_device(0);  // throws the driver's error
  static CachingPool* const pool = new CachingPool("pinned pool", std::make_unique<PinnedSource>());
  return *pool;
}

size_t parse_memory_size(const std::string& text, const std::string& what) {
  auto fail = [&]() -> size_t {
    throw ValueError("[memory] " + what + " '" + text +
                     "' is not a memory size; expected bytes or a number with a unit, e.g. "
                     "4096, 512MiB, 1.5GiB, 2GB");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t number_begin = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  if (i == number_begin) return fail();
  const std::string number = text.substr(number_begin, i - number_begin);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return fail();
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) {
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i++])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return fail();

  static const struct {
    const char* name;
    double scale;
  } kUnits[] = {{"", 1.0},
                {"b", 1.0},
                {"kb", 1e3},
                {"mb", 1e6},
                {"gb", 1e9},
                {"tb", 1e12},
                {"kib", 1024.0},
                {"mib", 1048576.0},
                {"gib", 1073741824.0},
                {"tib", 1099511627776.0}};
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      const double bytes = value * u.scale;
      if (!std::isfinite(bytes) || bytes >= 9.0e18) return fail();
      return static_cast<size_t>(std::llround(bytes));
    }
  }
  return fail();
}

}  // namespace kiln::memory
