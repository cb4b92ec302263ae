#include "blas.h"

#include <dlfcn.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

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

// oneDNN has no bf16/f16 gemm call in its C API: half-precision products run on its matmul
// primitive (float32 accumulation, one rounding of the result; AVX512-BF16, AMX or
// AVX512-FP16 where the CPU has them). Primitives are made once per layout and shared by
// every thread (executing one is thread-safe); each thread has its own stream.
dnnl_engine_t dnnl_cpu_engine() {
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success) e = nullptr;
    return e;
  }();
  return engine;
}

using MatmulKey =
    std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;

// oneDNN 2.6.3's brgemm matmul (its AMX and AVX512-BF16 kernels) takes only dense matrices: an
// operand or result whose leading dimension is wider than its rows, as in every part of a
// product kiln's pool splits (the columns of C, or the rows of a transposed A), goes to
// gemm:jit. Where gemm:jit is slow for the layout, the operands are copied into dense
// per-thread buffers (one pass over each, exact) and the dense layout runs on brgemm.
struct Matmul {
  Matmul() = default;
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  ~Matmul() {
    if (primitive) dnnl_primitive_destroy(primitive);
  }
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_desc_t a, b, c;
  dnnl_memory_desc_t scratchpad;  // what one execution needs; each thread brings its own
  bool dense_a = false, dense_b = false, dense_c = false;  // copied before (C: and after)
  std::string implementation;                              // oneDNN's impl_info_str
};

dnnl_data_type_t dnnl_type(DType t) { return t == DType::BFloat16 ? dnnl_bf16 : dnnl_f16; }

// One matmul primitive for A [m, k] and B [k, n] read through the given strides into C [m, n]
// (row stride ldc); primitive stays nullptr where oneDNN has no implementation.
std::shared_ptr<Matmul> create_matmul(dnnl_data_type_t t, bool ta, bool tb, int64_t m, int64_t n,
                                      int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                                      bool accumulate, bool half_result) {
  auto result = std::make_shared<Matmul>();
  Matmul& mm = *result;
  const dnnl_dims_t a_dims = {m, k}, b_dims = {k, n}, c_dims = {m, n};
  const dnnl_dims_t a_strides = {ta ? 1 : lda, ta ? lda : 1};
  const dnnl_dims_t b_strides = {tb ? 1 : ldb, tb ? ldb : 1};
  const dnnl_dims_t c_strides = {ldc, 1};
  bool ok = dnnl_cpu_engine() != nullptr &&
            dnnl_memory_desc_init_by_strides(&mm.a, 2, a_dims, t, a_strides) == dnnl_success &&
            dnnl_memory_desc_init_by_strides(&mm.b, 2, b_dims, t, b_strides) == dnnl_success &&
            dnnl_memory_desc_init_by_strides(&mm.c, 2, c_dims, half_result ? t : dnnl_f32,
                                             c_strides) == dnnl_success;
  dnnl_matmul_desc_t desc;
  ok = ok && dnnl_matmul_desc_init(&desc, &mm.a, &mm.b, nullptr, &mm.c) == dnnl_success;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post = nullptr;
  ok = ok && dnnl_primitive_attr_create(&attr) == dnnl_success;
  // Primitives are cached and run on any pool thread, several at once. oneDNN's default
  // scratchpad is one buffer shared by all primitives, safe only for a primitive run on the
  // thread that created it: two concurrent bfloat16 GEMMs then wrote into each other's partial
  // sums (runs of the same step differed at two threads). Each call passes its thread's own.
  ok = ok &&
       dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (ok && accumulate) {
    // C += A @ B: the sum post-op adds the old C.
    ok = dnnl_post_ops_create(&post) == dnnl_success &&
         dnnl_post_ops_append_sum(post, 1.0f) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, post) == dnnl_success;
  }
  dnnl_primitive_desc_t pd = nullptr;
  ok = ok &&
       dnnl_primitive_desc_create(&pd, &desc, attr, dnnl_cpu_engine(), nullptr) == dnnl_success;
  const dnnl_memory_desc_t* scratch =
      ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : nullptr;
  ok = ok && scratch != nullptr;
  if (ok) mm.scratchpad = *scratch;
  const char* impl = nullptr;
  if (ok && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
      impl != nullptr)
    mm.implementation = impl;
  ok = ok && dnnl_primitive_create(&mm.primitive, pd) == dnnl_success;
  if (!ok) mm.primitive = nullptr;
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (post) dnnl_post_ops_destroy(post);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return result;
}

