#include "communicator.h"

#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

#include "../core/settings.h"
#include "backends.h"

namespace kiln::dist {
namespace {

std::string tag(const char* op) { return std::string("[dist.") + op + "] "; }

std::string describe(const Tensor& x) {
  return std::string(dtype_name(x.dtype())) + shape_str(x.shape());
}

void check_defined(const char* op, const Tensor& x) {
  if (!x.defined()) throw ValueError(tag(op) + "got an undefined tensor");
}

// The dtypes every backend reduces: MPI natively or through float32, NCCL natively.
void check_reduction(const char* op, const Tensor& x, ReduceOp reduce) {
  check_defined(op, x);
  const DType d = x.dtype();
  if (d != DType::Float32 && d != DType::Float64 && d != DType::BFloat16 && d != DType::Float16 &&
      d != DType::Int64) {
    throw DTypeError(tag(op) +
                     "reduces float32, float64, bfloat16, float16 and int64 tensors, "
                     "got " +
                     describe(x));
  }
  if (reduce == ReduceOp::Average && !is_floating(d)) {
    throw DTypeError(tag(op) + "average needs a floating dtype, got " + describe(x) +
                     "; use ReduceOp::Sum and divide");
  }
}

// The evaluated input and a fresh output buffer, with the pointers a backend reads and
// writes. CUDA buffers are pinned on the device (Buffer::Use) until the collective is done.
struct Operands {
  Tensor input;
  std::shared_ptr<Buffer> output;
  std::vector<Buffer::Use> uses;
  const void* in = nullptr;
  void* out = nullptr;
};

Operands prepare(const Tensor& x, size_t out_bytes) {
  Operands o;
  x.eval();
  o.input = x;
  const Device device = x.device();
  o.output = std::make_shared<Buffer>(out_bytes, device);
  const Buffer& in = *x.node()->buffer;
  if (device.is_cuda()) {
    o.uses.emplace_back(in, false);
    o.in = o.uses.back().data();
    o.uses.emplace_back(*o.output, true);
    o.out = o.uses.back().data();
  } else {
    o.in = in.data();
    o.out = o.output->data();
  }
  return o;
}

Tensor identity(const Tensor& x) {
  x.eval();
  return x.detach();
}

// Waits for a collective on the operands' buffers. If the wait fails (a timeout), the
// backend may still write into them later, so they and the request are leaked on purpose:
// the job cannot continue anyway, and freed memory must never be written.
void finish(Communicator& c, std::unique_ptr<Work> work, Operands& o, const std::string& what) {
  try {
    c.wait(*work, what);
  } catch (...) {
    (void)work.release();
    (void)new Operands(std::move(o));
    throw;
  }
}

}  // namespace

// Results never join the lazy graph (see the header), so later graphs read them like any
// other constant.
Tensor detail::constant_from(std::shared_ptr<Buffer> buffer, const Shape& shape, DType dtype,
                             Device device) {
  auto node =
      std::make_shared<Node>(OpCode::Constant, std::vector<NodePtr>{}, shape, dtype, device);
  node->origin = "dist";
  node->buffer = std::move(buffer);
  return Tensor(std::move(node));
}

struct PendingTensor::State {
  Communicator* comm = nullptr;
  std::unique_ptr<Work> work;  // null once waited for (or for an identity)
  std::string what;
  Tensor input;
  std::vector<Buffer::Use> uses;
  Tensor result;
};

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "average"; }

Communicator::~Communicator() = default;

std::string Communicator::where() const {
  return "rank " + std::to_string(rank()) + " of " + std::to_string(size());
}

