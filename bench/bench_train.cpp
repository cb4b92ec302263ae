// Training-step benchmarks against PyTorch eager and torch.compile on the CPU
// (docs/benchmarks.md), in the same run: the same models, shapes, optimizers and thread
// count in bench_train_torch.py. A step is forward, backward, optimizer update and reading
// the loss back; kiln evaluates it as one graph.
//
// Rows: train_mlp_..., train_lstm_..., train_transformer_..., one with baseline
// pytorch-eager and one with torch-compile each, with kiln_ms / kiln_cpu_ms (median wall and
// process CPU time of a step), the baseline's pair, and extra fields kiln_peak_bytes (the
// memory pool's peak of allocated bytes over the timed steps) and torch_peak_bytes (the
// PyTorch process's peak RSS growth; its CPU allocator keeps no statistics). Targets (issue
// 24), kiln / PyTorch eager: MLP <= 0.7, Transformer <= 0.8, LSTM <= 1.5; the torch-compile
// rows have none. A torch.compile that fails leaves its row without a baseline and says why.
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "bench_common.h"
#include "bench_models.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "memory/host_pool.h"

using namespace kiln;
using namespace kiln::bench;

namespace {

struct Workload {
  std::string name;
  double target;  // kiln / PyTorch eager
  int warmup;
  std::function<std::function<double()>()> make;  // builds model + optimizer, returns a step
};

std::vector<Workload> workloads() {
  std::vector<Workload> w;
  w.push_back({"train_mlp_784_1024_1024_10_b128", 0.7, 3, [] {
                 auto model = std::make_shared<nn::Sequential>(
                     std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                         std::make_shared<nn::Linear>(784, 1024), std::make_shared<nn::ReLU>(),
                         std::make_shared<nn::Linear>(1024, 1024), std::make_shared<nn::ReLU>(),
                         std::make_shared<nn::Linear>(1024, 10)});
                 auto opt = std::make_shared<optim::SGD>(
                     model->parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
                 Tensor x = randn({128, 784}).eval();
                 Tensor y = randint(0, 10, {128}).eval();
                 return std::function<double()>([model, opt, x, y] {
                   opt->zero_grad();
                   Tensor loss = nn::cross_entropy(model->forward(x), y);
                   loss.backward();
                   opt->step();
                   return loss.item<double>();
                 });
               }});
  w.push_back({"train_lstm_h256_s64_b32", 1.5, 2, [] {
                 auto model = std::make_shared<CharLSTM>();
                 auto opt = std::make_shared<optim::Adam>(model->parameters(),
                                                          optim::AdamOptions{.lr = 1e-3});
                 Tensor x = randint(0, 128, {32, 64}).eval();
                 Tensor y = randint(0, 128, {32 * 64}).eval();
                 return std::function<double()>([model, opt, x, y] {
                   opt->zero_grad();
                   Tensor loss = nn::cross_entropy(reshape(model->forward(x), {32 * 64, 128}), y);
                   loss.backward();
                   opt->step();
                   return loss.item<double>();
                 });
               }});
  w.push_back({"train_transformer_2x256_h4_s128_b16", 0.8, 2, [] {
                 auto model = std::make_shared<GPT>(2, 128);
                 auto opt = std::make_shared<optim::AdamW>(
                     model->parameters(), optim::AdamWOptions{.lr = 3e-4, .weight_decay = 0.01});
                 Tensor x = randint(0, 128, {16, 128}).eval();
                 Tensor y = randint(0, 128, {16 * 128}).eval();
                 return std::function<double()>([model, opt, x, y] {
                   opt->zero_grad();
                   Tensor loss = nn::cross_entropy(reshape(model->forward(x), {16 * 128, 128}), y);
                   loss.backward();
                   opt->step();
                   return loss.item<double>();
                 });
               }});
  return w;
}

// One PyTorch run of a workload: the step's medians and the peak RSS growth, or a note.
struct TorchRun {
  Times step;
  double peak = -1;
  std::string note;  // empty on success
};

// Runs bench_train_torch.py for one workload (eager, or with `compile` under torch.compile)
// in its own process, so that each peak RSS starts from a fresh interpreter. The compile
// run is bounded by BENCH_TORCH_TIMEOUT seconds (default 900), compiling included.
TorchRun run_torch(const std::string& name, int threads, int reps, bool compile) {
  TorchRun out;
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    out.note = "PyTorch not installed (scripts/setup_torch.sh): baseline skipped";
    return out;
  }
  const int limit = env_int("BENCH_TORCH_TIMEOUT", 900);
  std::string cmd = "timeout " + std::to_string(limit) +
                    " python3 " KILN_BENCH_DIR "/bench_train_torch.py --threads " +
                    std::to_string(threads) + " --reps " + std::to_string(reps) + " --only " +
                    name + (compile ? " --compile" : "") + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    out.note = "could not run bench_train_torch.py";
    return out;
  }
  char line[1024];
  std::string last;  // the last diagnostic line, for a run that dies without a NOTE
  while (std::fgets(line, sizeof line, p)) {
    char got[128];
    int used = 0;
    Times t;
    double peak = -1;
    if (std::sscanf(line, "RESULT %127s %lf %lf %lf", got, &t.wall_ms, &t.cpu_ms, &peak) == 4 &&
        name == got) {
      out.step = t;
      out.peak = peak;
    } else if (std::sscanf(line, "NOTE %127s %n", got, &used) == 1 && used > 0) {
      out.note = line + used;
    } else {
      last = line;
      if (!compile) std::fputs(line, stdout);  // inductor's warnings would flood the table
    }
  }
  const int rc = pclose(p);
  while (!out.note.empty() && std::isspace(static_cast<unsigned char>(out.note.back())))
    out.note.pop_back();
  if (out.step.wall_ms < 0 && out.note.empty()) {
    while (!last.empty() && std::isspace(static_cast<unsigned char>(last.back()))) last.pop_back();
    out.note =
        WIFEXITED(rc) && WEXITSTATUS(rc) == 124
            ? "bench_train_torch.py ran past BENCH_TORCH_TIMEOUT=" + std::to_string(limit) + " s"
            : "bench_train_torch.py gave no result: " + last.substr(0, 160);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags = bench_flags(
      "bench_train",
      "Training steps of small models against PyTorch eager and torch.compile on the same "
      "shapes.");
  flags.add("only", "", "run only the workloads whose name contains this text");
  flags.note(
      "environment: BENCH_REPS (timed steps, default 10), BENCH_TORCH_TIMEOUT (seconds per "
      "PyTorch run, default 900)");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  Results results(flags.str("json"));
  const int reps = env_int("BENCH_REPS", 10);
  const int threads = thread_pool().size();
  const std::string only = flags.str("only");
  std::printf("training steps: %d threads, median of %d steps after warm-up\n", threads, reps);
  for (const Workload& w : workloads()) {
    if (!only.empty() && w.name.find(only) == std::string::npos) continue;
    manual_seed(0);
    std::function<double()> step = w.make();
    double loss = 0;
    for (int i = 0; i < w.warmup; ++i) loss = step();
    memory::host_pool().reset_peak_stats();
    auto before = kernel_times();
    const Times kiln_t = timed(0, reps, [&] { loss = step(); });
    if (env_int("KILN_BENCH_PROFILE", 0)) print_kernel_profile(before);
    double peak = static_cast<double>(memory::host_pool().stats().peak_allocated);
    for (bool compile : {false, true}) {
      const TorchRun torch = run_torch(w.name, threads, reps, compile);
      Result r;
      r.workload = w.name;
      r.set_kiln(kiln_t);
      r.baseline = compile ? "torch-compile" : "pytorch-eager";
      r.set_baseline(torch.step);
      r.compiler = compiler_label();
      if (!compile) {
        r.target = w.target;
        r.target_kind = "ratio<=";
      }
      r.extra = {{"kiln_peak_bytes", peak}, {"torch_peak_bytes", torch.peak}, {"final_loss", loss}};
      char buf[160];
      std::snprintf(buf, sizeof buf, "peak kiln %.0f MB / torch %.0f MB (RSS growth)", peak / 1e6,
                    torch.peak / 1e6);
      r.note = buf;
      if (!torch.note.empty()) r.note += "; " + torch.note;
      results.add(std::move(r));
    }
  }
  results.print("training steps (kiln vs PyTorch eager and torch.compile, CPU)");
  results.write_json();
  return 0;
}
