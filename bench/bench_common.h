#pragma once
// What every kiln benchmark shares: median-of-repetitions timing with warm-up (wall time
// and process CPU time: the machines are shared, and a CPU-time ratio survives load that a
// wall-time ratio does not), the STREAM-like bandwidth probe that gives the "stream-floor"
// baseline, a description of the machine (CPU model, ISA level found at run time, kiln's
// float32 GEMM path), and the result list (a printed table plus one JSON object per line,
// merged into bench/results/latest.json by bench/run_all.sh).
//
// Header-only on purpose: each bench_* is one translation unit plus this file.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "examples/common/flags.h"
#include "jit/blas.h"
#include "jit/compiler.h"
#include "jit/kernel_cache.h"

namespace kiln::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// CPU time of this process (all its threads, spinning included) in milliseconds.
inline double process_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

/// Wall and process CPU milliseconds of one measurement (negative: not measured).
struct Times {
  double wall_ms = -1;
  double cpu_ms = -1;
};

/// Starts at construction; elapsed() gives the wall and CPU time since then.
class Stopwatch {
 public:
  Stopwatch() : wall0_(Clock::now()), cpu0_(process_cpu_ms()) {}
  Times elapsed() const { return {ms_since(wall0_), process_cpu_ms() - cpu0_}; }

 private:
  Clock::time_point wall0_;
  double cpu0_;
};

/// Wall and CPU samples; medians() gives each one's median (not the pair of one sample).
struct Samples {
  std::vector<double> wall, cpu;
  void add(Times t) {
    wall.push_back(t.wall_ms);
    cpu.push_back(t.cpu_ms);
  }
  Times medians() const { return {median(wall), median(cpu)}; }
};

/// Runs `fn` `warmup` times, and with tiered compiles (KILN_JIT_TIERS) at least until every
/// kernel it launches has its full build: timings are of the steady state.
inline void warm_up(int warmup, const std::function<void()>& fn) {
  jit::KernelCache& cache = jit::kernel_cache();
  const int runs =
      cache.tiers()
          ? std::max<int>(warmup, static_cast<int>(jit::KernelCache::kRebuildAfterLaunches))
          : warmup;
  for (int i = 0; i < runs; ++i) fn();
  cache.wait_for_rebuilds();
}

/// Median wall and process CPU milliseconds of `fn` over `reps` timed runs after `warmup`
/// untimed ones (warm_up).
inline Times timed(int warmup, int reps, const std::function<void()>& fn) {
  warm_up(warmup, fn);
  Samples s;
  for (int i = 0; i < reps; ++i) {
    Stopwatch watch;
    fn();
    s.add(watch.elapsed());
  }
  return s.medians();
}

/// Median wall milliseconds of `fn` over `reps` timed runs after `warmup` untimed ones (for
/// probes whose CPU time nobody reads).
inline double median_ms(int warmup, int reps, const std::function<void()>& fn) {
  warm_up(warmup, fn);
  std::vector<double> times;
  times.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    auto start = Clock::now();
    fn();
    times.push_back(ms_since(start));
  }
  return median(times);
}

// --- the machine ----------------------------------------------------------------------

/// What a reader needs to compare two runs: the CPU and the GEMM kernels kiln ran on it.
struct Machine {
  std::string cpu_model;  ///< /proc/cpuinfo "model name" (lscpu's), e.g. "AMD EPYC"
  int family = -1;        ///< "cpu family" (x86), -1 when absent
  int model = -1;         ///< "model" number (x86), -1 when absent
  std::string isa;        ///< vector ISA level found at run time, e.g. "x86-64-v4 +avx512_bf16"
  std::string gemm;       ///< kiln's float32 GEMM path, e.g. "oneDNN 2.6.3 avx512_core_bf16"
};

