// Memory planning benchmarks (docs/benchmarks.md, "Memory planning"): the pool's peak and
// the step time of three training steps at memory budgets below their unplanned peak.
//
// Rows plan_<model>_<budget>: kiln_ms is the median step time under the budget, baseline
// "unplanned" the median of unplanned steps of the same model, each run right before one of
// the budgeted steps (this machine drifts by more than the targets' margins between runs
// minutes apart, so a baseline measured once per model decided rows by noise); the extra
// fields carry
// peak_bytes (the pool's measured peak of allocated bytes over the timed steps),
// budget_bytes, the unplanned peak, the planned peak, the planner's time per step (the
// timed steps run the stored plan; first_planner_ms is the first budgeted step's, planned
// with estimated costs, and settling_planner_ms the step whose costs settle), the
// rebuilds per step, the extra work and its floor (the least any plan needs at that budget,
// memory/planner/work_floor.h, on the tables of an unplanned step), the arena's size and bytes
// alive at once (memory/planner/arena_plan.h), and the pool's reserved/allocated ratio at the peak
// over budgeted steps alone.
//
// A budget fraction f means start + kept + f x (unplanned peak - start - kept): start is
// what the pool holds when the step begins (parameters, optimizer state, data), kept is what
// the step adds and keeps (gradients, the loss). That is the memory a planner can act on,
// the "activation memory" of PyTorch's activation_memory_budget; `of_peak` gives the same
// budget as a fraction of the whole unplanned peak. f = 1.0 plans with a budget equal to
// the unplanned peak plus 1% (the planner's overhead when it has nothing to do).
//
// Each step is zero_grad, forward, backward, step, zero_grad, then the loss is read: the
// gradients are released before the step is evaluated, so kiln can free each one right
// after its update (with them kept, the deep MLP's peak is parameters + momentum +
// gradients, which no budget can go below; docs/benchmarks.md has those figures too).
//
// Row plan_transformer_varlen: unbudgeted steps whose sequence length changes between 64
// and 512 from step to step; kiln_ms is the median step, `reserved_ratio` the pool's peak
// reserved over peak allocated (target <= 1.10; <= 1.05 for fixed shapes).
//
// Rows plan_transformer_fp32 / _bf16 / _fp16 (issue 25): the Transformer unplanned in
// float32 and with forward and loss under bf16/fp16 autocast (fp16 with a GradScaler), beside
// PyTorch eager in the same precision (torch.autocast; bench_train_torch.py), with
// peak_bytes, kept_activation_bytes (what the step keeps for backward, from its planning
// tables: bench/kept_for_backward.h), torch_saved_bytes (PyTorch's saved tensors counted the
// same way), and against float32: step_vs_fp32 (_cpu), kept_vs_fp32, peak_vs_fp32. bf16's
// targets: kiln / PyTorch autocast <= 1 (the row's target), kept <= 0.52x and step <= 0.75x
// float32's on a CPU with AVX512-BF16 (in the note).
//
// Rows plan_<model>_matched_<method> (issue 27 section 4): PyTorch's activation checkpointing
// methods on the same three steps (bench_plan_torch.py: checkpoint_sequential segments for
// the MLP, checkpointed sequence chunks for the LSTM, per-layer / every-k-layers / selective
// checkpointing for the Transformer), each measured as bytes its step adds above its start
// and its step time; kiln runs its step with a budget of its own start plus those bytes.
// The note compares the extra step time over each side's plain step: kiln's <= 0.5x
// PyTorch's (LSTM, Transformer), <= 0.8x (MLP).
//
// `--only mlp|lstm|transformer|varlen|amp|matched` runs one part; KILN_BENCH_PLAN_REPS sets the
// timed steps per row (default 5, as the runs in docs/benchmarks.md use).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "amp_bench.h"
#include "bench_common.h"
#include "bench_models.h"
#include "frontend/kiln.h"
#include "frontend/nn/nn.h"
#include "frontend/optim.h"
#include "kept_for_backward.h"
#include "memory/memory.h"
#include "memory/planner/work_floor.h"
#include "memory/reports/step_graph_file.h"

