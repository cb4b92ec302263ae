// The flash attention kernels' bodies (C++ and CUDA), as custom kernel specs.
//
// Both kernels see, per batch-head n of N: q [N, L, D], k [N, S, D], v [N, S, DV], the
// additive mask [MN, ML, MS] (ML in {1, L}, MS in {1, S}; batch-head n reads mask row
// (n / div) % MN), opts = {causal, div, has_mask, gemm} (int64; gemm: the address of the
// host's tile product, CPU only) and the scale (one element).
//
// On the CPU every tile product (q k^T, p v; in backward also dO v^T, p^T dO, dS^T q and
// dS k) is one call of the GEMM library that kiln's matmuls use (jit/blas.h: oneDNN's sgemm,
// OpenBLAS's dgemm), single-threaded inside a pool task; the JIT code keeps the softmax and
// masking, elementwise over a tile in per-thread scratch.
//
// Forward: out [N, L, DV + 1] holds each row's output and, in its last column, the row's
// log-sum-exp of the scaled, masked scores (one output, so one run makes both: a custom
// kernel node runs the kernel once per output it has). On the CPU a task is one block of
// FA_BR query rows of one batch-head; it walks the keys in blocks of FA_BC with the
// online softmax (running max and sum, rescaling the accumulator when the max grows).
//
// Backward: grads [N, C*L*D + S*D + S*DV] holds C partial dq, then dk and dv of each
// batch-head. A CPU task is one of C chunks of one batch-head's keys: it owns those keys'
// dk and dv rows and its own partial dq, so no two tasks write the same element and no
// atomics are needed. It walks its keys in blocks of FA_BC and, per block, every query
// block that sees them: scores and P = exp(scores - lse) once, dS = P * (dP - delta)
// (delta = rowsum(dO * O), computed outside), then dv, dk and the partial dq accumulate.
// The caller sums the C partials in chunk order (C = 1 unless a few batch-heads would leave
// the pool idle; flash_attention.cpp).
//
// Each element is a sum taken in a fixed order whatever task runs it (the products' sizes
// and the chunking depend on the shapes alone), so the values do not depend on the pool's
// split: the memory planner's reruns are bit-identical.
#include "flash_attention_kernels.h"

#include <cstdint>

#include "../../jit/blas.h"

namespace kiln::nn::detail {
namespace {

// A product in plain loops, for a build without a GEMM library for the dtype (or a library
// call that failed): row i of C takes the k terms in order.
template <typename T>
void loop_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
               const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* ci = c + i * ldc;
    if (!accumulate)
      for (int64_t j = 0; j < n; ++j) ci[j] = 0;
    for (int64_t p = 0; p < k; ++p) {
      const T x = ta ? a[p * lda + i] : a[i * lda + p];
      for (int64_t j = 0; j < n; ++j) ci[j] += x * (tb ? b[j * ldb + p] : b[p * ldb + j]);
    }
  }
}

// The kernels' fa_gemm_fn. Called from JIT code, so nothing may be thrown through it.
void flash_gemm(long long elem_bytes, int ta, int tb, long long m, long long n, long long k,
                const void* a, long long lda, const void* b, long long ldb, int accumulate, void* c,
                long long ldc) noexcept {
  const DType dtype = elem_bytes == 8 ? DType::Float64 : DType::Float32;
  static const bool f32 = jit::cpu_gemm_available(DType::Float32);
  static const bool f64 = jit::cpu_gemm_available(DType::Float64);
  if (m == 0 || n == 0) return;
  if (dtype == DType::Float32 ? f32 : f64) {
    try {
      jit::cpu_gemm(dtype, ta != 0, tb != 0, m, n, k, a, lda, b, ldb, accumulate != 0, c, ldc);
      return;
    } catch (...) {  // the library refused: the loops below give the same product
    }
  }
  if (dtype == DType::Float64)
    loop_gemm(ta, tb, m, n, k, static_cast<const double*>(a), lda, static_cast<const double*>(b),
              ldb, accumulate, static_cast<double*>(c), ldc);
  else
    loop_gemm(ta, tb, m, n, k, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb,
              accumulate, static_cast<float*>(c), ldc);
}