namespace detail {
// The x86-64 micro-architecture level (psABI: v2 SSE4.2/POPCNT, v3 AVX2/FMA/BMI2, v4
// AVX-512 F/BW/CD/DQ/VL) the running CPU supports, plus the extensions GEMM kernels use.
inline std::string isa_level() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  std::string level = "x86-64";
  if (__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt")) level = "x86-64-v2";
  if (level == "x86-64-v2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi2"))
    level = "x86-64-v3";
  if (level == "x86-64-v3" && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    level = "x86-64-v4";
  if (__builtin_cpu_supports("avx512vnni")) level += " +avx512_vnni";
  if (__builtin_cpu_supports("avx512bf16")) level += " +avx512_bf16";
  if (__builtin_cpu_supports("avx512fp16")) level += " +avx512_fp16";
  if (__builtin_cpu_supports("amx-tile")) level += " +amx";
  return level;
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "unknown";
#endif
}

// The value after "key<spaces>:" on the first /proc/cpuinfo line that starts with key.
inline std::string cpuinfo_field(const std::string& text, const char* key) {
  size_t at = 0;
  const size_t n = std::strlen(key);
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.compare(0, n, key) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos || line.find_first_not_of(" \t", n) != colon) continue;
    size_t v = line.find_first_not_of(" \t", colon + 1);
    return v == std::string::npos ? "" : line.substr(v);
  }
  return "";
}
}  // namespace detail

/// The machine this process runs on (read once).
inline const Machine& machine() {
  static const Machine m = [] {
    Machine out;
    std::ifstream in("/proc/cpuinfo");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out.cpu_model = detail::cpuinfo_field(text, "model name");
    if (out.cpu_model.empty()) out.cpu_model = "unknown CPU";
    std::string family = detail::cpuinfo_field(text, "cpu family");
    std::string model = detail::cpuinfo_field(text, "model");
    if (!family.empty()) out.family = std::atoi(family.c_str());
    if (!model.empty()) out.model = std::atoi(model.c_str());
    out.isa = detail::isa_level();
    const jit::GemmPath p = jit::gemm_path(DType::Float32);
    out.gemm = p.library == "none" ? "generated kernels (no GEMM library)"
                                   : p.library + " " + p.version + " " + p.kernels +
                                         (p.generic ? " (generic fallback)" : "");
    return out;
  }();
  return m;
}

/// One line naming the CPU, its ISA level and the float32 GEMM path, for a table header.
inline std::string machine_line() {
  const Machine& m = machine();
  std::string line = "CPU: " + m.cpu_model;
  if (m.family >= 0)
    line += " (family " + std::to_string(m.family) + ", model " + std::to_string(m.model) + ")";
  return line + ", " + m.isa + "; float32 GEMM: " + m.gemm;
}

/// The flag parser of a benchmark, with the --json flag every one takes; add its own flags,
/// then parse_or_exit. `--help` prints the usage without running anything.
inline example::Flags bench_flags(const char* program, const char* summary) {
  example::Flags flags(program, summary);
  flags.add("json", "", "append the results as JSON lines to this file (bench/run_all.sh)");
  return flags;
}

/// Parses argv; returns the exit code when the program should stop (--help, bad flag).
inline std::optional<int> parse_or_exit(example::Flags& flags, int argc, char** argv) {
  int code = 0;
  if (!flags.parse(argc, argv, &code)) return code;
  return std::nullopt;
}

/// An environment variable as an integer, or `fallback` when unset/empty.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::atoi(v) : fallback;
}

// --- the PyTorch side ---------------------------------------------------------------------

/// How a PyTorch-side script (bench/*_torch.py) ended: `note` is empty when it ran to the
/// end, else why there is no result (PyTorch missing, a timeout, a failure, with the last
/// line it printed that was not a result).
struct TorchScriptRun {
  std::string note;
};

