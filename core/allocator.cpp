#include "allocator.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "error.h"

namespace kiln {
namespace {

// Used until memory/ registers its pool, and by builds that leave the pool out.
class MallocAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      throw OutOfMemoryError("[host] could not allocate " + std::to_string(bytes) + " bytes");
    }
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
};

MallocAllocator g_malloc_allocator;
std::atomic<Allocator*> g_host_allocator{nullptr};

Allocator& allocator_for(Device device) {
  if (device.kind != Device::Kind::CPU) {
    throw DeviceError("[allocate] no allocator for device " + device.str() +
                      "; this build of kiln executes on cpu only");
  }
  return host_allocator();
}

}  // namespace

Allocator& host_allocator() {
  Allocator* a = g_host_allocator.load(std::memory_order_acquire);
  return a != nullptr ? *a : g_malloc_allocator;
}

void set_host_allocator(Allocator* allocator) {
  g_host_allocator.store(allocator, std::memory_order_release);
}

Buffer::Buffer(size_t bytes, Device device)
    : data_(nullptr), bytes_(bytes), device_(device), allocator_(&allocator_for(device)) {
  data_ = allocator_->allocate(bytes);
}

Buffer::~Buffer() { allocator_->deallocate(data_); }

}  // namespace kiln
