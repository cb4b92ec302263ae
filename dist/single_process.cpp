// The size-1 backend: the same program runs without a launcher, and every collective is
// the identity (a copy from the input to the output buffer).
#include <cstring>

#include "backends.h"

namespace kiln::dist::detail {
namespace {

class Done : public Work {
 public:
  bool done() override { return true; }
};

std::unique_ptr<Work> copy(const void* in, void* out, int64_t bytes) {
  if (in != out && bytes > 0) std::memmove(out, in, static_cast<size_t>(bytes));
  return std::make_unique<Done>();
}

class SingleProcess : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  const char* backend() const override { return "single"; }
  Device::Kind memory_kind() const override { return Device::Kind::CPU; }

  std::unique_ptr<Work> start_all_reduce(const void* in, void* out, int64_t count, DType dtype,
                                         ReduceOp) override {
    return copy(in, out, count * static_cast<int64_t>(itemsize(dtype)));
  }
  std::unique_ptr<Work> start_reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                             ReduceOp) override {
    return copy(in, out, count * static_cast<int64_t>(itemsize(dtype)));
  }
  std::unique_ptr<Work> start_all_gather(const void* in, void* out, int64_t bytes) override {
    return copy(in, out, bytes);
  }
  std::unique_ptr<Work> start_broadcast(const void* in, void* out, int64_t bytes,
                                        int root) override {
    if (root != 0) {
      throw ValueError("[dist.broadcast] root " + std::to_string(root) +
                       " is not a rank of a single-process job (expected 0)");
    }
    return copy(in, out, bytes);
  }
  std::unique_ptr<Work> start_barrier() override { return std::make_unique<Done>(); }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process() { return std::make_unique<SingleProcess>(); }

}  // namespace kiln::dist::detail
