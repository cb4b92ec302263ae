#pragma once
// The caching pool for host memory (memory/pools/caching_pool.h says how blocks are served), and
// the process-wide instance that core allocates every cpu buffer from.
#include "caching_pool.h"

namespace kiln::memory {

/// A CachingPool over aligned_alloc, named "host pool".
class HostPool final : public CachingPool {
 public:
  HostPool();
};

/// The process-wide host pool; kiln registers it as the host allocator at load time.
/// It is never destroyed, so buffers freed during static destruction stay valid to free.
HostPool& host_pool();

}  // namespace kiln::memory
