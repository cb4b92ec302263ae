// kiln::dist in one process: the single-process communicator (every collective an
// identity), the typed errors of bad input, the timeout, NCCL's errors without a GPU or
// without the library, the DistributedSampler's shards and DataParallel's buckets and
// no_sync. The multi-rank behaviour runs under mpiexec in tests/dist/ (CTest dist_mpi_*).
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/cuda_driver.h"
#include "dist/dist.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "memory/memory.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  const char* name_;
  bool had_ = false;
  std::string old_;
};

class NeverDone : public dist::Work {
 public:
  bool done() override { return false; }
};

}  // namespace

TEST_CASE("dist: without a launcher the world is one process and collectives are identities",
          "[dist]") {
  REQUIRE_FALSE(dist::launched_by_mpi());
  dist::Communicator& c = dist::world();
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  CHECK(c.local_rank() == 0);
  CHECK(std::string(c.backend()) == "single");
  CHECK(c.where() == "rank 0 of 1");
  for (DType d : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    Tensor x = cast(from_vector<float>({1.5f, -2, 3, 4}, {2, 2}), d);
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Average}) {
      Tensor y = c.all_reduce(x, op);
      CHECK(y.is_evaluated());
      CHECK(y.dtype() == d);
      CHECK(y.shape() == Shape{2, 2});
      CHECK(y.to_vector<float>() == x.to_vector<float>());
      CHECK(c.reduce_scatter(x, op).to_vector<float>() == x.to_vector<float>());
    }
  }
  Tensor i = from_vector<int64_t>({7, 8, 9});
  CHECK(c.all_reduce(i).to_vector<int64_t>() == std::vector<int64_t>{7, 8, 9});
  CHECK(c.all_gather(i).shape() == Shape{3});
  CHECK(c.broadcast(from_vector<int32_t>({1, 2}), 0).to_vector<int32_t>() ==
        std::vector<int32_t>{1, 2});
  c.barrier();
  dist::PendingTensor pending = c.all_reduce_async(from_vector<float>({1, 2}));
  CHECK(pending.wait().to_vector<float>() == std::vector<float>{1, 2});
  // Results carry no gradient history.
  Tensor w = randn({3}).requires_grad_();
  CHECK_FALSE(c.all_reduce(w * 2.0f).requires_grad());
}

TEST_CASE("dist: bad collective input is a typed error naming the call", "[dist]") {
  dist::Communicator& c = dist::world();
  Tensor i32 = from_vector<int32_t>({1, 2});
  CHECK_THROWS_AS(c.all_reduce(i32), DTypeError);
  CHECK_THROWS_WITH(c.all_reduce(i32), Contains("[dist.all_reduce]") && Contains("int32[2]"));
  CHECK_THROWS_WITH(c.all_reduce(from_vector<int64_t>({1}), dist::ReduceOp::Average),
                    Contains("average needs a floating dtype"));
  CHECK_THROWS_AS(c.all_reduce(Tensor()), ValueError);
  CHECK_THROWS_AS(c.broadcast(i32, 1), ValueError);
  CHECK_THROWS_WITH(c.broadcast(i32, 1), Contains("root 1") && Contains("expected 0..0"));
  CHECK_THROWS_AS(c.all_gather(tensor(1.0f)), ShapeError);
  CHECK_THROWS_AS(c.reduce_scatter(tensor(1.0f)), ShapeError);
  // A ZeRO optimizer whose factory makes nothing would never update its parameters.
  Tensor w = randn({4});
  w.requires_grad_();
  CHECK_THROWS_WITH(dist::ZeroRedundancyOptimizer({w}, [](std::vector<Tensor>) { return nullptr; }),
                    Contains("factory returned no optimizer"));
}