bool is_brgemm(const Matmul& mm) { return mm.implementation.rfind("brg:", 0) == 0; }

// Whether copying a layout's operands dense pays, given that the layout as stored runs on
// gemm:jit and the dense one on brgemm. Measured on Sapphire Rapids (oneDNN 2.6.3, one thread,
// median thread CPU time, copies included): gemm:jit reads a transposed A of a short k
// slowly, so weight gradients dW = dY^T X of a modest batch gain (k = 64..512: 0.53-0.89x of
// gemm:jit's time, e.g. an MLP step's 512x1024x128 part 1.12 -> 0.37 ms) and lose from
// k = 640 up (k = 1024: 1.0-1.3x; the 2048 of a Transformer step: 1.1x). With A as stored
// gemm:jit matches brgemm (its own AMX kernels), so copying C back for brgemm does not pay
// (the MLP forward's 128x512x784 part: 0.34 ms, 0.38 ms copied).
bool dense_copies_pay(bool ta, int64_t k) { return ta && k <= 512; }

// The primitive for one layout, or nullptr where oneDNN has no implementation (f16 before
// AVX512-FP16, bf16 before AVX-512): the caller then converts to float32. `half_result`:
// the destination is `dtype` (oneDNN rounds its float32 sums once as it stores them). Shared:
// the cache may drop it while another thread still runs it.
std::shared_ptr<const Matmul> matmul_for(DType dtype, bool ta, bool tb, int64_t m, int64_t n,
                                         int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                                         bool accumulate, bool half_result) {
  static std::mutex mutex;
  static std::map<MatmulKey, std::shared_ptr<const Matmul>> cache;
  const MatmulKey key{
      static_cast<int>(dtype), ta, tb, m, n, k, lda, ldb, ldc, accumulate, half_result};
  std::lock_guard lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  // Bounded: a workload with many layouts drops them all and starts again (a primitive still
  // running elsewhere lives until that call returns).
  if (cache.size() >= 1024) cache.clear();
  const dnnl_data_type_t t = dnnl_type(dtype);
  std::shared_ptr<Matmul> mm =
      create_matmul(t, ta, tb, m, n, k, lda, ldb, ldc, accumulate, half_result);
  // The leading dimensions of the dense layout; an operand with a wider one is copied.
  const int64_t dense_lda = ta ? m : k, dense_ldb = tb ? k : n;
  const bool wide_a = lda != dense_lda, wide_b = ldb != dense_ldb, wide_c = ldc != n;
  if (mm->primitive && !is_brgemm(*mm) && (wide_a || wide_b || wide_c) && dense_copies_pay(ta, k)) {
    std::shared_ptr<Matmul> dense =
        create_matmul(t, ta, tb, m, n, k, dense_lda, dense_ldb, n, accumulate, half_result);
    if (dense->primitive && is_brgemm(*dense)) {
      dense->dense_a = wide_a, dense->dense_b = wide_b, dense->dense_c = wide_c;
      mm = std::move(dense);
    }
  }
  if (!mm->primitive) mm = nullptr;
  cache.emplace(key, mm);
  return mm;
}

// `rows` rows of `row_bytes` each, `from` with a row stride of `from_stride` bytes, into `to`
// with `to_stride`.
void copy_rows(const void* from, int64_t from_stride, void* to, int64_t to_stride, int64_t rows,
               int64_t row_bytes) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(to) + r * to_stride,
                static_cast<const char*>(from) + r * from_stride, static_cast<size_t>(row_bytes));
}

