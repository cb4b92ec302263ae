// The CUDA backend against the ceilings of the device it runs on (docs/gpu.md; issue targets:
// fused kernels >= 0.85x of the copy bandwidth, GEMM >= 0.9x torch.matmul):
//   relu(a*b+c)*0.5, relu(a*b+c).sum()   N float32 (default 128M: 2 GiB moved, ~35x the L2)
//   row sums, row softmax                8192 x N/8192 float32
//       each against a device-to-device copy of the same bytes (read + written), timed next
//       to it in this run, and against PyTorch eager on the same device
//   matmul f32 / bf16                    4096^3 and 1024^3 against torch.matmul
//   MLP training step                    bench_train's MLP on the GPU against PyTorch eager
//   NVRTC compile per kernel             every CUDA kernel of this run, compiled cold into a
//                                        fresh KILN_CACHE_DIR (the median of their records)
// Device times come from events on kiln's stream around batches of evaluations (graph
// building and launching included), median over repetitions after warm-up; the training step
// is host wall time (it reads the loss back). Each workload is first checked against the
// CPU on a small size, so a fast wrong answer is never reported. Without a CUDA device it
// prints why and exits 0.
//
// Usage: bench_cuda [--json PATH]
//   env: BENCH_REPS (default 15), BENCH_CUDA_ELEMS (default 134217728), BENCH_CUDA_BATCH
//        (evaluations per timed batch, default 10), BENCH_CUDA_ON_CPU=1 (the same program
//        on the CPU with host timers and memcpy as the copy: checks this program without
//        a GPU; its numbers mean nothing)
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "core/cuda_driver.h"
#include "distinct_graphs.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "jit/executor.h"
#include "jit/kernel_cache.h"

#ifndef KILN_BENCH_DIR
#define KILN_BENCH_DIR "bench"
#endif

namespace {

using namespace kiln;
using namespace kiln::bench;

Device kGpu = Device::cuda(0);  // the CPU under BENCH_CUDA_ON_CPU=1
bool g_on_cpu = false;
int g_failures = 0;

void sync() {
  if (!g_on_cpu) cuda::synchronize(0);
}

struct Config {
  int reps = 15, batch = 10;
  int64_t elems = int64_t{128} << 20;
  std::vector<int64_t> gemm = {4096, 1024};  // square sizes
};

// Median milliseconds per call of `fn`, timed with events on kiln's stream around batches.
double device_ms(const Config& cfg, const std::function<void()>& fn) {
  if (g_on_cpu) {
    return median_ms(2, cfg.reps,
                     [&] {
                       for (int i = 0; i < cfg.batch; ++i) fn();
                     }) /
           cfg.batch;
  }
  cuda::StreamTimer timer(0);
  for (int i = 0; i < 2 * cfg.batch; ++i) fn();  // compiles, fills the pool
  cuda::synchronize(0);
  std::vector<double> times;
  for (int r = 0; r < cfg.reps; ++r) {
    timer.start();
    for (int i = 0; i < cfg.batch; ++i) fn();
    times.push_back(timer.stop() / cfg.batch);
  }
  return median(times);
}

// A device-to-device copy that moves `bytes` (half read, half written), in ms.
double copy_ms(const Config& cfg, double bytes) {
  size_t half = static_cast<size_t>(bytes / 2);
  if (g_on_cpu) {
    std::vector<char> src(half, 0x3f), dst(half);
    return device_ms(cfg, [&] { std::memcpy(dst.data(), src.data(), half); });
  }
  void* src = cuda::device_malloc(0, half);
  void* dst = cuda::device_malloc(0, half);
  cuda::memset_device(0, src, 0x3f, half);
  double ms = device_ms(cfg, [&] { cuda::copy_device_to_device(0, dst, src, half); });
  cuda::synchronize(0);
  cuda::device_free(0, src);
  cuda::device_free(0, dst);
  return ms;
}

// Largest |got - want| / max(floor, |want|): relative, and absolute below `floor`.
double max_rel_err(const std::vector<double>& got, const std::vector<double>& want, double floor) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::abs(got[i] - want[i]) / std::max(floor, std::abs(want[i]));
    if (!(e <= worst)) worst = e;  // NaN wins
  }
  return worst;
}

