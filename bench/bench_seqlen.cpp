// The sequence-length headline (issue 27 §4; docs/benchmarks.md, "Longer sequences in the
// same memory"): a 6-layer encoder (post-norm layers, d_model 256, 4 heads, feed-forward
// 1024, no dropout; token and position embeddings; a Linear to the vocabulary of 128; cross
// entropy on every position; AdamW) on one fixed batch of 8 sequences.
//
// PyTorch eager trains it at sequence 128 (bench_seqlen_torch.py), measuring the most bytes
// its allocator holds during a step beyond what it held when the step began. kiln then
// trains the same model at sequence 512 with a memory budget of its own step start plus that
// many bytes, and the row compares time per token: kiln at 512 under the budget against
// PyTorch at 128 (target <= 1.3). Rows:
//   seqlen_encoder6_s128: kiln and PyTorch at 128, unbudgeted (time per token, peaks);
//   seqlen_encoder6_s512_unbudgeted: kiln at 512 without a budget (what the budget saves);
//   seqlen_encoder6_s512_in_torch_s128_memory: kiln at 512 under the budget, against
//     PyTorch at 128: ms per 1000 tokens, peak bytes above the start for both.
// Each timed value is the median of KILN_BENCH_SEQLEN_REPS steps (default 3) after the
// steps kiln takes to fix its plan.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench_common.h"
#include "core/thread_pool.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "memory/memory.h"

using namespace kiln;
using namespace kiln::bench;

namespace {

constexpr int64_t kBatch = 8, kVocab = 128, kDim = 256;

class Encoder : public nn::Module {
 public:
  Encoder() : nn::Module("Encoder") {
    embed = register_module("embed", std::make_shared<nn::Embedding>(kVocab, kDim));
    pos = register_module("pos", std::make_shared<nn::Embedding>(512, kDim));
    auto list = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int i = 0; i < 6; ++i) {
      list->push_back(std::make_shared<nn::TransformerEncoderLayer>(
          kDim, 4, 1024, 0.0, nn::Activation::ReLU, 1e-5, true, false));
    }
    blocks = list;
    head = register_module("head", std::make_shared<nn::Linear>(kDim, kVocab));
  }
  Tensor forward(const Tensor& tokens) {
    Tensor h = embed->forward(tokens) + pos->forward(arange(tokens.size(1)));
    return head->forward(blocks->forward(h));
  }
  std::shared_ptr<nn::Embedding> embed, pos;
  std::shared_ptr<nn::Sequential> blocks;
  std::shared_ptr<nn::Linear> head;
};

struct Measured {
  Times step;          // medians of the timed steps
  size_t start = 0;    // pool bytes allocated when the timed steps began
  size_t peak = 0;     // the pool's peak of allocated bytes over them
  bool within = true;  // every plan held its budget
};

memory::CachingPool& pool() { return memory::host_pool(); }

// Trains a fresh model at `seq` under the budget in force: settling steps, then `reps` timed.
Measured train(int64_t seq, int reps) {
  manual_seed(7);
  Encoder model;
  optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.01});
  const Tensor x = randint(0, kVocab, {kBatch, seq}).eval();
  const Tensor y = randint(0, kVocab, {kBatch * seq}).eval();
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(reshape(model.forward(x), {kBatch * seq, kVocab}), y);
    loss.backward();
    opt.step();
    opt.zero_grad();  // gradients end with the step, as on PyTorch's side
    return loss.item<double>();
  };
  for (int i = 0; i < 4; ++i) step();  // kiln fixes a step's plan on its fourth run
  pool().empty_cache();
  Measured m;
  m.start = pool().allocated();
  pool().reset_peak_stats();
  Samples times;
  for (int i = 0; i < reps; ++i) {
    Stopwatch watch;
    step();
    times.add(watch.elapsed());
    m.within = m.within && memory::last_plan().within_budget;
  }
  m.step = times.medians();
  m.peak = pool().stats().peak_allocated;
  return m;
}

struct TorchSide {
  Times step;
  double peak_above_start = -1;
  std::string note;
};

TorchSide run_torch(int64_t seq, int reps) {
  TorchSide out;
  const std::string args = "--threads " + std::to_string(thread_pool().size()) + " --reps " +
                           std::to_string(reps) + " --seq " + std::to_string(seq) + " --batch " +
                           std::to_string(kBatch);
  const TorchScriptRun run =
      run_torch_script("bench_seqlen_torch.py", args, false, [&](const char* line) {
        Times t;
        double peak = -1;
        if (std::sscanf(line, "RESULT %lf %lf %lf", &t.wall_ms, &t.cpu_ms, &peak) != 3)
          return false;
        out.step = t;
        out.peak_above_start = peak;
        return true;
      });
  if (out.peak_above_start < 0)
    out.note = run.note.empty() ? "bench_seqlen_torch.py gave no result" : run.note;
  return out;
}

