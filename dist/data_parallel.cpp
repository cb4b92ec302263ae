#include "data_parallel.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <unordered_map>

#include "../core/evaluation_listener.h"
#include "../memory/pools/budget.h"
#include "../memory/reports/rank_bytes.h"
#include "../ops/ops.h"
#include "backends.h"
#include "flat.h"

namespace kiln::dist {
namespace {

// FNV-1a over bytes: cheap, and any differing bit changes it.
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// One int64 per rank, gathered on the host (whatever the default device).
std::vector<int64_t> gather_int64(Communicator& comm, int64_t value) {
  return comm.all_gather(from_vector<int64_t>({value}, {1}, Device::cpu())).to_vector<int64_t>();
}

// Starts each bucket's all-reduce while the backward pass is still running: the executor
// announces each gradient once its kernel has run, and a bucket whose gradients are all
// there is copied into one flat message and started. Buckets start strictly in order, so
// every rank starts the same collectives in the same order whatever order its kernels
// finish in (MPI requires it). Between kernels the collectives in flight are polled, since
// MPI's nonblocking collectives move only when polled. Gradients the executor does not
// announce (values known before the evaluation, or attached only at its end) are read
// after it, and the remaining buckets start then.
class BucketLauncher final : public EvaluationListener {
 public:
  BucketLauncher(Communicator& comm, const std::vector<std::vector<Tensor>>& grads)
      : comm_(&comm), grads_(&grads), flights_(grads.size()) {
    for (size_t b = 0; b < grads.size(); ++b) {
      Flight& f = flights_[b];
      f.values.resize(grads[b].size());
      f.missing = grads[b].size();
      for (size_t i = 0; i < grads[b].size(); ++i) {
        const Tensor& g = grads[b][i];
        slots_[g.node().get()].push_back({b, i});
        f.count += g.numel();
      }
    }
  }

  void value_ready(const Node& requested, const std::shared_ptr<Buffer>& value) override {
    auto it = slots_.find(&requested);
    if (it == slots_.end()) return;
    for (const auto& [b, i] : it->second) {
      Flight& f = flights_[b];
      if (f.values[i]) continue;
      f.values[i] = value;
      --f.missing;
    }
    start_ready();
  }

  void kernel_done() override { poll(); }

  // A collective that did not finish (an error or a timeout ended the synchronisation) may
  // still write into its buffers, so those are leaked on purpose, as Communicator's own
  // collectives do: the job cannot continue anyway, and freed memory must never be written.
  ~BucketLauncher() override {
    for (size_t b = polled_; b < next_; ++b) (void)new Flight(std::move(flights_[b]));
  }
  BucketLauncher(const BucketLauncher&) = delete;
  BucketLauncher& operator=(const BucketLauncher&) = delete;

  // Buckets started before the evaluation returned.
  size_t started() const { return next_; }

  // After the evaluation: every gradient has its value; the rest of the buckets start.
  void start_rest() {
    for (size_t b = 0; b < flights_.size(); ++b) {
      Flight& f = flights_[b];
      for (size_t i = 0; i < f.values.size(); ++i) {
        if (!f.values[i]) f.values[i] = (*grads_)[b][i].node()->buffer;
      }
      f.missing = 0;
    }
    start_ready();
    if (error_) std::rethrow_exception(error_);
  }

  // Waits for bucket b's average (TimeoutError after KILN_DIST_TIMEOUT) and returns it.
  Tensor wait(size_t b) {
    Flight& f = flights_[b];
    comm_->wait(*f.work, f.what);
    polled_ = std::max(polled_, b + 1);
    f.flat.reset();
    const Tensor& first = (*grads_)[b].front();
    return detail::constant_from(f.out, {f.count}, first.dtype(), first.device());
  }

 private:
  struct Flight {
    std::vector<std::shared_ptr<Buffer>> values;
    size_t missing = 0;
    int64_t count = 0;
    std::shared_ptr<Buffer> flat, out;
    std::unique_ptr<Work> work;
    std::string what;
  };

  void start_ready() {
    while (!error_ && next_ < flights_.size() && flights_[next_].missing == 0) {
      try {
        start(next_);
      } catch (...) {
        error_ = std::current_exception();
      }
      ++next_;
    }
  }