using namespace kiln;
using namespace kiln::bench;

namespace {

memory::CachingPool& pool() { return memory::host_pool(); }

// A model with its optimizer and a step on a fixed batch (or a batch of `seq` tokens).
struct Model {
  std::function<double(int seq)> step;
};

// The Transformer (6 layers, d_model 256, sequences of up to 512, AdamW) on a fresh batch of
// 16 sequences each step, in `p` (fp16: with loss scaling unless `scaling` is false).
Model make_transformer(Precision p, bool scaling = true) {
  manual_seed(42);
  auto m = std::make_shared<GPT>(6, 512);
  auto opt = std::make_shared<optim::AdamW>(m->parameters(),
                                            optim::AdamWOptions{.lr = 3e-4, .weight_decay = 0.01});
  auto len = std::make_shared<int>(256);
  std::function<Tensor()> step = amp_step(
      opt, p,
      [m, len] {
        const int seq = *len;
        Tensor x = randint(0, 128, {16, seq}), y = randint(0, 128, {16 * seq});
        return nn::cross_entropy(reshape(m->forward(x), {16 * seq, 128}), y);
      },
      scaling);
  return {[=](int seq) {
    *len = seq;
    Tensor loss = step();
    opt->zero_grad();
    return loss.item<double>();
  }};
}

Model make(const std::string& name) {
  manual_seed(42);
  if (name == "mlp") {
    auto seq = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 32; ++i) {
      seq->push_back(std::make_shared<nn::Linear>(1024, 1024));
      seq->push_back(std::make_shared<nn::ReLU>());
    }
    seq->push_back(std::make_shared<nn::Linear>(1024, 10));
    auto opt = std::make_shared<optim::SGD>(seq->parameters(),
                                            optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    Tensor x = randn({256, 1024}).eval(), y = randint(0, 10, {256}).eval();
    return {[=](int) {
      opt->zero_grad();
      Tensor loss = nn::cross_entropy(seq->forward(x), y);
      loss.backward();
      opt->step();
      opt->zero_grad();  // gradients are not kept past the step (see the file comment)
      return loss.item<double>();
    }};
  }
  if (name == "lstm") {
    auto m = std::make_shared<CharLSTM>();
    auto opt = std::make_shared<optim::Adam>(m->parameters(), optim::AdamOptions{.lr = 1e-3});
    Tensor x = randint(0, 128, {32, 256}).eval(), y = randint(0, 128, {32 * 256}).eval();
    return {[=](int) {
      opt->zero_grad();
      Tensor loss = nn::cross_entropy(reshape(m->forward(x), {32 * 256, 128}), y);
      loss.backward();
      opt->step();
      opt->zero_grad();
      return loss.item<double>();
    }};
  }
  return make_transformer(Precision::Float32);
}

// What the memory plans of the timed steps said: means over the steps, and highest peaks.
struct PlanFigures {
  double planner_ms = 0, rebuilds = 0, extra_pct = 0;
  size_t planned_peak = 0, kept = 0, arena = 0, arena_live = 0;
  bool within = true;

