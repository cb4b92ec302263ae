// float32 conv2d, forward and forward+backward, through kiln (nn::F::conv2d: its forward,
// backward-data and backward-weights products on oneDNN's convolution primitive through
// jit/library_conv.cpp where oneDNN is built in, else im2col as a reindex and one library
// GEMM) against the peers a user would otherwise call, on the same inputs and thread count:
//   onednn        oneDNN's convolution primitive called directly (convolution_direct),
//                 layouts chosen by oneDNN (blocked, e.g. nChw16c), with the reorders from
//                 and to the user's NCHW / OIHW tensors timed, as a framework holding NCHW
//                 tensors pays them; the primitives alone (inputs already in oneDNN's
//                 layouts, what a framework keeping blocked layouts between layers would
//                 pay) are the extra field onednn_primitive_ms
//   onednn-nchw   the same primitive asked to work on NCHW / OIHW as they are (no reorders)
//   torch-conv2d  torch.nn.functional.conv2d (bench_conv_torch.py; on the CPU it runs
//                 oneDNN's convolution too, through mkldnn) where PyTorch is importable
// Forward+backward is y = conv(x, w, b) and, seeded with a fixed random dy, dx, dw and db,
// all materialized (the step of one layer of a training loop). Shapes: ResNet's 3x3 stage
// (64 -> 64 at 56x56, batch 8 and 32), a 1x1 projection (256 -> 64 at 56x56) and the
// 7x7/2 stem on 224x224 images (3 -> 64, batch 8). Medians of wall and process CPU time;
// kiln and the oneDNN peers are timed round robin (one run of each per round), so that other
// processes' load falls on all of them alike (PyTorch runs in its own process, before).
// Before timing, kiln's output and gradients are compared with oneDNN's.
//
// The verdict the issue asks for (convolution through the library that measures faster):
// the ratio kiln / best peer per row; no target is set, the choice is the lead's.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench_common.h"
#include "frontend/nn/functional.h"
#include "jit/executor.h"
#include "kiln/kiln.h"

#if KILN_BENCH_DNNL
#include <dnnl.hpp>
#endif

#ifndef KILN_BENCH_DIR
#define KILN_BENCH_DIR "bench"
#endif

namespace {

using namespace kiln;
using namespace kiln::bench;

struct ConvShape {
  const char* what;
  int64_t n, c, h, w, o, k, stride, pad;
  int64_t oh() const { return (h + 2 * pad - k) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - k) / stride + 1; }
  double gflop() const {  // forward multiply-adds x 2
    return 2.0 * static_cast<double>(n * o * oh() * ow()) * static_cast<double>(c * k * k) * 1e-9;
  }
  std::string name(bool backward) const {
    char buf[128];
    std::snprintf(buf, sizeof buf, "conv2d %s N%lld %lld->%lld %lldx%lld k%lld/s%lld %s", what,
                  static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(o),
                  static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(k),
                  static_cast<long long>(stride), backward ? "fwd+bwd" : "fwd");
    return buf;
  }
};

const ConvShape kShapes[] = {
    {"resnet 3x3", 8, 64, 56, 56, 64, 3, 1, 1},
    {"resnet 3x3", 32, 64, 56, 56, 64, 3, 1, 1},
    {"1x1", 8, 256, 56, 56, 64, 1, 1, 0},
    {"stem 7x7", 8, 3, 224, 224, 64, 7, 2, 3},
};

// Fewer repetitions for the large products, so a run stays a few minutes on 2 cores.
int reps_for(const ConvShape& s, bool backward, int reps) {
  const double work = s.gflop() * (backward ? 3 : 1);
  return work > 6 ? std::max(3, reps / 2) : reps;
}

