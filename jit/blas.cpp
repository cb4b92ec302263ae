#include "blas.h"

#include <dlfcn.h>

#include <cstdio>
#include <mutex>

#include "../core/error.h"
#include "../core/log.h"

#ifndef KILN_WITH_BLAS
#define KILN_WITH_BLAS 0
#endif
#ifndef KILN_WITH_DNNL
#define KILN_WITH_DNNL 0
#endif

#if KILN_WITH_DNNL
#include <dnnl.h>
#endif

#if KILN_WITH_BLAS
// Declared here rather than through cblas.h: the header's location differs between
// distributions, and these entry points are all kiln needs.
extern "C" {
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void cblas_dgemm(int order, int transa, int transb, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb, double beta, double* c,
                 int ldc);
void openblas_set_num_threads(int threads);
char* openblas_get_corename(void);
char* openblas_get_config(void);
}
#endif

namespace kiln::jit {
namespace {

bool host_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

#if KILN_WITH_DNNL
// dnnl_cpu_isa_t values of oneDNN 2.x, named as oneDNN's ONEDNN_MAX_CPU_ISA spells them.
std::string dnnl_isa_name(dnnl_cpu_isa_t isa) {
  switch (static_cast<unsigned>(isa)) {
    case 0x1:
      return "sse41";
    case 0x3:
      return "avx";
    case 0x7:
      return "avx2";
    case 0x407:
      return "avx2_vnni";
    case 0xf:
      return "avx512_mic";
    case 0x1f:
      return "avx512_mic_4ops";
    case 0x27:
      return "avx512_core";
    case 0x67:
      return "avx512_core_vnni";
    case 0xe7:
      return "avx512_core_bf16";
    case 0x3e7:
      return "avx512_core_amx";
    default:
      return "isa 0x" + [&] {
        char hex[16];
        std::snprintf(hex, sizeof(hex), "%x", static_cast<unsigned>(isa));
        return std::string(hex);
      }();
  }
}

// Debian's oneDNN runs on OpenMP. kiln's thread pool splits a GEMM's work itself, so each
// pool thread must run its part on one thread, else every part starts a team of its own on
// the same cores. OpenMP's thread count is a per-thread setting, made once in every thread
// that calls oneDNN; the runtime is the one oneDNN brought into the process (looked up, so
// kiln links no OpenMP itself and a oneDNN on another threading runtime needs nothing).
void run_one_openmp_thread() {
  using SetThreads = void (*)(int);
  static const auto set_threads =
      reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set_threads != nullptr) set_threads(1);
}

GemmPath dnnl_path() {
  const dnnl_version_t* v = dnnl_version();
  GemmPath p;
  p.library = "oneDNN";
  p.version =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  p.kernels = dnnl_isa_name(isa);
  // Below AVX2 on a CPU that has it: oneDNN was limited (ONEDNN_MAX_CPU_ISA) or is confused.
  p.generic = host_has_avx2() && (static_cast<unsigned>(isa) & 0x7u) != 0x7u;
  return p;
}
#endif

#if KILN_WITH_BLAS
GemmPath openblas_path() {
  GemmPath p;
  p.library = "OpenBLAS";
  // openblas_get_config() reads "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_...".
  const std::string config = openblas_get_config();
  const size_t space = config.find(' ');
  if (config.rfind("OpenBLAS ", 0) == 0 && space != std::string::npos)
    p.version = config.substr(space + 1, config.find(' ', space + 1) - space - 1);
  p.kernels = openblas_get_corename();
  // The cores whose kernels use AVX2 or AVX-512 (OpenBLAS's names); any other core on a CPU
  // with AVX2 means OpenBLAS did not recognise the model and fell back to older code.
  static const char* const kVectorCores[] = {
      "Haswell",        "Zen",       "SkylakeX", "Cooperlake",
      "SapphireRapids", "Excavator", "Neoverse", "power"};
  bool vector = false;
  for (const char* core : kVectorCores)
    vector = vector || p.kernels.rfind(core, 0) == 0 || p.kernels == core;
  p.generic = host_has_avx2() && !vector;
  return p;
}
#endif

// One warning per dtype path, at its first GEMM: a generic path costs 4-5x on every product.
void warn_if_generic(DType dtype) {
  static std::once_flag once[2];
  std::call_once(once[dtype == DType::Float64 ? 1 : 0], [dtype] {
    const GemmPath p = gemm_path(dtype);
    if (!p.generic) return;
    log_line("kiln: warning: " + std::string(dtype_name(dtype)) + " GEMMs run on " + p.library +
             " " + p.version + "'s generic '" + p.kernels +
             "' kernels although this CPU has AVX2 or better; they may be several times "
             "slower than the CPU allows (see `kiln info`)");
  });
}

}  // namespace

