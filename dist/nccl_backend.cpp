// The NCCL backend for CUDA tensors. libnccl is opened with dlopen on first use (like
// libcuda in core/cuda_driver.cpp), so one kiln binary runs with or without it; the ranks
// agree on NCCL's unique id through a host communicator (MPI), broadcast from rank 0.
//
// Collectives are queued on kiln's stream of the device, after the kernels that produced
// their inputs, and polled (cuStreamQuery and ncclCommGetAsyncError) against the
// KILN_DIST_TIMEOUT deadline like every other collective (an uncaught TimeoutError ends the
// job through MPI_Abort).
#include <dlfcn.h>

#include <cstring>

#include "../core/cuda_driver.h"
#include "../core/settings.h"
#include "backends.h"

namespace kiln::dist {
namespace {

// The few NCCL declarations kiln needs (nccl.h, NCCL 2.x ABI), so that no NCCL header is
// needed to build kiln.
using ncclResult_t = int;
using ncclComm_t = void*;
struct ncclUniqueId {
  char internal[128];
};
constexpr ncclResult_t kSuccess = 0;
constexpr ncclResult_t kInProgress = 7;
constexpr int kInt8 = 0, kInt64 = 4, kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9;
constexpr int kSum = 0, kAvg = 4;
constexpr int kCudaSuccess = 0, kCudaNotReady = 600;  // CUDA_SUCCESS, CUDA_ERROR_NOT_READY

struct Nccl {
  std::string failure;  // why NCCL cannot be used; empty when loaded
  int version = 0;
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*GetErrorString)(ncclResult_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, int, int, ncclComm_t, void*);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, void*);
  ncclResult_t (*AllGather)(const void*, void*, size_t, int, ncclComm_t, void*);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, void*);
  int (*cuStreamQuery)(void*);  // from the CUDA driver kiln already opened
};

template <class Fn>
bool resolve(void* library, Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  return fn != nullptr;
}

// Opens NCCL (KILN_NCCL_LIBRARY or libnccl.so.2) each time a communicator is made, so a
// test can point the variable elsewhere; dlopen itself keeps one copy of the library.
Nccl load() {
  Nccl n{};
  const std::string path = settings::text("KILN_NCCL_LIBRARY").value_or("libnccl.so.2");
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    n.failure = "cannot load NCCL (" + std::string(why != nullptr ? why : path) +
                "); install NCCL or name it with KILN_NCCL_LIBRARY";
    return n;
  }
  const char* missing = nullptr;
  auto need = [&](bool found, const char* name) {
    if (!found && missing == nullptr) missing = name;
  };
  need(resolve(library, n.GetVersion, "ncclGetVersion"), "ncclGetVersion");
  need(resolve(library, n.GetUniqueId, "ncclGetUniqueId"), "ncclGetUniqueId");
  need(resolve(library, n.CommInitRank, "ncclCommInitRank"), "ncclCommInitRank");
  need(resolve(library, n.CommDestroy, "ncclCommDestroy"), "ncclCommDestroy");
  need(resolve(library, n.CommAbort, "ncclCommAbort"), "ncclCommAbort");
  need(resolve(library, n.CommGetAsyncError, "ncclCommGetAsyncError"), "ncclCommGetAsyncError");
  need(resolve(library, n.GetErrorString, "ncclGetErrorString"), "ncclGetErrorString");
  need(resolve(library, n.AllReduce, "ncclAllReduce"), "ncclAllReduce");
  need(resolve(library, n.ReduceScatter, "ncclReduceScatter"), "ncclReduceScatter");
  need(resolve(library, n.AllGather, "ncclAllGather"), "ncclAllGather");
  need(resolve(library, n.Broadcast, "ncclBroadcast"), "ncclBroadcast");
  if (missing != nullptr) {
    n.failure = "cannot use " + path + ": it has no " + missing + " (not NCCL 2)";
    dlclose(library);
    return n;
  }
  n.GetVersion(&n.version);
  return n;
}

int nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return kFloat32;
    case DType::Float64:
      return kFloat64;
    case DType::Float16:
      return kFloat16;
    case DType::BFloat16:
      return kBfloat16;
    case DType::Int64:
      return kInt64;
    default:
      throw DTypeError("[dist.nccl] reduces float32, float64, bfloat16, float16 and int64, got " +
                       std::string(dtype_name(dtype)));
  }
}