// ||got - want|| / ||want|| (the GEMM check: tf32 and bf16 round per element).
double frobenius_rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Runs `body`; a thrown error becomes a row that says so (and a failing exit status).
void guarded(Results& results, const std::string& workload, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    ++g_failures;
    std::fprintf(stderr, "bench_cuda: %s: %s\n", workload.c_str(), e.what());
    Result r;
    r.workload = workload;
    r.kiln_ms = -1;
    r.baseline = "none";
    r.note = std::string("FAILED: ") + e.what();
    results.add(r);
  }
}

// A check that failed: reported instead of a time.
void wrong(Results& results, const std::string& workload, double err) {
  ++g_failures;
  Result r;
  r.workload = workload;
  r.kiln_ms = -1;
  r.baseline = "none";
  char note[96];
  std::snprintf(note, sizeof note, "WRONG: disagrees with the CPU, error %.3g", err);
  r.note = note;
  results.add(r);
}

// PyTorch's numbers: key -> ms, from bench_cuda_torch.py run with the same sizes.
std::map<std::string, double> run_torch(const Config& cfg, int64_t rows, std::string& note) {
  std::map<std::string, double> out;
  std::string device = g_on_cpu ? "cpu" : "cuda";
  if (std::system(("python3 -c 'import torch, sys; sys.exit(0 if \"" + device +
                   "\" == \"cpu\" or torch.cuda.is_available() else 1)' >/dev/null 2>&1")
                      .c_str()) != 0) {
    note = "PyTorch (with " + device + ") not importable: torch baselines skipped";
    return out;
  }
  std::string cmd = "python3 " KILN_BENCH_DIR "/bench_cuda_torch.py --device " + device +
                    " --elems " + std::to_string(cfg.elems) + " --rows " + std::to_string(rows) +
                    " --reps " + std::to_string(cfg.reps) + " --batch " +
                    std::to_string(cfg.batch) + " --gemm " + std::to_string(cfg.gemm[0]) + "," +
                    std::to_string(cfg.gemm[1]);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    note = "could not run bench_cuda_torch.py";
    return out;
  }
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    char key[128];
    double ms = -1;
    if (std::sscanf(line, "RESULT %127s %lf", key, &ms) == 2) {
      out[key] = ms;
    } else {
      std::fputs(line, stdout);
    }
  }
  if (pclose(p) != 0) note = "bench_cuda_torch.py failed (its output is above)";
  return out;
}

double lookup(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? -1 : it->second;
}

// --- memory-bound workloads ----------------------------------------------------------------

struct Streaming {
  std::string name, torch_key;
  double read_bytes, write_bytes;
  bool target;                                            // the 0.85x-copy target applies
  double floor, tol;                                      // the check: max_rel_err <= tol
  std::function<Tensor(const std::vector<Tensor>&)> op;   // the graph over the inputs
  std::function<std::vector<Tensor>(bool small)> inputs;  // lazy (random numbers)
};