TEST_CASE("dist: a collective that does not complete is a TimeoutError after KILN_DIST_TIMEOUT",
          "[dist]") {
  dist::Communicator& c = dist::world();
  NeverDone never;
  {
    ScopedEnv timeout("KILN_DIST_TIMEOUT", "0.2");
    CHECK_THROWS_AS(c.wait(never, "all_reduce of float32[4]"), dist::TimeoutError);
    CHECK_THROWS_WITH(c.wait(never, "all_reduce of float32[4]"),
                      Contains("[dist.all_reduce] rank 0 of 1") && Contains("KILN_DIST_TIMEOUT") &&
                          Contains("0.2 s"));
  }
  ScopedEnv bad("KILN_DIST_TIMEOUT", "soon");
  CHECK_THROWS_AS(c.wait(never, "barrier"), ValueError);
}

TEST_CASE("dist: NCCL without its library or without a GPU is a typed error", "[dist]") {
  {
    ScopedEnv missing("KILN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
    CHECK_THROWS_AS(dist::make_nccl(dist::single_process(), 0), dist::DistError);
    CHECK_THROWS_WITH(dist::make_nccl(dist::single_process(), 0),
                      Contains("[dist.nccl] cannot load NCCL") && Contains("KILN_NCCL_LIBRARY"));
  }
  if (cuda::device_count() > 0) {
    WARN("skipped the no-GPU half: this machine has a CUDA device");
    return;
  }
  // With NCCL present but no driver, the device check speaks; without NCCL, the loader.
  try {
    dist::make_nccl(dist::single_process(), 0);
    FAIL("make_nccl succeeded without a CUDA device");
  } catch (const DeviceError& e) {
    CHECK_THAT(e.what(), Contains("CUDA"));
  } catch (const dist::DistError& e) {
    CHECK_THAT(e.what(), Contains("cannot load NCCL"));
  }
}

TEST_CASE("dist: NCCL collectives on one GPU", "[dist][cuda]") {
  if (cuda::device_count() == 0) {
    WARN("skipped: no CUDA device (" << cuda::driver_status() << ")");
    return;
  }
  std::unique_ptr<dist::Communicator> nccl;
  try {
    nccl = dist::make_nccl(dist::single_process(), 0);
  } catch (const dist::DistError& e) {
    WARN("skipped: " << e.what());
    return;
  }
  CHECK(std::string(nccl->backend()) == "nccl");
  Tensor x = from_vector<float>({1, 2, 3, 4}, {4}, Device::cuda(0));
  for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Average}) {
    Tensor y = nccl->all_reduce(x, op);
    CHECK(y.device() == Device::cuda(0));
    CHECK(y.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  }
  CHECK(nccl->all_gather(x).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(nccl->broadcast(cast(x, DType::BFloat16), 0).to_vector<float>() ==
        std::vector<float>{1, 2, 3, 4});
  CHECK(nccl->reduce_scatter(x).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK_THROWS_AS(nccl->all_reduce(from_vector<float>({1})), DeviceError);
}

TEST_CASE("dist: DistributedSampler shards like PyTorch's", "[dist]") {
  using dist::DistributedSampler;
  // Without shuffle: positions r, r+R, ... of 0..n-1 padded from the start.
  const dist::DistributedSamplerOptions plain{.shuffle = false};
  CHECK(DistributedSampler(10, 3, 0, plain).indices(0) == std::vector<int64_t>{0, 3, 6, 9});
  CHECK(DistributedSampler(10, 3, 1, plain).indices(0) == std::vector<int64_t>{1, 4, 7, 0});
  CHECK(DistributedSampler(10, 3, 2, plain).indices(0) == std::vector<int64_t>{2, 5, 8, 1});
  const dist::DistributedSamplerOptions drop{.shuffle = false, .drop_last = true};
  CHECK(DistributedSampler(10, 3, 2, drop).indices(0) == std::vector<int64_t>{2, 5, 8});
  CHECK(DistributedSampler(2, 4, 3, plain).indices(0) == std::vector<int64_t>{1});
  // An epoch's index list that cannot exist is an OutOfMemoryError, not std::bad_alloc.
  CHECK_THROWS_AS(DistributedSampler(int64_t{1} << 50, 2, 0).indices(0), OutOfMemoryError);
  CHECK_THROWS_AS(DistributedSampler(int64_t{1} << 62, 2, 1, plain).indices(0), OutOfMemoryError);

  // With shuffle: disjoint shards covering the epoch's permutation, a new order each epoch,
  // the same order for the same (seed, epoch).
  const int64_t n = 103;
  const int ranks = 4;
  for (uint64_t epoch : {0u, 1u}) {
    std::vector<int64_t> all;
    for (int r = 0; r < ranks; ++r) {
      DistributedSampler s(n, ranks, r, {.seed = 7});
      CHECK(s.size() == 26);
      std::vector<int64_t> mine = s.indices(epoch);
      CHECK(static_cast<int64_t>(mine.size()) == s.size());
      all.insert(all.end(), mine.begin(), mine.end());
    }
    CHECK(std::set<int64_t>(all.begin(), all.end()).size() == static_cast<size_t>(n));
    CHECK(all.size() == 104);  // one example repeated as padding
  }
  DistributedSampler s(n, ranks, 1, {.seed = 7});
  CHECK(s.indices(0) != s.indices(1));
  CHECK(s.indices(1) == DistributedSampler(n, ranks, 1, {.seed = 7}).indices(1));
  CHECK(s.indices(0) != DistributedSampler(n, ranks, 1, {.seed = 8}).indices(0));
  // Shard r of epoch e is every R-th example of the order a shuffling DataLoader visits.
  std::vector<int64_t> order = data::random_permutation(n, 7, 1);
  CHECK(s.indices(1)[2] == order[1 + 2 * ranks]);

  CHECK_THROWS_AS(DistributedSampler(10, 2, 2), ValueError);
  CHECK_THROWS_WITH(DistributedSampler(10, 2, -1), Contains("[DistributedSampler] rank -1"));
  CHECK_THROWS_AS(DistributedSampler(-1, 2, 0), ValueError);
  CHECK(DistributedSampler(10, dist::world()).size() == 10);
}

TEST_CASE("dist: a DataLoader visits its sampler's shard, reshuffled per epoch", "[dist]") {
  data::TensorDataset ds(reshape(arange(0, 20, 1, DType::Float32), {10, 2}), arange(10));
  auto sampler = std::make_shared<dist::DistributedSampler>(
      10, 3, 1, dist::DistributedSamplerOptions{.seed = 3});
  data::DataLoader loader(ds, {.batch_size = 3, .sampler = sampler});
  CHECK(loader.num_batches() == 2);  // 4 examples per rank
  std::vector<int64_t> seen;
  for (const data::Batch& b : loader) {
    for (int64_t t : b.targets().to_vector<int64_t>()) seen.push_back(t);
  }
  CHECK(seen == sampler->indices(0));
  std::vector<int64_t> second;
  for (const data::Batch& b : loader) {
    for (int64_t t : b.targets().to_vector<int64_t>()) second.push_back(t);
  }
  CHECK(second == sampler->indices(1));
  CHECK_THROWS_AS(data::DataLoader(ds, {.batch_size = 3, .shuffle = true, .sampler = sampler}),
                  ValueError);
}

TEST_CASE("dist: DataParallel in one process buckets, hashes and trains like the plain loop",
          "[dist]") {
  manual_seed(5);
  nn::Sequential plain({std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(8, 3)});
  manual_seed(5);
  nn::Sequential wrapped({std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(),
                          std::make_shared<nn::Linear>(8, 3)});
  // 4 parameters of 48, 8, 24 and 3 floats; 100-byte buckets split them, in reverse order.
  dist::DataParallel ddp(wrapped, dist::world(), {.bucket_bytes = 100});
  CHECK(ddp.buckets() == std::vector<std::vector<size_t>>{{3}, {2}, {1}, {0}});
  dist::DataParallel one_bucket(wrapped);
  CHECK(one_bucket.buckets() == std::vector<std::vector<size_t>>{{3, 2, 1, 0}});
  CHECK_THROWS_AS(dist::DataParallel(wrapped, dist::world(), {.bucket_bytes = 0}), ValueError);
  CHECK_THROWS_AS(dist::DataParallel(wrapped, dist::world(), {.first_bucket_bytes = 0}),
                  ValueError);
  // The first bucket closes early (12 + 96 bytes > 100), the rest at 1000 bytes.
  dist::DataParallel early(wrapped, dist::world(),
                           {.bucket_bytes = 1000, .first_bucket_bytes = 100});
  CHECK(early.buckets() == std::vector<std::vector<size_t>>{{3}, {2, 1, 0}});

  optim::SGD opt_plain(plain.parameters(), {.lr = 0.1});
  optim::SGD opt_wrapped(wrapped.parameters(), {.lr = 0.1});
  Tensor x = randn({5, 6});
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1});
  for (int step = 0; step < 3; ++step) {
    opt_plain.zero_grad();
    nn::cross_entropy(plain.forward(x), y).backward();
    opt_plain.step();
    opt_wrapped.zero_grad();
    ddp.backward(nn::cross_entropy(wrapped.forward(x), y));
    opt_wrapped.step();
  }
  auto a = plain.parameters(), b = wrapped.parameters();
  for (size_t k = 0; k < a.size(); ++k) CHECK(a[k].to_vector<float>() == b[k].to_vector<float>());
  const uint64_t h = ddp.parameter_hash();
  CHECK(h == ddp.parameter_hash());
  ddp.check_parameters_in_sync();
  {
    auto guard = ddp.no_sync();
    CHECK_FALSE(ddp.synchronizing());
    auto nested = ddp.no_sync();
  }
  CHECK(ddp.synchronizing());
  opt_wrapped.zero_grad();
  ddp.backward(nn::cross_entropy(wrapped.forward(x), y));
  opt_wrapped.step();
  CHECK(ddp.parameter_hash() != h);
}