// Largest |a - b| relative to the largest |b| (0 for two empty arrays).
double rel_diff(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// The inputs of one shape, evaluated: x [N,C,H,W], w [O,C,k,k], b [O], dy [N,O,OH,OW].
struct Inputs {
  Tensor x, w, b, dy;
};

Inputs make_inputs(const ConvShape& s) {
  return {(rand({s.n, s.c, s.h, s.w}) - 0.5f).eval(),
          ((rand({s.o, s.c, s.k, s.k}) - 0.5f) * 0.2f).eval(), (rand({s.o}) - 0.5f).eval(),
          (rand({s.n, s.o, s.oh(), s.ow()}) - 0.5f).eval()};
}

// kiln's forward output and gradients (dx, dw, db) of one layer step.
struct KilnStep {
  Tensor y, dx, dw, db;
};

KilnStep kiln_step(const ConvShape& s, const Inputs& in, bool backward) {
  if (!backward) {
    return {nn::F::conv2d(in.x, in.w, in.b, s.stride, s.pad), {}, {}, {}};
  }
  // Leaves of their own so that the forward-only rows build no gradient graph.
  Tensor x = in.x.detach(), w = in.w.detach(), b = in.b.detach();
  for (Tensor* t : {&x, &w, &b}) {
    t->requires_grad_();
    t->set_grad(Tensor());  // no accumulation across steps, should detach() share the leaf
  }
  Tensor y = nn::F::conv2d(x, w, b, s.stride, s.pad);
  y.backward(in.dy);
  return {y, x.grad(), w.grad(), b.grad()};
}

#if KILN_BENCH_DNNL
// oneDNN's convolution on the user's NCHW / OIHW buffers of one shape: forward, and forward
// plus backward data and backward weights, each with the reorders its layouts need.
class OneDnnConv {
 public:
  /// `plain`: the primitives work on NCHW / OIHW as given, instead of layouts of their own.
  OneDnnConv(const ConvShape& s, const Inputs& in, bool plain)
      : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dims src{s.n, s.c, s.h, s.w}, wei{s.o, s.c, s.k, s.k}, bias{s.o},
        dst{s.n, s.o, s.oh(), s.ow()}, strides{s.stride, s.stride}, pad{s.pad, s.pad};
    auto user = [&](const dnnl::memory::dims& d, tag t, const Tensor& from) {
      dnnl::memory m({d, dt::f32, t}, eng_);
      if (from.defined()) {
        std::copy_n(from.data<float>(), from.numel(), static_cast<float*>(m.get_data_handle()));
      }
      return m;
    };
    x_ = user(src, tag::nchw, in.x);
    w_ = user(wei, tag::oihw, in.w);
    b_ = user(bias, tag::x, in.b);
    dy_ = user(dst, tag::nchw, in.dy);
    y_ = user(dst, tag::nchw, {});
    dx_ = user(src, tag::nchw, {});
    dw_ = user(wei, tag::oihw, {});
    db_ = user(bias, tag::x, {});
    auto any = [&](const dnnl::memory::dims& d) {
      const tag user_tag = d.size() == 1 ? tag::x : (d == wei ? tag::oihw : tag::nchw);
      return dnnl::memory::desc(d, dt::f32, plain ? user_tag : tag::any);
    };
    const auto alg = dnnl::algorithm::convolution_direct;
    dnnl::convolution_forward::primitive_desc fwd_infer(
        {dnnl::prop_kind::forward_inference, alg, any(src), any(wei), b_.get_desc(), any(dst),
         strides, pad, pad},
        eng_);
    dnnl::convolution_forward::primitive_desc fwd_train(
        {dnnl::prop_kind::forward_training, alg, any(src), any(wei), b_.get_desc(), any(dst),
         strides, pad, pad},
        eng_);
    dnnl::convolution_backward_data::primitive_desc bwd_data(
        {alg, any(src), any(wei), any(dst), strides, pad, pad}, eng_, fwd_train);
    dnnl::convolution_backward_weights::primitive_desc bwd_weights(
        {alg, any(src), any(wei), b_.get_desc(), any(dst), strides, pad, pad}, eng_, fwd_train);
    impl_ = fwd_infer.impl_info_str();

    // Forward: reorder x and w in, run, reorder y out.
    build_forward(fwd_infer, infer_);
    build_forward(fwd_train, train_);
    // Backward data: dy and w in, dx out.
    dnnl::memory dy_d = into(dy_, bwd_data.diff_dst_desc(), train_);
    dnnl::memory w_d = into(w_, bwd_data.weights_desc(), train_);
    dnnl::memory dx_d = out_of(bwd_data.diff_src_desc(), dx_);
    train_.core.push_back(
        {dnnl::convolution_backward_data(bwd_data),
         {{DNNL_ARG_DIFF_DST, dy_d}, {DNNL_ARG_WEIGHTS, w_d}, {DNNL_ARG_DIFF_SRC, dx_d}}});
    train_.steps.push_back(train_.core.back());
    finish(dx_d, dx_, train_);
    // Backward weights: x and dy in, dw and db out.
    dnnl::memory x_w = into(x_, bwd_weights.src_desc(), train_);
    dnnl::memory dy_w = into(dy_, bwd_weights.diff_dst_desc(), train_);
    dnnl::memory dw_w = out_of(bwd_weights.diff_weights_desc(), dw_);
    train_.core.push_back({dnnl::convolution_backward_weights(bwd_weights),
                           {{DNNL_ARG_SRC, x_w},
                            {DNNL_ARG_DIFF_DST, dy_w},
                            {DNNL_ARG_DIFF_WEIGHTS, dw_w},
                            {DNNL_ARG_DIFF_BIAS, db_}}});
    train_.steps.push_back(train_.core.back());
    finish(dw_w, dw_, train_);
  }

  /// Runs the forward (or the training step) with its reorders; `core_only`: the
  /// primitives alone, on inputs already in their layouts.
  void run(bool backward, bool core_only) {
    Plan& p = backward ? train_ : infer_;
    for (auto& [prim, args] : core_only ? p.core : p.steps) prim.execute(stream_, args);
    stream_.wait();
  }

  const float* y() const { return static_cast<const float*>(y_.get_data_handle()); }
  const float* dx() const { return static_cast<const float*>(dx_.get_data_handle()); }
  const float* dw() const { return static_cast<const float*>(dw_.get_data_handle()); }
  const float* db() const { return static_cast<const float*>(db_.get_data_handle()); }
  const std::string& impl() const { return impl_; }

 private:
  using Step = std::pair<dnnl::primitive, std::unordered_map<int, dnnl::memory>>;
  struct Plan {
    std::vector<Step> steps;  // reorders and primitives, in order
    std::vector<Step> core;   // the primitives alone
  };

  // `user` in layout `want`: the same memory, or a new one with a reorder step before.
  dnnl::memory into(const dnnl::memory& user, const dnnl::memory::desc& want, Plan& p) {
    if (user.get_desc() == want) return user;
    dnnl::memory m(want, eng_);
    p.steps.push_back({dnnl::reorder(user, m), {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, m}}});
    // Once now, so that the primitives alone (core-only runs) read the data too.
    dnnl::reorder(user, m).execute(stream_, {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, m}});
    stream_.wait();
    return m;
  }
  // A result buffer in layout `have` for the user's `user` (reordered by finish()).
  dnnl::memory out_of(const dnnl::memory::desc& have, const dnnl::memory& user) {
    return user.get_desc() == have ? user : dnnl::memory(have, eng_);
  }
  void finish(const dnnl::memory& got, const dnnl::memory& user, Plan& p) {
    if (got.get_data_handle() == user.get_data_handle()) return;
    p.steps.push_back({dnnl::reorder(got, user), {{DNNL_ARG_FROM, got}, {DNNL_ARG_TO, user}}});
  }
  void build_forward(const dnnl::convolution_forward::primitive_desc& pd, Plan& p) {
    dnnl::memory x = into(x_, pd.src_desc(), p);
    dnnl::memory w = into(w_, pd.weights_desc(), p);
    dnnl::memory y = out_of(pd.dst_desc(), y_);
    p.core.push_back(
        {dnnl::convolution_forward(pd),
         {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b_}, {DNNL_ARG_DST, y}}});
    p.steps.push_back(p.core.back());
    finish(y, y_, p);
  }

  dnnl::engine eng_;
  dnnl::stream stream_;
  dnnl::memory x_, w_, b_, dy_, y_, dx_, dw_, db_;
  Plan infer_, train_;
  std::string impl_;
};