void bench_streaming(Results& results, const Config& cfg, const Streaming& w,
                     const std::map<std::string, double>& torch) {
  guarded(results, w.name, [&] {
    // The check: the small inputs on both devices.
    std::vector<Tensor> host = w.inputs(true), dev;
    for (const Tensor& t : host) dev.push_back(t.eval().to(kGpu).eval());
    double err =
        max_rel_err(w.op(dev).to_vector<double>(), w.op(host).to_vector<double>(), w.floor);
    if (!(err <= w.tol)) return wrong(results, w.name, err);

    // The timed inputs are generated on the device (random numbers carry no data).
    dev.clear();
    for (const Tensor& t : w.inputs(false)) dev.push_back(t.to(kGpu).eval());
    double kiln_ms = device_ms(cfg, [&] { w.op(dev).eval(); });
    jit::EvalStats st = jit::last_eval_stats();
    double bytes = w.read_bytes + w.write_bytes;
    double base_ms = copy_ms(cfg, bytes);
    Result r;
    r.workload = w.name;
    r.kiln_ms = kiln_ms;
    r.baseline = "d2d-copy";
    r.baseline_ms = base_ms;
    r.extra = {{"bytes_moved", bytes},
               {"kiln_gbs", bytes / (kiln_ms * 1e6)},
               {"copy_gbs", bytes / (base_ms * 1e6)},
               {"max_rel_err", err}};
    r.note = std::to_string(st.kernels) + " kernel(s)" + (g_on_cpu ? ", ON THE CPU" : "");
    if (w.target) {
      r.target_kind = "ratio>=";  // copy_ms / kiln_ms: the fraction of the copy bandwidth
      r.target = 0.85;
    }
    results.add(r);
    Result t = r;
    t.baseline = "pytorch-eager";
    t.baseline_ms = lookup(torch, w.torch_key);
    t.target_kind.clear();
    t.extra = {{"torch_gbs", t.baseline_ms > 0 ? bytes / (t.baseline_ms * 1e6) : -1}};
    if (w.torch_key == "chain") {  // PyTorch's copy of the same bytes, beside kiln's
      double torch_copy = lookup(torch, "copy");
      t.extra.push_back({"torch_copy_gbs", torch_copy > 0 ? bytes / (torch_copy * 1e6) : -1});
    }
    results.add(t);
  });
}

std::vector<Streaming> streaming_workloads(int64_t n, int64_t rows) {
  const int64_t cols = n / rows;
  const double f = sizeof(float);
  auto vectors = [n](bool small) {
    int64_t m = small ? (int64_t{1} << 20) + 17 : n;  // odd: the tail of vector loads
    return std::vector<Tensor>{rand({m}), rand({m}) - 0.5f, rand({m}) - 0.5f};
  };
  auto matrix = [rows, cols](bool small) {
    return std::vector<Tensor>{rand(small ? Shape{1000, 1027} : Shape{rows, cols}) * 4.0f - 2.0f};
  };
  std::string mtag = std::to_string(rows) + "x" + std::to_string(cols);
  std::string vtag = std::to_string(n >> 20) + "M";
  return {
      {"cuda relu(a*b+c)*0.5 " + vtag, "chain", 3 * n * f, n * f, true, 1, 1e-5,
       [](const std::vector<Tensor>& x) { return relu(x[0] * x[1] + x[2]) * 0.5f; }, vectors},
      {"cuda relu(a*b+c).sum() " + vtag, "sum", 3 * n * f, 0, true, 1, 1e-4,
       [](const std::vector<Tensor>& x) { return sum(relu(x[0] * x[1] + x[2])); }, vectors},
      {"cuda row sums " + mtag, "rowsum", n * f, rows * f, true, 1, 2e-4,
       [](const std::vector<Tensor>& x) { return sum(x[0], 1); }, matrix},
      // Counted as one read and one write (a row fits on chip); no target: the is
      // for fused elementwise and reduction kernels.
      {"cuda row softmax " + mtag, "softmax", n * f, n * f, false, 1e-4, 1e-4,
       [](const std::vector<Tensor>& x) { return softmax(x[0], 1); }, matrix},
  };
}

// --- GEMM -------------------------------------------------------------------------------------