const char* kHeader = R"(
#ifdef __CUDACC__
#define FA_FN __device__ inline
#define FA_R __restrict__
FA_FN float fa_exp(float x) { return expf(x); }
FA_FN double fa_exp(double x) { return exp(x); }
FA_FN float fa_log(float x) { return logf(x); }
FA_FN double fa_log(double x) { return log(x); }
FA_FN float fa_ninf(float) { return __int_as_float(0xff800000); }
FA_FN double fa_ninf(double) { return __longlong_as_double((long long)0xfff0000000000000ULL); }
#else
#define FA_FN static inline
#define FA_R __restrict
// float: a Cephes-style exp (degree-6 polynomial after a two-step ln 2 reduction, within
// 2 ulp) that the vectorizer turns into SIMD code, where libm's expf is a scalar call per
// score. Below -87.3 (e^x under float's normal range; -inf included) it is exactly 0, as
// a masked score must be.
FA_FN float fa_exp(float x) {
  const float big = x > 88.0f ? 88.0f : x;  // arguments here are <= 0 (scores less a maximum)
  const float n = __builtin_floorf(big * 1.44269504088896341f + 0.5f);
  float r = big - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  const float scale = __builtin_bit_cast(float, ((int)n + 127) << 23);
  return x < -87.3365447505531f ? 0.0f : p * scale;
}
FA_FN double fa_exp(double x) { return __builtin_exp(x); }
FA_FN float fa_log(float x) { return __builtin_logf(x); }
FA_FN double fa_log(double x) { return __builtin_log(x); }
FA_FN float fa_ninf(float) { return -__builtin_inff(); }
FA_FN double fa_ninf(double) { return -__builtin_inf(); }
// The CPU bodies' tile products: C = A B (+ C when accumulate), row-major, A [m, k] (stored
// [k, m] when ta), B [k, n] (stored [n, k] when tb), elements of elem_bytes bytes. The host's
// flash_gemm (flash_attention_kernels.cpp), passed by address in opts[3].
typedef void (*fa_gemm_fn)(long long elem_bytes, int ta, int tb, long long m, long long n,
                           long long k, const void* a, long long lda, const void* b,
                           long long ldb, int accumulate, void* c, long long ldc);
#endif
// Tile sizes (CPU): FA_BR query rows by FA_BC keys, large enough that each product is worth a
// library call, small enough that a tile's operands stay in L2. FA_MAX: the CUDA bodies'
// head size.
enum { FA_BR = 64, FA_BC = 128, FA_MAX = 256 };
// The additive mask at (query i, key j) of batch-head n.
template <typename T>
FA_FN T fa_bias(const T* mask, const long long* shape, long long div, long long n, long long i,
                long long j) {
  const long long base = ((n / div) % shape[0]) * shape[1] * shape[2];
  return mask[base + (shape[1] == 1 ? 0 : i) * shape[2] + (shape[2] == 1 ? 0 : j)];
}
// The largest of x[0, n) and `init`, and the sum of x[0, n), each kept in FA_LANES running
// values combined in a fixed order at the end: one running value is a serial chain the
// compiler may not reorder (no fast-math), so it runs one element per add latency; lanes
// vectorize. The order depends on n alone. NaN is never taken as a maximum, as before.
enum { FA_LANES = 16 };
template <typename T>
FA_FN T fa_row_max(const T* FA_R x, long long n, T init) {
  T lane[FA_LANES];
  for (int u = 0; u < FA_LANES; ++u) lane[u] = init;
  long long c = 0;
  for (; c + FA_LANES <= n; c += FA_LANES)
    for (int u = 0; u < FA_LANES; ++u) lane[u] = x[c + u] > lane[u] ? x[c + u] : lane[u];
  for (; c < n; ++c) lane[0] = x[c] > lane[0] ? x[c] : lane[0];
  T m = lane[0];
  for (int u = 1; u < FA_LANES; ++u) m = lane[u] > m ? lane[u] : m;
  return m;
}
template <typename T>
FA_FN T fa_row_sum(const T* FA_R x, long long n) {
  T lane[FA_LANES];
  for (int u = 0; u < FA_LANES; ++u) lane[u] = 0;
  long long c = 0;
  for (; c + FA_LANES <= n; c += FA_LANES)
    for (int u = 0; u < FA_LANES; ++u) lane[u] += x[c + u];
  for (; c < n; ++c) lane[0] += x[c];
  T sum = lane[0];
  for (int u = 1; u < FA_LANES; ++u) sum += lane[u];
  return sum;
}
// One row of scores made final in place: scaled, the mask's row added, keys after query i
// set to -inf when causal. Separate contiguous loops, so each vectorizes.
template <typename T>
FA_FN void fa_finish_scores(T* FA_R sr, long long nc, T sc, const T* FA_R mask,
                            const long long* shape, long long div, long long n, long long i,
                            long long j0, bool has_mask, bool causal) {
  for (long long c = 0; c < nc; ++c) sr[c] *= sc;
  if (has_mask) {
    const T* row = mask + ((n / div) % shape[0]) * shape[1] * shape[2] +
                   (shape[1] == 1 ? 0 : i) * shape[2];
    if (shape[2] == 1) {
      for (long long c = 0; c < nc; ++c) sr[c] += row[0];
    } else {
      for (long long c = 0; c < nc; ++c) sr[c] += row[j0 + c];
    }
  }
  if (causal)
    for (long long c = i - j0 + 1 > 0 ? i - j0 + 1 : 0; c < nc; ++c) sr[c] = fa_ninf(T(0));
}
)";

