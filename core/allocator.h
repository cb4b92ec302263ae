#pragma once
// The seam between core and memory/: core allocates buffers through interfaces that memory/
// implements and registers at load time, so core depends on nothing else in kiln.
// Host buffers come from an Allocator; buffers of a device kind (CUDA) from that kind's
// DeviceMemory, which also moves them to host memory and back under a device memory limit.
#include <cstddef>
#include <cstdint>
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

/// Where a device buffer's data is: on the device, in (pinned) host memory because it was
/// moved out to make room, or in both with the same contents.
enum class Placement : uint8_t { Device, Host, Both };

class Buffer;

/// Places the buffers of one device kind: gives them device memory (moving others out when
/// a limit is reached), moves them back on use, and frees them. memory/ registers the CUDA
/// one. Buffer is its only caller; all calls for one device may come from several threads.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  /// Gives a new buffer its device memory; throws DeviceError or OutOfMemoryError.
  virtual void attach(const Buffer& buffer) = 0;
  /// Frees every copy of a buffer that is being destroyed.
  virtual void detach(const Buffer& buffer) noexcept = 0;
  /// Makes the data resident on the device and returns the device pointer. `write` drops
  /// the host copy (it would go stale); `pin` adds one to the pin count (Buffer::Use).
  virtual void* acquire(const Buffer& buffer, bool write, bool pin) = 0;
  /// Takes one off the pin count.
  virtual void unpin(const Buffer& buffer) noexcept = 0;
  /// Returns a host copy of the data, making one if there is none (placement Both).
  virtual void* host_copy(const Buffer& buffer) = 0;
  /// Where the buffer's data is now.
  virtual Placement placement(const Buffer& buffer) const = 0;
};

/// Installs the DeviceMemory for a device kind (memory/ does this for CUDA at load time).
void set_device_memory(Device::Kind kind, DeviceMemory* memory);

/// Owned memory for one node's value. Freed back to its allocator on destruction.
///
/// A CUDA buffer's data may be moved to host memory when the device memory limit is reached;
/// data() brings it back. While a Buffer::Use of it lives, it is never moved.
class Buffer {
 public:
  /// Allocates `bytes` on `device` from its registered memory. For a CUDA device without a
  /// driver this throws the driver's DeviceError.
  Buffer(size_t bytes, Device device);
  /// Adopts `bytes` of host memory that `allocator` handed out (a part of a planned arena);
  /// the buffer returns it to `allocator` on destruction.
  Buffer(void* data, size_t bytes, Allocator& allocator);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// The data in the buffer's own space: host memory for cpu, a device pointer for CUDA
  /// (moved back to the device first if it was moved out). For CUDA this assumes the caller
  /// may write, so a host copy is dropped; read through a read-only Use to keep it.
  void* data() const;
  /// The data in host memory: for cpu the same as data(); for CUDA a host copy kept with the
  /// buffer (made by a synchronous copy if there is none yet, and valid until data()).
  void* host_data() const;
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  /// Where the data is now: Host for cpu buffers.
  Placement placement() const;

  /// Marks a buffer as needed by the running kernel: resident on its device and never moved
  /// out while the Use lives. Movable, so that a kernel can keep a vector of them.
  class Use {
   public:
    /// Pins `buffer`; `write` false keeps its host copy (for kernel inputs).
    explicit Use(const Buffer& buffer, bool write = true);
    ~Use();
    Use(Use&& other) noexcept;
    Use& operator=(Use&& other) noexcept;
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    /// The device pointer (host pointer for cpu), valid while the Use lives.
    void* data() const { return data_; }

   private:
    const Buffer* buffer_;
    void* data_;
  };

  /// State that the buffer's DeviceMemory keeps and changes under its own lock; read by
  /// nothing else. Unused for cpu buffers.
  struct Residency {
    void* device = nullptr;  ///< Device copy, or nullptr when moved out.
    void* host = nullptr;    ///< Host copy, or nullptr.
    uint64_t last_use = 0;   ///< The DeviceMemory's clock at the last acquire().
    int pins = 0;            ///< Live Uses; > 0 means it must stay on the device.
  };
  /// The residency record, for the buffer's DeviceMemory only.
  Residency& residency() const { return residency_; }

 private:
  void* data_;  // cpu: the memory; device kinds: unused (see residency_)
  size_t bytes_;
  Device device_;
  Allocator* allocator_;         // cpu buffers
  DeviceMemory* device_memory_;  // device buffers
  mutable Residency residency_;
};

}  // namespace kiln