/// Runs bench/`script` `args` with python3 in a process of its own (so that each peak RSS
/// starts from a fresh interpreter), bounded by BENCH_TORCH_TIMEOUT seconds (default 900),
/// and hands every line it prints to `on_line`, which returns whether it took the line as a
/// result. Other lines are echoed when `echo` and kept for the note. Used by every bench
/// that measures PyTorch beside kiln (those define KILN_BENCH_DIR, where the scripts are).
#ifdef KILN_BENCH_DIR
inline TorchScriptRun run_torch_script(const std::string& script, const std::string& args,
                                       bool echo,
                                       const std::function<bool(const char* line)>& on_line) {
  TorchScriptRun out;
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    out.note = "PyTorch not installed (scripts/setup_torch.sh): baseline skipped";
    return out;
  }
  const int limit = env_int("BENCH_TORCH_TIMEOUT", 900);
  const std::string cmd = "timeout " + std::to_string(limit) + " python3 " KILN_BENCH_DIR "/" +
                          script + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    out.note = "could not run " + script;
    return out;
  }
  char line[1024];
  std::string last;  // the last line that was not a result, for a run that dies
  while (std::fgets(line, sizeof line, p)) {
    if (on_line(line)) continue;
    last = line;
    if (echo) std::fputs(line, stdout);
  }
  const int rc = pclose(p);
  while (!last.empty() && std::isspace(static_cast<unsigned char>(last.back()))) last.pop_back();
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 124)
    out.note = script + " ran past BENCH_TORCH_TIMEOUT=" + std::to_string(limit) + " s";
  else if (rc != 0)
    out.note = script + " failed: " + last.substr(0, 160);
  return out;
}
#endif

// --- bandwidth probe ------------------------------------------------------------------

/// Sustained memory bandwidth in GB/s (1e9 bytes), measured on kiln's own thread pool so
/// that the floor uses the same threads the kernels get.
struct Bandwidth {
  double triad_gbs = 0;  ///< a[i] = b[i] + s*c[i]: 2 reads + 1 write (STREAM counting)
  double add3_gbs = 0;   ///< d[i] = a[i] + b[i] + c[i]: 3 reads + 1 write
  double read_gbs = 0;   ///< sum of three arrays: reads only
  int threads = 0;
};

namespace detail {
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using FloatArray = std::unique_ptr<float[], FreeDeleter>;

inline FloatArray alloc_floats(size_t n) {
  void* p = std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  return FloatArray(static_cast<float*>(p));
}
}  // namespace detail

/// Runs the triad and read loops over arrays of `n` floats (far larger than the caches) and
/// returns the median bandwidth of `reps` runs each (after one warm-up).
inline Bandwidth measure_bandwidth(size_t n = size_t{32} << 20, int reps = 7) {
  auto& pool = thread_pool();
  auto a = detail::alloc_floats(n), b = detail::alloc_floats(n), c = detail::alloc_floats(n);
  float* pa = a.get();
  float* pb = b.get();
  float* pc = c.get();
  auto total = static_cast<int64_t>(n);
  const int64_t grain = 1 << 16;
  // First touch from the pool, as kiln's kernels would touch their outputs.
  pool.parallel_for(total, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      pa[i] = 0.0f;
      pb[i] = 1.0f;
      pc[i] = 2.0f;
    }
  });
  Bandwidth bw;
  bw.threads = pool.size();
  const float s = 3.0f;
  double triad_ms = median_ms(1, reps, [&] {
    pool.parallel_for(total, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
    });
  });
  bw.triad_gbs = 3.0 * static_cast<double>(n) * sizeof(float) / (triad_ms * 1e6);

  auto d = detail::alloc_floats(n);
  float* pd = d.get();
  pool.parallel_for(total, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) pd[i] = 0.0f;
  });
  double add3_ms = median_ms(1, reps, [&] {
    pool.parallel_for(total, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) pd[i] = pa[i] + pb[i] + pc[i];
    });
  });
  bw.add3_gbs = 4.0 * static_cast<double>(n) * sizeof(float) / (add3_ms * 1e6);

  std::vector<double> partial(static_cast<size_t>(pool.size()) * 64);
  volatile double sink = 0;
  // Three arrays read at once, as the fused reductions read their inputs: on this kind of
  // machine one stream per core does not reach the read bandwidth that several do.
  double read_ms = median_ms(1, reps, [&] {
    pool.parallel_for(total, grain, [&](int64_t lo, int64_t hi) {
      // 16 independent accumulators so the loop vectorizes without -ffast-math.
      float acc[16] = {};
      int64_t i = lo;
      for (; i + 16 <= hi; i += 16) {
        for (int j = 0; j < 16; ++j) acc[j] += pa[i + j] + pb[i + j] + pc[i + j];
      }
      for (; i < hi; ++i) acc[0] += pa[i] + pb[i] + pc[i];
      float t = 0;
      for (float x : acc) t += x;
      partial[static_cast<size_t>(lo / grain) % partial.size()] = t;
    });
    sink = sink + partial[0];
  });
  bw.read_gbs = 3.0 * static_cast<double>(n) * sizeof(float) / (read_ms * 1e6);
  return bw;
}

