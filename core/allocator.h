#pragma once
// The seam between core and memory/: core allocates buffers through an Allocator and
// memory/ registers its caching pool here, so core depends on nothing else in kiln.
#include <cstddef>
#include <memory>

#include "device.h"

namespace kiln {

/// A source of raw, 64-byte aligned memory for one memory space.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns at least `bytes` bytes aligned to 64; zero bytes gives a valid unique pointer.
  /// Throws OutOfMemoryError when a limit or the machine's memory would be exceeded.
  virtual void* allocate(size_t bytes) = 0;
  /// Returns memory obtained from allocate().
  virtual void deallocate(void* ptr) = 0;
};

/// The allocator for host memory: memory/'s caching pool once registered, else malloc.
Allocator& host_allocator();
/// Installs the host allocator (memory/ does this at load time). Not for hot paths.
void set_host_allocator(Allocator* allocator);

/// Owned memory for one node's value. Freed back to its allocator on destruction.
class Buffer {
 public:
  /// Allocates `bytes` on `device` from its registered allocator.
  Buffer(size_t bytes, Device device);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  Allocator* allocator_;
};

}  // namespace kiln
