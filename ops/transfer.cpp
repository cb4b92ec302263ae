#include "transfer.h"

#include <cstring>
#include <functional>
#include <unordered_map>

#include "../core/cuda_driver.h"

namespace kiln {
namespace {

// A pending node whose value depends on no stored data: sources other than constants, and
// ops over such nodes. Its value is the same wherever it is computed (Philox numbers are
// identical on CPU and CUDA), so moving it is free and exact.
bool data_free(const Node& root, std::unordered_map<const Node*, bool>& memo) {
  // Iterative: graphs can be 100,000 nodes deep.
  std::vector<std::pair<const Node*, size_t>> stack{{&root, 0}};
  auto leaf_answer = [](const Node& n) -> int {
    // A user kernel is compiled for its device: it is never rebuilt on another.
    if (n.is_evaluated() || n.op == OpCode::Constant || n.op == OpCode::Transfer ||
        n.op == OpCode::Custom || n.grad_leaf)
      return 0;
    return n.inputs.empty() ? 1 : -1;  // -1: depends on the inputs
  };
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (memo.count(n)) {
      stack.pop_back();
      continue;
    }
    int own = leaf_answer(*n);
    if (own >= 0) {
      memo[n] = own == 1;
      stack.pop_back();
      continue;
    }
    if (next < n->inputs.size()) {
      const Node* in = n->inputs[next++].get();
      auto it = memo.find(in);
      if (it == memo.end()) {
        stack.push_back({in, 0});
      } else if (!it->second) {
        memo[n] = false;
        stack.pop_back();
      }
      continue;
    }
    memo[n] = true;  // every input was data-free
    stack.pop_back();
  }
  return memo.at(&root);
}

NodePtr rebuild_on(const NodePtr& root, Device device,
                   std::unordered_map<const Node*, NodePtr>& done) {
  std::vector<std::pair<const NodePtr*, size_t>> stack{{&root, 0}};
  while (!stack.empty()) {
    auto& [np, next] = stack.back();
    const Node& n = **np;
    if (done.count(&n)) {
      stack.pop_back();
      continue;
    }
    if (next < n.inputs.size()) {
      const NodePtr& in = n.inputs[next++];
      if (!done.count(in.get())) stack.push_back({&in, 0});
      continue;
    }
    std::vector<NodePtr> inputs;
    for (const NodePtr& in : n.inputs) inputs.push_back(done.at(in.get()));
    NodePtr copy = n.with(n.op, std::move(inputs), device);
    done[&n] = std::move(copy);
    stack.pop_back();
  }
  return done.at(root.get());
}

}  // namespace

namespace detail {

Device align_devices(const char* op, std::vector<Tensor*> inputs) {
  // The common case, all on one device, costs one comparison per input.
  bool same = true;
  for (Tensor* t : inputs)
    same = same && (!t->defined() || !inputs[0]->defined() || t->device() == inputs[0]->device());
  if (same) return inputs.empty() || !inputs[0]->defined() ? default_device() : inputs[0]->device();
  std::unordered_map<const Node*, bool> memo;
  const Tensor* anchor = nullptr;
  for (Tensor* t : inputs) {
    if (!t->defined() || data_free(*t->node(), memo)) continue;
    if (anchor == nullptr) {
      anchor = t;
    } else if (t->device() != anchor->device()) {
      throw DeviceError("[" + std::string(op) + "] inputs are on different devices (" +
                        anchor->device().str() + " and " + t->device().str() +
                        "); move them with to()");
    }
  }
  Device device = anchor                                    ? anchor->device()
                  : inputs.empty() || !inputs[0]->defined() ? Device::cpu()
                                                            : inputs[0]->device();
  std::unordered_map<const Node*, NodePtr> done;
  for (Tensor* t : inputs) {
    if (t->defined() && t->device() != device) *t = Tensor(rebuild_on(t->node(), device, done));
  }
  return device;
}

std::vector<Tensor> transfer_vjp(const Node& node, const Tensor& g) {
  return {to(g, node.inputs[0]->device)};
}

std::shared_ptr<Buffer> copy_buffer(const Buffer& src, Device device) {
  const size_t bytes = src.bytes();
  if (bytes == 0) return std::make_shared<Buffer>(0, device);
  const Device from = src.device();
  // Uses keep both sides resident for the copy; the source is pinned first so that
  // allocating the destination cannot move it out.
  Buffer::Use in(src, false);
  auto out = std::make_shared<Buffer>(bytes, device);
  Buffer::Use to_write(*out, true);
  if (!from.is_cuda() && !device.is_cuda()) {
    std::memcpy(to_write.data(), in.data(), bytes);
  } else if (!from.is_cuda()) {
    cuda::copy_host_to_device(device.index, to_write.data(), in.data(), bytes);
  } else if (!device.is_cuda()) {
    cuda::copy_device_to_host(from.index, to_write.data(), in.data(), bytes);
  } else if (from == device) {
    cuda::copy_device_to_device(device.index, to_write.data(), in.data(), bytes);
  } else {
    // Between two GPUs through the host: kiln sets up no peer access.
    auto staging = copy_buffer(src, Device::cpu());
    cuda::copy_host_to_device(device.index, to_write.data(), staging->data(), bytes);
  }
  return out;
}

}  // namespace detail

Tensor to(const Tensor& x, Device device) {
  if (!x.defined()) throw ValueError("[to] the tensor is undefined");
  if (x.device() == device) return x;
  check_device_available("to", device);
  std::unordered_map<const Node*, bool> memo;
  if (data_free(*x.node(), memo)) {
    std::unordered_map<const Node*, NodePtr> done;
    return Tensor(rebuild_on(x.node(), device, done));
  }
  auto node = std::make_shared<Node>(OpCode::Transfer, std::vector<NodePtr>{x.node()}, x.shape(),
                                     x.dtype(), device);
  node->origin = "to";
  return Tensor(std::move(node));
}

Tensor Tensor::to(Device device) const { return kiln::to(*this, device); }

}  // namespace kiln
