#include "cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "error.h"
#include "settings.h"

namespace kiln::cuda {
namespace {

// The few driver types kiln needs, declared here so that no CUDA header is required to
// build kiln. Handles are opaque pointers; CUdeviceptr is a 64-bit integer on every
// platform the driver supports.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUevent = void*;

constexpr CUresult kSuccess = 0;
constexpr CUresult kErrorOutOfMemory = 2;
// Results of cuModuleLoadDataEx that mean "this image is wrong", not "the device is".
constexpr CUresult kImageErrors[] = {200 /*INVALID_IMAGE*/,   209 /*NO_BINARY_FOR_GPU*/,
                                     218 /*INVALID_PTX*/,     221 /*JIT_COMPILER_NOT_FOUND*/,
                                     222 /*UNSUPPORTED_PTX*/, 300 /*INVALID_SOURCE*/};
constexpr int kAttrMultiprocessors = 16;    // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrMajor = 75;              // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrMinor = 76;              // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr unsigned kHostAllocPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE
constexpr int kJitErrorLogBuffer = 5;       // CU_JIT_ERROR_LOG_BUFFER
constexpr int kJitErrorLogBufferSize = 6;   // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES

struct Functions {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuModuleLoadDataEx)(CUmodule*, const void*, unsigned, int*, void**);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuEventDestroy)(CUevent);
};

// Per-device state, set up on first use of the device: the primary context (shared with
// the CUDA runtime, so cuBLAS and kiln see the same memory) and kiln's stream.
struct DeviceState {
  CUdevice handle = 0;
  std::once_flag once;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
};

struct Driver {
  bool loaded = false;
  std::string status;   // driver_status()
  std::string failure;  // why there is no driver, for the DeviceError
  Functions f{};
  std::vector<std::unique_ptr<DeviceState>> devices;
};

// Resolves `name` (or `fallback`, an older name of the same function) into `fn`.
template <class Fn>
bool resolve(void* library, Fn& fn, const char* name, const char* fallback = nullptr) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr && fallback != nullptr) symbol = dlsym(library, fallback);
  fn = reinterpret_cast<Fn>(symbol);
  return symbol != nullptr;
}

// Names of the results that can come before the driver is usable, when cuGetErrorName
// cannot help (the toolkit's stub library answers every call with CUDA_ERROR_STUB_LIBRARY).
const char* known_result_name(CUresult result) {
  switch (result) {
    case 2:
      return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3:
      return "CUDA_ERROR_NOT_INITIALIZED";
    case 34:
      return "CUDA_ERROR_STUB_LIBRARY";
    case 35:
      return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 100:
      return "CUDA_ERROR_NO_DEVICE";
    default:
      return nullptr;
  }
}