// Runs `mm` on A, B and C as cpu_gemm received them (leading dimensions lda, ldb, ldc); the
// operands the layout marks are copied into this thread's dense buffers first.
bool dnnl_matmul(const Matmul& mm, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
                 int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc, bool accumulate,
                 bool half_result) {
  thread_local dnnl_stream_t stream = [] {
    dnnl_stream_t s = nullptr;
    if (dnnl_stream_create(&s, dnnl_cpu_engine(), dnnl_stream_default_flags) != dnnl_success)
      s = nullptr;
    return s;
  }();
  if (!stream) return false;
  // This thread's scratchpad and dense copies, grown to the largest any call asked for.
  thread_local std::vector<char> scratch, dense_a, dense_b, dense_c;
  const size_t scratch_bytes = dnnl_memory_desc_get_size(&mm.scratchpad);
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
  constexpr int64_t kHalf = 2;
  const int64_t c_elem = half_result ? kHalf : 4;
  // A half operand of `rows` x `cols` with leading dimension `ld`, copied into `buf`.
  auto dense_copy = [](const void* from, int64_t ld, int64_t rows, int64_t cols,
                       std::vector<char>& buf) -> const void* {
    const size_t bytes = static_cast<size_t>(rows * cols * kHalf);
    if (buf.size() < bytes) buf.resize(bytes);
    copy_rows(from, ld * kHalf, buf.data(), cols * kHalf, rows, cols * kHalf);
    return buf.data();
  };
  // Stored A is [k, m] when transposed, else [m, k]; B is [n, k] or [k, n].
  if (mm.dense_a) a = dense_copy(a, lda, ta ? k : m, ta ? m : k, dense_a);
  if (mm.dense_b) b = dense_copy(b, ldb, tb ? n : k, tb ? k : n, dense_b);
  void* const c_out = c;
  if (mm.dense_c) {
    if (dense_c.size() < static_cast<size_t>(m * n * c_elem))
      dense_c.resize(static_cast<size_t>(m * n * c_elem));
    // The sum post-op reads the old C.
    if (accumulate) copy_rows(c, ldc * c_elem, dense_c.data(), n * c_elem, m, n * c_elem);
    c = dense_c.data();
  }
  dnnl_memory_t ma = nullptr, mb = nullptr, mc = nullptr, ms = nullptr;
  bool ok =
      dnnl_memory_create(&ma, &mm.a, dnnl_cpu_engine(), const_cast<void*>(a)) == dnnl_success &&
      dnnl_memory_create(&mb, &mm.b, dnnl_cpu_engine(), const_cast<void*>(b)) == dnnl_success &&
      dnnl_memory_create(&mc, &mm.c, dnnl_cpu_engine(), c) == dnnl_success &&
      dnnl_memory_create(&ms, &mm.scratchpad, dnnl_cpu_engine(), scratch.data()) == dnnl_success;
  if (ok) {
    const dnnl_exec_arg_t args[] = {
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}};
    ok = dnnl_primitive_execute(mm.primitive, stream, 4, args) == dnnl_success &&
         dnnl_stream_wait(stream) == dnnl_success;
  }
  for (dnnl_memory_t x : {ma, mb, mc, ms})
    if (x) dnnl_memory_destroy(x);
  if (ok && mm.dense_c) copy_rows(c, n * c_elem, c_out, ldc * c_elem, m, n * c_elem);
  return ok;
}

// Whether oneDNN runs `dtype` products on this CPU (asked once, on a small layout).
bool dnnl_half_available(DType dtype) {
  static const bool bf16 =
      matmul_for(DType::BFloat16, false, false, 8, 8, 8, 8, 8, 8, false, false) != nullptr;
  static const bool f16 =
      matmul_for(DType::Float16, false, false, 8, 8, 8, 8, 8, 8, false, false) != nullptr;
  return dtype == DType::BFloat16 ? bf16 : f16;
}
#endif

// A contiguous run of float16 as float32. The library is built for baseline x86-64, where
// each element took a branchy bit-twiddle (the float16 products on a CPU without oneDNN
// float16 kernels spent more time widening than multiplying); with F16C, 8 per instruction.
// F16C's conversion is exact for every number; it quiets a signalling NaN, which a product
// turns into a quiet NaN anyway.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx,f16c"))) void half_run_f16c(const uint16_t* x, int64_t n, float* out) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(out + j,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j))));
  for (; j < n; ++j) out[j] = half_bits_to_float(x[j]);
}
bool host_has_f16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}
#endif

void widen_run(DType t, const uint16_t* x, int64_t n, float* out) {
  if (t == DType::BFloat16) {
    // A bfloat16 is the top half of a float32: a shift the compiler vectorizes.
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t bits = static_cast<uint32_t>(x[j]) << 16;
      std::memcpy(out + j, &bits, sizeof bits);
    }
    return;
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (host_has_f16c()) return half_run_f16c(x, n, out);
#endif
  for (int64_t j = 0; j < n; ++j) out[j] = half_bits_to_float(x[j]);
}