  void start(size_t b) {
    Flight& f = flights_[b];
    const std::vector<Tensor>& pieces = (*grads_)[b];
    const DType dtype = pieces.front().dtype();
    const Device device = pieces.front().device();
    const size_t item = itemsize(dtype);
    f.flat = std::make_shared<Buffer>(static_cast<size_t>(f.count) * item, device);
    f.out = std::make_shared<Buffer>(static_cast<size_t>(f.count) * item, device);
    auto* at = static_cast<char*>(f.flat->host_data());
    for (size_t i = 0; i < pieces.size(); ++i) {
      const size_t bytes = static_cast<size_t>(pieces[i].numel()) * item;
      std::memcpy(at, f.values[i]->host_data(), bytes);
      at += bytes;
      f.values[i].reset();
    }
    f.what = "all_reduce of " + std::string(dtype_name(dtype)) + "[" + std::to_string(f.count) +
             "] (gradient bucket " + std::to_string(b) + ")";
    f.work =
        comm_->start_all_reduce(f.flat->data(), f.out->data(), f.count, dtype, ReduceOp::Average);
  }

  // Advances the oldest unfinished collective, and the next once it is done: a backend may
  // run a collective as several steps, each started when the last completes, so
  // advancing only the oldest keeps every rank's sequence of MPI calls the same.
  void poll() {
    try {
      while (!error_ && polled_ < next_ && flights_[polled_].work->done()) ++polled_;
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  Communicator* comm_;
  const std::vector<std::vector<Tensor>>* grads_;
  std::vector<Flight> flights_;
  std::unordered_map<const Node*, std::vector<std::pair<size_t, size_t>>> slots_;
  size_t next_ = 0;    // buckets before it have started
  size_t polled_ = 0;  // buckets before it have finished
  std::exception_ptr error_;
};

}  // namespace

DataParallel::DataParallel(nn::Module& module, Communicator& comm, DataParallelOptions options)
    : module_(&module), comm_(&comm), options_(options), params_(module.parameters()) {
  if (options_.bucket_bytes == 0 || options_.first_bucket_bytes == 0) {
    throw ValueError("[DataParallel] bucket_bytes and first_bucket_bytes must be > 0, got " +
                     std::to_string(options_.bucket_bytes) + " and " +
                     std::to_string(options_.first_bucket_bytes));
  }
  check_same_model();
  {
    NoGradGuard no_grad;
    for (Tensor& p : params_) p.assign(comm_->broadcast(p, 0));
  }
  if (options_.broadcast_buffers) broadcast_buffers();

  // Buckets follow the reverse registration order (PyTorch DDP's order: the last layers'
  // gradients are the first a backward pass produces) and never mix dtypes or devices, so
  // each is one flat tensor.
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const size_t b = p.node()->nbytes();
    const size_t limit = buckets_.size() == 1
                             ? std::min(options_.first_bucket_bytes, options_.bucket_bytes)
                             : options_.bucket_bytes;
    bool fresh = buckets_.empty() || bytes + b > limit;
    if (!fresh) {
      const Tensor& first = params_[buckets_.back().front()];
      fresh = first.dtype() != p.dtype() || !(first.device() == p.device());
    }
    if (fresh) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(k);
    bytes += b;
  }

