#pragma once
// kiln::dist — collectives over the ranks of a job, on kiln Tensors.
//
// One Communicator interface, three backends: Open MPI for host tensors (the job's world
// when started by `mpiexec`/`srun`), NCCL for CUDA tensors (libnccl opened at run time and
// bootstrapped through MPI), and a single-process backend (size 1, every collective an
// identity) so the same program runs without a launcher.
//
// Results are new, evaluated tensors with no gradient history: a collective is a side
// effect between processes, so it never enters the lazy graph (it could not be fused,
// duplicated or recomputed) and autograd does not flow through it. Write a result back with
// Tensor::assign (parameters) or Tensor::set_grad (gradients); docs/distributed.md shows how.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "../core/error.h"
#include "../core/tensor.h"

namespace kiln::dist {

/// A collective failed, the ranks disagree (shapes, dtypes, models), or a backend is missing.
class DistError : public Error {
  using Error::Error;
};
/// A collective did not complete within KILN_DIST_TIMEOUT seconds (another rank failed,
/// stalled or called a different collective). The job cannot continue after it.
class TimeoutError : public DistError {
  using DistError::DistError;
};

/// How reductions combine: the sum, or the sum divided by the number of ranks (floating
/// dtypes only).
enum class ReduceOp { Sum, Average };
/// "sum" or "average".
const char* reduce_op_name(ReduceOp op);

/// A collective in flight on a backend. done() makes progress and says whether it finished;
/// it throws DistError when the backend reports a failure.
class Work {
 public:
  virtual ~Work() = default;
  /// Makes progress; true once the collective has completed (its output is then valid).
  virtual bool done() = 0;
};

class PendingTensor;

/// The ranks of a job and the collectives between them. Tensor collectives validate their
/// input (dtype, and that every rank passes the same shape and dtype), evaluate it, and
/// return a new evaluated tensor on the input's device.
class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This process's rank in [0, size()).
  virtual int rank() const = 0;
  /// Number of ranks.
  virtual int size() const = 0;
  /// Rank among the ranks on this machine (pick the CUDA device with it).
  virtual int local_rank() const = 0;
  /// "single", "mpi" or "nccl".
  virtual const char* backend() const = 0;
  /// Where the buffers of the buffer-level calls below live (cpu for single and MPI).
  virtual Device::Kind memory_kind() const = 0;

  /// The elementwise sum (or average) of `x` over all ranks, on every rank. float32,
  /// float64, bfloat16, float16 and int64 (sum only); bit-identical on every rank.
  Tensor all_reduce(const Tensor& x, ReduceOp op = ReduceOp::Sum);
  /// Reduces `x` ([size()*k, ...] on every rank) and returns this rank's block of k rows.
  Tensor reduce_scatter(const Tensor& x, ReduceOp op = ReduceOp::Sum);
  /// Concatenates every rank's `x` ([k, ...], the same shape everywhere) along axis 0, in
  /// rank order: [size()*k, ...]. Any dtype.
  Tensor all_gather(const Tensor& x);
  /// Rank `root`'s `x` on every rank (same shape and dtype everywhere). Any dtype.
  Tensor broadcast(const Tensor& x, int root = 0);
  /// Returns when every rank has called barrier() (or throws TimeoutError).
  void barrier();
  /// all_reduce() started without waiting; PendingTensor::wait() returns the result. Used to
  /// keep several reductions in flight (DataParallel's buckets). Skips the shape agreement
  /// check, so every rank must pass the same shape and dtype.
  PendingTensor all_reduce_async(const Tensor& x, ReduceOp op = ReduceOp::Average);