// ZeRO's factory of Adam optimizers with learning rate 0.05.
static std::unique_ptr<optim::Optimizer> adam_shards(std::vector<Tensor> ps) {
  return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{.lr = 0.05});
}

// Stage 1 from the parameters (gradients averaged elsewhere: one rank, so nothing to do) and
// stage 2 from a DataParallel, whose backward() then reduces into the shard.
// Under AMP a bfloat16 model's optimizer keeps float32 master weights: under ZeRO they are
// part of the sharded state (one flat bfloat16 block per rank, its master beside it).
TEST_CASE("dist: ZeRO shards float32 master weights of bfloat16 parameters", "[dist]") {
  manual_seed(13);
  nn::Linear plain(4, 3);
  plain.to(DType::BFloat16);
  manual_seed(13);
  nn::Linear sharded(4, 3);
  sharded.to(DType::BFloat16);
  const optim::AdamOptions options{.lr = 0.01, .master_weights = true};
  optim::Adam full(plain.parameters(), options);
  dist::ZeroRedundancyOptimizer zero(sharded.parameters(), [&](std::vector<Tensor> ps) {
    return std::make_unique<optim::Adam>(std::move(ps), options);
  });
  Tensor x = randn({6, 4}).to(DType::BFloat16);
  for (int step = 0; step < 3; ++step) {
    full.zero_grad();
    zero.zero_grad();
    sum(plain.forward(x) * plain.forward(x)).backward();
    sum(sharded.forward(x) * sharded.forward(x)).backward();
    full.step();
    zero.step();
  }
  // Elementwise updates of the same values: the same bits, flat or per parameter.
  CHECK(plain.weight.to_vector<float>() == sharded.weight.to_vector<float>());
  CHECK(plain.bias.to_vector<float>() == sharded.bias.to_vector<float>());
  size_t master = 0;
  for (const auto& [name, t] : zero.local()->state_dict()) {
    if (name.find("master") != std::string::npos) {
      CHECK(t.dtype() == DType::Float32);
      master += t.node()->nbytes();
    }
  }
  CHECK(master == (12 + 3) * sizeof(float));  // one rank: the whole flat block's master
}