class NcclWork : public Work {
 public:
  NcclWork(const Nccl& nccl, ncclComm_t comm, void* stream, std::string what)
      : nccl_(nccl), comm_(comm), stream_(stream), what_(std::move(what)) {}
  bool done() override {
    ncclResult_t async = kSuccess;
    nccl_.CommGetAsyncError(comm_, &async);
    if (async != kSuccess && async != kInProgress) {
      throw DistError("[dist.nccl] " + what_ + " failed: " + nccl_.GetErrorString(async));
    }
    const int r = nccl_.cuStreamQuery(stream_);
    if (r == kCudaNotReady) return false;
    if (r != kCudaSuccess) {
      throw DistError("[dist.nccl] " + what_ + ": the CUDA stream reports error " +
                      std::to_string(r));
    }
    return true;
  }

 private:
  const Nccl& nccl_;
  ncclComm_t comm_;
  void* stream_;
  std::string what_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(Nccl nccl, Communicator& bootstrap, int device)
      : nccl_(std::move(nccl)), bootstrap_(bootstrap), device_(device) {
    cuda::set_current(device_);
    stream_ = cuda::stream(device_);
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) check(nccl_.GetUniqueId(&id), "ncclGetUniqueId");
    auto work = bootstrap.start_broadcast(&id, &id, sizeof id, 0);
    bootstrap.wait(*work, "broadcast of NCCL's unique id");
    check(nccl_.CommInitRank(&comm_, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) nccl_.CommDestroy(comm_);
  }

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  int local_rank() const override { return bootstrap_.local_rank(); }
  const char* backend() const override { return "nccl"; }
  Device::Kind memory_kind() const override { return Device::Kind::CUDA; }

  std::unique_ptr<Work> start_all_reduce(const void* in, void* out, int64_t count, DType dtype,
                                         ReduceOp op) override {
    cuda::set_current(device_);
    check(nccl_.AllReduce(in, out, static_cast<size_t>(count), nccl_type(dtype),
                          op == ReduceOp::Average ? kAvg : kSum, comm_, stream_),
          "ncclAllReduce");
    return work("all_reduce");
  }
  std::unique_ptr<Work> start_reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                             ReduceOp op) override {
    cuda::set_current(device_);
    check(nccl_.ReduceScatter(in, out, static_cast<size_t>(count), nccl_type(dtype),
                              op == ReduceOp::Average ? kAvg : kSum, comm_, stream_),
          "ncclReduceScatter");
    return work("reduce_scatter");
  }
  std::unique_ptr<Work> start_all_gather(const void* in, void* out, int64_t bytes) override {
    cuda::set_current(device_);
    check(nccl_.AllGather(in, out, static_cast<size_t>(bytes), kInt8, comm_, stream_),
          "ncclAllGather");
    return work("all_gather");
  }
  std::unique_ptr<Work> start_broadcast(const void* in, void* out, int64_t bytes,
                                        int root) override {
    cuda::set_current(device_);
    check(nccl_.Broadcast(in, out, static_cast<size_t>(bytes), kInt8, root, comm_, stream_),
          "ncclBroadcast");
    return work("broadcast");
  }
  // NCCL has no barrier; the host communicator's is the same set of ranks.
  std::unique_ptr<Work> start_barrier() override { return bootstrap_.start_barrier(); }

 protected:
  Communicator& host() override { return bootstrap_; }

 private:
  void check(ncclResult_t r, const char* call) {
    if (r != kSuccess && r != kInProgress) {
      throw DistError(std::string("[dist.nccl] ") + where() +
                      " on cuda:" + std::to_string(device_) + ": " + call +
                      " failed: " + nccl_.GetErrorString(r));
    }
  }
  std::unique_ptr<Work> work(const char* op) {
    return std::make_unique<NcclWork>(nccl_, comm_, stream_,
                                      std::string(op) + " on cuda:" + std::to_string(device_));
  }

  Nccl nccl_;
  Communicator& bootstrap_;
  int device_;
  void* stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device) {
  if (bootstrap.memory_kind() != Device::Kind::CPU) {
    throw DistError("[dist.nccl] needs a host communicator (MPI) to bootstrap through, got a " +
                    std::string(bootstrap.backend()) + " communicator");
  }
  Nccl nccl = load();
  if (!nccl.failure.empty()) throw DistError("[dist.nccl] " + nccl.failure);
  cuda::check_device(device);  // DeviceError without a driver or for a bad index
  // The driver is already open (check_device succeeded); take cuStreamQuery from it.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) {
    const auto path = settings::text("KILN_CUDA_DRIVER");
    if (path) driver = dlopen(path->c_str(), RTLD_NOW | RTLD_NOLOAD);
  }
  if (driver == nullptr || !resolve(driver, nccl.cuStreamQuery, "cuStreamQuery")) {
    throw DistError("[dist.nccl] the CUDA driver has no cuStreamQuery");
  }
  return std::make_unique<NcclCommunicator>(std::move(nccl), bootstrap, device);
}

}  // namespace kiln::dist