const char* kForwardCpu = R"(
typedef decltype(q[0] + q[0]) T;
const long long L = q_shape[1], D = q_shape[2], S = k_shape[1], DV = v_shape[2];
const long long RB = (L + FA_BR - 1) / FA_BR;
const bool causal = opts[0] != 0, has_mask = opts[2] != 0;
const long long div = opts[1];
const fa_gemm_fn gemm = (fa_gemm_fn)opts[3];
const T sc = scale[0], ninf = fa_ninf(T(0));
T* acc = (T*)__builtin_alloca(sizeof(T) * FA_BR * DV);
alignas(64) T s[FA_BR * FA_BC];
T m[FA_BR], l[FA_BR];
for (long long task = kiln_task_begin; task < kiln_task_end; ++task) {
  const long long n = task / RB, i0 = (task % RB) * FA_BR;
  const long long nr = L - i0 < FA_BR ? L - i0 : FA_BR;
  const T* qn = q + n * L * D;
  const T* kn = k + n * S * D;
  const T* vn = v + n * S * DV;
  for (long long r = 0; r < nr; ++r) m[r] = ninf, l[r] = 0;
  for (long long x = 0; x < nr * DV; ++x) acc[x] = 0;
  // Causal rows i0.. see keys j <= i only: later key blocks are skipped whole.
  const long long send = causal ? (i0 + nr < S ? i0 + nr : S) : S;
  for (long long j0 = 0; j0 < send; j0 += FA_BC) {
    const long long nc = send - j0 < FA_BC ? send - j0 : FA_BC;
    gemm(sizeof(T), 0, 1, nr, nc, D, qn + i0 * D, D, kn + j0 * D, D, 0, s, FA_BC);
    for (long long r = 0; r < nr; ++r) {
      const long long i = i0 + r;
      T* sr = s + r * FA_BC;
      fa_finish_scores(sr, nc, sc, mask, mask_shape, div, n, i, j0, has_mask, causal);
      const T mx = fa_row_max(sr, nc, m[r]);
      if (mx == ninf) {  // nothing visible yet: this block adds nothing
        for (long long c = 0; c < nc; ++c) sr[c] = 0;
        continue;
      }
      const T alpha = fa_exp(m[r] - mx);
      for (long long c = 0; c < nc; ++c) sr[c] = fa_exp(sr[c] - mx);
      l[r] = l[r] * alpha + fa_row_sum(sr, nc);
      m[r] = mx;
      T* ar = acc + r * DV;
      for (long long e = 0; e < DV; ++e) ar[e] *= alpha;
    }
    // acc += P V over this block's keys.
    gemm(sizeof(T), 0, 0, nr, DV, nc, s, FA_BC, vn + j0 * DV, DV, 1, acc, DV);
  }
  // A row with nothing visible has l = 0: its output is 0/0 = NaN, as the composed path's.
  for (long long r = 0; r < nr; ++r) {
    T* o = out + (n * L + i0 + r) * (DV + 1);
    for (long long e = 0; e < DV; ++e) o[e] = acc[r * DV + e] / l[r];
    o[DV] = m[r] + fa_log(l[r]);
  }
}
)";