/// Milliseconds to move `read_bytes` + `write_bytes` at the bandwidth of the probe loop
/// with the same read:write mix: reads only (reductions), 3:1 (the 6-op chain) or 2:1
/// (triad; softmax). Matching the mix matters because a plain store also reads its line
/// first (write-allocate), which the byte count does not show.
inline double stream_floor_ms(const Bandwidth& bw, double read_bytes, double write_bytes) {
  double gbs = bw.read_gbs;
  if (write_bytes > 0.01 * read_bytes) {
    gbs = read_bytes >= 2.5 * write_bytes ? bw.add3_gbs : bw.triad_gbs;
  }
  return (read_bytes + write_bytes) / (gbs * 1e6);
}

// --- results ---------------------------------------------------------------------------

/// One row of latest.json. Times are always milliseconds in the JSON; a negative
/// baseline_ms means "not measured" (written as null).
struct Result {
  std::string workload;
  double kiln_ms = 0;
  double kiln_cpu_ms = -1;  ///< process CPU ms over the same runs (median); negative: none
  /// stream-floor | openblas | pytorch-eager | torch-compile, or "none" for the rows the
  /// issue gives an absolute target instead (compile, reload, per-op costs).
  std::string baseline;
  double baseline_ms = -1;
  double baseline_cpu_ms = -1;  ///< the baseline's process CPU ms; negative: not measured
  std::string compiler;         ///< the CPU compiler that built kiln's kernels ("" if irrelevant)
  std::string note;
  bool micro = false;       ///< print the table in microseconds (JSON stays ms, adds kiln_us)
  double target = 0;        ///< the issue's target for the ratio, or for kiln_ms
  std::string target_kind;  ///< "ratio<=" (kiln/baseline), "ratio>=" (baseline/kiln), "value<="
  std::vector<std::pair<std::string, double>> extra;  ///< more numeric fields for the JSON

  /// Sets kiln_ms and kiln_cpu_ms from one measurement.
  void set_kiln(Times t) {
    kiln_ms = t.wall_ms;
    kiln_cpu_ms = t.cpu_ms;
  }
  /// Sets baseline_ms and baseline_cpu_ms from one measurement.
  void set_baseline(Times t) {
    baseline_ms = t.wall_ms;
    baseline_cpu_ms = t.cpu_ms;
  }
};

inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