// oneDNN runs on OpenMP; its team gets the same number of threads as kiln's pool.
void set_omp_threads(int n) {
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(n);
}
#endif

// Each of `fns` timed over `reps` rounds that run each once, after one untimed round: the
// median wall and CPU times, and the fastest wall time (on a shared machine, the closest to
// what the code costs when nothing else runs).
struct RoundRobin {
  Times median;
  double min_wall_ms = 0;
};
std::vector<RoundRobin> interleaved(int reps, const std::vector<std::function<void()>>& fns) {
  for (const auto& fn : fns) fn();
  std::vector<Samples> samples(fns.size());
  for (int i = 0; i < reps; ++i) {
    for (size_t k = 0; k < fns.size(); ++k) {
      Stopwatch watch;
      fns[k]();
      samples[k].add(watch.elapsed());
    }
  }
  std::vector<RoundRobin> out;
  for (const Samples& s : samples)
    out.push_back({s.medians(), *std::min_element(s.wall.begin(), s.wall.end())});
  return out;
}

// torch.nn.functional.conv2d's times: key "index,backward" -> Times, or empty and a note.
std::map<std::string, Times> torch_times(int threads, int reps, std::string& note,
                                         std::string& info) {
  std::map<std::string, Times> out;
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    note = "PyTorch not installed (scripts/setup_torch.sh): torch peer skipped";
    return out;
  }
  std::string cmd = "python3 " KILN_BENCH_DIR "/bench_conv_torch.py --threads " +
                    std::to_string(threads) + " --reps " + std::to_string(reps);
  for (const ConvShape& s : kShapes) {
    char spec[128];
    std::snprintf(spec, sizeof spec, " %lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld",
                  static_cast<long long>(s.n), static_cast<long long>(s.c),
                  static_cast<long long>(s.h), static_cast<long long>(s.w),
                  static_cast<long long>(s.o), static_cast<long long>(s.k),
                  static_cast<long long>(s.stride), static_cast<long long>(s.pad));
    cmd += spec;
  }
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    note = "could not run bench_conv_torch.py";
    return out;
  }
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    int index = 0, backward = 0, used = 0;
    Times t;
    if (std::sscanf(line, "RESULT %d %d %lf %lf", &index, &backward, &t.wall_ms, &t.cpu_ms) == 4) {
      out[std::to_string(index) + "," + std::to_string(backward)] = t;
    } else if (std::sscanf(line, "INFO %n", &used) == 0 && used > 0) {
      info = line + used;
      while (!info.empty() && (info.back() == '\n' || info.back() == '\r')) info.pop_back();
    } else {
      std::fputs(line, stdout);
    }
  }
  if (pclose(p) != 0 && out.empty()) note = "bench_conv_torch.py failed";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  example::Flags flags =
      bench_flags("bench_conv",
                  "kiln's conv2d (library convolution, or im2col + GEMM) forward and "
                  "forward+backward against oneDNN's "
                  "convolution primitive and torch.nn.functional.conv2d.");
  flags.add("only", "", "run only the rows whose shape description contains this text");
  flags.note(
      "environment: BENCH_REPS (timed repetitions, default 5), KILN_BENCH_PROFILE=1 (print "
      "the slowest generated kernels of each row)");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  Results results(flags.str("json"));
  const int reps = env_int("BENCH_REPS", 5);
  const int threads = thread_pool().size();
  const std::string compiler = compiler_label();
  const std::string only = flags.str("only");
  std::printf("bench_conv: %d threads, compiler %s; %s\n", threads, compiler.c_str(),
              machine_line().c_str());

  std::string torch_note, torch_info;
  const std::map<std::string, Times> torch = torch_times(threads, reps, torch_note, torch_info);
  if (!torch_info.empty()) std::printf("bench_conv: %s\n", torch_info.c_str());
  if (!torch_note.empty()) std::printf("bench_conv: %s\n", torch_note.c_str());

  bool agree = true;
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const ConvShape& s = kShapes[i];
    if (!only.empty() && std::string(s.what).find(only) == std::string::npos) continue;
    manual_seed(static_cast<uint64_t>(i));
    const Inputs in = make_inputs(s);