// op(X) of a half matrix as a dense float32 rows x cols matrix (row-major, no transpose).
void widen(DType t, bool trans, int64_t rows, int64_t cols, const uint16_t* x, int64_t ld,
           std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows * cols));
  if (!trans) {
    for (int64_t i = 0; i < rows; ++i) widen_run(t, x + i * ld, cols, out.data() + i * cols);
    return;
  }
  // Transposed: stored row r of X is column r of the result; widen it, then scatter it.
  thread_local std::vector<float> run;
  run.resize(static_cast<size_t>(rows));
  for (int64_t j = 0; j < cols; ++j) {
    widen_run(t, x + j * ld, rows, run.data());
    for (int64_t i = 0; i < rows; ++i)
      out[static_cast<size_t>(i * cols + j)] = run[static_cast<size_t>(i)];
  }
}

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
  if (dtype == DType::Float16 || dtype == DType::BFloat16) {
#if KILN_WITH_DNNL
    if (dnnl_half_available(dtype)) {
      GemmPath p = dnnl_path();
      p.kernels += " (matmul primitive)";
      return p;
    }
#endif
    // Converted to float32, multiplied there, rounded back.
    GemmPath p = gemm_path(DType::Float32);
    if (p.library != "none") p.kernels += " (via float32)";
    return p;
  }
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
  // Half precision runs on oneDNN's matmul or converted to float32, so wherever float32 does.
  if (dtype == DType::Float32 || dtype == DType::Float16 || dtype == DType::BFloat16)
    return KILN_WITH_DNNL || KILN_WITH_BLAS;
  return dtype == DType::Float64 && KILN_WITH_BLAS;
}

HalfGemmKernel half_gemm_kernel(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                int64_t lda, int64_t ldb, int64_t ldc, bool accumulate,
                                bool half_result) {
  if (dtype != DType::Float16 && dtype != DType::BFloat16)
    throw DTypeError("[matmul] half_gemm_kernel takes float16 or bfloat16, not " +
                     std::string(dtype_name(dtype)));
#if KILN_WITH_DNNL
  if (const auto mm = matmul_for(dtype, ta, tb, m, n, k, lda, ldb, ldc, accumulate, half_result))
    return {mm->implementation, mm->dense_a, mm->dense_b, mm->dense_c};
#endif
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)lda, (void)ldb, (void)ldc;
  (void)accumulate, (void)half_result;
  return {};
}

void cpu_gemm(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
              int64_t lda, const void* b, int64_t ldb, bool accumulate, void* c, int64_t ldc,
              bool half_result) {
  const bool half = dtype == DType::Float16 || dtype == DType::BFloat16;
  if (half_result && (!half || accumulate))
    throw ValueError("[matmul] a rounded half result needs half operands and no accumulation");
  if (half) {
#if KILN_WITH_DNNL
    if (const auto mm =
            matmul_for(dtype, ta, tb, m, n, k, lda, ldb, ldc, accumulate, half_result)) {
      static thread_local bool one_thread = false;
      if (!one_thread) {
        run_one_openmp_thread();
        one_thread = true;
      }
      if (!dnnl_matmul(*mm, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate, half_result))
        throw ValueError("[matmul] oneDNN's " + std::string(dtype_name(dtype)) +
                         " matmul failed for " + std::to_string(m) + "x" + std::to_string(k) +
                         " @ " + std::to_string(k) + "x" + std::to_string(n));
      return;
    }
#endif
    // Where oneDNN has no half kernels for this CPU: widen the operands, multiply in float32.
    thread_local std::vector<float> fa, fb, fc;
    widen(dtype, ta, m, k, static_cast<const uint16_t*>(a), lda, fa);
    widen(dtype, tb, k, n, static_cast<const uint16_t*>(b), ldb, fb);
    if (!half_result) {
      cpu_gemm(DType::Float32, false, false, m, n, k, fa.data(), k, fb.data(), n, accumulate, c,
               ldc);
      return;
    }
    fc.resize(static_cast<size_t>(m * n));
    cpu_gemm(DType::Float32, false, false, m, n, k, fa.data(), k, fb.data(), n, false, fc.data(),
             n);
    auto* out = static_cast<uint16_t*>(c);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float v = fc[static_cast<size_t>(i * n + j)];
        out[i * ldc + j] =
            dtype == DType::BFloat16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v);
      }
    return;
  }
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
