// float32 GEMM through kiln::matmul against the best of the libraries called directly in the
// same run, with the same inputs and thread count: oneDNN (kiln's float32 library), OpenBLAS
// on the kernels it picked (and, when it picked generic ones on a CPU with AVX2, on the
// right ones: OPENBLAS_CORETYPE set for a child run of this program alone), and
// torch.matmul where PyTorch is importable. Shapes: squares 256..2048, the benchmark
// LSTM's step (and its weight gradient, A transposed) and the Transformer's projections.
// Wall and process CPU time are medians; the CPU-time ratio survives a loaded machine.
// kiln's time covers building the matmul and evaluating it (after warm-up).
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "jit/blas.h"
#include "jit/executor.h"
#include "kiln/kiln.h"

#if KILN_BENCH_DNNL
#include <dnnl.h>
#endif

namespace {

using namespace kiln;
using namespace kiln::bench;

struct Shape3 {
  const char* what;
  int64_t m, n, k;
  bool ta;  // A stored [k, m] and used transposed (a weight gradient)
};

const Shape3 kShapes[] = {
    {"square", 256, 256, 256, false},
    {"square", 512, 512, 512, false},
    {"square", 1024, 1024, 1024, false},
    {"square", 2048, 2048, 2048, false},
    {"lstm step", 32, 1024, 256, false},
    {"lstm weight grad", 256, 1024, 32, true},
    {"transformer qkv", 2048, 768, 256, false},
    {"transformer ffn1", 2048, 1024, 256, false},
    {"transformer ffn2", 2048, 256, 1024, false},
};

int reps_for(const Shape3& s, int reps) {
  return 2.0 * s.m * s.n * s.k > 4e9 ? std::max(3, reps / 2) : reps;
}

// OpenBLAS threaded over `threads`, each shape on fresh inputs.
std::vector<Times> openblas_times(int threads, int reps) {
  openblas_set_num_threads(threads);
  std::vector<Times> out;
  for (const Shape3& s : kShapes) {
    std::vector<float> a(static_cast<size_t>(s.m * s.k), 0.25f),
        b(static_cast<size_t>(s.k * s.n), 0.5f), c(static_cast<size_t>(s.m * s.n));
    out.push_back(timed(2, reps_for(s, reps), [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, CblasNoTrans,
                  static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f,
                  a.data(), static_cast<int>(s.ta ? s.m : s.k), b.data(), static_cast<int>(s.n),
                  0.0f, c.data(), static_cast<int>(s.n));
    }));
  }
  openblas_set_num_threads(1);
  return out;
}

// The OpenBLAS core for this CPU's vector features, for a child run when it picked generic.
const char* right_openblas_core() {
  if (__builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (__builtin_cpu_supports("avx512bw")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2")) return "Haswell";
  return nullptr;
}

// torch.matmul's times by shape, or empty with `note` saying why.
std::map<std::string, Times> torch_times(int threads, int reps, std::string& note) {
  std::map<std::string, Times> out;
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    note = "PyTorch not installed";
    return out;
  }
  std::string cmd = "python3 " KILN_BENCH_DIR "/bench_gemm_torch.py --threads " +
                    std::to_string(threads) + " --reps " + std::to_string(reps);
  for (const Shape3& s : kShapes)
    cmd += " " + std::to_string(s.m) + "," + std::to_string(s.n) + "," + std::to_string(s.k) + "," +
           std::to_string(s.ta ? 1 : 0);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    note = "could not run bench_gemm_torch.py";
    return out;
  }
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    long long m, n, k;
    int ta;
    Times t;
    if (std::sscanf(line, "RESULT %lld %lld %lld %d %lf %lf", &m, &n, &k, &ta, &t.wall_ms,
                    &t.cpu_ms) == 6)
      out[std::to_string(m) + "," + std::to_string(n) + "," + std::to_string(k) + "," +
          std::to_string(ta)] = t;
  }
  if (pclose(p) != 0 && out.empty()) note = "bench_gemm_torch.py failed";
  return out;
}