  report_id_ = memory::add_rank_bytes_source([this] {
    memory::RankBytes r;
    r.holder = "DataParallel";
    r.rank = comm_->rank();
    r.ranks = comm_->size();
    for (const Tensor& p : params_) {
      r.parameters += p.node()->nbytes();
      const Tensor g = p.grad();
      if (g.defined()) r.gradients += g.node()->nbytes();
    }
    return r;
  });
}

DataParallel::~DataParallel() { memory::remove_rank_bytes_source(report_id_); }

// Ranks whose modules differ would exchange buffers of different sizes; a signature of
// every parameter's dtype, shape and device, compared first, names the problem instead.
void DataParallel::check_same_model() {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : params_) {
    const int64_t fields[] = {static_cast<int64_t>(p.dtype()), p.ndim(),
                              static_cast<int64_t>(p.device().kind)};
    h = fnv1a(fields, sizeof fields, h);
    h = fnv1a(p.shape().data(), p.shape().size() * sizeof(int64_t), h);
  }
  const std::vector<int64_t> hashes = gather_int64(*comm_, static_cast<int64_t>(h));
  const std::vector<int64_t> counts = gather_int64(*comm_, static_cast<int64_t>(params_.size()));
  std::string differ;
  for (int r = 1; r < comm_->size(); ++r) {
    if (hashes[r] != hashes[0]) {
      differ += (differ.empty() ? "rank " : ", rank ") + std::to_string(r) + " (" +
                std::to_string(counts[r]) + " parameters)";
    }
  }
  if (!differ.empty()) {
    throw DistError("[DataParallel] " + comm_->where() +
                    ": every rank must wrap a module with "
                    "the same parameter shapes, dtypes and devices; rank 0 (" +
                    std::to_string(counts[0]) + " parameters) differs from " + differ);
  }
}

void DataParallel::broadcast_buffers() {
  NoGradGuard no_grad;
  for (Tensor& b : module_->buffers()) b.assign(comm_->broadcast(b, 0));
}

void DataParallel::backward(const Tensor& loss) {
  loss.backward();
  synchronize_gradients();
}

void DataParallel::synchronize_gradients() {
  if (!synchronizing()) return;
  last_sync_ = {};
  if (reducer_) {
    reducer_();
    return;
  }
  if (comm_->size() == 1) return;
  NoGradGuard no_grad;
  std::vector<std::vector<Tensor>> grads(buckets_.size());
  std::vector<Tensor> all;
  bool host = comm_->memory_kind() == Device::Kind::CPU;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t k : buckets_[b]) {
      const Tensor& p = params_[k];
      Tensor g = p.grad();
      if (!g.defined()) g = zeros_like(p);
      if (g.dtype() != p.dtype()) g = cast(g, p.dtype());
      host = host && !p.device().is_cuda();
      grads[b].push_back(g);
      all.push_back(g);
    }
  }
  // Host buckets start their all-reduce during the backward pass (BucketLauncher). Not under
  // a memory budget: the plan holds the step's peak, and flat messages allocated while the
  // step's values are alive would add to it; there, and for CUDA tensors, the buckets start
  // once the evaluation has produced every gradient, and run concurrently.
  if (host && memory::budget(Device::cpu()) == 0) {
    BucketLauncher launcher(*comm_, grads);
    {
      ScopedEvaluationListener listen(launcher);
      eval(all);
    }
    all.clear();
    last_sync_ = {buckets_.size(), launcher.started()};
    launcher.start_rest();
    for (size_t b = 0; b < buckets_.size(); ++b) set_bucket_gradients(b, launcher.wait(b));
    return;
  }
  eval(all);
  all.clear();
  last_sync_ = {buckets_.size(), 0};
  std::vector<PendingTensor> pending;
  pending.reserve(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Tensor& first = params_[buckets_[b].front()];
    int64_t count = 0;
    for (const Tensor& g : grads[b]) count += g.numel();
    const Tensor flat = detail::flat_range(grads[b], 0, count, first.dtype(), first.device());
    grads[b].clear();
    pending.push_back(comm_->all_reduce_async(flat, ReduceOp::Average));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) set_bucket_gradients(b, pending[b].wait());
}

void DataParallel::set_bucket_gradients(size_t bucket, const Tensor& average) {
  int64_t offset = 0;
  for (size_t k : buckets_[bucket]) {
    Tensor& p = params_[k];
    p.set_grad(detail::flat_slice(average, offset, p.shape()));
    offset += p.numel();
  }
}

uint64_t DataParallel::parameter_hash() const {
  eval(params_);
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : params_) h = fnv1a(p.raw_data(), p.node()->nbytes(), h);
  return h;
}

void DataParallel::check_parameters_in_sync() {
  const std::vector<int64_t> hashes = gather_int64(*comm_, static_cast<int64_t>(parameter_hash()));
  std::string differ;
  for (int r = 1; r < comm_->size(); ++r) {
    if (hashes[r] != hashes[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!differ.empty()) {
    throw DistError("[DataParallel] " + comm_->where() + ": the parameters of rank(s) " + differ +
                    " differ from rank 0's (hashes of their bytes); the ranks no longer train "
                    "the same model");
  }
}

}  // namespace kiln::dist
