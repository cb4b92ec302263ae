#include "cuda_launch.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "../core/cuda_driver.h"
#include "nvrtc.h"
#include "printer_cuda.h"

namespace kiln::jit {
namespace {

struct LoadedCudaKernel {
  PrintedCudaKernel printed;
  std::vector<void*> functions;  // one per stage
  KernelRecord* record = nullptr;
  std::mutex* record_mutex = nullptr;
};

struct DeviceLimits {
  int arch = 0;
  int64_t max_grid = 1;
};

const DeviceLimits& limits_of(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceLimits> known;
  std::lock_guard lock(mutex);
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  cuda::DeviceProperties p = cuda::properties(device);
  // Grid-stride kernels need only enough blocks to fill every multiprocessor a few times;
  // a fixed grid per device also fixes the order reductions combine in.
  DeviceLimits l{p.major * 10 + p.minor, std::max<int64_t>(int64_t{p.multiprocessors} * 16, 1)};
  return known.emplace(device, l).first->second;
}

// Modules by (IR structure, device): the module must be loaded in each device's context.
std::mutex g_mutex;
std::unordered_map<uint64_t, std::unordered_map<int, LoadedCudaKernel>> g_loaded;

LoadedCudaKernel& kernel_for(const KernelIR& ir, int device) {
  uint64_t key = ir.structure_hash();
  std::lock_guard lock(g_mutex);
  auto& per_device = g_loaded[key];
  auto it = per_device.find(device);
  if (it != per_device.end()) {
    count_use(it->second.record, it->second.record_mutex, 1, 0, 0);
    return it->second;
  }
  LoadedCudaKernel k;
  k.printed = print_cuda(ir);
  // Loading an image (and finding its stages) is its check: the cache discards a disk entry
  // the driver rejects and compiles it again. The module loaded by the check is the one kept.
  auto load = [&](const std::vector<uint8_t>& image) {
    void* module = cuda::load_module(device, image);
    std::vector<void*> functions;
    for (const CudaStage& s : k.printed.stages)
      functions.push_back(cuda::get_function(module, s.entry));
    k.functions = std::move(functions);
  };
  CudaKernelImage image = cuda_kernel_image(k.printed, ir.source_ops, limits_of(device).arch, load);
  k.record = image.record;
  k.record_mutex = image.record_mutex;
  if (k.functions.empty()) load(*image.image);  // in memory already: checked on another device
  return per_device.emplace(device, std::move(k)).first->second;
}

int64_t grid_for(const CudaStage& s, int64_t extent, int64_t max_grid) {
  if (s.single_block) return 1;
  int64_t want = (extent + s.items_per_block - 1) / std::max<int64_t>(s.items_per_block, 1);
  return std::clamp<int64_t>(want, 1, max_grid);
}

}  // namespace

void run_cuda_kernel(const LoweredKernel& lk, Node& root) {
  const int device = root.device.index;
  cuda::set_current(device);
  LoadedCudaKernel& k = kernel_for(lk.ir, device);
  const PrintedCudaKernel& pk = k.printed;
  const int64_t max_grid = limits_of(device).max_grid;
  const size_t n_in = lk.ir.inputs.size();

  if (root.numel() == 0) {
    root.buffer = std::make_shared<Buffer>(0, root.device);
    return;
  }
  // Inputs are made resident and pinned first, so that allocating the output (which may
  // move other buffers to host memory under a limit) cannot move them out.
  std::vector<Buffer::Use> uses;
  uses.reserve(n_in + 3);
  // The kernel reads num_params words of P (the highest index it uses, plus one); trailing
  // parameters it never reads are left out of the argument struct, so the blob holds them all
  // and the driver copies the struct's size.
  std::vector<uint64_t> blob(
      static_cast<size_t>(pk.num_buffers) +
          std::max<size_t>(static_cast<size_t>(pk.num_params), lk.params.size()),
      0);
  auto slot = [&](size_t i, const void* p) { blob[i] = reinterpret_cast<uint64_t>(p); };
  for (size_t i = 0; i < lk.input_nodes.size(); ++i) {
    uses.emplace_back(*lk.input_nodes[i]->buffer, false);
    slot(i + 1, uses.back().data());
  }
  auto out = std::make_shared<Buffer>(root.nbytes(), root.device);
  uses.emplace_back(*out, true);
  slot(0, uses.back().data());

  auto extent_of = [&](const CudaStage& s, int64_t previous_grid) -> int64_t {
    switch (s.extent) {
      case CudaStage::Extent::Output:
        return root.numel();
      case CudaStage::Extent::Work:
        return lk.parallel_extent;
      case CudaStage::Extent::Partials:
        return previous_grid;
    }
    return 0;
  };
  std::shared_ptr<Buffer> scratch;
  if (pk.scratch != PrintedCudaKernel::Scratch::None) {
    int64_t count = pk.scratch == PrintedCudaKernel::Scratch::PerOutput
                        ? root.numel()
                        : grid_for(pk.stages.front(), extent_of(pk.stages.front(), 1), max_grid);
    scratch = std::make_shared<Buffer>(
        static_cast<size_t>(count) * static_cast<size_t>(pk.scratch_elem_bytes), root.device);
    uses.emplace_back(*scratch, true);
    slot(n_in + 1, uses.back().data());
  }
  std::shared_ptr<Buffer> err;
  void* err_data = nullptr;
  if (lk.ir.can_fail) {
    err = std::make_shared<Buffer>(4 * sizeof(int64_t), root.device);
    uses.emplace_back(*err, true);
    err_data = uses.back().data();
    cuda::memset_device(device, err_data, 0, err->bytes());
    slot(n_in + 2, err_data);
  }
  for (size_t p = 0; p < lk.params.size(); ++p)
    blob[static_cast<size_t>(pk.num_buffers) + p] = static_cast<uint64_t>(lk.params[p]);

  int64_t previous_grid = 1;
  for (size_t s = 0; s < pk.stages.size(); ++s) {
    const CudaStage& stage = pk.stages[s];
    long long extent = extent_of(stage, previous_grid);
    int64_t grid = grid_for(stage, extent, max_grid);
    void* params[] = {blob.data(), &extent};
    cuda::launch(device, k.functions[s], static_cast<unsigned>(grid),
                 static_cast<unsigned>(stage.block), 0, params);
    previous_grid = grid;
  }
  count_use(k.record, k.record_mutex, 0, 1, 0);
  if (err_data != nullptr) {
    int64_t host_err[4] = {0, 0, 0, 0};
    cuda::copy_device_to_host(device, host_err, err_data, sizeof host_err);
    if (host_err[0] != 0) raise_kernel_index_error(lk.ir, root, host_err);
  }
  root.buffer = std::move(out);
}

}  // namespace kiln::jit