GemmPath gemm_path(DType dtype) {
#if KILN_WITH_DNNL
  if (dtype == DType::Float32) return dnnl_path();
#endif
#if KILN_WITH_BLAS
  if (dtype == DType::Float32 || dtype == DType::Float64) return openblas_path();
#endif
  (void)dtype;
  return GemmPath{"none", "", "generated kernels", false};
}

bool cpu_gemm_available(DType dtype) {
  // What the build has, not gemm_path(): the matcher asks for every reduction it sees.
  if (dtype == DType::Float32) return KILN_WITH_DNNL || KILN_WITH_BLAS;
  return dtype == DType::Float64 && KILN_WITH_BLAS;
}

void cpu_gemm(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
              int64_t lda, const void* b, int64_t ldb, bool accumulate, void* c, int64_t ldc) {
  warn_if_generic(dtype);
#if KILN_WITH_DNNL
  if (dtype == DType::Float32) {
    static thread_local bool one_thread = false;
    if (!one_thread) {
      run_one_openmp_thread();
      one_thread = true;
    }
    const dnnl_status_t status = dnnl_sgemm(
        ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, static_cast<const float*>(a), lda,
        static_cast<const float*>(b), ldb, accumulate ? 1.0f : 0.0f, static_cast<float*>(c), ldc);
    if (status != dnnl_success)
      throw ValueError("[matmul] oneDNN sgemm failed (status " + std::to_string(status) + ") for " +
                       std::to_string(m) + "x" + std::to_string(k) + " @ " + std::to_string(k) +
                       "x" + std::to_string(n));
    return;
  }
#endif
#if KILN_WITH_BLAS
  // OpenBLAS runs single-threaded and kiln's pool splits the work: two thread teams on the
  // same cores (OpenBLAS's spin-waiting after every call included) would fight over them
  // between the many small products of a training step.
  static std::once_flag threads_set;
  std::call_once(threads_set, [] { openblas_set_num_threads(1); });
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  const int ia = ta ? kTrans : kNoTrans, ib = tb ? kTrans : kNoTrans;
  const auto M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  if (dtype == DType::Float32) {
    cblas_sgemm(kRowMajor, ia, ib, M, N, K, 1.0f, static_cast<const float*>(a),
                static_cast<int>(lda), static_cast<const float*>(b), static_cast<int>(ldb),
                accumulate ? 1.0f : 0.0f, static_cast<float*>(c), static_cast<int>(ldc));
    return;
  }
  if (dtype == DType::Float64) {
    cblas_dgemm(kRowMajor, ia, ib, M, N, K, 1.0, static_cast<const double*>(a),
                static_cast<int>(lda), static_cast<const double*>(b), static_cast<int>(ldb),
                accumulate ? 1.0 : 0.0, static_cast<double*>(c), static_cast<int>(ldc));
    return;
  }
#endif
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb;
  (void)accumulate, (void)c, (void)ldc;
  throw ValueError("[matmul] no GEMM library for " + std::string(dtype_name(dtype)) +
                   " in this build");
}

}  // namespace kiln::jit
