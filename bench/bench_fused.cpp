// Memory-bound workloads that fusion should bring to the bandwidth floor:
//   relu(a*b+c).sum()                      4M and 16M float32 (one kernel, reads only)
//   ((((a*b+c)*0.5)-a)*b)+c  (6 ops)       4M and 16M float32 (one kernel, output written)
//   row sums / column sums of 4096x4096    (reads only)
//   row softmax of 4096x4096               (floor: 2 reads + 1 write of the matrix)
//   concat of 16 pieces [1,512,512] * 2    (one kernel choosing its piece per row, as an
//                                          RNN's stacked steps and their gradients do)
// Each kiln time is the median over repetitions of building the graph and evaluating it
// (after warm-up, so no compile is timed). The baseline "stream-floor" is the bytes the
// workload must move divided by the bandwidth measured in the same run on kiln's thread
// pool (bench_common.h). When python3 can import torch, bench_torch.py times the same
// workloads with PyTorch eager and torch.compile at the same thread count. Targets: the
// fused rows <= 1.15x the floor and >= 3.5x faster than PyTorch eager; the fused
// elementwise+reduce relu(a*b+c).sum() also <= 1.0x torch.compile. Every time is a median
// of wall and of process CPU time (the floor has no CPU time of its own).
//
// Usage: bench_fused [--json PATH]     env: BENCH_REPS (default 15)
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "jit/executor.h"
#include "kiln/kiln.h"

#ifndef KILN_BENCH_DIR
#define KILN_BENCH_DIR "bench"
#endif