std::string key_of(const Shape3& s) {
  return std::to_string(s.m) + "," + std::to_string(s.n) + "," + std::to_string(s.k) + "," +
         std::to_string(s.ta ? 1 : 0);
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags =
      bench_flags("bench_gemm",
                  "kiln's float32 GEMM against oneDNN, OpenBLAS and torch.matmul called directly.");
  flags.add("openblas-only", "0",
            "1: print OpenBLAS's times alone (the child run with OPENBLAS_CORETYPE set)");
  flags.note("environment: BENCH_REPS (timed repetitions, default 9)");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  const int reps = env_int("BENCH_REPS", 9);
  const int threads = thread_pool().size();
  if (flags.str("openblas-only") == "1") {
    const std::vector<Times> t = openblas_times(threads, reps);
    for (size_t i = 0; i < t.size(); ++i)
      std::printf("OPENBLAS %zu %.6f %.6f\n", i, t[i].wall_ms, t[i].cpu_ms);
    return 0;
  }
  Results results(flags.str("json"));
  const std::string compiler = compiler_label();
  const jit::GemmPath blas = jit::gemm_path(DType::Float64);  // OpenBLAS's own path
  std::printf("bench_gemm: %d threads, compiler %s; %s\n", threads, compiler.c_str(),
              machine_line().c_str());

  // kiln's rows first, every shape, before any peer runs in this process: after a call on
  // a team of two (oneDNN's OpenMP, OpenBLAS's pool), the team's threads spin for a while,
  // and a kiln row timed then shared its cores with them (a small product ran at one
  // thread's speed: 0.166 ms for the LSTM step instead of 0.088).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // see just above
  std::vector<Times> kiln_times;
  std::vector<jit::EvalStats> kiln_stats;
  for (const Shape3& s : kShapes) {
    Tensor a = (rand(s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k}) - 0.5f).eval();
    Tensor b = (rand({s.k, s.n}) - 0.5f).eval();
    auto product = [&] { return matmul(s.ta ? transpose(a, 0, 1) : a, b); };
    kiln_times.push_back(timed(2, reps_for(s, reps), [&] { product().eval(); }));
    kiln_stats.push_back(jit::last_eval_stats());
  }
  std::vector<Times> openblas = openblas_times(threads, reps);
  std::string openblas_label = "openblas(" + blas.kernels + ")";
  if (blas.library == "OpenBLAS" && blas.generic && right_openblas_core()) {
    // What OpenBLAS does on kernels for this CPU: the core type is read once at load, so a
    // child process of this program runs with it set, for that command alone.
    const std::string cmd = std::string("OPENBLAS_CORETYPE=") + right_openblas_core() + " '" +
                            std::string(argv[0]) + "' --openblas-only 1";
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char line[256];
      size_t i;
      Times t;
      while (std::fgets(line, sizeof line, p))
        if (std::sscanf(line, "OPENBLAS %zu %lf %lf", &i, &t.wall_ms, &t.cpu_ms) == 3 &&
            i < openblas.size() && t.wall_ms < openblas[i].wall_ms)
          openblas[i] = t;
      pclose(p);
      openblas_label = std::string("openblas(") + right_openblas_core() + ", set)";
    }
  }
  std::string torch_note;
  const std::map<std::string, Times> torch = torch_times(threads, reps, torch_note);

  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Shape3& s = kShapes[i];
    Tensor a = (rand(s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k}) - 0.5f).eval();
    Tensor b = (rand({s.k, s.n}) - 0.5f).eval();
    const int r = reps_for(s, reps);
    std::vector<std::pair<std::string, Times>> peers;
#if KILN_BENCH_DNNL
    {
      // oneDNN threaded over the same cores (OpenMP; kiln calls it one thread per part).
      using SetThreads = void (*)(int);
      if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads")))
        set(threads);
      std::vector<float> c(static_cast<size_t>(s.m * s.n));
      const float* pa = a.data<float>();
      const float* pb = b.data<float>();
      peers.push_back({"onednn", timed(2, r, [&] {
                         dnnl_sgemm(s.ta ? 'T' : 'N', 'N', s.m, s.n, s.k, 1.0f, pa,
                                    s.ta ? s.m : s.k, pb, s.n, 0.0f, c.data(), s.n);
                       })});
      if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads")))
        set(1);
    }
#endif
    peers.push_back({openblas_label, openblas[i]});
    if (auto it = torch.find(key_of(s)); it != torch.end())
      peers.push_back({"torch.matmul", it->second});
    const Times kiln_t = kiln_times[i];
    const jit::EvalStats st = kiln_stats[i];
    const auto best = std::min_element(
        peers.begin(), peers.end(),
        [](const auto& x, const auto& y) { return x.second.wall_ms < y.second.wall_ms; });
    Result row;
    char workload[96];
    std::snprintf(workload, sizeof workload, "GEMM f32 %s %lldx%lldx%lld%s", s.what,
                  static_cast<long long>(s.m), static_cast<long long>(s.n),
                  static_cast<long long>(s.k), s.ta ? " A^T" : "");
    row.workload = workload;
    row.set_kiln(kiln_t);
    row.baseline = best->first;
    row.set_baseline(best->second);
    row.compiler = compiler;
    const double gflop = 2.0 * s.m * s.n * static_cast<double>(s.k) * 1e-9;
    std::string note =
        std::string(st.library_calls ? "library call" : "generated kernel") + "; kiln " +
        std::to_string(static_cast<int>(gflop / (kiln_t.wall_ms * 1e-3))) + " GFLOP/s";
    for (const auto& [name, t] : peers) {
      note += "; " + name + " " + std::to_string(static_cast<int>(gflop / (t.wall_ms * 1e-3))) +
              " GFLOP/s";
      row.extra.push_back({name + "_ms", t.wall_ms});
      row.extra.push_back({name + "_cpu_ms", t.cpu_ms});
    }
    if (torch.empty()) note += "; torch: " + torch_note;
    row.note = note;
    // Target: kiln at least 0.95x the best peer's speed, i.e. kiln_ms / best_ms <= 1/0.95.
    row.target_kind = "ratio<=";
    row.target = 1.0 / 0.95;
    results.add(row);
  }
  results.print("bench_gemm (median ms; ratio = kiln / best of the libraries called directly)");
  results.write_json();
  return 0;
}
