// The MPI backend (Open MPI here; any MPI-3 library works): host tensors, nonblocking
// collectives polled against the KILN_DIST_TIMEOUT deadline, and guards that turn a failing
// rank into the end of the whole job instead of a hang.
//
// Reductions:
//  - float32 and float64 are reduce-scattered, then all-gathered (the ring all-reduce
//    written out): each block of the result is computed by one rank and copied to the
//    others, so every rank holds the same bits by construction, whatever algorithm the MPI
//    library picks for a plain MPI_Allreduce.
//  - bfloat16 and float16, which MPI has no types for, are converted to float32, reduced as
//    above, and rounded back once (one rounding, like a float32 accumulator).
//  - int64 sums are exact, so they use MPI_Iallreduce directly.
//  Averages divide each reduced block by the number of ranks before it is gathered.
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <vector>

#include "backends.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

namespace kiln::dist::detail {

#ifndef KILN_HAVE_MPI

std::unique_ptr<Communicator> make_mpi() {
  throw DistError(
      "[dist.world] this process was started by an MPI launcher (or KILN_DIST_BACKEND=mpi), "
      "but kiln was built without MPI (configured with KILN_WITH_MPI=OFF, or CMake's "
      "find_package(MPI) found no MPI library). Install libopenmpi-dev (scripts/setup.sh does) "
      "and reconfigure, or run without mpiexec for a single process");
}
void finalize_mpi() {}
void abort_mpi(int) {}

#else

namespace {

// Set while kiln owns a running MPI (initialised by make_mpi, not yet finalized).
bool g_owned = false;
bool g_running = false;
int g_rank = 0, g_size = 1;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

std::string where() { return "rank " + std::to_string(g_rank) + " of " + std::to_string(g_size); }

void check(int code, const std::string& what) {
  if (code != MPI_SUCCESS) {
    throw DistError("[dist." + what.substr(0, what.find(' ')) + "] " + where() + ": " + what +
                    " failed: " + mpi_error(code));
  }
}

// An uncaught exception on any rank ends the job with the rank's message; without this the
// other ranks would wait in their next collective until the timeout.
void on_terminate() {
  std::string why = "terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& error) {
      why = std::string("uncaught exception: ") + error.what();
    } catch (...) {
      why = "uncaught exception of an unknown type";
    }
  }
  dist::abort(where() + ": " + why + "; aborting the job");
}

// A rank that leaves (exit(), or a return from main) without dist::finalize() would leave the
// others waiting in their next collective; ending the job names the rank instead.
void on_exit() {
  if (!g_running) return;
  dist::abort(where() +
              ": the process is exiting without dist::finalize() (an exit() or a "
              "return from main while the job runs; end with dist::finalize() or a "
              "dist::Session); aborting the job so that the other ranks do not wait");
}

// Steps of one collective: each starts a nonblocking MPI call; done() tests the current
// request and starts the next step once it completes, then runs `finish`.
class MpiWork : public Work {
 public:
  using Step = std::function<int(MPI_Request*)>;
  explicit MpiWork(std::string what) : what_(std::move(what)) {}

  bool done() override {
    for (;;) {
      if (request_ != MPI_REQUEST_NULL) {
        int flag = 0;
        check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), what_);
        if (!flag) return false;
      }
      if (next_ < steps.size()) {
        check(steps[next_++](&request_), what_);
        continue;
      }
      if (finish) {
        finish();
        finish = nullptr;
      }
      return true;
    }
  }

  std::vector<Step> steps;
  std::function<void()> finish;
  std::vector<char> stage, shard;  // staging buffers that live as long as the collective

 private:
  std::string what_;
  size_t next_ = 0;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// The MPI type a floating dtype is reduced in, and its element size.
MPI_Datatype reduce_type(DType dtype) { return dtype == DType::Float64 ? MPI_DOUBLE : MPI_FLOAT; }
size_t reduce_size(DType dtype) { return dtype == DType::Float64 ? 8 : 4; }

// Converts n elements of `dtype` at `in` into the reduce type at `out`, and back.
void to_stage(const void* in, void* out, int64_t n, DType dtype) {
  float* f = static_cast<float*>(out);
  if (dtype == DType::BFloat16) {
    const auto* h = static_cast<const BFloat16*>(in);
    for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(h[i]);
  } else if (dtype == DType::Float16) {
    const auto* h = static_cast<const Half*>(in);
    for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(h[i]);
  } else {
    std::memcpy(out, in, static_cast<size_t>(n) * reduce_size(dtype));
  }
}
void from_stage(const void* in, void* out, int64_t n, DType dtype) {
  const float* f = static_cast<const float*>(in);
  if (dtype == DType::BFloat16) {
    auto* h = static_cast<BFloat16*>(out);
    for (int64_t i = 0; i < n; ++i) h[i] = BFloat16(f[i]);
  } else if (dtype == DType::Float16) {
    auto* h = static_cast<Half*>(out);
    for (int64_t i = 0; i < n; ++i) h[i] = Half(f[i]);
  } else {
    std::memcpy(out, in, static_cast<size_t>(n) * reduce_size(dtype));
  }
}
void divide(void* data, int64_t n, DType dtype, int by) {
  if (dtype == DType::Float64) {
    double* d = static_cast<double*>(data);
    for (int64_t i = 0; i < n; ++i) d[i] /= by;
  } else {
    float* f = static_cast<float*>(data);
    const float b = static_cast<float>(by);
    for (int64_t i = 0; i < n; ++i) f[i] /= b;
  }
}

