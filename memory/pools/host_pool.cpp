#include "host_pool.h"

#include <cstdlib>

namespace kiln::memory {
namespace {

class HostSource final : public SegmentSource {
 public:
  void* reserve(size_t bytes) override { return std::aligned_alloc(64, bytes); }
  void release(void* ptr, size_t) noexcept override { std::free(ptr); }
  bool host_addressable() const override { return true; }
  const char* who() const override { return "the OS"; }
};

}  // namespace

HostPool::HostPool() : CachingPool("host pool", std::make_unique<HostSource>()) {}

HostPool& host_pool() {
  // Leaked on purpose: buffers owned by other static objects may be freed after this
  // translation unit's statics are destroyed, and must still find a live pool.
  static HostPool* const pool = new HostPool();
  return *pool;
}

namespace {
// The library is shared, so this runs when it is loaded, before any tensor is made.
[[maybe_unused]] const bool kRegistered = [] {
  set_host_allocator(&host_pool());
  return true;
}();
}  // namespace

}  // namespace kiln::memory
