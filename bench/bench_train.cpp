// Training-step benchmarks against PyTorch eager on the CPU (docs/benchmarks.md): the same
// models, shapes, optimizers and thread count in bench_train_torch.py. A step is forward,
// backward, optimizer update and reading the loss back; kiln evaluates it as one graph.
//
// Rows: train_mlp_..., train_lstm_..., train_transformer_... with kiln_ms (median step),
// baseline pytorch-eager, and extra fields kiln_peak_bytes (the memory pool's peak of
// allocated bytes over the timed steps) and torch_peak_bytes (the PyTorch process's peak
// RSS growth; its CPU allocator keeps no statistics). Target: kiln/baseline <= 0.7.
#include <algorithm>
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
  int warmup;
  std::function<std::function<double()>()> make;  // builds model + optimizer, returns a step
};

std::vector<Workload> workloads() {
  std::vector<Workload> w;
  w.push_back({"train_mlp_784_1024_1024_10_b128", 3, [] {
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
  w.push_back({"train_lstm_h256_s64_b32", 2, [] {
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
  w.push_back({"train_transformer_2x256_h4_s128_b16", 2, [] {
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

// (step ms, peak bytes) of one workload from bench_train_torch.py, run in its own process so
// that each peak RSS starts from a fresh interpreter. Empty note on success.
std::pair<double, double> run_torch(const std::string& name, int threads, int reps,
                                    std::string& note) {
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    note = "PyTorch not installed (scripts/setup_torch.sh): baseline skipped";
    return {-1, -1};
  }
  std::string cmd = "python3 " KILN_BENCH_DIR "/bench_train_torch.py --threads " +
                    std::to_string(threads) + " --reps " + std::to_string(reps) + " --only " + name;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    note = "could not run bench_train_torch.py";
    return {-1, -1};
  }
  char line[512];
  std::pair<double, double> out{-1, -1};
  while (std::fgets(line, sizeof line, p)) {
    char got[128];
    double ms = -1, peak = -1;
    if (std::sscanf(line, "RESULT %127s %lf %lf", got, &ms, &peak) == 3 && name == got) {
      out = {ms, peak};
    } else {
      std::fputs(line, stdout);
    }
  }
  pclose(p);
  if (out.first < 0) note = "bench_train_torch.py gave no result";
  return out;
}

// With KILN_BENCH_PROFILE=1: the kernels that took the most time since `before`.
void print_profile(const std::map<std::string, std::pair<double, uint64_t>>& before) {
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  uint64_t launches = 0;
  for (const jit::KernelRecord& r : jit::kernel_records()) {
    auto it = before.find(r.key);
    double ms = r.run_ms_total - (it == before.end() ? 0.0 : it->second.first);
    uint64_t n = r.launches - (it == before.end() ? 0 : it->second.second);
    if (ms <= 0) continue;
    total += ms;
    launches += n;
    std::string ops;
    for (const std::string& o : r.source_ops) ops += (ops.empty() ? "" : " ") + o;
    rows.push_back({ms, std::to_string(n) + " x  " + ops.substr(0, 100)});
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("  generated kernels: %.1f ms in %llu launches\n", total,
              static_cast<unsigned long long>(launches));
  for (size_t i = 0; i < rows.size() && i < 12; ++i)
    std::printf("  %9.1f ms  %s\n", rows[i].first, rows[i].second.c_str());
}

std::map<std::string, std::pair<double, uint64_t>> run_times() {
  std::map<std::string, std::pair<double, uint64_t>> out;
  for (const jit::KernelRecord& r : jit::kernel_records())
    out[r.key] = {r.run_ms_total, r.launches};
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags = bench_flags(
      "bench_train", "Training steps of small models against PyTorch eager on the same shapes.");
  flags.add("only", "", "run only the workloads whose name contains this text");
  flags.note("environment: BENCH_REPS (timed steps, default 10)");
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
    auto before = run_times();
    double ms = median_ms(0, reps, [&] { loss = step(); });
    if (env_int("KILN_BENCH_PROFILE", 0)) print_profile(before);
    double peak = static_cast<double>(memory::host_pool().stats().peak_allocated);
    std::string note;
    auto [torch_ms, torch_peak] = run_torch(w.name, threads, reps, note);
    Result r;
    r.workload = w.name;
    r.kiln_ms = ms;
    r.baseline = "pytorch-eager";
    r.baseline_ms = torch_ms;
    r.compiler = compiler_label();
    r.target = 0.7;
    r.target_kind = "ratio<=";
    r.extra = {{"kiln_peak_bytes", peak}, {"torch_peak_bytes", torch_peak}, {"final_loss", loss}};
    char buf[160];
    std::snprintf(buf, sizeof buf, "peak kiln %.0f MB / torch %.0f MB (RSS growth)%s%s", peak / 1e6,
                  torch_peak / 1e6, note.empty() ? "" : "; ", note.c_str());
    r.note = buf;
    results.add(std::move(r));
  }
  results.print("training steps (kiln vs PyTorch eager, CPU)");
  results.write_json();
  return 0;
}
