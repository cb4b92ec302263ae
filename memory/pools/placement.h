#pragma once
// Placement of CUDA buffers: each buffer's data is on its device, in pinned host memory, or
// in both. Device memory comes from device_pool(i); when an allocation would exceed the
// device's memory limit (or the device is full), the least valuable buffers that no running
// kernel uses are moved to pinned host memory and brought back on their next use.
//
// The policy (which buffers to move out) is a pure function so that it is tested on machines
// without a GPU; the moving itself goes through core/cuda_driver.h.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::memory {

/// A resident device buffer as the eviction policy sees it.
struct ResidentBuffer {
  size_t bytes = 0;            ///< Device memory it holds.
  uint64_t last_use = 0;       ///< Clock value of its last use (higher is more recent).
  bool pinned = false;         ///< In use by the running kernel: never chosen.
  bool has_host_copy = false;  ///< Moving it out needs no copy (placement Both).
};

/// Chooses buffers to move out so that at least `needed` bytes are freed. Unpinned buffers
/// are taken in order of decreasing score (now - last_use + 1) * bytes, so that buffers
/// long unused and large go first (ties: older, then lower index); a buffer with a valid
/// host copy scores double, since moving it out costs no copy. Then buffers chosen first
/// that later choices made unnecessary are dropped again, so little more than `needed` is
/// moved. Returns indices into `resident`, in the order to move them; frees less than
/// `needed` only when every unpinned buffer is chosen.
std::vector<size_t> choose_evictions(const std::vector<ResidentBuffer>& resident, size_t needed,
                                     uint64_t now);

/// Counters of one device's placement. Sizes are in bytes.
struct PlacementStats {
  size_t device_bytes = 0;   ///< Bytes of buffers resident on the device.
  size_t host_bytes = 0;     ///< Bytes of buffers held in pinned host memory (moved out or copies).
  uint64_t buffers = 0;      ///< Live buffers of the device.
  uint64_t evictions = 0;    ///< Buffers moved out to host memory.
  uint64_t restores = 0;     ///< Buffers brought back to the device.
  size_t evicted_bytes = 0;  ///< Total bytes moved out.
  size_t restored_bytes = 0;  ///< Total bytes brought back.
};

/// Caps CUDA device `device`'s pool (reserved bytes; 0: unlimited). Later allocations over
/// it move buffers out first. Overrides KILN_DEVICE_MEMORY_LIMIT. Throws DeviceError.
void set_device_memory_limit(int device, size_t bytes);
/// The current cap of `device` (0: unlimited).
size_t device_memory_limit(int device);
/// A snapshot of `device`'s placement counters. Throws DeviceError.
PlacementStats placement_stats(int device);
/// The placement counters as table rows for the memory report.
std::string placement_report(int device);

}  // namespace kiln::memory