void Communicator::wait(Work& work, const std::string& what) {
  using clock = std::chrono::steady_clock;
  const double limit = detail::timeout_seconds();
  const auto start = clock::now();
  // MPI's nonblocking collectives move only while a rank polls them: a 7 MB all-reduce
  // crosses shared memory in hundreds of fragments, each waiting for both ranks' next poll.
  // Sleeping between polls therefore stalled the peers too (a 2-rank MLP step took 32 ms of
  // wall time for 22 ms of CPU time; 18-25 ms for the same CPU time polling continuously).
  // A waiting rank polls without pause for its first 50 ms, yielding the core between polls
  // to any runnable thread (oversubscribed ranks still compute), and only then with short
  // sleeps, as for a peer that is still far from the collective.
  constexpr double kPollWithoutSleep = 0.05;
  double waited = 0;
  for (int polls = 1; !work.done(); ++polls) {
    if (waited < kPollWithoutSleep) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(waited < 1.0 ? 20 : 200));
    }
    if ((polls & 63) != 0 && waited < kPollWithoutSleep) continue;
    waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > limit) {
      const std::string op = what.substr(0, what.find(' '));
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", limit);
      throw TimeoutError(tag(op.c_str()) + where() + ": " + what + " did not complete within " +
                         seconds +
                         " s (KILN_DIST_TIMEOUT): another rank failed, stalled or "
                         "called a different collective; the job cannot continue");
    }
  }
}

Communicator& Communicator::cuda_peer(int index) {
  std::lock_guard<std::mutex> lock(peers_mutex_);
  auto it = cuda_peers_.find(index);
  if (it == cuda_peers_.end()) it = cuda_peers_.emplace(index, make_nccl(*this, index)).first;
  return *it->second;
}

Communicator* Communicator::route(const char* op, Device device) {
  if ((device.is_cuda() ? Device::Kind::CUDA : Device::Kind::CPU) == memory_kind()) return this;
  if (device.is_cuda() && memory_kind() == Device::Kind::CPU) {
    if (size() == 1) return nullptr;
    return &cuda_peer(device.index);
  }
  throw DeviceError(tag(op) + "the " + backend() + " communicator moves " +
                    (memory_kind() == Device::Kind::CUDA ? "CUDA" : "host") +
                    " tensors only, got a tensor on " + device.str() +
                    "; use dist::world() for host tensors");
}

// Every rank must pass the same dtype and shape, or MPI would truncate or wait forever:
// one small all-gather of each rank's signature turns a mismatch into an error on every
// rank that names each rank's tensor.
void Communicator::check_same_on_all_ranks(const char* op, const Tensor& x, int64_t extra) {
  if (size() == 1) return;
  constexpr int kDims = 6;
  std::vector<int64_t> mine(kDims + 3, -1);
  mine[0] = static_cast<int64_t>(x.dtype());
  mine[1] = x.ndim();
  mine[2] = extra;
  for (int i = 0; i < x.ndim(); ++i) {
    if (i < kDims) {
      mine[3 + i] = x.shape()[i];
    } else {
      mine[3 + kDims - 1] = mine[3 + kDims - 1] * 1000003 + x.shape()[i];
    }
  }
  const int64_t bytes = static_cast<int64_t>(mine.size() * sizeof(int64_t));
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(size()));
  Communicator& h = host();
  auto work = h.start_all_gather(mine.data(), all.data(), bytes);
  h.wait(*work, std::string(op) + " (agreeing on shapes)");
  bool same = true;
  for (int r = 0; r < size(); ++r) {
    for (size_t i = 0; i < mine.size(); ++i) same = same && all[r * mine.size() + i] == mine[i];
  }
  if (same) return;
  const bool is_broadcast = std::string(op) == "broadcast";
  const bool is_gather = std::string(op) == "all_gather";
  std::string ranks;
  for (int r = 0; r < size(); ++r) {
    const int64_t* s = &all[r * mine.size()];
    Shape shape;
    for (int64_t i = 0; i < std::min<int64_t>(s[1], kDims); ++i) shape.push_back(s[3 + i]);
    ranks += (r ? ", rank " : "rank ") + std::to_string(r) + " " +
             std::string(dtype_name(static_cast<DType>(s[0]))) + shape_str(shape) +
             (s[1] > kDims ? "(+" + std::to_string(s[1] - kDims) + " dims)" : "");
    if (s[2] != mine[2]) {
      ranks += is_broadcast ? " (root " + std::to_string(s[2]) + ")"
                            : std::string(" (") + reduce_op_name(static_cast<ReduceOp>(s[2])) + ")";
    }
  }
  throw DistError(tag(op) + where() + ": every rank must pass the same dtype and shape" +
                  (is_broadcast ? " and root"
                   : is_gather  ? ""
                                : " and reduction") +
                  "; got " + ranks);
}