void bench_gemm(Results& results, const Config& cfg, DType dtype, int64_t n,
                const std::map<std::string, double>& torch) {
  std::string tag = dtype == DType::BFloat16 ? "bf16" : "f32";
  std::string name = "cuda matmul " + tag + " " + std::to_string(n) + "^3";
  guarded(results, name, [&] {
    // The check against float64 on the CPU, from the same (rounded) inputs.
    Tensor sa = cast(randn({192, 256}), dtype).eval(), sb = cast(randn({256, 160}), dtype).eval();
    std::vector<double> got = matmul(sa.to(kGpu), sb.to(kGpu)).to_vector<double>();
    std::vector<double> want =
        matmul(cast(sa, DType::Float64), cast(sb, DType::Float64)).to_vector<double>();
    double err = frobenius_rel_err(got, want);
    if (!(err <= (dtype == DType::BFloat16 ? 2e-2 : 5e-3))) return wrong(results, name, err);

    Tensor a = cast(randn({n, n}), dtype).to(kGpu).eval();
    Tensor b = cast(randn({n, n}), dtype).to(kGpu).eval();
    double ms = device_ms(cfg, [&] { matmul(a, b).eval(); });
    Result r;
    r.workload = name;
    r.kiln_ms = ms;
    r.baseline = "torch.matmul";
    r.baseline_ms = lookup(torch, "gemm_" + tag + "_" + std::to_string(n));
    r.target_kind = "ratio>=";  // torch_ms / kiln_ms
    r.target = 0.9;
    double flop = 2.0 * static_cast<double>(n) * n * n;
    r.extra = {{"kiln_tflops", flop / (ms * 1e9)},
               {"torch_tflops", r.baseline_ms > 0 ? flop / (r.baseline_ms * 1e9) : -1},
               {"rel_err", err}};
    char note[96];
    std::snprintf(note, sizeof note, "rel. error %.2g (tf32 ~3e-4, bf16 ~4e-3)", err);
    r.note = note;
    results.add(r);
  });
}

// --- training step ----------------------------------------------------------------------------

void bench_mlp(Results& results, const Config& cfg, const std::map<std::string, double>& torch) {
  const std::string name = "cuda train_mlp_784_1024_1024_10_b128";
  guarded(results, name, [&] {
    manual_seed(0);
    auto model =
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
            std::make_shared<nn::Linear>(784, 1024), std::make_shared<nn::ReLU>(),
            std::make_shared<nn::Linear>(1024, 1024), std::make_shared<nn::ReLU>(),
            std::make_shared<nn::Linear>(1024, 10)});
    // parameters() shares the module's handles, so set_data moves the model itself.
    for (Tensor& p : model->parameters()) p.set_data(p.to(kGpu).eval());
    optim::SGD opt(model->parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    Tensor x = randn({128, 784}).to(kGpu).eval();
    Tensor y = randint(0, 10, {128}).to(kGpu).eval();
    double loss = 0;
    auto step = [&] {
      opt.zero_grad();
      Tensor l = nn::cross_entropy(model->forward(x), y);
      l.backward();
      opt.step();
      loss = l.item<double>();
    };
    for (int i = 0; i < 3; ++i) step();
    double ms = median_ms(0, std::max(cfg.reps, 20), step);
    Result r;
    r.workload = name;
    r.kiln_ms = ms;
    r.baseline = "pytorch-eager";
    r.baseline_ms = lookup(torch, "train_mlp");
    r.extra = {{"final_loss", loss}};
    r.note = "host wall time per step (loss read back)";
    results.add(r);
  });
}

// --- NVRTC ------------------------------------------------------------------------------------

// The structurally distinct small graphs of bench_compile, so the compile median has a
// population beyond the workloads above.
void compile_distinct_kernels() {
  std::vector<float> v(64 * 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 37) * 0.05f - 0.9f;
  Tensor x = from_vector(v, {64, 64}).to(kGpu).eval();
  Tensor y = (x * 0.5f + 0.1f).eval();
  for (int i = 0; i < kDistinctGraphs; ++i) distinct_graph(i, x, y).eval();
  sync();
}

