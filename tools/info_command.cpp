// `kiln info`: what this kiln build and this host provide.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/cuda_driver.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "jit/blas.h"
#include "jit/compiler.h"
#include "jit/kernel_cache.h"
#include "jit/library_conv.h"
#include "tools/cli.h"
#include "tools/text_output.h"

namespace kiln::cli {
namespace {

using Json = nlohmann::json;

struct CompilerInfo {
  bool available = false;
  std::string identity;  // or why it is unavailable
};

CompilerInfo probe_compiler(const std::string& name) {
  CompilerInfo info;
  try {
    if (auto compiler = jit::make_cpu_compiler(name)) {
      info.available = true;
      info.identity = compiler->identity();
    } else {
      info.identity = "not built (-DKILN_WITH_LLVM=OFF)";
    }
  } catch (const std::exception& e) {
    info.identity = e.what();
  }
  return info;
}

// The CUDA devices the driver reports; a device whose query fails is listed with the error
// rather than failing the whole report.
struct CudaDeviceInfo {
  cuda::DeviceProperties properties;
  std::string error;
};

std::vector<CudaDeviceInfo> probe_cuda_devices() {
  std::vector<CudaDeviceInfo> out;
  for (int i = 0; i < cuda::device_count(); ++i) {
    CudaDeviceInfo info;
    info.properties.index = i;
    try {
      info.properties = cuda::properties(i);
    } catch (const Error& e) {
      info.error = e.what();
    }
    out.push_back(info);
  }
  return out;
}

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

// "oneDNN 2.6.3, avx512_core_bf16 kernels" (with a warning when the path is generic).
std::string gemm_line(const jit::GemmPath& p) {
  if (p.library == "none") return "generated kernels (no GEMM library in this build)";
  std::string line = p.library + " " + p.version + ", " + p.kernels + " kernels";
  if (p.generic) line += " (generic: this CPU has AVX2 or better)";
  return line;
}

Json gemm_json(const jit::GemmPath& p) {
  return {{"library", p.library},
          {"version", p.version},
          {"kernels", p.kernels},
          {"generic", p.generic}};
}

}  // namespace

int run_info_command(const Invocation& inv) {
  const CompilerInfo llvm = probe_compiler("llvm");
  const CompilerInfo external = probe_compiler("external");
  // A bad KILN_CPU_COMPILER is worth showing here rather than failing the whole report.
  std::string default_compiler;
  bool default_ok = true;
  try {
    default_compiler = jit::cpu_compiler().name();
  } catch (const Error& e) {
    default_compiler = e.what();
    default_ok = false;
  }
  const std::string& features = jit::host_cpu_features();
  const int threads = thread_pool().size();
  jit::KernelCache& cache = jit::kernel_cache();
  const std::vector<CudaDeviceInfo> cuda_devices = probe_cuda_devices();
  const std::string driver = cuda::driver_status();
  const jit::GemmPath gemm32 = jit::gemm_path(DType::Float32);
  const jit::GemmPath gemm64 = jit::gemm_path(DType::Float64);
  const jit::GemmPath gemm_bf16 = jit::gemm_path(DType::BFloat16);
  const jit::GemmPath gemm_f16 = jit::gemm_path(DType::Float16);

  if (inv.json) {
    Json out = {
        {"version", kiln_version()},
        {"compilers",
         {{"llvm", {{"available", llvm.available}, {"identity", llvm.identity}}},
          {"external", {{"available", external.available}, {"identity", external.identity}}}}},
        {"default_compiler", default_ok ? Json(default_compiler) : Json(nullptr)},
        {"cpu_features", features},
        {"threads", threads},
        {"gemm",
         {{"float32", gemm_json(gemm32)},
          {"float64", gemm_json(gemm64)},
          {"bfloat16", gemm_json(gemm_bf16)},
          {"float16", gemm_json(gemm_f16)}}},
        {"conv",
         {{"float32", jit::conv_path(DType::Float32)},
          {"float64", jit::conv_path(DType::Float64)},
          {"bfloat16", jit::conv_path(DType::BFloat16)},
          {"float16", jit::conv_path(DType::Float16)}}},
        {"cache",
         {{"directory", cache.directory()},
          {"disk_enabled", cache.disk_enabled()},
          {"read_only_directories", cache.read_only_directories()}}},
        {"devices", Json::array({Json{{"type", "cpu"}, {"threads", threads}}})},
        {"cuda_driver", driver},
        {"cuda_devices", Json::array()}};
    for (const CudaDeviceInfo& d : cuda_devices) {
      const cuda::DeviceProperties& p = d.properties;
      Json device = {{"type", "cuda"}, {"index", p.index}};
      if (d.error.empty()) {
        device["name"] = p.name;
        device["compute_capability"] = std::to_string(p.major) + "." + std::to_string(p.minor);
        device["total_memory"] = p.total_memory;
        device["multiprocessors"] = p.multiprocessors;
      } else {
        device["error"] = d.error;
      }
      out["devices"].push_back(device);
      out["cuda_devices"].push_back(device);
    }
    if (!default_ok) out["default_compiler_error"] = default_compiler;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  auto compiler_line = [](const CompilerInfo& c) {
    return std::string(c.available ? "yes, " : "no, ") + c.identity;
  };
  TextTable table({"kiln", kiln_version()}, {false, false});
  table.add_row({"llvm compiler", compiler_line(llvm)});
  table.add_row({"external compiler", compiler_line(external)});
  table.add_row({"default compiler", default_ok ? default_compiler : "error: " + default_compiler});
  table.add_row({"cpu features", features});
  table.add_row({"threads", std::to_string(threads)});
  table.add_row({"gemm float32", gemm_line(gemm32)});
  table.add_row({"gemm float64", gemm_line(gemm64)});
  table.add_row({"gemm bfloat16", gemm_line(gemm_bf16)});
  table.add_row({"gemm float16", gemm_line(gemm_f16)});
  for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16})
    table.add_row({"conv " + std::string(dtype_name(dtype)), jit::conv_path(dtype)});
  std::string directory = cache.directory().empty() ? "(none: memory only)" : cache.directory();
  if (!cache.directory().empty() && !cache.disk_enabled())
    directory += " (not writable: new kernels kept in memory)";
  table.add_row({"cache directory", directory});
  for (const std::string& layer : cache.read_only_directories())
    table.add_row({"cache read-only", layer});
  std::string devices = "cpu (" + std::to_string(threads) + " threads)";
  if (cuda_devices.empty()) devices += "; no CUDA devices (" + driver + ")";
  table.add_row({"devices", devices});
  if (!cuda_devices.empty()) table.add_row({"cuda driver", driver});
  for (const CudaDeviceInfo& d : cuda_devices) {
    const cuda::DeviceProperties& p = d.properties;
    table.add_row({"cuda:" + std::to_string(p.index),
                   d.error.empty()
                       ? p.name + ", compute capability " + std::to_string(p.major) + "." +
                             std::to_string(p.minor) + ", " + gib(p.total_memory) + ", " +
                             std::to_string(p.multiprocessors) + " SMs"
                       : "error: " + d.error});
  }
  std::cout << table.render();
  return 0;
}

}  // namespace kiln::cli