// Milliseconds per 1000 tokens of a step over `seq`-long sequences.
Times per_kilotoken(Times t, int64_t seq) {
  const double k = 1000.0 / static_cast<double>(kBatch * seq);
  return {t.wall_ms * k, t.cpu_ms * k};
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags = bench_flags(
      "bench_seqlen", "Sequence 512 in the memory PyTorch eager needs at 128: a 6-layer encoder.");
  flags.add("attention", "auto",
            "attention kernels of kiln's steps: auto (flash under the budget), math or flash");
  flags.note("environment: KILN_BENCH_SEQLEN_REPS (timed steps, default 3)");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  const std::string attention = flags.str("attention");
  if (attention != "auto" && attention != "math" && attention != "flash") {
    std::fprintf(stderr, "bench_seqlen: --attention expects auto, math or flash, got '%s'\n",
                 attention.c_str());
    return 2;
  }
  nn::SDPBackendGuard backend(attention == "math"    ? nn::SDPBackend::Math
                              : attention == "flash" ? nn::SDPBackend::Flash
                                                     : nn::SDPBackend::Auto);
  Results results(flags.str("json"));
  const int reps = env_int("KILN_BENCH_SEQLEN_REPS", 3);

  const TorchSide torch = run_torch(128, reps);
  memory::clear_budget();
  const Measured short_run = train(128, reps);
  const Measured long_free = train(512, reps);
  const auto mib = [](double b) { return b / (1024.0 * 1024.0); };

  Result r128;
  r128.workload = "seqlen_encoder6_s128";
  r128.set_kiln(per_kilotoken(short_run.step, 128));
  r128.compiler = compiler_label();
  r128.baseline = "pytorch-eager";
  const double kiln128_above = static_cast<double>(short_run.peak - short_run.start);
  if (torch.note.empty()) r128.set_baseline(per_kilotoken(torch.step, 128));
  char note[256];
  std::snprintf(note, sizeof note,
                "ms per 1000 tokens; above start: kiln %.1f MiB, torch %.1f MiB%s",
                mib(kiln128_above), mib(torch.peak_above_start),
                torch.note.empty() ? "" : ("; " + torch.note).c_str());
  r128.note = note;
  r128.extra = {{"kiln_peak_above_start_bytes", kiln128_above},
                {"torch_peak_above_start_bytes", torch.peak_above_start}};
  results.add(r128);

  Result free512;
  free512.workload = "seqlen_encoder6_s512_unbudgeted";
  free512.set_kiln(per_kilotoken(long_free.step, 512));
  free512.compiler = compiler_label();
  free512.baseline = "none";
  const double free_above = static_cast<double>(long_free.peak - long_free.start);
  std::snprintf(note, sizeof note, "ms per 1000 tokens; above start %.1f MiB", mib(free_above));
  free512.note = note;
  free512.extra = {{"kiln_peak_above_start_bytes", free_above}};
  results.add(free512);

  Result headline;
  headline.workload = "seqlen_encoder6_s512_in_torch_s128_memory";
  headline.compiler = compiler_label();
  headline.baseline = "pytorch-eager-s128";
  headline.target = 1.3;
  headline.target_kind = "ratio<=";
  if (!torch.note.empty()) {
    headline.kiln_ms = -1;
    headline.note = "no PyTorch side: " + torch.note;
    results.add(headline);
  } else {
    // The budget counts everything kiln's pool holds: its own step start (parameters,
    // AdamW's state, the batch) plus the bytes PyTorch's step added at 128.
    const size_t budget = long_free.start + static_cast<size_t>(torch.peak_above_start);
    memory::set_budget(budget);
    try {
      const Measured held = train(512, reps);
      const double above = static_cast<double>(held.peak - held.start);
      headline.set_kiln(per_kilotoken(held.step, 512));
      headline.set_baseline(per_kilotoken(torch.step, 128));
      std::snprintf(note, sizeof note,
                    "ms per 1000 tokens; above start: kiln@512 %.1f MiB, torch@128 %.1f MiB "
                    "(%s)",
                    mib(above), mib(torch.peak_above_start),
                    held.within && held.peak <= budget ? "within" : "OVER the budget");
      headline.note = note;
      headline.extra = {{"kiln_peak_above_start_bytes", above},
                        {"torch_peak_above_start_bytes", torch.peak_above_start},
                        {"budget_bytes", static_cast<double>(budget)}};
    } catch (const OutOfMemoryError& e) {
      headline.kiln_ms = -1;
      const std::string what = e.what();
      const size_t at = what.find("needs at least");
      const size_t end = what.find(" bytes;", at);
      headline.note = "infeasible: " + what.substr(at == std::string::npos ? 0 : at,
                                                   end == std::string::npos ? 90 : end - at);
    }
    memory::clear_budget();
    results.add(headline);
  }
  results.print("Sequence 512 within PyTorch's memory at 128 (6-layer encoder, batch 8)");
  return 0;
}