const char* kBackwardCpu = R"(
typedef decltype(q[0] + q[0]) T;
const long long L = q_shape[1], D = q_shape[2], S = k_shape[1], DV = v_shape[2];
const long long C = L * D > 0 ? (grads_shape[1] - S * (D + DV)) / (L * D) : 1;
const long long SC = (S + C - 1) / C;  // keys per chunk
const long long G = C * L * D + S * D + S * DV;
const bool causal = opts[0] != 0, has_mask = opts[2] != 0;
const long long div = opts[1];
const fa_gemm_fn gemm = (fa_gemm_fn)opts[3];
const T sc = scale[0];
alignas(64) T s[FA_BR * FA_BC];
alignas(64) T dp[FA_BR * FA_BC];
for (long long task = kiln_task_begin; task < kiln_task_end; ++task) {
  const long long n = task / C, chunk = task % C;
  const T* qn = q + n * L * D;
  const T* kn = k + n * S * D;
  const T* vn = v + n * S * DV;
  const T* gn = dout + n * L * DV;
  const T* fn = fwd + n * L * (DV + 1);
  const T* dn = delta + n * L;
  T* dq = grads + n * G + chunk * L * D;  // this chunk's part of dq
  T* dk = grads + n * G + C * L * D;
  T* dv = dk + S * D;
  const long long k0 = chunk * SC, k1 = k0 + SC < S ? k0 + SC : S;
  for (long long x = 0; x < L * D; ++x) dq[x] = 0;
  for (long long j0 = k0; j0 < k1; j0 += FA_BC) {
    const long long nc = k1 - j0 < FA_BC ? k1 - j0 : FA_BC;
    T* dkj = dk + j0 * D;
    T* dvj = dv + j0 * DV;
    for (long long x = 0; x < nc * D; ++x) dkj[x] = 0;
    for (long long x = 0; x < nc * DV; ++x) dvj[x] = 0;
    // Causal: rows i < j0 see none of these keys.
    for (long long i0 = causal ? j0 : 0; i0 < L; i0 += FA_BR) {
      const long long nr = L - i0 < FA_BR ? L - i0 : FA_BR;
      gemm(sizeof(T), 0, 1, nr, nc, D, qn + i0 * D, D, kn + j0 * D, D, 0, s, FA_BC);
      gemm(sizeof(T), 0, 1, nr, nc, DV, gn + i0 * DV, DV, vn + j0 * DV, DV, 0, dp, FA_BC);
      for (long long r = 0; r < nr; ++r) {
        const long long i = i0 + r;
        const T lse = fn[i * (DV + 1) + DV], di = dn[i];
        T* sr = s + r * FA_BC;
        T* dpr = dp + r * FA_BC;
        fa_finish_scores(sr, nc, sc, mask, mask_shape, div, n, i, j0, has_mask, causal);
        for (long long c = 0; c < nc; ++c) {
          sr[c] = fa_exp(sr[c] - lse);
          dpr[c] = sr[c] * (dpr[c] - di);
        }
      }
      // dv += P^T dO, dk += dS^T Q, dq += dS K (dS = P * (dP - delta)); scale after.
      gemm(sizeof(T), 1, 0, nc, DV, nr, s, FA_BC, gn + i0 * DV, DV, 1, dvj, DV);
      gemm(sizeof(T), 1, 0, nc, D, nr, dp, FA_BC, qn + i0 * D, D, 1, dkj, D);
      gemm(sizeof(T), 0, 0, nr, D, nc, dp, FA_BC, kn + j0 * D, D, 1, dq + i0 * D, D);
    }
    for (long long x = 0; x < nc * D; ++x) dkj[x] *= sc;
  }
  for (long long x = 0; x < L * D; ++x) dq[x] *= sc;
}
)";

// CUDA: one thread per query row (forward, dq) or key row (dk, dv), streaming over the
// other side with the same online softmax; accumulators live in FA_MAX-wide local arrays
// (the op checks D, DV <= FA_MAX for CUDA calls).
const char* kForwardCuda = R"(
typedef decltype(q[0] + q[0]) T;
const long long N = q_shape[0], L = q_shape[1], D = q_shape[2], S = k_shape[1], DV = v_shape[2];
const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
if (t >= N * L) return;
const long long n = t / L, i = t % L;
const bool causal = opts[0] != 0, has_mask = opts[2] != 0;
const T sc = scale[0], ninf = fa_ninf(T(0));
const T* qi = q + t * D;
T acc[FA_MAX];
for (long long e = 0; e < DV; ++e) acc[e] = 0;
T m = ninf, l = 0;
const long long send = causal ? (i + 1 < S ? i + 1 : S) : S;
for (long long j = 0; j < send; ++j) {
  const T* kj = k + (n * S + j) * D;
  T x = 0;
  for (long long d = 0; d < D; ++d) x += qi[d] * kj[d];
  x *= sc;
  if (has_mask) x += fa_bias(mask, mask_shape, opts[1], n, i, j);
  if (x == ninf) continue;
  if (x > m) {
    const T alpha = fa_exp(m - x);
    l *= alpha;
    for (long long e = 0; e < DV; ++e) acc[e] *= alpha;
    m = x;
  }
  const T p = fa_exp(x - m);
  l += p;
  const T* vj = v + (n * S + j) * DV;
  for (long long e = 0; e < DV; ++e) acc[e] += p * vj[e];
}
T* o = out + t * (DV + 1);
for (long long e = 0; e < DV; ++e) o[e] = acc[e] / l;
o[DV] = m + fa_log(l);
)";

