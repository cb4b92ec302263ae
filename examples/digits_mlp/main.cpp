// Trains an MLP on the UCI handwritten digits (8x8 images, 1,797 samples, as shipped inside
// scikit-learn) with a held-out test split. Each step's forward, backward and Adam update
// are one lazy graph, fused and compiled once and reused every step after.
//
// Run with `make demo`, or `build/examples/digits_mlp --help` for the options.
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "common/example_util.h"
#include "frontend/data.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "frontend/serialize.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

using namespace kiln;

namespace {

// Fraction of `predicted` classes equal to `labels`, as a percentage.
double accuracy(const Tensor& logits, const Tensor& labels) {
  return 100.0 * mean(cast(argmax(logits, 1) == labels, DType::Float32)).item<double>();
}

int run(const example::Flags& flags) {
  example::check_memory_flags(flags, {"save", "log-csv", "log-jsonl"});
  const example::AmpMode amp_mode = example::amp_mode(flags);
  manual_seed(static_cast<uint64_t>(flags.integer("seed")));
  const int64_t epochs = flags.integer("epochs");
  const int64_t hidden = flags.integer("hidden");

  // 64 pixel columns with values 0..16, then the digit.
  data::CsvTable table = data::read_csv(flags.str("data"));
  const int64_t n = table.values.size(0);
  Tensor pixels = slice(table.values, 1, 0, 64) / 16.0f;
  Tensor digits = cast(slice(table.values, 1, 64, 65), DType::Int64);
  eval({pixels, digits});
  auto [train_idx, test_idx] = data::train_test_split(n, flags.real("test-fraction"), 0);
  data::TensorDataset all(pixels, reshape(digits, {n}));
  data::TensorDataset train = all.subset(train_idx), test = all.subset(test_idx);
  std::printf("digits: %lld samples, %lld train / %lld test, 64 features, 10 classes\n",
              static_cast<long long>(n), static_cast<long long>(train.size()),
              static_cast<long long>(test.size()));

  auto model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
          std::make_shared<nn::Linear>(64, hidden), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(hidden, hidden), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(hidden, 10)});
  std::printf("model: 64-%lld-%lld-10 MLP, %lld parameters\n", static_cast<long long>(hidden),
              static_cast<long long>(hidden), static_cast<long long>(model->num_parameters()));

  optim::Adam opt(model->parameters(), {.lr = flags.real("lr")});
  amp::GradScaler scaler(amp_mode.scaler_options());
  data::DataLoader loader(train,
                          {.batch_size = flags.integer("batch-size"), .shuffle = true, .seed = 1});
  example::apply_memory_flags(flags);
  // Loss, gradient norm, memory and samples per second each step, at no extra evaluation.
  TrainingMonitor monitor(
      model->parameters(),
      example::monitor_options(flags, epochs * loader.num_batches(), "samples"));
  auto start = std::chrono::steady_clock::now();
  char epoch_line[96] = "";
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    model->train();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, batches = 0;
    for (const data::Batch& batch : loader) {
      opt.zero_grad();
      Tensor logits, loss;
      {
        amp::autocast scope(Device::cpu(), amp_mode.dtype, amp_mode.enabled);
        logits = model->forward(batch.features());
        loss = nn::cross_entropy(logits, batch.targets());
      }
      scaler.scale(loss).backward();
      scaler.unscale_(opt);  // the norm of the true gradients (a no-op without loss scaling)
      Tensor norm = monitor.grad_norm();
      scaler.step(opt);  // opt.step(), skipped when a float16 gradient overflowed
      scaler.update();
      Tensor hits = sum(argmax(logits, 1) == batch.targets());
      eval({loss, hits, norm});  // one graph: forward, backward, update, metrics and the norm
      monitor.step(loss, batch.size());
      loss_sum += loss.item<double>();
      correct += hits.item<int64_t>();
      seen += batch.size();
      ++batches;
    }
    std::snprintf(epoch_line, sizeof epoch_line, "epoch %lld: loss %.4f, train acc %.1f%%",
                  static_cast<long long>(epoch), loss_sum / static_cast<double>(batches),
                  100.0 * static_cast<double>(correct) / static_cast<double>(seen));
    monitor.set_status(epoch_line);  // shown on the progress line from here on
  }
  monitor.finish();
  std::printf("%s\n", epoch_line);
  example::report_training_memory(flags);  // the last step recorded is a training step

  std::printf("trained %lld epochs in %.1f s\n", static_cast<long long>(epochs),
              example::seconds_since(start));
  // Saved before the test pass: an evaluation that fails (a budget that fits training but
  // not the whole test split at once) must not lose the trained weights.
  if (!flags.str("save").empty()) {
    save_safetensors(flags.str("save"), model->state_dict(), {{"input_scale", "0.0625"}});
    std::printf("weights saved to %s (run examples/embed on them with --scale 0.0625)\n",
                flags.str("save").c_str());
  }

  model->eval();
  const double test_acc =
      example::in_phase("the test pass after epoch " + std::to_string(epochs), [&] {
        NoGradGuard no_grad;
        amp::autocast scope(Device::cpu(), amp_mode.dtype, amp_mode.enabled);
        return accuracy(model->forward(test.tensors()[0]), test.tensors()[1]);
      });
  std::printf("test accuracy: %.1f%%\n", test_acc);
  example::print_runtime_report();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags("digits_mlp",
                       "Trains an MLP on the UCI handwritten digits and reports test accuracy.");
  flags.add("data", KILN_SOURCE_DIR "/data/digits.csv.gz",
            "digits CSV (gzip or plain), from scripts/fetch_digits.sh");
  flags.add("epochs", "30", "passes over the training split");
  flags.add("batch-size", "64", "examples per step");
  flags.add("hidden", "128", "width of the two hidden layers");
  flags.add("lr", "0.002", "Adam learning rate");
  flags.add("test-fraction", "0.2", "share of the samples held out for testing");
  flags.add("seed", "0", "seed of the initialisation (kiln::manual_seed)");
  flags.add("save", "", "write the trained weights to this safetensors file");
  example::add_amp_flag(flags);
  example::add_monitor_flags(flags);
  example::add_memory_flags(flags);
  return flags.main(argc, argv, run);
}