  // Adds the plan of the step just run, one of `reps`.
  void add(int reps) {
    const memory::PlanSummary s = memory::last_plan();
    planner_ms += s.planner_ms / reps;
    rebuilds += static_cast<double>(s.recomputes) / reps;
    extra_pct += (s.base_cost > 0 ? 100.0 * s.extra_cost / s.base_cost : 0) / reps;
    planned_peak = std::max(planned_peak, s.planned_peak);
    kept = s.output_bytes;
    arena = std::max(arena, s.arena_bytes);
    arena_live = std::max(arena_live, s.arena_live_peak);
    within = within && s.within_budget;
  }
};

struct Measured : PlanFigures {
  double ms = 0, cpu_ms = -1, reserve_ratio = 0;
  size_t start = 0, peak = 0;
};

// kiln times a step's first three runs and fixes its plan, kernel order and arena on the
// fourth (docs/memory.md, "Plans made once"); a training loop runs the fixed plan from then
// on, so that is what the rows time. The first steps plan again each time, quickly (an
// order race and at most two plans); the fixing step searches thoroughly.
constexpr int kSettlingSteps = 4;

// `reps` timed steps after `warmup` untimed ones; peaks over the timed steps.
Measured measure(const Model& model, int reps, int seq, int warmup = kSettlingSteps) {
  for (int i = 0; i < warmup; ++i) model.step(seq);
  pool().empty_cache();
  Measured m;
  m.start = pool().allocated();
  pool().reset_peak_stats();
  Samples times;
  for (int i = 0; i < reps; ++i) {
    Stopwatch watch;
    model.step(seq);
    times.add(watch.elapsed());
    m.add(reps);
  }
  memory::PoolStats st = pool().stats();
  if (std::getenv("KILN_BENCH_VERBOSE"))
    std::fprintf(stderr, "%s\n%s\n", pool().report().c_str(), memory::plan_report().c_str());
  m.ms = times.medians().wall_ms;
  m.cpu_ms = times.medians().cpu_ms;
  m.peak = st.peak_allocated;
  m.reserve_ratio = st.reserve_ratio();
  return m;
}

// The tables of one more unplanned step, with the kernel times measured so far, written
// through KILN_PLAN_DUMP and read back: each row's work floor (memory/planner/work_floor.h) comes
// from them.
memory::StepGraph step_tables(const Model& model, int seq) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln_bench_plan_" + std::to_string(getpid()) + ".graph"))
                               .string();
  const char* before = std::getenv("KILN_PLAN_DUMP");
  const std::string saved = before ? before : "";
  setenv("KILN_PLAN_DUMP", path.c_str(), 1);
  model.step(seq);
  if (before)
    setenv("KILN_PLAN_DUMP", saved.c_str(), 1);
  else
    unsetenv("KILN_PLAN_DUMP");
  memory::StepGraph tables = memory::load_step_graph(path).graph;
  std::filesystem::remove(path);
  return tables;
}

// Step times under `budget` paired with unplanned ones: each timed budgeted step right
// after an unplanned step of the same model, so that the machine's drift (the same
// unplanned step moved by 15% between runs minutes apart) shows in both medians alike.
// Budgeted warm-up steps first (compiling, choosing the kernel order, timing kernels, until
// the plan is fixed). Each timed step follows an untimed one of the same kind: a budgeted
// step does not reuse the unbudgeted step's bigger cached arena (CachingPool::open_arena),
// so the first step after a switch maps and faults in a new one, which a training loop
// that keeps its budget pays once (it added 9-18% to the timed LSTM steps).
struct Paired : PlanFigures {
  double ms = 0, base_ms = 0, cpu_ms = -1, base_cpu_ms = -1;
  size_t peak = 0;
  // Planning time of the first budgeted step and of the step whose costs settle.
  double first_planner_ms = 0, settling_planner_ms = 0;
};

Paired measure_paired(const Model& model, int reps, int seq, size_t budget) {
  memory::set_budget(budget);
  Paired m;
  for (int i = 0; i < kSettlingSteps; ++i) {
    model.step(seq);
    if (i == 0) m.first_planner_ms = memory::last_plan().planner_ms;
    if (i == kSettlingSteps - 1) m.settling_planner_ms = memory::last_plan().planner_ms;
  }
  Samples times, base;
  for (int i = 0; i < reps; ++i) {
    memory::clear_budget();
    model.step(seq);
    Stopwatch base_watch;
    model.step(seq);
    base.add(base_watch.elapsed());
    memory::set_budget(budget);
    model.step(seq);
    pool().reset_peak_stats();
    Stopwatch watch;
    model.step(seq);
    times.add(watch.elapsed());
    m.add(reps);
    m.peak = std::max(m.peak, pool().stats().peak_allocated);
  }
  m.ms = times.medians().wall_ms;
  m.cpu_ms = times.medians().cpu_ms;
  m.base_ms = base.medians().wall_ms;
  m.base_cpu_ms = base.medians().cpu_ms;
  return m;
}

