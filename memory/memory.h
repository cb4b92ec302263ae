#pragma once
// Everything memory/ offers, and the one report that covers every memory space.
#include <string>

#include "pools/budget.h"
#include "pools/caching_pool.h"
#include "pools/device_pools.h"
#include "pools/host_pool.h"
#include "pools/placement.h"
#include "reports/plan_report.h"
#include "reports/rank_bytes.h"
#include "reports/step_record.h"

namespace kiln::memory {

/// The reports of every memory space: the host pool, then (with a CUDA driver) the pinned
/// pool and each CUDA device's pool with its placement counters, or a line saying why there
/// are no CUDA devices; then the memory budget and the last step's plan figures, and the
/// training state this rank holds (rank_bytes_report(), when a dist holder is registered).
std::string report();

}  // namespace kiln::memory