const char* kBackwardCuda = R"(
typedef decltype(q[0] + q[0]) T;
const long long N = q_shape[0], L = q_shape[1], D = q_shape[2], S = k_shape[1], DV = v_shape[2];
const long long G = L * D + S * D + S * DV;
const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
if (t >= N * (L + S)) return;
const bool causal = opts[0] != 0, has_mask = opts[2] != 0;
const T sc = scale[0], ninf = fa_ninf(T(0));
T a[FA_MAX], b[FA_MAX];
if (t < N * L) {  // dq of one query row
  const long long n = t / L, i = t % L;
  const T* qi = q + t * D;
  const T* gi = dout + t * DV;
  const T lse = fwd[t * (DV + 1) + DV], di = delta[t];
  for (long long d = 0; d < D; ++d) a[d] = 0;
  const long long send = causal ? (i + 1 < S ? i + 1 : S) : S;
  for (long long j = 0; j < send; ++j) {
    const T* kj = k + (n * S + j) * D;
    const T* vj = v + (n * S + j) * DV;
    T x = 0, dpv = 0;
    for (long long d = 0; d < D; ++d) x += qi[d] * kj[d];
    for (long long e = 0; e < DV; ++e) dpv += gi[e] * vj[e];
    x *= sc;
    if (has_mask) x += fa_bias(mask, mask_shape, opts[1], n, i, j);
    const T ds = fa_exp(x - lse) * (dpv - di);
    for (long long d = 0; d < D; ++d) a[d] += ds * kj[d];
  }
  for (long long d = 0; d < D; ++d) grads[n * G + i * D + d] = a[d] * sc;
} else {  // dk and dv of one key row
  const long long u = t - N * L, n = u / S, j = u % S;
  const T* kj = k + u * D;
  const T* vj = v + u * DV;
  for (long long d = 0; d < D; ++d) a[d] = 0;
  for (long long e = 0; e < DV; ++e) b[e] = 0;
  for (long long i = causal ? j : 0; i < L; ++i) {
    const T* qi = q + (n * L + i) * D;
    const T* gi = dout + (n * L + i) * DV;
    T x = 0, dpv = 0;
    for (long long d = 0; d < D; ++d) x += qi[d] * kj[d];
    for (long long e = 0; e < DV; ++e) dpv += gi[e] * vj[e];
    x *= sc;
    if (has_mask) x += fa_bias(mask, mask_shape, opts[1], n, i, j);
    const T p = fa_exp(x - fwd[(n * L + i) * (DV + 1) + DV]);
    const T ds = p * (dpv - delta[n * L + i]);
    for (long long e = 0; e < DV; ++e) b[e] += p * gi[e];
    for (long long d = 0; d < D; ++d) a[d] += ds * qi[d];
  }
  for (long long d = 0; d < D; ++d) grads[n * G + L * D + j * D + d] = a[d] * sc;
  for (long long e = 0; e < DV; ++e) grads[n * G + L * D + S * D + j * DV + e] = b[e];
}
)";

}  // namespace

int64_t flash_gemm_address() {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(&flash_gemm));
}

CustomKernelSpec flash_forward_spec() {
  CustomKernelSpec s;
  s.name = "flash_attention_forward";
  s.inputs = {"q", "k", "v", "mask", "opts", "scale"};
  s.outputs = {"out"};
  s.header = kHeader;
  s.cpu_source = kForwardCpu;
  s.cpu_tasks = "q_shape[0] * ((q_shape[1] + FA_BR - 1) / FA_BR)";
  s.cuda_source = kForwardCuda;
  s.cuda_block = 128;
  return s;
}

CustomKernelSpec flash_backward_spec() {
  CustomKernelSpec s;
  s.name = "flash_attention_backward";
  s.inputs = {"q", "k", "v", "mask", "opts", "scale", "fwd", "dout", "delta"};
  s.outputs = {"grads"};
  s.header = kHeader;
  s.cpu_source = kBackwardCpu;
  // One task per chunk of keys of each batch-head; the chunk count C is what the caller sized
  // grads for (C partial dq ahead of dk and dv).
  s.cpu_tasks =
      "q_shape[0] * (q_shape[1] * q_shape[2] > 0 ? (grads_shape[1] - k_shape[1] * "
      "(q_shape[2] + v_shape[2])) / (q_shape[1] * q_shape[2]) : 1)";
  s.cuda_source = kBackwardCuda;
  s.cuda_block = 128;
  return s;
}

}  // namespace kiln::nn::detail
