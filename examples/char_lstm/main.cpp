// A character-level LSTM language model: learns to continue a text file (by default the
// GPL-3 text every Debian system ships) and prints a sample in the style it learned.
//
// build/examples/char_lstm --help lists the options; the default run takes about a minute.
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "common/example_util.h"
#include "common/text_corpus.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"

using namespace kiln;

namespace {

/// Embedding -> LSTM -> Linear over the vocabulary.
class CharLSTM : public nn::Module {
 public:
  CharLSTM(int64_t vocab, int64_t embed, int64_t hidden, int64_t layers) : nn::Module("CharLSTM") {
    embedding = register_module("embedding", std::make_shared<nn::Embedding>(vocab, embed));
    lstm = register_module("lstm", std::make_shared<nn::LSTM>(embed, hidden, layers, true, true));
    head = register_module("head", std::make_shared<nn::Linear>(hidden, vocab));
  }
  /// tokens [B, T] -> logits [B, T, vocab] and the final states.
  nn::LSTMOutput forward(const Tensor& tokens, const Tensor& h0 = Tensor(),
                         const Tensor& c0 = Tensor()) {
    nn::LSTMOutput out = lstm->forward(embedding->forward(tokens), h0, c0);
    out.output = head->forward(out.output);
    return out;
  }

  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::Linear> head;
};

int run(const example::Flags& flags) {
  example::check_memory_flags(flags, {"log-csv", "log-jsonl"});
  const example::AmpMode amp_mode = example::amp_mode(flags);
  manual_seed(static_cast<uint64_t>(flags.integer("seed")));
  example::TextCorpus corpus(flags.str("text"));
  const int64_t steps = flags.integer("steps"), batch = flags.integer("batch-size"),
                seq = flags.integer("seq-len");
  std::printf("text: %s, %zu characters, vocabulary %lld\n", flags.str("text").c_str(),
              corpus.size(), static_cast<long long>(corpus.vocab_size()));

  auto model = std::make_shared<CharLSTM>(corpus.vocab_size(), flags.integer("embed"),
                                          flags.integer("hidden"), flags.integer("layers"));
  std::printf("model: embedding %lld -> LSTM %lld x %lld -> %lld classes, %lld parameters\n",
              static_cast<long long>(flags.integer("embed")),
              static_cast<long long>(flags.integer("layers")),
              static_cast<long long>(flags.integer("hidden")),
              static_cast<long long>(corpus.vocab_size()),
              static_cast<long long>(model->num_parameters()));
  std::vector<Tensor> params = model->parameters();
  optim::Adam opt(params, {.lr = flags.real("lr")});
  amp::GradScaler scaler(amp_mode.scaler_options());

  std::mt19937_64 rng(static_cast<uint64_t>(flags.integer("seed")));
  example::apply_memory_flags(flags);
  // Loss, gradient norm, memory and tokens per second each step, at no extra evaluation.
  TrainingMonitor monitor(params, example::monitor_options(flags, steps, "tokens", 0.9));
  for (int64_t step = 1; step <= steps; ++step) {
    auto [x, y] = corpus.batch(batch, seq, rng);
    opt.zero_grad();
    Tensor loss;
    {
      amp::autocast scope(Device::cpu(), amp_mode.dtype, amp_mode.enabled);
      Tensor logits = model->forward(x).output;
      loss = nn::cross_entropy(reshape(logits, {batch * seq, corpus.vocab_size()}),
                               reshape(y, {batch * seq}));
    }
    scaler.scale(loss).backward();
    scaler.unscale_(opt);  // clip the true gradients (a no-op without loss scaling)
    Tensor norm = optim::clip_grad_norm(params, 1.0);  // the norm before clipping
    monitor.watch_grad_norm(norm);
    scaler.step(opt);  // opt.step(), skipped when a float16 gradient overflowed
    scaler.update();
    eval({loss, norm});  // one graph: forward, backward, clipping, update and the norm
    monitor.step(loss, batch * seq);
  }
  monitor.finish();
  example::print_loss_change(monitor, corpus.vocab_size());
  example::report_training_memory(flags);  // before sampling replaces the last step

  // Sampling: feed one character at a time, carrying the LSTM state.
  model->eval();
  NoGradGuard no_grad;
  amp::autocast scope(Device::cpu(), amp_mode.dtype, amp_mode.enabled);
  std::string prompt = flags.str("prompt");
  std::string sample = prompt;
  Tensor h, c;
  Tensor tokens = reshape(corpus.encode(prompt), {1, static_cast<int64_t>(prompt.size())});
  const double temperature = flags.real("temperature");
  example::in_phase("sampling after step " + std::to_string(steps), [&] {
    for (int64_t i = 0; i < flags.integer("sample-length"); ++i) {
      nn::LSTMOutput out = model->forward(tokens, h, c);
      h = out.h_n;
      c = out.c_n;
      Tensor last = slice(out.output, 1, -1, out.output.size(1));
      int64_t next = example::sample_token(reshape(last, {corpus.vocab_size()}), temperature, rng);
      sample += corpus.decode(next);
      tokens = reshape(from_vector<int64_t>({next}), {1, 1});
    }
  });
  std::printf("\nsample (temperature %.2f):\n%s\n", temperature, sample.c_str());
  example::print_runtime_report();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags(
      "char_lstm",
      "Trains a character-level LSTM language model on a text file and samples from it.");
  flags.add("text", "/usr/share/common-licenses/GPL-3", "training text (plain or gzip)");
  flags.add("steps", "500", "training steps");
  flags.add("batch-size", "16", "sequences per step");
  flags.add("seq-len", "32", "characters per training sequence");
  flags.add("embed", "64", "character embedding size");
  flags.add("hidden", "128", "LSTM hidden size");
  flags.add("layers", "1", "stacked LSTM layers");
  flags.add("lr", "0.003", "Adam learning rate");
  flags.add("seed", "0", "seed of initialisation, batches and sampling");
  flags.add("prompt", "The ", "text the sample starts from");
  flags.add("sample-length", "300", "characters to generate");
  flags.add("temperature", "0.7", "sampling temperature (lower: more conservative)");
  example::add_amp_flag(flags);
  example::add_monitor_flags(flags);
  example::add_memory_flags(flags);
  return flags.main(argc, argv, run);
}
