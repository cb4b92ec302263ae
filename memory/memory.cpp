#include "memory.h"

#include "../core/cuda_driver.h"

namespace kiln::memory {

std::string report() {
  std::string out = host_pool().report();
  const int devices = cuda::device_count();
  if (devices == 0) return out + "[cuda] no CUDA devices (" + cuda::driver_status() + ")\n";
  out += pinned_pool().report();
  for (int i = 0; i < devices; ++i) {
    // Every device is listed so the report has the same shape on every call; a device that
    // kiln has not used yet shows an empty pool.
    out += device_pool(i).report();
    out += placement_report(i);
  }
  return out;
}

}  // namespace kiln::memory