std::string result_text(const Functions& f, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (f.cuGetErrorName == nullptr || f.cuGetErrorName(result, &name) != kSuccess) name = nullptr;
  if (f.cuGetErrorString == nullptr || f.cuGetErrorString(result, &text) != kSuccess)
    text = nullptr;
  if (name == nullptr) name = known_result_name(result);
  std::string out = name != nullptr ? name : "CUDA error " + std::to_string(result);
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

// Opens the driver and fills `d`; on failure leaves d.loaded false and says why.
void load(Driver& d) {
  const std::string path = settings::text("KILN_CUDA_DRIVER").value_or("libcuda.so.1");
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    d.failure = "no CUDA driver found (" + std::string(why != nullptr ? why : path) + ")";
    d.status = d.failure;
    return;
  }
  Functions& f = d.f;
  const char* missing = nullptr;
  auto need = [&](bool found, const char* name) {
    if (!found && missing == nullptr) missing = name;
  };
  need(resolve(library, f.cuInit, "cuInit"), "cuInit");
  need(resolve(library, f.cuDriverGetVersion, "cuDriverGetVersion"), "cuDriverGetVersion");
  need(resolve(library, f.cuGetErrorName, "cuGetErrorName"), "cuGetErrorName");
  need(resolve(library, f.cuGetErrorString, "cuGetErrorString"), "cuGetErrorString");
  need(resolve(library, f.cuDeviceGetCount, "cuDeviceGetCount"), "cuDeviceGetCount");
  need(resolve(library, f.cuDeviceGet, "cuDeviceGet"), "cuDeviceGet");
  need(resolve(library, f.cuDeviceGetName, "cuDeviceGetName"), "cuDeviceGetName");
  need(resolve(library, f.cuDeviceGetAttribute, "cuDeviceGetAttribute"), "cuDeviceGetAttribute");
  need(resolve(library, f.cuDeviceTotalMem, "cuDeviceTotalMem_v2"), "cuDeviceTotalMem_v2");
  need(resolve(library, f.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
       "cuDevicePrimaryCtxRetain");
  need(resolve(library, f.cuCtxSetCurrent, "cuCtxSetCurrent"), "cuCtxSetCurrent");
  need(resolve(library, f.cuStreamCreate, "cuStreamCreate"), "cuStreamCreate");
  need(resolve(library, f.cuStreamSynchronize, "cuStreamSynchronize"), "cuStreamSynchronize");
  need(resolve(library, f.cuModuleLoadDataEx, "cuModuleLoadDataEx"), "cuModuleLoadDataEx");
  need(resolve(library, f.cuModuleGetFunction, "cuModuleGetFunction"), "cuModuleGetFunction");
  need(resolve(library, f.cuLaunchKernel, "cuLaunchKernel"), "cuLaunchKernel");
  need(resolve(library, f.cuMemAlloc, "cuMemAlloc_v2"), "cuMemAlloc_v2");
  need(resolve(library, f.cuMemFree, "cuMemFree_v2"), "cuMemFree_v2");
  need(resolve(library, f.cuMemHostAlloc, "cuMemHostAlloc"), "cuMemHostAlloc");
  need(resolve(library, f.cuMemFreeHost, "cuMemFreeHost"), "cuMemFreeHost");
  need(resolve(library, f.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"), "cuMemcpyHtoDAsync_v2");
  need(resolve(library, f.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"), "cuMemcpyDtoHAsync_v2");
  need(resolve(library, f.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"), "cuMemcpyDtoDAsync_v2");
  need(resolve(library, f.cuMemsetD8Async, "cuMemsetD8Async"), "cuMemsetD8Async");
  need(resolve(library, f.cuMemGetInfo, "cuMemGetInfo_v2"), "cuMemGetInfo_v2");
  need(resolve(library, f.cuEventCreate, "cuEventCreate"), "cuEventCreate");
  need(resolve(library, f.cuEventRecord, "cuEventRecord"), "cuEventRecord");
  need(resolve(library, f.cuEventSynchronize, "cuEventSynchronize"), "cuEventSynchronize");
  need(resolve(library, f.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
       "cuEventElapsedTime_v2");
  need(resolve(library, f.cuEventDestroy, "cuEventDestroy_v2"), "cuEventDestroy_v2");
  if (missing != nullptr) {
    d.failure = "no CUDA driver found (" + path + " has no " + missing + ": not a CUDA driver)";
    d.status = d.failure;
    f = Functions{};
    dlclose(library);
    return;
  }
  // The library stays open for the life of the process: kernels and memory refer into it.
  if (CUresult r = f.cuInit(0); r != kSuccess) {
    d.failure = "no usable CUDA driver (" + path + ": cuInit failed: " + result_text(f, r) + ")";
    d.status = d.failure;
    return;
  }
  int version = 0;
  int count = 0;
  f.cuDriverGetVersion(&version);
  if (CUresult r = f.cuDeviceGetCount(&count); r != kSuccess) {
    d.failure = "no usable CUDA driver (cuDeviceGetCount failed: " + result_text(f, r) + ")";
    d.status = d.failure;
    return;
  }
  for (int i = 0; i < count; ++i) {
    auto state = std::make_unique<DeviceState>();
    if (CUresult r = f.cuDeviceGet(&state->handle, i); r != kSuccess) {
      d.failure = "no usable CUDA driver (cuDeviceGet(" + std::to_string(i) +
                  ") failed: " + result_text(f, r) + ")";
      d.status = d.failure;
      d.devices.clear();
      return;
    }
    d.devices.push_back(std::move(state));
  }
  d.loaded = true;
  d.status = "CUDA driver " + std::to_string(version / 1000) + "." +
             std::to_string(version % 1000 / 10) + ", " + std::to_string(count) +
             (count == 1 ? " device" : " devices");
}

// Loaded once, on first use, by whichever thread gets here first (a magic static). Never
// destroyed: buffers freed during static destruction still call into the driver.
Driver& driver() {
  static Driver* const d = [] {
    auto* loaded = new Driver();
    load(*loaded);
    return loaded;
  }();
  return *d;
}

// The driver's functions, or the DeviceError every CUDA request gets without one.
const Functions& api() {
  Driver& d = driver();
  if (!d.loaded) {
    throw DeviceError("[cuda] " + d.failure +
                      "; CUDA devices are unavailable on this machine (set KILN_CUDA_DRIVER to "
                      "the path of libcuda.so.1 if the driver is installed elsewhere)");
  }
  return d.f;
}

void check(CUresult result, const char* call, const std::string& what) {
  if (result == kSuccess) return;
  std::string message = "[cuda] " + std::string(call) + " failed";
  if (!what.empty()) message += " (" + what + ")";
  message += ": " + result_text(driver().f, result);
  if (result == kErrorOutOfMemory) throw OutOfMemoryError(message);
  throw DeviceError(message);
}

void check_index(int device) {
  api();
  const size_t count = driver().devices.size();
  if (device < 0 || device >= static_cast<int>(count)) {
    throw DeviceError("[cuda] device cuda:" + std::to_string(device) +
                      " does not exist; this machine has " + std::to_string(count) +
                      " CUDA device" + (count == 1 ? "" : "s"));
  }
}

// The context current on this thread as far as kiln set it; saves a driver call per op.
thread_local CUcontext t_current = nullptr;

// The device's state with its context and stream created. Throws for a bad index.
DeviceState& device_state(int device) {
  check_index(device);
  Driver& d = driver();
  DeviceState& state = *d.devices[static_cast<size_t>(device)];
  std::call_once(state.once, [&] {
    const Functions& f = d.f;
    check(f.cuDevicePrimaryCtxRetain(&state.context, state.handle), "cuDevicePrimaryCtxRetain",
          "cuda:" + std::to_string(device));
    check(f.cuCtxSetCurrent(state.context), "cuCtxSetCurrent", "cuda:" + std::to_string(device));
    t_current = state.context;  // this thread's current context changed
    // Non-blocking: kiln's work need not wait for other libraries' legacy default stream.
    check(f.cuStreamCreate(&state.stream, kStreamNonBlocking), "cuStreamCreate",
          "cuda:" + std::to_string(device));
  });
  return state;
}

DeviceState& current(int device) {
  DeviceState& state = device_state(device);
  if (t_current != state.context) {
    check(driver().f.cuCtxSetCurrent(state.context), "cuCtxSetCurrent",
          "cuda:" + std::to_string(device));
    t_current = state.context;
  }
  return state;
}

CUdeviceptr dptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

std::string bytes_text(size_t bytes) { return std::to_string(bytes) + " bytes"; }

}  // namespace

bool driver_loaded() { return driver().loaded; }

std::string driver_status() { return driver().status; }

int device_count() { return static_cast<int>(driver().devices.size()); }

void check_device(int device) { check_index(device); }

DeviceProperties properties(int device) {
  const Functions& f = api();
  DeviceState& state = device_state(device);
  DeviceProperties p;
  p.index = device;
  char name[256] = {};
  check(f.cuDeviceGetName(name, sizeof(name) - 1, state.handle), "cuDeviceGetName", "");
  p.name = name;
  check(f.cuDeviceGetAttribute(&p.major, kAttrMajor, state.handle), "cuDeviceGetAttribute",
        "compute capability major");
  check(f.cuDeviceGetAttribute(&p.minor, kAttrMinor, state.handle), "cuDeviceGetAttribute",
        "compute capability minor");
  check(f.cuDeviceGetAttribute(&p.multiprocessors, kAttrMultiprocessors, state.handle),
        "cuDeviceGetAttribute", "multiprocessor count");
  check(f.cuDeviceTotalMem(&p.total_memory, state.handle), "cuDeviceTotalMem_v2", "");
  return p;
}

std::pair<size_t, size_t> memory_info(int device) {
  current(device);
  size_t free = 0, total = 0;
  check(api().cuMemGetInfo(&free, &total), "cuMemGetInfo_v2", "cuda:" + std::to_string(device));
  return {free, total};
}

void set_current(int device) { current(device); }

void* stream(int device) { return device_state(device).stream; }

void synchronize(int device) {
  DeviceState& state = current(device);
  check(api().cuStreamSynchronize(state.stream), "cuStreamSynchronize",
        "cuda:" + std::to_string(device));
}

void* load_module(int device, const std::vector<uint8_t>& image) {
  const Functions& f = api();
  current(device);
  // A CUBIN is an ELF file; anything else is PTX text, which the driver reads up to a NUL.
  const bool cubin = image.size() >= 4 && std::memcmp(image.data(),
                                                      "\x7f"
                                                      "ELF",
                                                      4) == 0;
  std::vector<uint8_t> text;
  const void* data = image.data();
  if (!cubin) {
    text = image;
    text.push_back(0);
    data = text.data();
  }
  char log[8192] = {};
  int options[] = {kJitErrorLogBuffer, kJitErrorLogBufferSize};
  void* values[] = {log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(log) - 1))};
  CUmodule module = nullptr;
  CUresult r = f.cuModuleLoadDataEx(&module, data, 2, options, values);
  if (r == kSuccess) return module;
  for (CUresult image_error : kImageErrors) {
    if (r == image_error) {
      throw CompileError(
          "[cuda] cuModuleLoadDataEx rejected a " + std::string(cubin ? "CUBIN" : "PTX") +
          " image of " + bytes_text(image.size()) + " for cuda:" + std::to_string(device) + ": " +
          result_text(f, r) + (log[0] != 0 ? "\nJIT log:\n" + std::string(log) : ""));
    }
  }
  check(r, "cuModuleLoadDataEx", "cuda:" + std::to_string(device));
  return module;
}

void* get_function(void* module, const std::string& name) {
  const Functions& f = api();
  CUfunction function = nullptr;
  check(f.cuModuleGetFunction(&function, module, name.c_str()), "cuModuleGetFunction",
        "kernel " + name);
  return function;
}

void launch(int device, void* function, unsigned grid, unsigned block, size_t shared_bytes,
            void** params) {
  DeviceState& state = current(device);
  check(api().cuLaunchKernel(function, grid, 1, 1, block, 1, 1, static_cast<unsigned>(shared_bytes),
                             state.stream, params, nullptr),
        "cuLaunchKernel",
        "grid " + std::to_string(grid) + ", block " + std::to_string(block) +
            ", cuda:" + std::to_string(device));
}

void copy_host_to_device(int device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& state = current(device);
  const Functions& f = api();
  check(f.cuMemcpyHtoDAsync(dptr(dst), src, bytes, state.stream), "cuMemcpyHtoDAsync_v2",
        bytes_text(bytes));
  // From pinned memory the copy is truly asynchronous; the caller may reuse `src` at once.
  check(f.cuStreamSynchronize(state.stream), "cuStreamSynchronize", "after a host-to-device copy");
}

void copy_device_to_host(int device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& state = current(device);
  const Functions& f = api();
  check(f.cuMemcpyDtoHAsync(dst, dptr(src), bytes, state.stream), "cuMemcpyDtoHAsync_v2",
        bytes_text(bytes));
  check(f.cuStreamSynchronize(state.stream), "cuStreamSynchronize", "after a device-to-host copy");
}

void copy_device_to_device(int device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& state = current(device);
  check(api().cuMemcpyDtoDAsync(dptr(dst), dptr(src), bytes, state.stream), "cuMemcpyDtoDAsync_v2",
        bytes_text(bytes));
}

void memset_device(int device, void* dst, unsigned char value, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& state = current(device);
  check(api().cuMemsetD8Async(dptr(dst), value, bytes, state.stream), "cuMemsetD8Async",
        bytes_text(bytes));
}

void* device_malloc(int device, size_t bytes) {
  current(device);
  CUdeviceptr p = 0;
  check(api().cuMemAlloc(&p, bytes == 0 ? 1 : bytes), "cuMemAlloc_v2",
        bytes_text(bytes) + " on cuda:" + std::to_string(device));
  return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
}

void device_free(int device, void* ptr) noexcept {
  if (ptr == nullptr) return;
  try {
    current(device);
    api().cuMemFree(dptr(ptr));
  } catch (const Error&) {
    // Only reachable if the driver went away; the memory goes with it.
  }
}

void* pinned_malloc(size_t bytes) {
  // Any context will do: portable pinned memory is usable by every device's copies.
  current(0);
  void* p = nullptr;
  check(api().cuMemHostAlloc(&p, bytes == 0 ? 1 : bytes, kHostAllocPortable), "cuMemHostAlloc",
        bytes_text(bytes) + " of pinned host memory");
  return p;
}

void pinned_free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  try {
    current(0);
    api().cuMemFreeHost(ptr);
  } catch (const Error&) {
  }
}

StreamTimer::StreamTimer(int device) : device_(device) {
  current(device);
  check(api().cuEventCreate(&start_, 0), "cuEventCreate", "timer start");
  try {
    check(api().cuEventCreate(&stop_, 0), "cuEventCreate", "timer stop");
  } catch (...) {
    api().cuEventDestroy(start_);
    throw;
  }
}

StreamTimer::~StreamTimer() {
  const Functions& f = driver().f;
  f.cuEventDestroy(start_);
  f.cuEventDestroy(stop_);
}

void StreamTimer::start() {
  DeviceState& state = current(device_);
  check(api().cuEventRecord(start_, state.stream), "cuEventRecord", "timer start");
}

float StreamTimer::stop() {
  DeviceState& state = current(device_);
  const Functions& f = api();
  check(f.cuEventRecord(stop_, state.stream), "cuEventRecord", "timer stop");
  check(f.cuEventSynchronize(stop_), "cuEventSynchronize", "timer stop");
  float ms = 0.0f;
  check(f.cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime", "");
  return ms;
}

}  // namespace kiln::cuda