Tensor Communicator::all_reduce(const Tensor& x, ReduceOp op) {
  check_reduction("all_reduce", x, op);
  Communicator* c = route("all_reduce", x.device());
  check_same_on_all_ranks("all_reduce", x, static_cast<int64_t>(op));
  if (c == nullptr) return identity(x);
  return c->all_reduce_async(x, op).wait();
}

PendingTensor Communicator::all_reduce_async(const Tensor& x, ReduceOp op) {
  check_reduction("all_reduce", x, op);
  Communicator* c = route("all_reduce", x.device());
  auto state = std::make_unique<PendingTensor::State>();
  if (c == nullptr) {
    state->result = identity(x);
    return PendingTensor(std::move(state));
  }
  Operands o = prepare(x, x.node()->nbytes());
  state->work = c->start_all_reduce(o.in, o.out, x.numel(), x.dtype(), op);
  state->comm = c;
  state->what = "all_reduce of " + describe(x);
  state->input = o.input;
  state->uses = std::move(o.uses);
  state->result = detail::constant_from(o.output, x.shape(), x.dtype(), x.device());
  return PendingTensor(std::move(state));
}

Tensor Communicator::reduce_scatter(const Tensor& x, ReduceOp op) {
  check_reduction("reduce_scatter", x, op);
  if (x.ndim() < 1 || x.size(0) % size() != 0) {
    throw ShapeError(tag("reduce_scatter") + where() + ": the first dimension must divide " +
                     "into " + std::to_string(size()) + " equal blocks, got " + describe(x));
  }
  Communicator* c = route("reduce_scatter", x.device());
  check_same_on_all_ranks("reduce_scatter", x, static_cast<int64_t>(op));
  if (c == nullptr) return identity(x);
  Shape shape = x.shape();
  shape[0] /= size();
  const int64_t count = numel(shape);
  Operands o = prepare(x, static_cast<size_t>(count) * itemsize(x.dtype()));
  auto work = c->start_reduce_scatter(o.in, o.out, count, x.dtype(), op);
  finish(*c, std::move(work), o, "reduce_scatter of " + describe(x));
  return detail::constant_from(o.output, shape, x.dtype(), x.device());
}

Tensor Communicator::all_gather(const Tensor& x) {
  check_defined("all_gather", x);
  if (x.ndim() < 1) {
    throw ShapeError(tag("all_gather") +
                     "concatenates along axis 0, so it needs a tensor of "
                     "rank >= 1, got " +
                     describe(x) + "; reshape it to [1]");
  }
  Communicator* c = route("all_gather", x.device());
  check_same_on_all_ranks("all_gather", x, 0);
  if (c == nullptr) return identity(x);
  Shape shape = x.shape();
  shape[0] *= size();
  const int64_t bytes = static_cast<int64_t>(x.node()->nbytes());
  Operands o = prepare(x, static_cast<size_t>(bytes) * static_cast<size_t>(size()));
  auto work = c->start_all_gather(o.in, o.out, bytes);
  finish(*c, std::move(work), o, "all_gather of " + describe(x));
  return detail::constant_from(o.output, shape, x.dtype(), x.device());
}

Tensor Communicator::broadcast(const Tensor& x, int root) {
  check_defined("broadcast", x);
  if (root < 0 || root >= size()) {
    throw ValueError(tag("broadcast") + "root " + std::to_string(root) + " is not a rank of a " +
                     "job of " + std::to_string(size()) + " (expected 0.." +
                     std::to_string(size() - 1) + ")");
  }
  Communicator* c = route("broadcast", x.device());
  check_same_on_all_ranks("broadcast", x, root);
  if (c == nullptr) return identity(x);
  const int64_t bytes = static_cast<int64_t>(x.node()->nbytes());
  Operands o = prepare(x, static_cast<size_t>(bytes));
  auto work = c->start_broadcast(o.in, o.out, bytes, root);
  finish(*c, std::move(work), o, "broadcast of " + describe(x));
  return detail::constant_from(o.output, x.shape(), x.dtype(), x.device());
}

