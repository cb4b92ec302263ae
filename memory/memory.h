#pragma once
// Everything memory/ offers, and the one report that covers every memory space.
#include <string>

#include "caching_pool.h"
#include "device_pools.h"
#include "host_pool.h"
#include "placement.h"

namespace kiln::memory {

/// The reports of every memory space: the host pool, then (with a CUDA driver) the pinned
/// pool and each CUDA device's pool with its placement counters, or a line saying why there
/// are no CUDA devices.
std::string report();

}  // namespace kiln::memory