std::string describe(const char* op, int64_t count, DType dtype) {
  return std::string(op) + " of " + std::to_string(count) + " " + std::string(dtype_name(dtype));
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int local_rank) : comm_(comm), local_rank_(local_rank) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    if (g_running) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  const char* backend() const override { return "mpi"; }
  Device::Kind memory_kind() const override { return Device::Kind::CPU; }

  std::unique_ptr<Work> start_all_reduce(const void* in, void* out, int64_t count, DType dtype,
                                         ReduceOp op) override {
    auto w = std::make_unique<MpiWork>(describe("all_reduce", count, dtype));
    if (dtype == DType::Int64) {
      const int n = checked_count(count, "all_reduce");
      w->steps.push_back([=, this](MPI_Request* r) {
        return MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, n, MPI_INT64_T, MPI_SUM, comm_,
                              r);
      });
      return w;
    }
    const int64_t block = (count + size_ - 1) / size_;
    const int n = checked_count(block, "all_reduce");
    const size_t es = reduce_size(dtype);
    w->stage.assign(static_cast<size_t>(block * size_) * es, 0);
    w->shard.resize(static_cast<size_t>(block) * es);
    to_stage(in, w->stage.data(), count, dtype);
    MpiWork* p = w.get();
    const MPI_Datatype type = reduce_type(dtype);
    w->steps.push_back([=, this](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(p->stage.data(), p->shard.data(), n, type, MPI_SUM, comm_,
                                       r);
    });
    w->steps.push_back([=, this](MPI_Request* r) {
      if (op == ReduceOp::Average) divide(p->shard.data(), block, dtype, size_);
      return MPI_Iallgather(p->shard.data(), n, type, p->stage.data(), n, type, comm_, r);
    });
    w->finish = [=] { from_stage(p->stage.data(), out, count, dtype); };
    return w;
  }

  std::unique_ptr<Work> start_reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                             ReduceOp op) override {
    auto w = std::make_unique<MpiWork>(describe("reduce_scatter", count * size_, dtype));
    const int n = checked_count(count, "reduce_scatter");
    if (dtype == DType::Int64) {
      w->steps.push_back([=, this](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(in, out, n, MPI_INT64_T, MPI_SUM, comm_, r);
      });
      return w;
    }
    const size_t es = reduce_size(dtype);
    w->stage.resize(static_cast<size_t>(count * size_) * es);
    w->shard.resize(static_cast<size_t>(count) * es);
    to_stage(in, w->stage.data(), count * size_, dtype);
    MpiWork* p = w.get();
    const MPI_Datatype type = reduce_type(dtype);
    w->steps.push_back([=, this](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(p->stage.data(), p->shard.data(), n, type, MPI_SUM, comm_,
                                       r);
    });
    w->finish = [=, this] {
      if (op == ReduceOp::Average) divide(p->shard.data(), count, dtype, size_);
      from_stage(p->shard.data(), out, count, dtype);
    };
    return w;
  }

  std::unique_ptr<Work> start_all_gather(const void* in, void* out, int64_t bytes) override {
    auto w = std::make_unique<MpiWork>("all_gather of " + std::to_string(bytes) + " bytes");
    const int n = checked_count(bytes, "all_gather");
    w->steps.push_back([=, this](MPI_Request* r) {
      return MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_, r);
    });
    return w;
  }

  std::unique_ptr<Work> start_broadcast(const void* in, void* out, int64_t bytes,
                                        int root) override {
    if (root < 0 || root >= size_) {
      throw ValueError("[dist.broadcast] root " + std::to_string(root) + " is not a rank of " +
                       "a job of " + std::to_string(size_));
    }
    auto w = std::make_unique<MpiWork>("broadcast of " + std::to_string(bytes) + " bytes");
    const int n = checked_count(bytes, "broadcast");
    if (rank_ == root && in != out && bytes > 0) std::memcpy(out, in, static_cast<size_t>(bytes));
    w->steps.push_back(
        [=, this](MPI_Request* r) { return MPI_Ibcast(out, n, MPI_BYTE, root, comm_, r); });
    return w;
  }

  std::unique_ptr<Work> start_barrier() override {
    auto w = std::make_unique<MpiWork>("barrier");
    w->steps.push_back([this](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
    return w;
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // Serialized: kiln calls MPI from whichever thread runs a collective, one at a time.
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) {
      throw DistError("[dist.world] MPI_Init_thread failed: " + mpi_error(rc));
    }
    g_owned = true;
  }
  // kiln's own copy of the world, so its messages never match a host application's.
  MPI_Comm comm = MPI_COMM_NULL;
  if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm); rc != MPI_SUCCESS) {
    throw DistError("[dist.world] MPI_Comm_dup failed: " + mpi_error(rc));
  }
  // Errors come back as codes that become DistErrors naming the call, not as aborts.
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &g_rank);
  MPI_Comm_size(comm, &g_size);
  int local_rank = 0;
  MPI_Comm local = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
  }
  g_running = true;
  if (g_owned) {
    std::set_terminate(on_terminate);
    std::atexit(on_exit);
  }
  return std::make_unique<MpiCommunicator>(comm, local_rank);
}

void finalize_mpi() {
  if (!g_running) return;
  g_running = false;
  if (g_owned) MPI_Finalize();
}

void abort_mpi(int code) {
  if (g_running) MPI_Abort(MPI_COMM_WORLD, code);
}

#endif

}  // namespace kiln::dist::detail