  // --- Buffer level: the backends' primitives. Counts are elements of `dtype`; `in` may
  // equal `out`. Buffers are in memory_kind()'s memory and must stay alive until the Work
  // is done. Nothing is validated across ranks here.
  /// out = reduction of every rank's `in` (count elements).
  virtual std::unique_ptr<Work> start_all_reduce(const void* in, void* out, int64_t count,
                                                 DType dtype, ReduceOp op) = 0;
  /// out (count elements) = this rank's block of the reduction of `in` (size()*count).
  virtual std::unique_ptr<Work> start_reduce_scatter(const void* in, void* out, int64_t count,
                                                     DType dtype, ReduceOp op) = 0;
  /// out (size()*bytes) = every rank's `in` (bytes), in rank order.
  virtual std::unique_ptr<Work> start_all_gather(const void* in, void* out, int64_t bytes) = 0;
  /// out (bytes) = rank root's `in`.
  virtual std::unique_ptr<Work> start_broadcast(const void* in, void* out, int64_t bytes,
                                                int root) = 0;
  /// Completes once every rank has started a barrier.
  virtual std::unique_ptr<Work> start_barrier() = 0;
  /// Polls `work` until done, or throws TimeoutError after KILN_DIST_TIMEOUT seconds
  /// (default 300); `what` names the call in messages ("all_reduce of float32[1024]").
  void wait(Work& work, const std::string& what);

  /// "rank 1 of 4" for messages.
  std::string where() const;

 protected:
  Communicator() = default;
  /// The NCCL communicator this (host) communicator bootstraps for CUDA device `index`,
  /// made on first use.
  Communicator& cuda_peer(int index);
  /// The host communicator over the same ranks (itself, or the one NCCL bootstrapped
  /// through): the shape agreement check runs on it.
  virtual Communicator& host() { return *this; }

 private:
  friend class PendingTensor;
  // Which communicator runs a collective on a tensor of `device`: this one, a CUDA peer,
  // or none (nullptr: size 1 and another memory, where the collective is an identity).
  Communicator* route(const char* op, Device device);
  void check_same_on_all_ranks(const char* op, const Tensor& x, int64_t extra);

  std::mutex peers_mutex_;
  std::map<int, std::unique_ptr<Communicator>> cuda_peers_;
};

/// A reduction in flight (Communicator::all_reduce_async).
class PendingTensor {
 public:
  PendingTensor(PendingTensor&&) noexcept;
  PendingTensor& operator=(PendingTensor&&) noexcept;
  ~PendingTensor();
  /// Waits for the reduction (or throws TimeoutError) and returns its result.
  Tensor wait();

 private:
  friend class Communicator;
  struct State;
  explicit PendingTensor(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// The job's communicator, made on first use: MPI when the process was started by a
/// launcher (mpiexec, srun: OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is set), else the
/// single-process one; KILN_DIST_BACKEND=single|mpi overrides. Throws DistError when the
/// launcher asks for MPI and kiln was built without it.
Communicator& world();
/// The single-process communicator (size 1), whatever the launcher.
Communicator& single_process();
/// True when kiln was built with the MPI backend.
bool mpi_available();
/// True when the environment says a launcher started several ranks (or KILN_DIST_BACKEND=mpi).
bool launched_by_mpi();

/// A NCCL communicator over the ranks of `bootstrap` for CUDA device `device` (NCCL's
/// unique id is broadcast from rank 0 through `bootstrap`). Throws DistError when libnccl
/// cannot be loaded (KILN_NCCL_LIBRARY names another file) and DeviceError without a
/// usable CUDA device. Communicator::all_reduce and friends make one by themselves for
/// CUDA tensors.
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device);

/// Ends the MPI part of the job normally (MPI_Finalize); later world() calls throw. A job
/// started by a launcher must reach this (or a Session's end): a rank that exits without it
/// aborts the job, so that the other ranks do not wait for it.
void finalize();
/// Prints "[kiln.dist] <why>" and ends the whole job with `code` (MPI_Abort);
/// without MPI it exits the process with `code`.
[[noreturn]] void abort(const std::string& why, int code = 1);

/// Starts the job's communicator (world()) and finalizes it when it goes out of scope; if
/// an exception leaves the scope of a job of several ranks, the whole job is aborted
/// instead so that no rank hangs (catch it inside and call dist::abort to print it).
class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  Communicator& comm() const { return *comm_; }

 private:
  Communicator* comm_;
  int exceptions_;
};

}  // namespace kiln::dist
