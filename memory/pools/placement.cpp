#include "placement.h"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include "../../core/allocator.h"
#include "../../core/cuda_driver.h"
#include "../../core/error.h"
#include "device_pools.h"

namespace kiln::memory {

std::vector<size_t> choose_evictions(const std::vector<ResidentBuffer>& resident, size_t needed,
                                     uint64_t now) {
  std::vector<size_t> order;
  if (needed == 0) return order;
  for (size_t i = 0; i < resident.size(); ++i) {
    if (!resident[i].pinned) order.push_back(i);
  }
  auto score = [&](size_t i) {
    const ResidentBuffer& r = resident[i];
    const double age = static_cast<double>(now >= r.last_use ? now - r.last_use : 0) + 1.0;
    return age * static_cast<double>(r.bytes) * (r.has_host_copy ? 2.0 : 1.0);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double sa = score(a), sb = score(b);
    if (sa != sb) return sa > sb;
    return resident[a].last_use < resident[b].last_use;
  });
  std::vector<size_t> chosen;
  size_t freed = 0;
  for (size_t i : order) {
    if (freed >= needed) break;
    chosen.push_back(i);
    freed += resident[i].bytes;
  }
  // A small early choice may have become unnecessary once a bigger one was added.
  std::vector<size_t> kept;
  for (size_t k = 0; k < chosen.size(); ++k) {
    const size_t bytes = resident[chosen[k]].bytes;
    if (k + 1 < chosen.size() && freed >= needed && freed - bytes >= needed) {
      freed -= bytes;
      continue;
    }
    kept.push_back(chosen[k]);
  }
  return kept;
}

namespace {

// The CUDA DeviceMemory: every CUDA Buffer's memory goes through here. One lock per device
// guards the residency records of its buffers, its clock and its counters; copies run under
// it, so a buffer is never seen half moved.
class CudaMemory final : public DeviceMemory {
 public:
  void attach(const Buffer& buffer) override {
    DeviceState& d = device(buffer);
    std::lock_guard lock(d.mutex);
    Buffer::Residency& r = buffer.residency();
    r.device = allocate(d, buffer);
    r.last_use = ++d.clock;
    d.buffers.insert(&buffer);
    d.stats.device_bytes += buffer.bytes();
  }

  void detach(const Buffer& buffer) noexcept override {
    DeviceState& d = *devices()[static_cast<size_t>(buffer.device().index)];
    std::lock_guard lock(d.mutex);
    Buffer::Residency& r = buffer.residency();
    d.buffers.erase(&buffer);
    try {
      if (r.device != nullptr) {
        device_pool(d.index).deallocate(r.device);
        d.stats.device_bytes -= buffer.bytes();
      }
      if (r.host != nullptr) {
        pinned_pool().deallocate(r.host);
        d.stats.host_bytes -= buffer.bytes();
      }
    } catch (const Error&) {
      // Only foreign pointers throw, and these came from the same pools.
    }
    r = Buffer::Residency{};
  }

  void* acquire(const Buffer& buffer, bool write, bool pin) override {
    DeviceState& d = device(buffer);
    std::lock_guard lock(d.mutex);
    Buffer::Residency& r = buffer.residency();
    if (r.device == nullptr) {
      void* memory = allocate(d, buffer);
      try {
        cuda::copy_host_to_device(d.index, memory, r.host, buffer.bytes());
      } catch (...) {
        device_pool(d.index).deallocate(memory);
        throw;
      }
      r.device = memory;
      d.stats.device_bytes += buffer.bytes();
      ++d.stats.restores;
      d.stats.restored_bytes += buffer.bytes();
    }
    if (write && r.host != nullptr) drop_host_copy(d, buffer);
    r.last_use = ++d.clock;
    if (pin) ++r.pins;
    return r.device;
  }

  void unpin(const Buffer& buffer) noexcept override {
    DeviceState& d = *devices()[static_cast<size_t>(buffer.device().index)];
    std::lock_guard lock(d.mutex);
    --buffer.residency().pins;
  }

  void* host_copy(const Buffer& buffer) override {
    DeviceState& d = device(buffer);
    std::lock_guard lock(d.mutex);
    Buffer::Residency& r = buffer.residency();
    if (r.host == nullptr) copy_out(d, buffer);
    return r.host;
  }

  Placement placement(const Buffer& buffer) const override {
    DeviceState& d = *devices()[static_cast<size_t>(buffer.device().index)];
    std::lock_guard lock(d.mutex);
    const Buffer::Residency& r = buffer.residency();
    if (r.device != nullptr && r.host != nullptr) return Placement::Both;
    return r.device != nullptr ? Placement::Device : Placement::Host;
  }

  PlacementStats stats(int index) {
    DeviceState& d = *devices()[static_cast<size_t>(index)];
    std::lock_guard lock(d.mutex);
    PlacementStats s = d.stats;
    s.buffers = d.buffers.size();
    return s;
  }

  std::string report(int index) {
    DeviceState& d = *devices()[static_cast<size_t>(index)];
    std::lock_guard lock(d.mutex);
    return placement_table(d);
  }

