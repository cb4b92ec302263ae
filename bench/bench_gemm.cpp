// Square float32 GEMM through kiln::matmul against cblas_sgemm from OpenBLAS called
// directly in the same process (same inputs, same thread count), sizes 256..2048.
// kiln's time covers building the matmul and evaluating it (after warm-up); whether kiln
// routes it to the library or to generated code is shown in the note column.
//
// Usage: bench_gemm [--json PATH]     env: BENCH_REPS (default 9)
#include <cblas.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "jit/executor.h"
#include "kiln/kiln.h"

int main(int argc, char** argv) {
  using namespace kiln;
  using namespace kiln::bench;
  example::Flags flags =
      bench_flags("bench_gemm", "kiln's GEMM path against OpenBLAS called directly.");
  flags.note("environment: BENCH_REPS (timed repetitions, default 9)");
  if (std::optional<int> code = parse_or_exit(flags, argc, argv)) return *code;
  Results results(flags.str("json"));
  const int reps = env_int("BENCH_REPS", 9);
  const int threads = thread_pool().size();
  const std::string compiler = compiler_label();
  std::printf("bench_gemm: %d threads, compiler %s\n", threads, compiler.c_str());

  for (int n : {256, 512, 1024, 2048}) {
    Tensor a = (rand({n, n}) - 0.5f).eval(), b = (rand({n, n}) - 0.5f).eval();
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    std::vector<float> c(static_cast<size_t>(n) * n);
    // Fewer repetitions for the large sizes keep the whole run short.
    int r = n >= 2048 ? std::max(3, reps / 2) : reps;
    // The baseline is OpenBLAS threading itself over as many threads as kiln's pool has;
    // kiln runs OpenBLAS single-threaded and splits the work over its own pool, so the
    // setting goes back to 1 afterwards.
    openblas_set_num_threads(threads);
    double blas_ms = median_ms(2, r, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, pa, n, pb, n, 0.0f,
                  c.data(), n);
    });
    openblas_set_num_threads(1);

    // Check kiln against the library once before timing it.
    Tensor k = matmul(a, b).eval();
    const float* pk = k.data<float>();
    double worst = 0;
    for (size_t i = 0; i < c.size(); i += 97) {
      worst = std::max(worst, std::abs(static_cast<double>(pk[i]) - c[i]) /
                                  std::max(1.0, std::abs(static_cast<double>(c[i]))));
    }
    if (worst > 1e-3) {
      std::fprintf(stderr, "bench_gemm: kiln and OpenBLAS differ at n=%d (rel %.3g)\n", n, worst);
      return 1;
    }

    double kiln_ms = median_ms(2, r, [&] { matmul(a, b).eval(); });
    jit::EvalStats st = jit::last_eval_stats();
    Result row;
    row.workload = "GEMM f32 " + std::to_string(n);
    row.kiln_ms = kiln_ms;
    row.baseline = "openblas";
    row.baseline_ms = blas_ms;
    row.compiler = compiler;
    double gflop = 2.0 * n * n * static_cast<double>(n) * 1e-9;
    char note[160];
    std::snprintf(note, sizeof note, "%s; kiln %.1f GFLOP/s, openblas %.1f GFLOP/s",
                  st.library_calls ? "library call" : "generated kernel", gflop / (kiln_ms * 1e-3),
                  gflop / (blas_ms * 1e-3));
    row.note = note;
    // Target: kiln at least 0.95x OpenBLAS's speed, i.e. kiln_ms / blas_ms <= 1/0.95.
    row.target_kind = "ratio<=";
    row.target = 1.0 / 0.95;
    results.add(row);
  }
  results.print("bench_gemm (median ms; ratio = kiln / openblas)");
  results.write_json();
  return 0;
}
