#pragma once
// The caching pools of CUDA memory: one per device (cuMemAlloc) and one of pinned host
// memory (cuMemHostAlloc), both the same CachingPool as the host pool. Device buffers take
// their memory from here through memory/pools/placement.h, which also moves them to the pinned
// pool when a device memory limit is reached.
#include <string>

#include "caching_pool.h"

namespace kiln::memory {

/// The pool of CUDA device `device`'s memory ("cuda:0 pool"), made on first use with the
/// limit from KILN_DEVICE_MEMORY_LIMIT. Throws DeviceError without a driver or device.
CachingPool& device_pool(int device);
/// The pool of pinned (page-locked) host memory ("pinned pool") used for swapped-out
/// buffers and host copies. Throws DeviceError without a CUDA driver.
CachingPool& pinned_pool();

/// Parses a memory size: plain bytes ("4096"), or a number with a unit, decimal (KB, MB, GB,
/// TB: powers of 1000) or binary (KiB, MiB, GiB, TiB); "1.5GiB", "512 MiB", "2gb" work.
/// Throws ValueError naming `what` (e.g. the variable) for anything else.
size_t parse_memory_size(const std::string& text, const std::string& what = "memory size");

}  // namespace kiln::memory