inline std::string json_number(double v) {
  if (!(v >= 0) || !std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// kiln_ms / baseline_ms (how many times slower kiln is), or NAN without a baseline.
inline double ratio(const Result& r) {
  return (r.baseline_ms > 0 && r.kiln_ms >= 0) ? r.kiln_ms / r.baseline_ms : NAN;
}

/// kiln_cpu_ms / baseline_cpu_ms, or NAN when either CPU time is missing.
inline double cpu_ratio(const Result& r) {
  return (r.baseline_cpu_ms > 0 && r.kiln_cpu_ms >= 0) ? r.kiln_cpu_ms / r.baseline_cpu_ms : NAN;
}

/// "met" / "MISSED" / "" for a result with a target, judged on wall time (`cpu`: on CPU
/// time, "n/a" where that is not measured).
inline std::string verdict(const Result& r, bool cpu = false) {
  if (r.target_kind.empty()) return "";
  double x = r.target_kind == "value<=" ? (cpu ? r.kiln_cpu_ms : r.kiln_ms)
                                        : (cpu ? cpu_ratio(r) : ratio(r));
  if (cpu && x < 0) x = NAN;
  if (std::isnan(x)) return "n/a";
  bool ok = r.target_kind == "ratio>=" ? (1.0 / x >= r.target) : (x <= r.target);
  return ok ? "met" : "MISSED";
}

/// Collects results, prints them as a table and appends them as JSON lines to the file
/// `json_path` (the --json flag; none when empty).
class Results {
 public:
  explicit Results(std::string json_path) : json_path_(std::move(json_path)) {}
  void add(Result r) { rows_.push_back(std::move(r)); }

  /// Prints the table under `title` and a header line naming the machine (machine_line).
  /// "ratio" is kiln / baseline in wall time, "cpu ratio" the same in process CPU time.
  void print(const char* title) const {
    std::printf("\n%s\n%s; load average %s\n", title, machine_line().c_str(),
                load_average().c_str());
    std::printf("%-34s %-8s %11s %11s %-16s %11s %11s %7s %7s %-7s %-7s %s\n", "workload",
                "compiler", "kiln", "kiln cpu", "baseline", "baseline", "base cpu", "ratio",
                "cpu rt", "target", "cpu tgt", "note");
    for (const Result& r : rows_) {
      const double scale = r.micro ? 1e3 : 1.0;
      const char* unit = r.micro ? "us" : "ms";
      auto value = [&](double v) {
        char buf[32] = "-";
        if (v >= 0) std::snprintf(buf, sizeof buf, "%.4g %s", v * scale, unit);
        return std::string(buf);
      };
      auto quotient = [](double q) {
        char buf[16] = "-";
        if (!std::isnan(q)) std::snprintf(buf, sizeof buf, "%.3f", q);
        return std::string(buf);
      };
      std::printf("%-34s %-8s %11s %11s %-16s %11s %11s %7s %7s %-7s %-7s %s\n", r.workload.c_str(),
                  r.compiler.empty() ? "-" : r.compiler.c_str(), value(r.kiln_ms).c_str(),
                  value(r.kiln_cpu_ms).c_str(), r.baseline.c_str(), value(r.baseline_ms).c_str(),
                  value(r.baseline_cpu_ms).c_str(), quotient(ratio(r)).c_str(),
                  quotient(cpu_ratio(r)).c_str(), verdict(r).c_str(), verdict(r, true).c_str(),
                  r.note.c_str());
    }
    std::fflush(stdout);
  }

  /// Appends one JSON object per line; run_all.sh joins the lines into a list. Every row
  /// names the machine (cpu_model, cpu_family, cpu_model_number, cpu_isa, gemm_path) and
  /// the load average when it was written.
  void write_json() const {
    if (json_path_.empty()) return;
    FILE* f = std::fopen(json_path_.c_str(), "a");
    if (!f) {
      std::fprintf(stderr, "bench: cannot append to %s\n", json_path_.c_str());
      return;
    }
    const Machine& m = machine();
    const std::string load = load_average();
    for (const Result& r : rows_) {
      std::fprintf(f,
                   "{\"workload\": \"%s\", \"kiln_ms\": %s, \"kiln_cpu_ms\": %s, "
                   "\"baseline\": \"%s\", \"baseline_ms\": %s, \"baseline_cpu_ms\": %s, "
                   "\"ratio\": %s, \"cpu_ratio\": %s",
                   json_escape(r.workload).c_str(), json_number(r.kiln_ms).c_str(),
                   json_number(r.kiln_cpu_ms).c_str(), json_escape(r.baseline).c_str(),
                   json_number(r.baseline_ms).c_str(), json_number(r.baseline_cpu_ms).c_str(),
                   json_number(ratio(r)).c_str(), json_number(cpu_ratio(r)).c_str());
      if (!r.compiler.empty()) std::fprintf(f, ", \"compiler\": \"%s\"", r.compiler.c_str());
      if (r.micro) std::fprintf(f, ", \"kiln_us\": %s", json_number(r.kiln_ms * 1e3).c_str());
      for (const auto& [key, value] : r.extra) {
        std::fprintf(f, ", \"%s\": %s", json_escape(key).c_str(), json_number(value).c_str());
      }
      if (!r.target_kind.empty()) {
        // Spelled out for a reader of the JSON: "kiln/baseline <= 1.15", "kiln_ms <= 15".
        const char* lhs = r.target_kind == "value<="   ? "kiln_ms <="
                          : r.target_kind == "ratio>=" ? "baseline/kiln >="
                                                       : "kiln/baseline <=";
        auto met = [](const std::string& v) {
          return v == "met" ? "true" : (v == "MISSED" ? "false" : "null");
        };
        std::fprintf(f, ", \"target\": \"%s %.4g\", \"target_met\": %s, \"target_met_cpu\": %s",
                     lhs, r.target, met(verdict(r)), met(verdict(r, true)));
      }
      if (!r.note.empty()) std::fprintf(f, ", \"note\": \"%s\"", json_escape(r.note).c_str());
      std::fprintf(f,
                   ", \"cpu_model\": \"%s\", \"cpu_family\": %s, \"cpu_model_number\": %s, "
                   "\"cpu_isa\": \"%s\", \"gemm_path\": \"%s\", \"load_average\": \"%s\"}\n",
                   json_escape(m.cpu_model).c_str(), json_number(m.family).c_str(),
                   json_number(m.model).c_str(), json_escape(m.isa).c_str(),
                   json_escape(m.gemm).c_str(), json_escape(load).c_str());
    }
    std::fclose(f);
  }

  /// The 1-, 5- and 15-minute load averages ("0.52 0.61 0.70"), or "?" off Linux.
  static std::string load_average() {
    std::ifstream in("/proc/loadavg");
    std::string a, b, c;
    if (!(in >> a >> b >> c)) return "?";
    return a + " " + b + " " + c;
  }

 private:
  std::string json_path_;
  std::vector<Result> rows_;
};

// --- where the time went (KILN_BENCH_PROFILE=1) ----------------------------------------

/// Each generated kernel's (run ms, launches) so far, by cache key.
inline std::map<std::string, std::pair<double, uint64_t>> kernel_times() {
  std::map<std::string, std::pair<double, uint64_t>> out;
  for (const jit::KernelRecord& r : jit::kernel_records())
    out[r.key] = {r.run_ms_total, r.launches};
  return out;
}

/// Prints the generated kernels that took the most time since `before` (kernel_times()),
/// with their launch counts and source ops; library calls are not among them.
inline void print_kernel_profile(const std::map<std::string, std::pair<double, uint64_t>>& before,
                                 size_t top = 12) {
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
  for (size_t i = 0; i < rows.size() && i < top; ++i)
    std::printf("  %9.1f ms  %s\n", rows[i].first, rows[i].second.c_str());
}

/// The CPU compiler kiln uses in this process ("llvm" or "external"; KILN_CPU_COMPILER).
inline std::string compiler_label() { return jit::cpu_compiler().name(); }

}  // namespace kiln::bench
