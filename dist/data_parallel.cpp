#include "data_parallel.h"

#include <cstring>
#include <string>

#include "../memory/reports/rank_bytes.h"
#include "../ops/ops.h"
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

}  // namespace

DataParallel::DataParallel(nn::Module& module, Communicator& comm, DataParallelOptions options)
    : module_(&module), comm_(&comm), options_(options), params_(module.parameters()) {
  if (options_.bucket_bytes == 0) {
    throw ValueError("[DataParallel] bucket_bytes must be > 0");
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
    bool fresh = buckets_.empty() || bytes + b > options_.bucket_bytes;
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
  if (reducer_) {
    reducer_();
    return;
  }
  if (comm_->size() == 1) return;
  NoGradGuard no_grad;
  // One evaluation computes every gradient (the backward pass: the executor runs it as a
  // whole, so communication starts once it is done); each bucket's gradients are then
  // copied into one flat message (dist/flat.h), and the buckets' all-reduces run
  // concurrently.
  std::vector<std::vector<Tensor>> grads(buckets_.size());
  std::vector<Tensor> all;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t k : buckets_[b]) {
      const Tensor& p = params_[k];
      Tensor g = p.grad();
      if (!g.defined()) g = zeros_like(p);
      if (g.dtype() != p.dtype()) g = cast(g, p.dtype());
      grads[b].push_back(g);
      all.push_back(g);
    }
  }
  eval(all);
  all.clear();
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
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Tensor average = pending[b].wait();
    int64_t offset = 0;
    for (size_t k : buckets_[b]) {
      Tensor& p = params_[k];
      p.set_grad(detail::flat_slice(average, offset, p.shape()));
      offset += p.numel();
    }
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
