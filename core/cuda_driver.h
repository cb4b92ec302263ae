#pragma once
// The CUDA driver API, loaded at run time. kiln never links libcuda: the library is opened
// with dlopen on first use (KILN_CUDA_DRIVER names another file, e.g. for tests), so one
// binary runs on machines with and without a GPU. Without a usable driver every call below
// except driver_loaded(), driver_status() and device_count() throws a DeviceError that
// says why; device_count() is then 0.
//
// Every function is thread-safe. Device work goes on one stream per device ("kiln's
// stream"), so work submitted from kiln is ordered without events.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::cuda {

/// True when libcuda was found and cuInit succeeded.
bool driver_loaded();
/// "CUDA driver 13.0, 1 device", or why there is none: "no CUDA driver found (...)".
std::string driver_status();
/// Number of CUDA devices; 0 without a driver.
int device_count();
/// Throws the DeviceError for a device kiln cannot use (no driver, index out of range).
void check_device(int device);

/// What `kiln info` and the memory report show about a device.
struct DeviceProperties {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  ///< Compute capability.
  size_t total_memory = 0;   ///< Bytes.
  int multiprocessors = 0;
};
/// The properties of `device`. Throws DeviceError without a driver or for a bad index.
DeviceProperties properties(int device);
/// Free and total bytes of device memory as the driver sees them (all processes).
std::pair<size_t, size_t> memory_info(int device);

/// Makes the device's primary context current on this thread (retained once per process).
void set_current(int device);
/// kiln's stream for `device` (a CUstream).
void* stream(int device);
/// Waits until all work on kiln's stream of `device` is done.
void synchronize(int device);

/// Loads a CUBIN or PTX image (a CUmodule). Throws CompileError when the driver rejects the
/// image (with the JIT log for PTX), DeviceError for other failures.
void* load_module(int device, const std::vector<uint8_t>& image);
/// The kernel `name` of a loaded module (a CUfunction). Throws DeviceError when missing.
void* get_function(void* module, const std::string& name);
/// Launches a 1-D grid on kiln's stream; `params` as cuLaunchKernel's kernelParams.
void launch(int device, void* function, unsigned grid, unsigned block, size_t shared_bytes,
            void** params);

/// Copies host memory to the device; returns when `src` may be reused (the copy is done).
void copy_host_to_device(int device, void* dst, const void* src, size_t bytes);
/// Copies device memory to the host after the work queued before it; returns when done.
void copy_device_to_host(int device, void* dst, const void* src, size_t bytes);
/// Queues a device-to-device copy on kiln's stream.
void copy_device_to_device(int device, void* dst, const void* src, size_t bytes);
/// Queues a byte fill of device memory on kiln's stream.
void memset_device(int device, void* dst, unsigned char value, size_t bytes);

/// Device memory straight from the driver (the pools cache it). Throws OutOfMemoryError
/// when the device is full, DeviceError for other failures.
void* device_malloc(int device, size_t bytes);
/// Returns memory from device_malloc(); never throws (errors are ignored on this path).
void device_free(int device, void* ptr) noexcept;
/// Page-locked host memory usable by every device's copies. Throws like device_malloc().
void* pinned_malloc(size_t bytes);
/// Returns memory from pinned_malloc(); never throws.
void pinned_free(void* ptr) noexcept;

/// Times work on kiln's stream of a device with a pair of events.
class StreamTimer {
 public:
  explicit StreamTimer(int device);
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  /// Records the start on the stream.
  void start();
  /// Records the end, waits for it, and returns the milliseconds since start().
  float stop();

 private:
  int device_;
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace kiln::cuda