 private:
  struct DeviceState {
    int index = 0;
    std::mutex mutex;
    std::unordered_set<const Buffer*> buffers;  // every live buffer of the device
    uint64_t clock = 0;                         // advances at every attach and acquire
    PlacementStats stats;
  };

  static std::vector<DeviceState*>& devices() {
    // Sized once by the driver's device count; leaked so that buffers freed during static
    // destruction still find their device.
    static std::vector<DeviceState*>* const all = [] {
      auto* v = new std::vector<DeviceState*>();
      for (int i = 0; i < cuda::device_count(); ++i) {
        v->push_back(new DeviceState());
        v->back()->index = i;
      }
      return v;
    }();
    return *all;
  }

  static DeviceState& device(const Buffer& buffer) {
    cuda::check_device(buffer.device().index);  // the driver's error without one
    return *devices()[static_cast<size_t>(buffer.device().index)];
  }

  // Device memory for `buffer`, moving other buffers out until the pool can serve it.
  void* allocate(DeviceState& d, const Buffer& buffer) {
    CachingPool& pool = device_pool(d.index);
    const size_t bytes = buffer.bytes();
    for (;;) {
      if (void* p = pool.try_allocate(bytes)) return p;
      std::vector<ResidentBuffer> resident;
      std::vector<const Buffer*> owners;
      for (const Buffer* b : d.buffers) {
        const Buffer::Residency& r = b->residency();
        if (r.device == nullptr || b == &buffer) continue;
        resident.push_back({b->bytes(), r.last_use, r.pins > 0, r.host != nullptr});
        owners.push_back(b);
      }
      // Over a limit, free what the request adds beyond it; otherwise (fragmentation, a
      // full device) at least the request's size.
      const PoolStats s = pool.stats();
      size_t needed = bytes;
      if (s.limit != 0 && s.allocated + bytes > s.limit) {
        needed = std::max(bytes, s.allocated + bytes - s.limit);
      }
      std::vector<size_t> chosen = choose_evictions(resident, needed, d.clock);
      if (chosen.empty()) {
        size_t in_use = 0;
        for (const ResidentBuffer& r : resident) in_use += r.pinned ? r.bytes : 0;
        try {
          return pool.allocate(bytes);  // throws with the pool's reason and report
        } catch (const OutOfMemoryError& e) {
          throw OutOfMemoryError(
              std::string(e.what()) + "no buffer of cuda:" + std::to_string(d.index) +
              " could be moved to host memory: " + std::to_string(resident.size()) + " resident, " +
              format_bytes(in_use) + " in use by the running kernel\n" + placement_table(d));
        }
      }
      for (size_t i : chosen) evict(d, *owners[i]);
    }
  }

  void copy_out(DeviceState& d, const Buffer& buffer) {
    Buffer::Residency& r = buffer.residency();
    void* host = pinned_pool().allocate(buffer.bytes());
    try {
      cuda::copy_device_to_host(d.index, host, r.device, buffer.bytes());
    } catch (...) {
      pinned_pool().deallocate(host);
      throw;
    }
    r.host = host;
    d.stats.host_bytes += buffer.bytes();
  }

  void drop_host_copy(DeviceState& d, const Buffer& buffer) {
    Buffer::Residency& r = buffer.residency();
    pinned_pool().deallocate(r.host);
    r.host = nullptr;
    d.stats.host_bytes -= buffer.bytes();
  }

  void evict(DeviceState& d, const Buffer& buffer) {
    Buffer::Residency& r = buffer.residency();
    if (r.host == nullptr) copy_out(d, buffer);
    device_pool(d.index).deallocate(r.device);
    r.device = nullptr;
    d.stats.device_bytes -= buffer.bytes();
    ++d.stats.evictions;
    d.stats.evicted_bytes += buffer.bytes();
  }

  static std::string placement_table(const DeviceState& d) {
    std::ostringstream out;
    out << "[cuda:" << d.index << " placement]\n"
        << "  resident on device  " << format_bytes(d.stats.device_bytes) << "\n"
        << "  in host memory      " << format_bytes(d.stats.host_bytes) << "\n"
        << "  buffers             " << d.buffers.size() << "\n"
        << "  moved out           " << d.stats.evictions << " ("
        << format_bytes(d.stats.evicted_bytes) << ")\n"
        << "  brought back        " << d.stats.restores << " ("
        << format_bytes(d.stats.restored_bytes) << ")\n";
    return out.str();
  }
};

CudaMemory& cuda_memory() {
  static CudaMemory* const memory = new CudaMemory();
  return *memory;
}

// The library is shared, so this runs when it is loaded, before any buffer is made.
[[maybe_unused]] const bool kRegistered = [] {
  set_device_memory(Device::Kind::CUDA, &cuda_memory());
  return true;
}();

}  // namespace

void set_device_memory_limit(int device, size_t bytes) { device_pool(device).set_limit(bytes); }

size_t device_memory_limit(int device) { return device_pool(device).limit(); }

PlacementStats placement_stats(int device) {
  cuda::check_device(device);
  return cuda_memory().stats(device);
}

std::string placement_report(int device) {
  cuda::check_device(device);
  return cuda_memory().report(device);
}

}  // namespace kiln::memory