void report_compile_times(Results& results) {
  std::vector<double> ms;
  double worst = 0;
  std::string target;
  for (const jit::KernelRecord& r : jit::kernel_records()) {
    bool cuda_target = r.target.rfind("sm_", 0) == 0 || r.target.rfind("compute_", 0) == 0;
    if (!cuda_target || r.compile_ms <= 0) continue;
    ms.push_back(r.compile_ms);
    worst = std::max(worst, r.compile_ms);
    target = r.target;
  }
  Result r;
  r.workload = "cuda nvrtc compile per kernel (cold)";
  r.kiln_ms = ms.empty() ? -1 : median(ms);
  r.baseline = "none";
  r.extra = {{"kernels", static_cast<double>(ms.size())}, {"max_ms", worst}};
  r.note = "median of " + std::to_string(ms.size()) + " kernels for " +
           (target.empty() ? "-" : target) + ", fresh cache directory";
  results.add(r);
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags =
      bench_flags("bench_cuda",
                  "The CUDA backend: memory-bound kernels, GEMM and a training step against "
                  "a device copy and PyTorch (docs/gpu.md). Without a device it exits 0.");
  flags.note(
      "environment: BENCH_CUDA_ON_CPU=1 (run on the CPU to check the program), BENCH_REPS, "
      "BENCH_CUDA_BATCH, BENCH_CUDA_ELEMS");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  Config cfg;
  g_on_cpu = env_int("BENCH_CUDA_ON_CPU", 0) != 0;
  if (g_on_cpu) {
    kGpu = Device::cpu();
    cfg.gemm = {256, 128};
  }
  if (!g_on_cpu && cuda::device_count() == 0) {
    std::printf("bench_cuda: no CUDA device (%s); nothing to measure\n",
                cuda::driver_status().c_str());
    return 0;
  }
  // A fresh cache directory before the first kiln call, so every kernel compiles cold.
  std::string cache_dir =
      (std::filesystem::temp_directory_path() / "kiln-bench-cuda-XXXXXX").string();
  if (!mkdtemp(cache_dir.data())) {
    std::perror("bench_cuda: mkdtemp");
    return 1;
  }
  setenv("KILN_CACHE_DIR", cache_dir.c_str(), 1);

  cfg.reps = env_int("BENCH_REPS", cfg.reps);
  cfg.batch = std::max(1, env_int("BENCH_CUDA_BATCH", cfg.batch));
  if (const char* e = std::getenv("BENCH_CUDA_ELEMS"); e && *e) cfg.elems = std::atoll(e);
  const int64_t rows = 8192;
  cfg.elems = std::max<int64_t>(rows, cfg.elems / rows * rows);

  if (g_on_cpu) {
    std::printf("bench_cuda: ON THE CPU (BENCH_CUDA_ON_CPU=1): checks the program only\n");
  } else {
    cuda::DeviceProperties p = cuda::properties(0);
    std::printf("bench_cuda: %s (sm_%d%d, %d SMs, %.0f GiB), %s\n", p.name.c_str(), p.major,
                p.minor, p.multiprocessors, static_cast<double>(p.total_memory) / (1 << 30),
                cuda::driver_status().c_str());
  }
  std::printf("bench_cuda: %lld floats, batches of %d, median of %d\n",
              static_cast<long long>(cfg.elems), cfg.batch, cfg.reps);
  std::fflush(stdout);

  Results results(flags.str("json"));
  guarded(results, "cuda nvrtc compile (distinct kernels)", compile_distinct_kernels);
  std::string torch_note;
  std::map<std::string, double> torch = run_torch(cfg, rows, torch_note);
  if (!torch_note.empty()) std::printf("bench_cuda: %s\n", torch_note.c_str());

  for (const Streaming& w : streaming_workloads(cfg.elems, rows))
    bench_streaming(results, cfg, w, torch);
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (int64_t n : cfg.gemm) bench_gemm(results, cfg, dt, n, torch);
  }
  bench_mlp(results, cfg, torch);
  report_compile_times(results);

  results.print("bench_cuda (median ms; ratio = kiln / baseline)");
  results.write_json();
  std::error_code ec;
  std::filesystem::remove_all(cache_dir, ec);
  return g_failures ? 1 : 0;
}