// One of PyTorch's checkpointing methods on a model (bench_plan_torch.py): its median step
// and the most bytes its step adds above the step's start.
struct TorchMethod {
  std::string name;
  Times step;
  double above = -1;
};

std::vector<TorchMethod> run_torch_methods(const std::string& model, int reps, std::string* note) {
  std::vector<TorchMethod> out;
  const std::string args = "--threads " + std::to_string(thread_pool().size()) + " --reps " +
                           std::to_string(reps) + " --model " + model;
  const TorchScriptRun run =
      run_torch_script("bench_plan_torch.py", args, false, [&](const char* line) {
        char got[64], method[64];
        TorchMethod m;
        if (std::sscanf(line, "RESULT %63s %63s %lf %lf %lf", got, method, &m.step.wall_ms,
                        &m.step.cpu_ms, &m.above) != 5 ||
            model != got)
          return false;
        m.name = method;
        out.push_back(m);
        return true;
      });
  if (out.empty()) *note = run.note.empty() ? "bench_plan_torch.py gave no result" : run.note;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags = bench_flags(
      "bench_plan", "Memory planning: peaks and step times of training steps under budgets.");
  flags.add("only", "",
            "run one part only: mlp, lstm, transformer, varlen, amp (the Transformer in "
            "fp32, bf16 and fp16 autocast beside torch.autocast), or matched (the three steps "
            "at the memory of PyTorch's checkpointing methods)");
  flags.note("environment: KILN_BENCH_PLAN_REPS (timed steps, default 5), KILN_BENCH_VERBOSE");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  const std::string only = flags.str("only");
  if (!only.empty() && only != "mlp" && only != "lstm" && only != "transformer" &&
      only != "varlen" && only != "amp" && only != "matched") {
    std::fprintf(stderr,
                 "bench_plan: --only expects mlp, lstm, transformer, varlen, amp or matched, got "
                 "'%s'\n",
                 only.c_str());
    return 2;
  }
  Results results(flags.str("json"));
  const int reps = env_int("KILN_BENCH_PLAN_REPS", 5);
  struct Spec {
    const char* name;
    int seq;
  };
  for (Spec spec : {Spec{"mlp", 0}, Spec{"lstm", 0}, Spec{"transformer", 256}}) {
    if (!only.empty() && only != spec.name) continue;
    memory::clear_budget();
    Model model = make(spec.name);
    const Measured base = measure(model, reps, spec.seq);
    const memory::StepGraph tables = step_tables(model, spec.seq);
    const size_t floor = base.start + base.kept;
    const size_t releasable = base.peak > floor ? base.peak - floor : 0;
    std::printf("%s: unplanned %.1f ms, peak %s (start %s, kept %s), reserved/allocated %.3f\n",
                spec.name, base.ms, memory::format_bytes(base.peak).c_str(),
                memory::format_bytes(base.start).c_str(), memory::format_bytes(base.kept).c_str(),
                base.reserve_ratio);
    {
      Result r;
      r.workload = std::string("plan_") + spec.name + "_unplanned";
      r.kiln_ms = base.ms;
      r.kiln_cpu_ms = base.cpu_ms;
      r.baseline = "none";
      r.note = "reserved/alloc " + std::to_string(base.reserve_ratio).substr(0, 5);
      r.extra = {{"peak_bytes", static_cast<double>(base.peak)},
                 {"budget_bytes", 0},
                 {"reserved_ratio", base.reserve_ratio},
                 {"planner_ms", base.planner_ms}};
      results.add(r);
    }
    for (double f : {1.0, 0.5, 0.33, 0.2}) {
      // At 1.0 the budget is the measured unplanned peak plus 1%: the plan's block sizes
      // and the pool's may differ by a block's rounding, and this row is about overhead.
      const size_t budget = f >= 1.0
                                ? base.peak + base.peak / 100
                                : floor + static_cast<size_t>(f * static_cast<double>(releasable));
      memory::set_budget(budget);
      Result r;
      char label[16];
      std::snprintf(label, sizeof label, "%g", f);
      r.workload = std::string("plan_") + spec.name + "_" + label;
      r.baseline = "unplanned";
      r.target = f >= 1.0 ? 1.05 : f >= 0.5 ? 1.05 : f >= 0.33 ? 1.10 : 1.25;
      r.target_kind = "ratio<=";
      try {
        const Paired m = measure_paired(model, reps, spec.seq, budget);
        // The pool's reserve, apart from the unplanned steps' (whose cached segments would
        // otherwise count): a fresh cache, then budgeted steps only.
        const Measured alone = measure(model, 2, spec.seq, 1);
        const size_t peak = std::max(m.peak, alone.peak);
        r.set_kiln({m.ms, m.cpu_ms});
        r.set_baseline({m.base_ms, m.base_cpu_ms});
        const memory::WorkFloor floor_at = memory::extra_work_floor(tables, budget);
        const double floor_pct =
            floor_at.base_cost > 0 ? 100.0 * floor_at.extra_cost / floor_at.base_cost : 0;
        char note[260];
        std::snprintf(note, sizeof note,
                      "peak %s / budget %s (%.2f of peak)%s, +%.1f%% work (floor %.1f%%), "
                      "reserved/alloc %.3f, planning %.0f ms first, %.0f ms settling",
                      memory::format_bytes(peak).c_str(), memory::format_bytes(budget).c_str(),
                      static_cast<double>(budget) / static_cast<double>(base.peak),
                      peak <= budget ? "" : " OVER", m.extra_pct, floor_pct, alone.reserve_ratio,
                      m.first_planner_ms, m.settling_planner_ms);
        r.note = note;
        r.extra = {{"peak_bytes", static_cast<double>(peak)},
                   {"budget_bytes", static_cast<double>(budget)},
                   {"unplanned_peak_bytes", static_cast<double>(base.peak)},
                   {"of_peak", static_cast<double>(budget) / static_cast<double>(base.peak)},
                   {"planned_peak_bytes", static_cast<double>(m.planned_peak)},
                   {"planner_ms", m.planner_ms},
                   {"first_planner_ms", m.first_planner_ms},
                   {"settling_planner_ms", m.settling_planner_ms},
                   {"rebuilds", m.rebuilds},
                   {"extra_work_pct", m.extra_pct},
                   {"work_floor_pct", floor_pct},
                   {"arena_bytes", static_cast<double>(m.arena)},
                   {"arena_live_bytes", static_cast<double>(m.arena_live)},
                   {"reserved_ratio", alone.reserve_ratio}};
      } catch (const OutOfMemoryError& e) {
        r.kiln_ms = -1;
        std::string what = e.what();
        if (std::getenv("KILN_BENCH_VERBOSE")) std::fprintf(stderr, "%s\n", what.c_str());
        size_t at = what.find("smallest budget");
        r.note = "infeasible: " + what.substr(at == std::string::npos ? 0 : at, 60);
        r.extra = {{"budget_bytes", static_cast<double>(budget)},
                   {"unplanned_peak_bytes", static_cast<double>(base.peak)}};
        // The refused step is still pending (nothing ran): run it unbudgeted so that the
        // next row starts from the same state.
        memory::clear_budget();
        model.step(spec.seq);
      }
      results.add(r);
    }
    memory::clear_budget();
  }
  if (only.empty() || only == "matched") {
    // Side by side at matched memory (issue 27 section 4): each of PyTorch's checkpointing
    // methods (bench_plan_torch.py) adds some bytes above its step's start and some step
    // time over plain eager; kiln runs the same step with a budget of its own start plus
    // those bytes. Targets on the extra time: kiln's <= 0.5x PyTorch's on the LSTM and the
    // Transformer, <= 0.8x on the MLP.
    for (Spec spec : {Spec{"mlp", 0}, Spec{"lstm", 0}, Spec{"transformer", 256}}) {
      std::string torch_note;
      const std::vector<TorchMethod> methods = run_torch_methods(spec.name, reps, &torch_note);
      const TorchMethod* plain = nullptr;
      for (const TorchMethod& m : methods)
        if (m.name == "none") plain = &m;
      memory::clear_budget();
      Model model = make(spec.name);
      const Measured base = measure(model, reps, spec.seq);
      const double target = std::string(spec.name) == "mlp" ? 0.8 : 0.5;
      for (const TorchMethod& method : methods) {
        if (plain == nullptr || &method == plain) continue;
        const size_t budget = base.start + static_cast<size_t>(method.above);
        Result r;
        r.workload = std::string("plan_") + spec.name + "_matched_" + method.name;
        r.baseline = "torch-" + method.name;
        r.set_baseline(method.step);
        const double torch_extra = 100.0 * (method.step.wall_ms / plain->step.wall_ms - 1);
        try {
          const Paired m = measure_paired(model, reps, spec.seq, budget);
          r.set_kiln({m.ms, m.cpu_ms});
          const double kiln_extra = 100.0 * (m.ms / m.base_ms - 1);
          const double extra_ratio =
              torch_extra > 0 ? std::max(kiln_extra, 0.0) / torch_extra : NAN;
          char note[300];
          std::snprintf(note, sizeof note,
                        "above start: torch %s, kiln %s%s; extra time kiln %+.1f%%, torch "
                        "%+.1f%%: %.2f (target <= %.1f: %s)",
                        memory::format_bytes(static_cast<size_t>(method.above)).c_str(),
                        memory::format_bytes(m.peak > base.start ? m.peak - base.start : 0).c_str(),
                        m.peak <= budget ? "" : " OVER", kiln_extra, torch_extra, extra_ratio,
                        target,
                        std::isnan(extra_ratio) ? "n/a"
                        : extra_ratio <= target ? "met"
                                                : "MISSED");
          r.note = note;
          r.extra = {{"torch_above_start_bytes", method.above},
                     {"kiln_above_start_bytes",
                      static_cast<double>(m.peak > base.start ? m.peak - base.start : 0)},
                     {"budget_bytes", static_cast<double>(budget)},
                     {"kiln_unplanned_ms", m.base_ms},
                     {"torch_eager_ms", plain->step.wall_ms},
                     {"kiln_extra_pct", kiln_extra},
                     {"torch_extra_pct", torch_extra},
                     {"extra_ratio", extra_ratio},
                     {"extra_ratio_target", target}};
        } catch (const OutOfMemoryError& e) {
          r.kiln_ms = -1;
          const std::string what = e.what();
          const size_t at = what.find("smallest budget");
          r.note = "infeasible: " + what.substr(at == std::string::npos ? 0 : at, 70);
          memory::clear_budget();
          model.step(spec.seq);
        }
        results.add(r);
      }
      if (methods.empty()) {
        Result r;
        r.workload = std::string("plan_") + spec.name + "_matched";
        r.kiln_ms = -1;
        r.note = "no PyTorch side: " + torch_note;
        results.add(r);
      }
      memory::clear_budget();
    }
  }
  if (only.empty() || only == "varlen") {
    // Sequence lengths change every step: does the pool's layout keep up?
    Model model = make("transformer");
    model.step(64);
    pool().empty_cache();
    pool().reset_peak_stats();
    Samples times;
    const int lens[] = {64, 512, 128, 384, 256, 448, 96, 320, 512, 64};
    for (int len : lens) {
      Stopwatch watch;
      model.step(len);
      times.add(watch.elapsed());
    }
    memory::PoolStats st = pool().stats();
    Result r;
    r.workload = "plan_transformer_varlen";
    r.set_kiln(times.medians());
    r.baseline = "none";
    r.note = "seq 64..512; reserved/alloc " + std::to_string(st.reserve_ratio()).substr(0, 5) +
             " (target <= 1.10)";
    r.extra = {{"peak_bytes", static_cast<double>(st.peak_allocated)},
               {"budget_bytes", 0},
               {"reserved_ratio", st.reserve_ratio()}};
    results.add(r);
  }
  if (only.empty() || only == "amp") {
    // The Transformer unplanned in float32 and under bf16/fp16 autocast, beside PyTorch
    // eager (torch.autocast) on the same shapes (bench_train_torch.py).
    std::optional<Measured> fp32;
    KeptForBackward fp32_kept;
    for (Precision p : {Precision::Float32, Precision::BFloat16, Precision::Float16}) {
      KeptForBackward kept;
      {
        // As bench_train: the second step of a model of its own, without loss scaling.
        Model first = make_transformer(p, false);
        first.step(256);
        kept = measure_kept_for_backward([&] { first.step(256); });
      }
      const Measured m = measure(make_transformer(p), reps, 256);
      const TorchRun torch =
          run_torch("plan_transformer_6x256_h4_s256_b16", thread_pool().size(), reps, false, p);
      Result r;
      r.workload = std::string("plan_transformer_") + precision_name(p);
      r.set_kiln({m.ms, m.cpu_ms});
      r.baseline = p == Precision::Float32 ? std::string("pytorch-eager")
                                           : std::string("pytorch-autocast-") + precision_name(p);
      r.set_baseline(torch.step);
      r.compiler = compiler_label();
      if (p == Precision::BFloat16) {
        r.target = 1.0;
        r.target_kind = "ratio<=";
      }
      r.extra = {{"peak_bytes", static_cast<double>(m.peak)},
                 {"kept_activation_bytes", kept.found ? static_cast<double>(kept.activations) : -1},
                 {"kept_leaf_copy_bytes", kept.found ? static_cast<double>(kept.leaf_copies) : -1},
                 {"torch_saved_bytes", torch.saved},
                 {"torch_peak_bytes", torch.peak}};
      char note[320];
      if (p == Precision::Float32) {
        fp32 = m;
        fp32_kept = kept;
        std::snprintf(note, sizeof note, "peak %s; kept for backward kiln %.1f MB / torch %.1f MB",
                      memory::format_bytes(m.peak).c_str(),
                      static_cast<double>(kept.activations) / 1e6, torch.saved / 1e6);
      } else {
        const double step = m.ms / fp32->ms, cpu = m.cpu_ms / fp32->cpu_ms;
        const double kept_ratio = static_cast<double>(kept.activations) /
                                  static_cast<double>(std::max<size_t>(fp32_kept.activations, 1));
        r.extra.push_back({"step_vs_fp32", step});
        r.extra.push_back({"step_vs_fp32_cpu", cpu});
        r.extra.push_back({"kept_vs_fp32", kept_ratio});
        r.extra.push_back(
            {"peak_vs_fp32", static_cast<double>(m.peak) / static_cast<double>(fp32->peak)});
        const bool bf16_cpu = machine().isa.find("+avx512_bf16") != std::string::npos;
        std::snprintf(
            note, sizeof note,
            "vs fp32: step %.2fx wall / %.2fx cpu, kept %.2fx, peak %.2fx%s; peak %s; kept kiln "
            "%.1f MB (+%.1f MB half copies of leaves) / torch %.1f MB",
            step, cpu, kept_ratio, static_cast<double>(m.peak) / static_cast<double>(fp32->peak),
            p != Precision::BFloat16 ? ""
            : !bf16_cpu
                ? " (kept <= 0.52; step target n/a: no AVX512-BF16)"
                : (std::string(" (kept <= 0.52: ") + (kept_ratio <= 0.52 ? "met" : "MISSED") +
                   "; step <= 0.75: " + (step <= 0.75 ? "met" : "MISSED") + " wall, " +
                   (cpu <= 0.75 ? "met" : "MISSED") + " cpu)")
                      .c_str(),
            memory::format_bytes(m.peak).c_str(), static_cast<double>(kept.activations) / 1e6,
            static_cast<double>(kept.leaf_copies) / 1e6, torch.saved / 1e6);
      }
      r.note = note;
      if (!torch.note.empty()) r.note += "; " + torch.note;
      results.add(r);
    }
  }
  results.print("memory planning (median step; baseline: the same model unplanned)");
  results.write_json();
  return 0;
}