void Communicator::barrier() {
  auto work = start_barrier();
  wait(*work, "barrier");
}

// --- PendingTensor ------------------------------------------------------------------------

PendingTensor::PendingTensor(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingTensor::PendingTensor(PendingTensor&&) noexcept = default;
PendingTensor& PendingTensor::operator=(PendingTensor&&) noexcept = default;

PendingTensor::~PendingTensor() {
  // The backend still writes into the output: it must finish before the buffers go.
  if (state_ && state_->work) {
    try {
      wait();
    } catch (const std::exception& e) {
      dist::abort(std::string("a collective dropped without wait() failed: ") + e.what());
    }
  }
}

Tensor PendingTensor::wait() {
  if (!state_) throw ValueError("[dist.wait] this PendingTensor was moved from");
  if (state_->work) {
    try {
      state_->comm->wait(*state_->work, state_->what);
    } catch (...) {
      // As finish(): the backend may still write into the buffers, which must outlive it.
      (void)state_.release();
      throw;
    }
    state_->work.reset();
    state_->uses.clear();
    state_->input = Tensor();
  }
  return state_->result;
}

// --- The job's communicator -----------------------------------------------------------------

namespace {

struct WorldState {
  std::mutex mutex;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> single;
  bool finalized = false;
};

// Never destroyed: ranks may still use it from static destructors, and MPI must not be torn
// down by the C++ runtime in an order of its choosing.
WorldState& world_state() {
  static WorldState* state = new WorldState;
  return *state;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

}  // namespace

bool launched_by_mpi() {
  const auto choice = settings::choice("KILN_DIST_BACKEND", {"auto", "single", "mpi"});
  if (choice && *choice != "auto") return *choice == "mpi";
  // Open MPI's mpiexec, PMI-1/2 launchers (MPICH's hydra, Slurm's srun --mpi=pmi2) and PMIx
  // launchers (srun --mpi=pmix, prterun) each set one of these in every rank.
  return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMI_SIZE") || env_set("PMIX_RANK");
}

Communicator& world() {
  WorldState& s = world_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.finalized) {
    throw DistError("[dist.world] dist::finalize() already ended this rank's part of the job");
  }
  if (!s.world) s.world = launched_by_mpi() ? detail::make_mpi() : detail::make_single_process();
  return *s.world;
}

Communicator& single_process() {
  WorldState& s = world_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.single) s.single = detail::make_single_process();
  return *s.single;
}

void finalize() {
  WorldState& s = world_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.finalized) return;
  s.finalized = true;
  // NCCL communicators (peers of the world) go before MPI, which they were bootstrapped by.
  s.world.reset();
  detail::finalize_mpi();
}

void abort(const std::string& why, int code) {
  std::fflush(stdout);
  std::fprintf(stderr, "[kiln.dist] %s\n", why.c_str());
  std::fflush(stderr);
  detail::abort_mpi(code);
  std::_Exit(code);
}

Session::Session() : comm_(&world()), exceptions_(std::uncaught_exceptions()) {}

Session::~Session() {
  // Alone, a rank can leave with its exception (the caller reports it); in a job the others
  // would wait for it in their next collective.
  if (std::uncaught_exceptions() > exceptions_ && comm_->size() > 1) {
    dist::abort(comm_->where() +
                ": an exception is leaving dist::Session's scope; aborting "
                "the job so that the other ranks do not wait");
  }
  finalize();
}

namespace detail {

double timeout_seconds() {
  const auto t = settings::real("KILN_DIST_TIMEOUT", 0);
  if (t && *t <= 0) settings::reject("KILN_DIST_TIMEOUT", "0", "(it must be above 0)");
  return t.value_or(300.0);
}

int checked_count(int64_t count, const std::string& what) {
  if (count > INT32_MAX) {
    throw DistError("[dist] " + what + " moves " + std::to_string(count) +
                    " elements in one call; the MPI backend takes at most 2^31-1 per call");
  }
  return static_cast<int>(count);
}

}  // namespace detail
}  // namespace kiln::dist