TEST_CASE("dist: ZeRO in one process holds one flat block and steps like its optimizer", "[dist]") {
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    manual_seed(9);
    nn::Linear plain(4, 3);
    manual_seed(9);
    nn::Linear sharded(4, 3);
    optim::Adam full(plain.parameters(), {.lr = 0.05});
    dist::DataParallel ddp(sharded);
    auto zero = stage == 1 ? std::make_unique<dist::ZeroRedundancyOptimizer>(sharded.parameters(),
                                                                             adam_shards)
                           : std::make_unique<dist::ZeroRedundancyOptimizer>(
                                 ddp, adam_shards, dist::ZeroOptions{.stage = 2});
    CHECK(zero->num_groups() == 1);
    CHECK(zero->shard_numel(0) == 12 + 3);  // one rank: the whole flat vector, no padding
    REQUIRE(zero->local() != nullptr);
    Tensor x = randn({6, 4});
    for (int step = 0; step < 3; ++step) {
      full.zero_grad();
      zero->zero_grad();
      sum(plain.forward(x) * plain.forward(x)).backward();
      ddp.backward(sum(sharded.forward(x) * sharded.forward(x)));
      // Stage 2: the reducer took the gradients; the parameters hold none, the shard all.
      CHECK(sharded.weight.grad().defined() == (stage == 1));
      CHECK(zero->local_gradient_bytes() == (12 + 3) * sizeof(float));
      full.step();
      zero->step();
    }
    CHECK(plain.weight.to_vector<float>() == sharded.weight.to_vector<float>());
    CHECK(plain.bias.to_vector<float>() == sharded.bias.to_vector<float>());
    CHECK(zero->local_state_bytes() == 2 * (12 + 3) * sizeof(float));  // Adam's two moments

    const std::vector<memory::RankBytes> held = memory::rank_bytes();
    REQUIRE(held.size() == 2);  // the DataParallel and the ZeRO optimizer, in that order
    CHECK(held[0].holder == "DataParallel");
    CHECK_FALSE(held[0].optimizer_state.has_value());
    CHECK(held[1].holder == "ZeRO-" + std::to_string(stage));
    CHECK(held[1].rank == 0);
    CHECK(held[1].ranks == 1);
    CHECK(held[1].parameters == (12 + 3) * sizeof(float));
    CHECK(held[1].gradients == (12 + 3) * sizeof(float));
    CHECK(held[1].optimizer_state == 2 * (12 + 3) * sizeof(float));
    CHECK_THAT(memory::report(),
               Contains("[rank 0 of 1] ZeRO-" + std::to_string(stage) +
                        ": parameters 60 B, gradients 60 B, optimizer state 120 B"));
    CHECK_THAT(memory::plan_report(), Contains("training state held by this rank"));
  }
  auto none = [](std::vector<Tensor>) { return std::unique_ptr<optim::Optimizer>(); };
  CHECK_THROWS_AS(dist::ZeroRedundancyOptimizer({}, none), ValueError);
  nn::Linear layer(4, 3);
  CHECK_THROWS_AS(
      dist::ZeroRedundancyOptimizer(layer.parameters(), none, dist::world(), {.stage = 3}),
      ValueError);
}

TEST_CASE("dist: the per-rank byte report is empty without DataParallel or ZeRO", "[dist]") {
  CHECK(memory::rank_bytes().empty());
  CHECK(memory::rank_bytes_report().empty());
}