#if KILN_BENCH_DNNL
    set_omp_threads(threads);
    OneDnnConv dnn(s, in, false), dnn_plain(s, in, true);
    set_omp_threads(1);
#endif
    for (bool backward : {false, true}) {
      const int r = reps_for(s, backward, reps);
      // kiln first, then the peers, each on the same inputs.
      KilnStep check = kiln_step(s, in, backward);
      if (backward) {
        eval({check.y, check.dx, check.dw, check.db});
      } else {
        check.y.eval();
      }
      auto kiln_run = [&] {
        KilnStep st = kiln_step(s, in, backward);
        if (backward) {
          eval({st.y, st.dx, st.dw, st.db});
        } else {
          st.y.eval();
        }
      };
      std::vector<std::pair<std::string, Times>> peers;
      Result row;
      std::string note;
      const auto before = kernel_times();
      Times kiln_t;
#if KILN_BENCH_DNNL
      // oneDNN's OpenMP team gets the pool's thread count for its own runs only (kiln sets
      // it per call and keeps 1 for its GEMM callers).
      auto peer = [&](OneDnnConv& d, bool core_only) {
        return [&d, backward, core_only, threads] {
          set_omp_threads(threads);
          d.run(backward, core_only);
          set_omp_threads(1);
        };
      };
      peer(dnn, false)();
      peer(dnn_plain, false)();
      // Agreement with oneDNN before any time is reported.
      double diff = rel_diff(check.y.data<float>(), dnn.y(), static_cast<size_t>(check.y.numel()));
      if (backward) {
        diff = std::max(diff, rel_diff(check.dx.data<float>(), dnn.dx(),
                                       static_cast<size_t>(check.dx.numel())));
        diff = std::max(diff, rel_diff(check.dw.data<float>(), dnn.dw(),
                                       static_cast<size_t>(check.dw.numel())));
        diff = std::max(diff, rel_diff(check.db.data<float>(), dnn.db(),
                                       static_cast<size_t>(check.db.numel())));
      }
      diff = std::max(diff, rel_diff(check.y.data<float>(), dnn_plain.y(),
                                     static_cast<size_t>(check.y.numel())));
      // Round robin, one run of each per round, so that load from other processes drifting
      // during the row falls on kiln and its peers alike.
      const std::vector<RoundRobin> t =
          interleaved(r, {kiln_run, peer(dnn, false), peer(dnn_plain, false), peer(dnn, true)});
      kiln_t = t[0].median;
      peers.push_back({"onednn", t[1].median});
      peers.push_back({"onednn-nchw", t[2].median});
      const Times core = t[3].median;
      row.extra.push_back({"kiln_min_ms", t[0].min_wall_ms});
      row.extra.push_back({"onednn_min_ms", t[1].min_wall_ms});
      row.extra.push_back({"onednn-nchw_min_ms", t[2].min_wall_ms});
      char mins[128];
      std::snprintf(mins, sizeof mins,
                    "; fastest runs: kiln %.4g, onednn %.4g, onednn-nchw %.4g ms", t[0].min_wall_ms,
                    t[1].min_wall_ms, t[2].min_wall_ms);
      if (!(diff <= 1e-3)) {
        std::fprintf(stderr, "bench_conv: %s: kiln and oneDNN differ by %.3g (relative)\n",
                     s.name(backward).c_str(), diff);
        agree = false;
      }
      row.extra.push_back({"onednn_primitive_ms", core.wall_ms});
      row.extra.push_back({"onednn_primitive_cpu_ms", core.cpu_ms});
      row.extra.push_back({"max_rel_diff_vs_onednn", diff});
      char alone[48];
      std::snprintf(alone, sizeof alone, "%.4g", core.wall_ms);
      note = "oneDNN " + dnn.impl() + ", primitives alone " + alone + " ms; nchw " +
             dnn_plain.impl() + mins;
#else
      kiln_t = interleaved(r, {kiln_run})[0].median;
      note = "oneDNN not found at build time";
#endif
      // The last evaluation is kiln's (the peers run no kiln code).
      const jit::EvalStats st = jit::last_eval_stats();
      if (env_int("KILN_BENCH_PROFILE", 0)) {
        std::printf("%s (%d runs):\n", s.name(backward).c_str(), r + 1);
        print_kernel_profile(before, 6);
      }
      if (auto it = torch.find(std::to_string(i) + "," + (backward ? "1" : "0")); it != torch.end())
        peers.push_back({"torch-conv2d", it->second});
      for (const auto& [name, t] : peers) {
        row.extra.push_back({name + "_ms", t.wall_ms});
        row.extra.push_back({name + "_cpu_ms", t.cpu_ms});
      }
      row.workload = s.name(backward);
      row.set_kiln(kiln_t);
      row.compiler = compiler;
      const double gflop = s.gflop() * (backward ? 3 : 1);
      row.extra.push_back({"gflop", gflop});
      char rate[96];
      std::snprintf(rate, sizeof rate,
                    "kiln %.0f GFLOP/s, %zu kernels + %zu library calls (%zu convolutions)",
                    gflop / (kiln_t.wall_ms * 1e-3), st.kernels, st.library_calls, st.conv_calls);
      note = rate + std::string("; ") + note;
      if (!peers.empty()) {
        const auto best = std::min_element(
            peers.begin(), peers.end(),
            [](const auto& a, const auto& b) { return a.second.wall_ms < b.second.wall_ms; });
        row.baseline = best->first;
        row.set_baseline(best->second);
        for (const auto& [name, t] : peers) {
          std::snprintf(rate, sizeof rate, "; %s %.4g ms", name.c_str(), t.wall_ms);
          note += rate;
        }
      } else {
        row.baseline = "none";
      }
      if (torch.empty() && !torch_note.empty()) note += "; " + torch_note;
      row.note = note;
      results.add(row);
    }
  }
  results.print("bench_conv (median ms; ratio = kiln / fastest peer; no target)");
  results.write_json();
  if (!agree) {
    std::fprintf(stderr, "bench_conv: results disagree with oneDNN (see above)\n");
    return 1;
  }
  return 0;
}
