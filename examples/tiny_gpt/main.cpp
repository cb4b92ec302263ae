// A small decoder-only Transformer (GPT style: token + position embeddings, causal
// pre-norm encoder layers, a linear head) trained on a text file character by character,
// then sampled. By default it learns the GPL-3 text every Debian system ships.
//
// build/examples/tiny_gpt --help lists the options; the default run takes about a minute.
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "common/example_util.h"
#include "common/text_corpus.h"
#include "frontend/lr_scheduler.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"

using namespace kiln;

namespace {

class TinyGPT : public nn::Module {
 public:
  TinyGPT(int64_t vocab, int64_t context, int64_t d_model, int64_t heads, int64_t layers,
          double dropout)
      : nn::Module("TinyGPT"), context(context) {
    tokens = register_module("tokens", std::make_shared<nn::Embedding>(vocab, d_model));
    positions = register_module("positions", std::make_shared<nn::Embedding>(context, d_model));
    // Held in a Sequential so that parameter names read "blocks.0.self_attn...", as PyTorch's.
    auto list = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(std::make_shared<nn::TransformerEncoderLayer>(
          d_model, heads, 4 * d_model, dropout, nn::Activation::GELU, 1e-5,
          /*batch_first=*/true, /*norm_first=*/true));
      list->push_back(blocks.back());
    }
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{d_model}));
    head = register_module("head", std::make_shared<nn::Linear>(d_model, vocab));
  }

  /// ids [B, T] with T <= context -> logits [B, T, vocab]; position t sees positions <= t.
  Tensor forward(const Tensor& ids) {
    const int64_t t = ids.size(1);
    Tensor h = tokens->forward(ids) + positions->forward(arange(t));
    for (auto& block : blocks) h = block->forward(h, Tensor(), Tensor(), /*is_causal=*/true);
    return head->forward(norm->forward(h));
  }

  const int64_t context;
  std::shared_ptr<nn::Embedding> tokens, positions;
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;
};

int run(const example::Flags& flags) {
  example::check_memory_flags(flags, {"log-csv", "log-jsonl"});
  const example::AmpMode amp_mode = example::amp_mode(flags);
  manual_seed(static_cast<uint64_t>(flags.integer("seed")));
  example::TextCorpus corpus(flags.str("text"));
  const int64_t steps = flags.integer("steps"), batch = flags.integer("batch-size"),
                context = flags.integer("context");
  const int64_t vocab = corpus.vocab_size();
  std::printf("text: %s, %zu characters, vocabulary %lld\n", flags.str("text").c_str(),
              corpus.size(), static_cast<long long>(vocab));
  auto model =
      std::make_shared<TinyGPT>(vocab, context, flags.integer("d-model"), flags.integer("heads"),
                                flags.integer("layers"), flags.real("dropout"));
  std::printf("model: %lld layers, d_model %lld, %lld heads, context %lld, %lld parameters\n",
              static_cast<long long>(flags.integer("layers")),
              static_cast<long long>(flags.integer("d-model")),
              static_cast<long long>(flags.integer("heads")), static_cast<long long>(context),
              static_cast<long long>(model->num_parameters()));

  std::vector<Tensor> params = model->parameters();
  optim::AdamW opt(params, {.lr = flags.real("lr"), .weight_decay = 0.01});
  amp::GradScaler scaler(amp_mode.scaler_options());
  // Linear warm-up over the first tenth, then cosine decay.
  const int64_t warmup = std::max<int64_t>(1, steps / 10);
  std::unique_ptr<optim::SequentialLR> schedule = optim::warmup_cosine(
      opt, warmup, std::max<int64_t>(steps, warmup + 1), 0.1, flags.real("lr") * 0.1);

  std::mt19937_64 rng(static_cast<uint64_t>(flags.integer("seed")));
  example::apply_memory_flags(flags);
  // Loss, gradient norm, lr, memory and tokens per second each step, at no extra evaluation.
  TrainingMonitorOptions watch = example::monitor_options(flags, steps, "tokens", 0.9);
  watch.optimizer = &opt;
  TrainingMonitor monitor(params, watch);
  model->train();
  for (int64_t step = 1; step <= steps; ++step) {
    auto [x, y] = corpus.batch(batch, context, rng);
    opt.zero_grad();
    Tensor loss;
    {
      amp::autocast scope(Device::cpu(), amp_mode.dtype, amp_mode.enabled);
      Tensor logits = model->forward(x);
      loss = nn::cross_entropy(reshape(logits, {batch * context, vocab}),
                               reshape(y, {batch * context}));
    }
    scaler.scale(loss).backward();
    scaler.unscale_(opt);  // clip the true gradients (a no-op without loss scaling)
    Tensor norm = optim::clip_grad_norm(params, 1.0);  // the norm before clipping
    monitor.watch_grad_norm(norm);
    scaler.step(opt);  // opt.step(), skipped when a float16 gradient overflowed
    scaler.update();
    eval({loss, norm});  // one graph: forward, backward, clipping, update and the norm
    monitor.step(loss, batch * context);  // logs the lr this step used
    schedule->step();
  }
  monitor.finish();
  example::print_loss_change(monitor, vocab);
  example::report_training_memory(flags);  // before sampling replaces the last step

  // Sampling: the context window slides over the text generated so far. Each length is a
  // new shape but not a new kernel: kernels take sizes as arguments.
  model->eval();
  NoGradGuard no_grad;
  amp::autocast scope(Device::cpu(), amp_mode.dtype, amp_mode.enabled);
  std::string sample = flags.str("prompt");
  std::vector<int64_t> ids = corpus.encode(sample).to_vector<int64_t>();
  const double temperature = flags.real("temperature");
  example::in_phase("sampling after step " + std::to_string(steps), [&] {
    for (int64_t i = 0; i < flags.integer("sample-length"); ++i) {
      int64_t t = std::min<int64_t>(static_cast<int64_t>(ids.size()), context);
      std::vector<int64_t> window(ids.end() - t, ids.end());
      Tensor logits = model->forward(from_vector(window, {1, t}));
      Tensor last = reshape(slice(logits, 1, t - 1, t), {vocab});
      int64_t next = example::sample_token(last, temperature, rng);
      ids.push_back(next);
      sample += corpus.decode(next);
    }
  });
  std::printf("\nsample (temperature %.2f):\n%s\n", temperature, sample.c_str());
  example::print_runtime_report();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags(
      "tiny_gpt", "Trains a small decoder-only Transformer on a text file and samples from it.");
  flags.add("text", "/usr/share/common-licenses/GPL-3", "training text (plain or gzip)");
  flags.add("steps", "400", "training steps");
  flags.add("batch-size", "16", "sequences per step");
  flags.add("context", "64", "characters per sequence (the attention window)");
  flags.add("d-model", "128", "model width");
  flags.add("heads", "4", "attention heads");
  flags.add("layers", "2", "Transformer layers");
  flags.add("dropout", "0.1", "dropout probability in training");
  flags.add("lr", "0.002", "peak AdamW learning rate");
  flags.add("seed", "0", "seed of initialisation, batches, dropout and sampling");
  flags.add("prompt", "The ", "text the sample starts from");
  flags.add("sample-length", "200", "characters to generate");
  flags.add("temperature", "0.7", "sampling temperature");
  example::add_amp_flag(flags);
  example::add_monitor_flags(flags);
  example::add_memory_flags(flags);
  return flags.main(argc, argv, run);
}
