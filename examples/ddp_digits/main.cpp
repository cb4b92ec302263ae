// Data-parallel training of examples/digits_mlp's model: each rank trains on its shard of
// every batch and gradients are averaged across ranks (kiln::dist::DataParallel), so N ranks
// take the same steps as one process with the same --batch-size (the global batch).
//
//   build/examples/ddp_digits                      one process, no launcher needed
//   mpiexec -n 2 build/examples/ddp_digits         two ranks, each with half of each batch
//   mpiexec -n 2 build/examples/ddp_digits --zero 2   ... with Adam's state and the
//                                                  gradients sharded (ZeRO stage 2)
//
// docs/distributed.md explains launching, what is synchronised and running on a cluster.
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>

#include "common/example_util.h"
#include "dist/dist.h"
#include "frontend/data.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "memory/memory.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

using namespace kiln;

namespace {

int train(const example::Flags& flags, dist::Communicator& comm) {
  const bool lead = comm.rank() == 0;  // the rank that prints
  const int64_t epochs = flags.integer("epochs");
  const int64_t hidden = flags.integer("hidden");
  const int64_t batch = flags.integer("batch-size");
  const int64_t zero_stage = flags.integer("zero");
  if (zero_stage < 0 || zero_stage > 2) {
    throw example::UsageError("--zero must be 0 (no sharding), 1 or 2, got " +
                              std::to_string(zero_stage));
  }
  if (batch < comm.size() || batch % comm.size() != 0) {
    throw example::UsageError("--batch-size " + std::to_string(batch) +
                              " must be a multiple of the number of ranks (" +
                              std::to_string(comm.size()) + ")");
  }
  manual_seed(static_cast<uint64_t>(flags.integer("seed")));

  // Every rank reads the whole file and splits it the same way; the sampler shards it.
  data::CsvTable table = data::read_csv(flags.str("data"));
  const int64_t n = table.values.size(0);
  Tensor pixels = slice(table.values, 1, 0, 64) / 16.0f;
  Tensor digits = cast(slice(table.values, 1, 64, 65), DType::Int64);
  eval({pixels, digits});
  auto [train_idx, test_idx] = data::train_test_split(n, flags.real("test-fraction"), 0);
  data::TensorDataset all(pixels, reshape(digits, {n}));
  data::TensorDataset train = all.subset(train_idx), test = all.subset(test_idx);

  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Linear>(64, hidden), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(hidden, hidden), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(hidden, 10)});
  // Rank 0's initial weights on every rank, and the gradient buckets.
  dist::DataParallel ddp(*model, comm,
                         {.bucket_bytes = static_cast<size_t>(flags.real("bucket-mb") * 1e6)});
  // Adam, unsharded (--zero 0) or sharded by ZeRO, which then averages the gradients itself
  // (all-reduce at stage 1, reduce-scatter at stage 2).
  auto adam = [lr = flags.real("lr")](std::vector<Tensor> ps) {
    return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{.lr = lr});
  };
  std::unique_ptr<optim::Optimizer> plain;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
  if (zero_stage == 0) {
    plain = adam(model->parameters());
  } else {
    zero = std::make_unique<dist::ZeroRedundancyOptimizer>(
        ddp, adam, dist::ZeroOptions{.stage = static_cast<int>(zero_stage)});
  }
  auto sampler = std::make_shared<dist::DistributedSampler>(
      train.size(), comm, dist::DistributedSamplerOptions{.shuffle = true, .seed = 1});
  data::DataLoader loader(train, {.batch_size = batch / comm.size(), .sampler = sampler});
  if (lead) {
    std::printf(
        "digits: %lld train / %lld test samples; %d rank(s) (%s), %lld examples per "
        "rank and step, %zu gradient bucket(s)\n",
        static_cast<long long>(train.size()), static_cast<long long>(test.size()), comm.size(),
        comm.backend(), static_cast<long long>(batch / comm.size()), ddp.buckets().size());
  }

  auto start = std::chrono::steady_clock::now();
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    model->train();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    for (const data::Batch& b : loader) {
      if (plain) plain->zero_grad();
      if (zero) zero->zero_grad();
      Tensor logits = model->forward(b.features());
      Tensor loss = nn::cross_entropy(logits, b.targets());
      ddp.backward(loss);  // backward, then the average of the ranks' gradients
      if (plain) plain->step();
      if (zero) zero->step();
      Tensor hits = sum(argmax(logits, 1) == b.targets());
      eval({loss, hits});
      loss_sum += loss.item<double>() * static_cast<double>(b.size());  // per example
      correct += hits.item<int64_t>();
      seen += b.size();
    }
    // The epoch's figures over all ranks (a float64 sum of [loss, correct, seen]): the mean
    // loss per example, as one process would report it.
    std::vector<double> totals =
        comm.all_reduce(from_vector<double>({loss_sum, double(correct), double(seen)}))
            .to_vector<double>();
    if (lead) {
      char text[96];
      std::snprintf(text, sizeof text, "loss %.4f  train acc %5.1f%%  %.1fs", totals[0] / totals[2],
                    100.0 * totals[1] / totals[2], example::seconds_since(start));
      example::progress("epoch " + std::to_string(epoch), epoch, epochs, text);
    }
  }
  ddp.check_parameters_in_sync();  // every rank ends with the same bits

  model->eval();
  NoGradGuard no_grad;
  const double test_acc =
      100.0 *
      mean(cast(argmax(model->forward(test.tensors()[0]), 1) == test.tensors()[1], DType::Float32))
          .item<double>();
  if (lead) {
    std::printf(
        "trained %lld epochs in %.1f s on %d rank(s); parameters identical on every "
        "rank\ntest accuracy: %.1f%%\n",
        static_cast<long long>(epochs), example::seconds_since(start), comm.size(), test_acc);
  }
  // What each rank holds of the training state (ZeRO shards it), rank by rank.
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank()) std::printf("%s", memory::rank_bytes_report().c_str());
    std::fflush(stdout);
    comm.barrier();
  }
  return 0;
}

int run(const example::Flags& flags) {
  dist::Session session;  // MPI under mpiexec/srun, one process otherwise
  try {
    return train(flags, session.comm());
  } catch (const std::exception& e) {
    if (session.comm().size() == 1) throw;  // reported by Flags::main: "ddp_digits: error: ..."
    // One rank's error ends the whole job with its message, instead of leaving the other
    // ranks waiting in their next collective.
    dist::abort(std::string("ddp_digits: ") + session.comm().where() + ": error: " + e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags("ddp_digits",
                       "Trains digits_mlp's MLP data-parallel across the ranks of an MPI job "
                       "(mpiexec -n N) or in one process, and reports test accuracy.");
  flags.add("data", KILN_SOURCE_DIR "/data/digits.csv.gz",
            "digits CSV (gzip or plain), from scripts/fetch_digits.sh");
  flags.add("epochs", "30", "passes over the training split");
  flags.add("batch-size", "64", "examples per step over all ranks (a multiple of the ranks)");
  flags.add("hidden", "128", "width of the two hidden layers");
  flags.add("lr", "0.002", "Adam learning rate");
  flags.add("test-fraction", "0.2", "share of the samples held out for testing");
  flags.add("seed", "0", "seed of the initialisation (rank 0's weights are broadcast)");
  flags.add("bucket-mb", "25", "gradient all-reduce bucket size in MB");
  flags.add("zero", "0",
            "ZeRO stage: 0 (every rank holds all optimizer state), 1 (state sharded) or 2 "
            "(state and gradients sharded)");
  return flags.main(argc, argv, run);
}