namespace {

using namespace kiln;
using namespace kiln::bench;

constexpr double kFloat = sizeof(float);

Tensor chain6(const Tensor& a, const Tensor& b, const Tensor& c) {
  return ((((a * b + c) * 0.5f) - a) * b) + c;
}

// Compares kiln's value with a host computation once, so a fast wrong answer is not
// reported as a result.
bool close(double got, double want, double rtol) {
  return std::abs(got - want) <= rtol * std::max(1.0, std::abs(want));
}

// The bandwidth and PyTorch targets apply to these (not to sums and softmax).
bool is_fused(const std::string& name) { return name.find("relu") == 0 || name.find("6-op") == 0; }

// bench_torch.py's name for a workload: spaces and parentheses are awkward on its output
// line, so it uses the name with every non-alphanumeric run replaced by '_'.
std::string torch_key(const std::string& name) {
  std::string out;
  for (char ch : name) {
    bool keep = std::isalnum(static_cast<unsigned char>(ch)) != 0;
    if (keep) {
      out += ch;
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

struct Workload {
  std::string name;
  double read_bytes, write_bytes;
  std::function<Tensor()> build;  // builds the graph (inputs already evaluated)
};

// What bench_torch.py measured for one workload; compile_note says why torch.compile has
// no times.
struct TorchTimes {
  Times eager, compiled;
  std::string compile_note;
};

// The workload name -> PyTorch's times from bench_torch.py, or an empty map and a note
// saying why there are none.
std::map<std::string, TorchTimes> run_torch(int threads, int reps, std::string& note) {
  std::map<std::string, TorchTimes> out;
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    note = "PyTorch not installed: baseline skipped";
    return out;
  }
  std::string cmd = "python3 " KILN_BENCH_DIR "/bench_torch.py --threads " +
                    std::to_string(threads) + " --reps " + std::to_string(reps);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    note = "could not run bench_torch.py: baseline skipped";
    return out;
  }
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    char name[128];
    int used = 0;
    TorchTimes t;
    // "RESULT name eager_ms eager_cpu_ms compile_ms compile_cpu_ms" (compile -1 when
    // torch.compile failed, after a line "NOTE name reason").
    if (std::sscanf(line, "RESULT %127s %lf %lf %lf %lf", name, &t.eager.wall_ms, &t.eager.cpu_ms,
                    &t.compiled.wall_ms, &t.compiled.cpu_ms) == 5) {
      t.compile_note = out[name].compile_note;
      out[name] = t;
    } else if (std::sscanf(line, "NOTE %127s %n", name, &used) == 1 && used > 0) {
      std::string why = line + used;
      while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
      out[name].compile_note = why;
      std::fputs(line, stdout);
    } else {
      std::fputs(line, stdout);  // the script's own diagnostics
    }
  }
  if (pclose(p) != 0 && out.empty()) note = "bench_torch.py failed: baseline skipped";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags =
      bench_flags("bench_fused",
                  "Fused elementwise and reduction kernels against the machine's bandwidth "
                  "floor and PyTorch (docs/benchmarks.md).");
  flags.note("environment: BENCH_REPS (timed repetitions, default 15), KILN_CPU_COMPILER");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  Results results(flags.str("json"));
  const int reps = env_int("BENCH_REPS", 15);
  const std::string compiler = compiler_label();
  const int threads = thread_pool().size();

  Bandwidth bw = measure_bandwidth();
  std::printf(
      "bench_fused: %d threads, compiler %s; bandwidth GB/s: triad %.2f, 3-read+1-write "
      "%.2f, read %.2f\n%s\n",
      threads, compiler.c_str(), bw.triad_gbs, bw.add3_gbs, bw.read_gbs, machine_line().c_str());

  const int64_t m4 = int64_t{4} << 20, m16 = int64_t{16} << 20, side = 4096;
  std::vector<Workload> workloads;
  std::vector<Tensor> keep;  // evaluated inputs, alive for the whole run
  for (int64_t n : {m4, m16}) {
    std::string tag = n == m4 ? "4M" : "16M";
    Tensor a = rand({n}).eval(), b = (rand({n}) - 0.5f).eval(), c = (rand({n}) - 0.5f).eval();
    keep.insert(keep.end(), {a, b, c});
    double bytes = static_cast<double>(n) * kFloat;
    workloads.push_back(
        {"relu(a*b+c).sum() " + tag, 3 * bytes, 0, [=] { return sum(relu(a * b + c)); }});
    workloads.push_back({"6-op chain " + tag, 3 * bytes, bytes, [=] { return chain6(a, b, c); }});
  }
  Tensor x = (rand({side, side}) - 0.5f).eval();
  keep.push_back(x);
  double mat = static_cast<double>(side * side) * kFloat;
  workloads.push_back({"row sums 4096x4096", mat, side * kFloat, [=] { return sum(x, 1); }});
  workloads.push_back({"column sums 4096x4096", mat, side * kFloat, [=] { return sum(x, 0); }});
  workloads.push_back({"row softmax 4096x4096", 2 * mat, mat, [=] { return softmax(x, 1); }});
  std::vector<Tensor> pieces;
  for (int k = 0; k < 16; ++k) pieces.push_back((rand({1, 512, 512}) - 0.5f).eval());
  keep.insert(keep.end(), pieces.begin(), pieces.end());
  const double stacked = 16.0 * 512 * 512 * kFloat;
  workloads.push_back({"concat of 16 pieces 16x512x512", stacked, stacked,
                       [=] { return concat(pieces, 0) * 2.0f; }});

  // Correctness spot checks against the host.
  {
    const Tensor& a = keep[0];
    const Tensor& b = keep[1];
    const Tensor& c = keep[2];
    const float *pa = a.data<float>(), *pb = b.data<float>(), *pc = c.data<float>();
    double want = 0;
    for (int64_t i = 0; i < m4; ++i) want += std::max(0.0f, pa[i] * pb[i] + pc[i]);
    double got = sum(relu(a * b + c)).item<double>();
    Tensor ch = chain6(a, b, c).eval();
    const float* pch = ch.data<float>();
    bool ok = close(got, want, 1e-3);
    for (int64_t i = 0; i < m4; i += 4099) {
      ok = ok && close(pch[i], ((((pa[i] * pb[i] + pc[i]) * 0.5f) - pa[i]) * pb[i]) + pc[i], 1e-5);
    }
    std::vector<float> rows = sum(x, 1).to_vector<float>();
    const float* px = x.data<float>();
    for (int64_t r = 0; r < side; r += 511) {
      double s = 0;
      for (int64_t j = 0; j < side; ++j) s += px[r * side + j];
      ok = ok && close(rows[static_cast<size_t>(r)], s, 1e-3);
    }
    Tensor joined = (concat(pieces, 0) * 2.0f).eval();
    const float* pj = joined.data<float>();
    for (int64_t i = 0; i < 16 * 512 * 512; i += 4099)
      ok = ok &&
           pj[i] ==
               2.0f * pieces[static_cast<size_t>(i / (512 * 512))].data<float>()[i % (512 * 512)];
    if (!ok) {
      std::fprintf(stderr, "bench_fused: kiln's results disagree with the host; not timing\n");
      return 1;
    }
  }

  std::map<std::string, Times> kiln_of;
  for (const Workload& w : workloads) {
    // The probe runs again next to each workload, so that both see the same load from other
    // processes on a shared machine.
    Bandwidth near = measure_bandwidth(size_t{32} << 20, 5);
    const Times kiln_t = timed(3, reps, [&] { w.build().eval(); });
    const double kiln_ms = kiln_t.wall_ms;
    kiln_of[w.name] = kiln_t;
    jit::EvalStats st = jit::last_eval_stats();
    Result r;
    r.workload = w.name;
    r.set_kiln(kiln_t);
    r.baseline = "stream-floor";
    r.baseline_ms = stream_floor_ms(near, w.read_bytes, w.write_bytes);
    r.compiler = compiler;
    r.note = std::to_string(st.kernels) + " kernel(s)";
    r.extra = {{"bytes_moved", w.read_bytes + w.write_bytes},
               {"floor_gbs", (w.read_bytes + w.write_bytes) / (r.baseline_ms * 1e6)},
               {"kiln_gbs", (w.read_bytes + w.write_bytes) / (kiln_ms * 1e6)}};
    if (is_fused(w.name)) {
      r.target_kind = "ratio<=";
      r.target = 1.15;
    }
    results.add(r);
  }

  // PyTorch: the fused workloads and softmax (the issue compares sums with the floor only).
  std::string torch_note;
  auto torch = run_torch(threads, reps, torch_note);
  for (const Workload& w : workloads) {
    if (w.name.find("sums") != std::string::npos) continue;
    auto it = torch.find(torch_key(w.name));
    for (const char* baseline : {"pytorch-eager", "torch-compile"}) {
      const bool eager = baseline == std::string("pytorch-eager");
      Result r;
      r.workload = w.name;
      r.set_kiln(kiln_of[w.name]);
      r.baseline = baseline;
      r.compiler = compiler;
      if (it != torch.end()) {
        r.set_baseline(eager ? it->second.eager : it->second.compiled);
        if (r.baseline_ms < 0) {
          r.baseline_ms = r.baseline_cpu_ms = -1;
          r.note =
              it->second.compile_note.empty() ? "torch.compile failed" : it->second.compile_note;
        }
      } else {
        r.note = torch_note.empty() ? "workload missing from bench_torch.py" : torch_note;
      }
      if (is_fused(w.name) && eager) {
        r.target_kind = "ratio>=";  // PyTorch eager at least 3.5x slower than kiln
        r.target = 3.5;
      }
      if (w.name.find("relu") == 0 && !eager) {
        r.target_kind = "ratio<=";  // the fused elementwise+reduce: no slower than inductor
        r.target = 1.0;
      }
      results.add(r);
    }
  }
  if (!torch_note.empty()) std::printf("bench_fused: %s\n", torch_note.c_str());

  results.print("bench_fused (median ms; ratio = kiln / baseline)");
  results.write_json();
  return 0;
}
