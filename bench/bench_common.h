#pragma once
// What every kiln benchmark shares: median-of-repetitions timing with warm-up, the
// STREAM-like bandwidth probe that gives the "stream-floor" baseline, and the result list
// (a printed table plus one JSON object per line, merged into bench/results/latest.json by
// bench/run_all.sh).
//
// Header-only on purpose: each bench_* is one translation unit plus this file.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "examples/common/flags.h"
#include "jit/compiler.h"

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

/// Median milliseconds of `fn` over `reps` timed runs after `warmup` untimed ones.
inline double median_ms(int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  times.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    auto start = Clock::now();
    fn();
    times.push_back(ms_since(start));
  }
  return median(times);
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
  /// stream-floor | openblas | pytorch-eager | torch-compile, or "none" for the rows the
  /// issue gives an absolute target instead (compile, reload, per-op costs).
  std::string baseline;
  double baseline_ms = -1;
  std::string compiler;  ///< the CPU compiler that built kiln's kernels ("" if irrelevant)
  std::string note;
  bool micro = false;       ///< print the table in microseconds (JSON stays ms, adds kiln_us)
  double target = 0;        ///< the issue's target for the ratio, or for kiln_ms
  std::string target_kind;  ///< "ratio<=" (kiln/baseline), "ratio>=" (baseline/kiln), "value<="
  std::vector<std::pair<std::string, double>> extra;  ///< more numeric fields for the JSON
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

/// "met" / "MISSED" / "" for a result with a target.
inline std::string verdict(const Result& r) {
  if (r.target_kind.empty()) return "";
  double x = r.target_kind == "value<=" ? r.kiln_ms : ratio(r);
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

  void print(const char* title) const {
    std::printf("\n%s\n", title);
    std::printf("%-34s %-8s %12s %-14s %12s %8s %-7s %s\n", "workload", "compiler", "kiln",
                "baseline", "baseline", "ratio", "target", "note");
    for (const Result& r : rows_) {
      double q = ratio(r);
      char rq[16] = "-";
      if (!std::isnan(q)) std::snprintf(rq, sizeof rq, "%.3f", q);
      char kv[32], bv[32];
      double scale = r.micro ? 1e3 : 1.0;
      const char* unit = r.micro ? "us" : "ms";
      std::snprintf(kv, sizeof kv, "%.4g %s", r.kiln_ms * scale, unit);
      if (r.baseline_ms >= 0) {
        std::snprintf(bv, sizeof bv, "%.4g %s", r.baseline_ms * scale, unit);
      } else {
        std::snprintf(bv, sizeof bv, "-");
      }
      std::printf("%-34s %-8s %12s %-14s %12s %8s %-7s %s\n", r.workload.c_str(),
                  r.compiler.empty() ? "-" : r.compiler.c_str(), kv, r.baseline.c_str(), bv, rq,
                  verdict(r).c_str(), r.note.c_str());
    }
    std::fflush(stdout);
  }

  /// Appends one JSON object per line; run_all.sh joins the lines into a list.
  void write_json() const {
    if (json_path_.empty()) return;
    FILE* f = std::fopen(json_path_.c_str(), "a");
    if (!f) {
      std::fprintf(stderr, "bench: cannot append to %s\n", json_path_.c_str());
      return;
    }
    for (const Result& r : rows_) {
      std::fprintf(f,
                   "{\"workload\": \"%s\", \"kiln_ms\": %s, \"baseline\": \"%s\", "
                   "\"baseline_ms\": %s, \"ratio\": %s",
                   json_escape(r.workload).c_str(), json_number(r.kiln_ms).c_str(),
                   json_escape(r.baseline).c_str(), json_number(r.baseline_ms).c_str(),
                   json_number(ratio(r)).c_str());
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
        std::fprintf(f, ", \"target\": \"%s %.4g\", \"target_met\": %s", lhs, r.target,
                     verdict(r) == "met" ? "true" : (verdict(r) == "MISSED" ? "false" : "null"));
      }
      if (!r.note.empty()) std::fprintf(f, ", \"note\": \"%s\"", json_escape(r.note).c_str());
      std::fprintf(f, "}\n");
    }
    std::fclose(f);
  }

 private:
  std::string json_path_;
  std::vector<Result> rows_;
};

/// The CPU compiler kiln uses in this process ("llvm" or "external"; KILN_CPU_COMPILER).
inline std::string compiler_label() { return jit::cpu_compiler().name(); }

}  // namespace kiln::bench
