#include "memory.h"

#include "../core/cuda_driver.h"

namespace kiln::memory {

namespace {

std::string plan_lines() {
  PlanSummary s = last_plan();
  const std::string budget = budget_description();
  std::string out = "[plan] budget " + budget;
  if (s.pool.empty()) return out + "; no step planned yet\n";
  // A fraction means different bytes on each device: say what it came to for this step.
  if (s.budget > 0 && budget != format_bytes(s.budget))
    out += " (" + format_bytes(s.budget) + " of the " + s.pool + ")";
  out += "; last step on the " + s.pool + ": peak " + format_bytes(s.measured_peak) + " (planned " +
         format_bytes(s.planned_peak) + ", lower bound " + format_bytes(s.lower_bound) + "), " +
         std::to_string(s.recomputes) + " rebuilds, " + std::to_string(s.in_place) +
         " kernels in place\n";
  return out;
}

}  // namespace

std::string report() {
  std::string out = host_pool().report();
  const int devices = cuda::device_count();
  if (devices == 0) {
    out += "[cuda] no CUDA devices (" + cuda::driver_status() + ")\n";
  } else {
    out += pinned_pool().report();
    for (int i = 0; i < devices; ++i) {
      // Every device is listed so the report has the same shape on every call; a device
      // that kiln has not used yet shows an empty pool.
      out += device_pool(i).report();
      out += placement_report(i);
    }
  }
  return out + plan_lines() + rank_bytes_report();
}

}  // namespace kiln::memory
