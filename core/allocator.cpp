#include "allocator.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>

#include "cuda_driver.h"
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
// One DeviceMemory per non-cpu device kind, indexed by Device::Kind.
std::atomic<DeviceMemory*> g_device_memory[2] = {nullptr, nullptr};

DeviceMemory& device_memory_for(Device device) {
  DeviceMemory* memory =
      g_device_memory[static_cast<size_t>(device.kind)].load(std::memory_order_acquire);
  if (memory == nullptr) {
    // memory/ registers at load time, so this is a build that left memory/ out.
    throw DeviceError("[allocate] no memory manager for device " + device.str() + " (" +
                      cuda::driver_status() + "); this build of kiln has no memory/ pools");
  }
  return *memory;
}

}  // namespace

Allocator& host_allocator() {
  Allocator* a = g_host_allocator.load(std::memory_order_acquire);
  return a != nullptr ? *a : g_malloc_allocator;
}

void set_host_allocator(Allocator* allocator) {
  g_host_allocator.store(allocator, std::memory_order_release);
}

void set_device_memory(Device::Kind kind, DeviceMemory* memory) {
  if (kind == Device::Kind::CPU) {
    throw ValueError("[set_device_memory] cpu memory comes from the host allocator");
  }
  g_device_memory[static_cast<size_t>(kind)].store(memory, std::memory_order_release);
}

Buffer::Buffer(size_t bytes, Device device)
    : data_(nullptr), bytes_(bytes), device_(device), allocator_(nullptr), device_memory_(nullptr) {
  if (device.kind == Device::Kind::CPU) {
    allocator_ = &host_allocator();
    data_ = allocator_->allocate(bytes);
  } else {
    device_memory_ = &device_memory_for(device);
    device_memory_->attach(*this);
  }
}

Buffer::Buffer(void* data, size_t bytes, Allocator& allocator)
    : data_(data),
      bytes_(bytes),
      device_(Device::cpu()),
      allocator_(&allocator),
      device_memory_(nullptr) {}

Buffer::~Buffer() {
  if (allocator_ != nullptr) {
    allocator_->deallocate(data_);
  } else {
    device_memory_->detach(*this);
  }
}

void* Buffer::data() const {
  if (allocator_ != nullptr) return data_;
  return device_memory_->acquire(*this, /*write=*/true, /*pin=*/false);
}

void* Buffer::host_data() const {
  if (allocator_ != nullptr) return data_;
  return device_memory_->host_copy(*this);
}

Placement Buffer::placement() const {
  if (allocator_ != nullptr) return Placement::Host;
  return device_memory_->placement(*this);
}

Buffer::Use::Use(const Buffer& buffer, bool write) : buffer_(&buffer), data_(nullptr) {
  if (buffer.allocator_ != nullptr) {
    data_ = buffer.data_;
  } else {
    data_ = buffer.device_memory_->acquire(buffer, write, /*pin=*/true);
  }
}

Buffer::Use::~Use() {
  if (buffer_ != nullptr && buffer_->device_memory_ != nullptr) {
    buffer_->device_memory_->unpin(*buffer_);
  }
}

Buffer::Use::Use(Use&& other) noexcept
    : buffer_(std::exchange(other.buffer_, nullptr)), data_(other.data_) {}

Buffer::Use& Buffer::Use::operator=(Use&& other) noexcept {
  if (this != &other) {
    if (buffer_ != nullptr && buffer_->device_memory_ != nullptr) {
      buffer_->device_memory_->unpin(*buffer_);
    }
    buffer_ = std::exchange(other.buffer_, nullptr);
    data_ = other.data_;
  }
  return *this;
}

}  // namespace kiln
