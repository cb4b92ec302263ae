// What the JIT costs besides running kernels:
//   cold compile per kernel   median compile_ms of >= 20 structurally distinct kernels,
//                             compiled into a fresh, empty KILN_CACHE_DIR
//   reload per kernel         a second process on the same directory: load_ms_total /
//                             disk_hits (it must compile nothing)
//   batch-size change         after warm-up, the same graph at another batch size: kernels
//                             compiled (must be 0) and the time of that evaluation
//   build one op              1e5 `x = x + 1.0f` without evaluating, per op
//   small cached graph        relu(a*b+c) on 16 floats, build + evaluate, per evaluation
//
// The cache directory is chosen once per process, and so is the compiler, so each phase is
// a separate process: run without --phase, this program creates a temporary directory and
// runs itself as `--phase cold`, `--phase reload` and `--phase overhead`, each of which sets
// KILN_CACHE_DIR before its first kiln call. KILN_CPU_COMPILER is passed through.
//
// Usage: bench_compile [--json PATH]
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "distinct_graphs.h"
#include "jit/executor.h"
#include "jit/kernel_cache.h"
#include "kiln/kiln.h"

namespace {

using namespace kiln;
using namespace kiln::bench;

constexpr int kKernels = kDistinctGraphs;

std::vector<Tensor> inputs() {
  std::vector<float> v(64 * 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 37) * 0.05f - 0.9f;
  Tensor x = from_vector(v, {64, 64});
  for (float& e : v) e = e * 0.5f + 0.1f;
  return {x, from_vector(v, {64, 64})};
}

// Evaluates the 24 graphs; returns the median wall time of their evaluations (ms).
double run_distinct_graphs() {
  std::vector<Tensor> in = inputs();
  std::vector<double> wall;
  for (int i = 0; i < kKernels; ++i) {
    auto start = Clock::now();
    distinct_graph(i, in[0], in[1]).eval();
    wall.push_back(ms_since(start));
  }
  return median(wall);
}

// This process's CPU time plus that of its waited-for children (the external compiler runs
// as a child), in milliseconds.
double cpu_with_children_ms() {
  rusage u;
  getrusage(RUSAGE_CHILDREN, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec * 1e-3; };
  return process_cpu_ms() + ms(u.ru_utime) + ms(u.ru_stime);
}

// The phase's CPU time per kernel: compiling (or loading) dominates the 24 first
// evaluations of tiny graphs, so this is the CPU cost of a kernel, as a mean.
void phase_cold(Results& results) {
  const double cpu0 = cpu_with_children_ms();
  double wall = run_distinct_graphs();
  const double phase_cpu = cpu_with_children_ms() - cpu0;
  jit::CacheStats s = jit::cache_stats();
  std::vector<double> compile;
  for (const jit::KernelRecord& r : jit::kernel_records()) {
    if (r.compile_ms > 0) compile.push_back(r.compile_ms);
  }
  Result r;
  r.workload = "cold compile per kernel";
  r.kiln_ms = median(compile);
  r.kiln_cpu_ms = compile.empty() ? -1 : phase_cpu / static_cast<double>(compile.size());
  r.baseline = "none";
  r.compiler = compiler_label();
  r.target_kind = "value<=";
  r.target = 15;
  char note[200];
  std::snprintf(note, sizeof note,
                "median of %zu kernels (%llu compiled); first evaluation wall time %.2f ms median",
                compile.size(), static_cast<unsigned long long>(s.kernels_compiled), wall);
  r.note = note;
  r.extra = {{"kernels", static_cast<double>(compile.size())}, {"first_eval_wall_ms", wall}};
  results.add(r);
}

void phase_reload(Results& results) {
  const double cpu0 = cpu_with_children_ms();
  double wall = run_distinct_graphs();
  const double phase_cpu = cpu_with_children_ms() - cpu0;
  jit::CacheStats s = jit::cache_stats();
  Result r;
  r.workload = "disk-cache reload per kernel";
  r.kiln_ms = s.disk_hits ? s.load_ms_total / static_cast<double>(s.disk_hits) : -1;
  r.kiln_cpu_ms = s.disk_hits ? phase_cpu / static_cast<double>(s.disk_hits) : -1;
  r.baseline = "none";
  r.compiler = compiler_label();
  r.target_kind = "value<=";
  r.target = 0.1;
  char note[200];
  std::snprintf(note, sizeof note,
                "%llu disk hits, %llu compiled; first evaluation wall %.3f ms median",
                static_cast<unsigned long long>(s.disk_hits),
                static_cast<unsigned long long>(s.kernels_compiled), wall);
  r.note = note;
  r.extra = {{"disk_hits", static_cast<double>(s.disk_hits)},
             {"kernels_compiled", static_cast<double>(s.kernels_compiled)},
             {"first_eval_wall_ms", wall}};
  results.add(r);
}

void phase_overhead(Results& results) {
  const std::string compiler = compiler_label();

  // Batch-size change: a linear-ish layer with a row reduction, warmed at batch 64, then
  // evaluated once at each of several new batch sizes (the first evaluation at a size).
  {
    auto graph = [](const Tensor& x, const Tensor& w, const Tensor& b) {
      return sum(relu(x * w + b), 1);
    };
    Tensor w = (rand({256}) - 0.5f).eval(), b = (rand({256}) - 0.5f).eval();
    Tensor x64 = rand({64, 256}).eval();
    for (int i = 0; i < 3; ++i) graph(x64, w, b).eval();
    double warm_ms = median_ms(5, 51, [&] { graph(x64, w, b).eval(); });
    Samples first;
    uint64_t before = jit::cache_stats().kernels_compiled;
    for (int64_t batch : {200, 96, 333, 17, 1000, 128, 65}) {
      Tensor x = rand({batch, 256}).eval();
      Stopwatch watch;
      graph(x, w, b).eval();
      first.add(watch.elapsed());
    }
    uint64_t compiled = jit::cache_stats().kernels_compiled - before;
    Result r;
    r.workload = "batch-size change";
    r.set_kiln(first.medians());
    r.baseline = "none";
    r.compiler = compiler;
    r.micro = true;
    char note[200];
    std::snprintf(note, sizeof note,
                  "%llu kernels compiled over 7 new batch sizes (must be 0); median first eval; "
                  "warm batch-64 eval %.1f us",
                  static_cast<unsigned long long>(compiled), warm_ms * 1e3);
    r.note = note;
    r.extra = {{"kernels_compiled", static_cast<double>(compiled)}, {"warm_ms", warm_ms}};
    results.add(r);
  }

  // Building one op: 1e5 additions of a weak scalar, nothing evaluated. Timed in slices of
  // 1000 so that a slice the scheduler preempted does not move the median.
  {
    const int ops = 100000, slice = 1000;
    std::vector<double> per_op, per_op_cpu, whole, destroy;
    for (int rep = 0; rep < 3; ++rep) {
      Tensor x = zeros({16});
      auto begin = Clock::now();
      for (int s = 0; s < ops / slice; ++s) {
        Stopwatch watch;
        for (int i = 0; i < slice; ++i) x = x + 1.0f;
        const Times t = watch.elapsed();
        per_op.push_back(t.wall_ms / slice);
        per_op_cpu.push_back(t.cpu_ms / slice);
      }
      whole.push_back(ms_since(begin) / ops);
      auto start = Clock::now();
      x = Tensor();
      destroy.push_back(ms_since(start) / ops);
    }
    Result r;
    r.workload = "build one op (x = x + 1.0f)";
    r.kiln_ms = median(per_op);
    r.kiln_cpu_ms = median(per_op_cpu);
    r.baseline = "none";
    r.micro = true;
    r.target_kind = "value<=";
    r.target = 0.002;
    char note[160];
    std::snprintf(note, sizeof note,
                  "median per op of 1000-op slices, 3 x 1e5 ops (whole run %.2f us/op); "
                  "freeing the chain %.2f us/op",
                  median(whole) * 1e3, median(destroy) * 1e3);
    r.note = note;
    results.add(r);
  }

  // A small cached graph: relu(a*b+c) on 16 floats, built and evaluated each time.
  {
    Tensor a = rand({16}).eval(), b = rand({16}).eval(), c = rand({16}).eval();
    // Built in its own statement: in `relu(a * b + c).eval()` the temporaries a*b and
    // a*b+c are still alive (held) during eval() and would be materialized as outputs.
    auto step = [&] {
      Tensor t = relu(a * b + c);
      t.eval();
    };
    for (int i = 0; i < 200; ++i) step();
    uint64_t before = jit::cache_stats().kernels_compiled;
    // Each evaluation timed alone: the median ignores the ones the scheduler preempted.
    std::vector<double> per_eval, per_eval_cpu, per_build;
    for (int i = 0; i < 3000; ++i) {
      // The CPU clock is a system call: read outside the wall-timed span.
      const double cpu0 = process_cpu_ms();
      auto start = Clock::now();
      step();
      per_eval.push_back(ms_since(start));
      per_eval_cpu.push_back(process_cpu_ms() - cpu0);
      start = Clock::now();
      Tensor t = relu(a * b + c);
      per_build.push_back(ms_since(start));
    }
    uint64_t compiled = jit::cache_stats().kernels_compiled - before;
    Result r;
    r.workload = "evaluate small cached graph";
    r.kiln_ms = median(per_eval);
    r.kiln_cpu_ms = median(per_eval_cpu);
    r.baseline = "none";
    r.compiler = compiler;
    r.micro = true;
    r.target_kind = "value<=";
    r.target = 0.005;  // issue 26 (issue 8's was 20 us)
    char note[160];
    std::snprintf(note, sizeof note,
                  "3 ops on 16 floats incl. building (building alone %.2f us); %zu kernel(s), "
                  "%llu compiled",
                  median(per_build) * 1e3, jit::last_eval_stats().kernels,
                  static_cast<unsigned long long>(compiled));
    r.note = note;
    r.extra = {{"build_only_ms", median(per_build)}};
    results.add(r);
  }
}

// Runs this executable again with `args` (the directory and JSON path are passed on).
int run_self(const std::string& args) {
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string cmd = "'" + self + "' " + args;
  int rc = std::system(cmd.c_str());
  if (rc != 0) std::fprintf(stderr, "bench_compile: '%s' failed (%d)\n", cmd.c_str(), rc);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags =
      bench_flags("bench_compile",
                  "Kernel compile times: cold compiles, reloads from the disk cache and the "
                  "cost of a cache hit, each phase in a fresh process.");
  flags.add("phase", "", "internal: run one phase (cold, reload or overhead) in this process");
  flags.add("dir", "", "internal: the phase's kernel cache directory");
  flags.note("environment: KILN_CPU_COMPILER");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  std::string phase = flags.str("phase");
  std::string json = flags.str("json");
  std::string json_arg = json.empty() ? "" : " --json '" + json + "'";

  if (phase.empty()) {
    // Orchestrator: never calls kiln itself.
    char tmpl[] = "/tmp/kiln-bench-cache-XXXXXX";
    char* dir = mkdtemp(tmpl);
    if (!dir) {
      std::perror("bench_compile: mkdtemp");
      return 1;
    }
    char tmpl2[] = "/tmp/kiln-bench-cache-XXXXXX";
    char* dir2 = mkdtemp(tmpl2);
    if (!dir2) {
      std::perror("bench_compile: mkdtemp");
      return 1;
    }
    int rc = run_self("--phase cold --dir '" + std::string(dir) + "'" + json_arg);
    if (rc == 0) rc = run_self("--phase reload --dir '" + std::string(dir) + "'" + json_arg);
    if (rc == 0) rc = run_self("--phase overhead --dir '" + std::string(dir2) + "'" + json_arg);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    std::filesystem::remove_all(dir2, ec);
    return rc == 0 ? 0 : 1;
  }

  // A phase: the cache directory must be set before kiln's first call reads it.
  std::string dir = flags.str("dir");
  if (dir.empty()) {
    std::fprintf(stderr, "bench_compile: --phase needs --dir\n");
    return 2;
  }
  ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
  Results results(json);
  if (phase == "cold") {
    phase_cold(results);
  } else if (phase == "reload") {
    phase_reload(results);
  } else if (phase == "overhead") {
    phase_overhead(results);
  } else {
    std::fprintf(stderr, "bench_compile: unknown phase '%s'\n", phase.c_str());
    return 2;
  }
  results.print(("bench_compile --phase " + phase).c_str());
  results.write_json();
  return 0;
}
