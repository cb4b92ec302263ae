// The flash attention kernels' bodies (C++ and CUDA), as custom kernel specs.
//
// Both kernels see, per batch-head n of N: q [N, L, D], k [N, S, D], v [N, S, DV], the
// additive mask [MN, ML, MS] (ML in {1, L}, MS in {1, S}; batch-head n reads mask row
// (n / div) % MN), opts = {causal, div, has_mask} (int64) and the scale (one element).
//
// Forward: out [N, L, DV + 1] holds each row's output and, in its last column, the row's
// log-sum-exp of the scaled, masked scores (one output, so one run makes both: a custom
// kernel node runs the kernel once per output it has). On the CPU a task is one block of
// FA_BR query rows of one batch-head; it walks the keys in blocks of FA_BC with the
// online softmax (running max and sum, rescaling the accumulator when the max grows).
//
// Backward: grads [N, L*D + S*D + S*DV] holds dq, dk and dv of each batch-head. CPU tasks
// are of two kinds, so no two tasks write the same element and no atomics are needed:
// blocks of query rows (dq: every key, recomputing P = exp(scores - lse)) and blocks of
// keys (dk, dv: every query row). Scores are recomputed twice, the price of a
// deterministic split. ds = P * (dP - delta), with delta = rowsum(dO * O) computed outside.
//
// Each element is a sum taken in a fixed order whatever task runs it, so the values do not
// depend on the pool's split: the memory planner's reruns are bit-identical.
#include "flash_attention_kernels.h"

namespace kiln::nn::detail {
namespace {

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
#endif
// Tile sizes (CPU): FA_BR query rows by FA_BC keys. FA_MAX: the CUDA bodies' head size.
enum { FA_BR = 32, FA_BC = 64, FA_MAX = 256 };
// The additive mask at (query i, key j) of batch-head n.
template <typename T>
FA_FN T fa_bias(const T* mask, const long long* shape, long long div, long long n, long long i,
                long long j) {
  const long long base = ((n / div) % shape[0]) * shape[1] * shape[2];
  return mask[base + (shape[1] == 1 ? 0 : i) * shape[2] + (shape[2] == 1 ? 0 : j)];
}
// A [rows, width] block of `src` (row stride `width`) from row `from`, transposed into
// dst [width][FA_BC] and padded with zeros to FA_BC columns: the dot products below then
// run over a contiguous FA_BC-wide row, which vectorizes without reassociation.
template <typename T>
FA_FN void fa_transpose(T* FA_R dst, const T* FA_R src, long long from, long long rows, long long width) {
  for (long long d = 0; d < width; ++d) {
    for (long long c = 0; c < rows; ++c) dst[d * FA_BC + c] = src[(from + c) * width + d];
    for (long long c = rows; c < FA_BC; ++c) dst[d * FA_BC + c] = 0;
  }
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
// out[r][c] = sum_d a[r][d] * bt[d][c] for r < rows, c < FA_BC (a's rows `width` apart):
// four rows at a time share each load of bt and keep their sums in registers. Each sum
// runs over d in order, whatever the grouping.
template <typename T>
FA_FN void fa_dots(T* FA_R out, const T* FA_R a, long long rows, const T* FA_R bt,
                   long long width) {
  long long r = 0;
  for (; r + 4 <= rows; r += 4) {
    T acc[4][FA_BC];
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < FA_BC; ++c) acc[x][c] = 0;
    const T* a0 = a + r * width;
    for (long long d = 0; d < width; ++d) {
      const T* b = bt + d * FA_BC;
      const T x0 = a0[d], x1 = a0[width + d], x2 = a0[2 * width + d], x3 = a0[3 * width + d];
      for (int c = 0; c < FA_BC; ++c) {
        const T bc = b[c];
        acc[0][c] += x0 * bc;
        acc[1][c] += x1 * bc;
        acc[2][c] += x2 * bc;
        acc[3][c] += x3 * bc;
      }
    }
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < FA_BC; ++c) out[(r + x) * FA_BC + c] = acc[x][c];
  }
  for (; r < rows; ++r) {
    T acc[FA_BC];
    for (int c = 0; c < FA_BC; ++c) acc[c] = 0;
    for (long long d = 0; d < width; ++d) {
      const T x = a[r * width + d];
      const T* b = bt + d * FA_BC;
      for (int c = 0; c < FA_BC; ++c) acc[c] += x * b[c];
    }
    for (int c = 0; c < FA_BC; ++c) out[r * FA_BC + c] = acc[c];
  }
}
)";

const char* kForwardCpu = R"(
typedef decltype(q[0] + q[0]) T;
const long long L = q_shape[1], D = q_shape[2], S = k_shape[1], DV = v_shape[2];
const long long RB = (L + FA_BR - 1) / FA_BR;
const bool causal = opts[0] != 0, has_mask = opts[2] != 0;
const long long div = opts[1];
const T sc = scale[0], ninf = fa_ninf(T(0));
T* kt = (T*)__builtin_alloca(sizeof(T) * (D * FA_BC + FA_BR * DV));
T* acc = kt + D * FA_BC;
T s[FA_BR * FA_BC], m[FA_BR], l[FA_BR];
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
    fa_transpose(kt, kn, j0, nc, D);
    fa_dots(s, qn + i0 * D, nr, kt, D);
    for (long long r = 0; r < nr; ++r) {
      const long long i = i0 + r;
      T* sr = s + r * FA_BC;
      fa_finish_scores(sr, nc, sc, mask, mask_shape, div, n, i, j0, has_mask, causal);
      T mx = m[r];
      for (long long c = 0; c < nc; ++c) mx = sr[c] > mx ? sr[c] : mx;
      if (mx == ninf) continue;  // nothing visible yet: this block adds nothing
      const T alpha = fa_exp(m[r] - mx);
      for (long long c = 0; c < nc; ++c) sr[c] = fa_exp(sr[c] - mx);
      T rs = 0;
      for (long long c = 0; c < nc; ++c) rs += sr[c];
      l[r] = l[r] * alpha + rs;
      m[r] = mx;
      T* ar = acc + r * DV;
      for (long long e = 0; e < DV; ++e) ar[e] *= alpha;
      for (long long c = 0; c < nc; ++c) {
        const T p = sr[c];
        const T* vj = vn + (j0 + c) * DV;
        for (long long e = 0; e < DV; ++e) ar[e] += p * vj[e];
      }
    }
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
const long long RB = (L + FA_BR - 1) / FA_BR, CB = (S + FA_BC - 1) / FA_BC;
const long long G = L * D + S * D + S * DV;
const bool causal = opts[0] != 0, has_mask = opts[2] != 0;
const long long div = opts[1];
const T sc = scale[0];
T* kt = (T*)__builtin_alloca(sizeof(T) * (FA_BC * (D + DV + D + DV) + FA_BR * D));
T* vt = kt + D * FA_BC;
T* dka = vt + DV * FA_BC;
T* dva = dka + FA_BC * D;
T* dqa = dva + FA_BC * DV;
T s[FA_BR * FA_BC], dp[FA_BR * FA_BC];
for (long long task = kiln_task_begin; task < kiln_task_end; ++task) {
  const long long n = task / (RB + CB), b = task % (RB + CB);
  const T* qn = q + n * L * D;
  const T* kn = k + n * S * D;
  const T* vn = v + n * S * DV;
  const T* gn = dout + n * L * DV;
  const T* fn = fwd + n * L * (DV + 1);
  const T* dn = delta + n * L;
  T* dq = grads + n * G;
  T* dk = dq + L * D;
  T* dv = dk + S * D;
  if (b < RB) {  // dq of query rows [i0, i0 + nr)
    const long long i0 = b * FA_BR, nr = L - i0 < FA_BR ? L - i0 : FA_BR;
    for (long long x = 0; x < nr * D; ++x) dqa[x] = 0;
    const long long send = causal ? (i0 + nr < S ? i0 + nr : S) : S;
    for (long long j0 = 0; j0 < send; j0 += FA_BC) {
      const long long nc = send - j0 < FA_BC ? send - j0 : FA_BC;
      fa_transpose(kt, kn, j0, nc, D);
      fa_transpose(vt, vn, j0, nc, DV);
      fa_dots(s, qn + i0 * D, nr, kt, D);
      fa_dots(dp, gn + i0 * DV, nr, vt, DV);
      for (long long r = 0; r < nr; ++r) {
        const long long i = i0 + r;
        const T lse = fn[i * (DV + 1) + DV], di = dn[i];
        T* qa = dqa + r * D;
        T* sr = s + r * FA_BC;
        const T* dpr = dp + r * FA_BC;
        fa_finish_scores(sr, nc, sc, mask, mask_shape, div, n, i, j0, has_mask, causal);
        for (long long c = 0; c < nc; ++c) sr[c] = fa_exp(sr[c] - lse) * (dpr[c] - di);
        for (long long c = 0; c < nc; ++c) {
          const T ds = sr[c];
          const T* kj = kn + (j0 + c) * D;
          for (long long d = 0; d < D; ++d) qa[d] += ds * kj[d];
        }
      }
    }
    for (long long r = 0; r < nr; ++r)
      for (long long d = 0; d < D; ++d) dq[(i0 + r) * D + d] = dqa[r * D + d] * sc;
  } else {  // dk and dv of keys [j0, j0 + nc)
    const long long j0 = (b - RB) * FA_BC, nc = S - j0 < FA_BC ? S - j0 : FA_BC;
    fa_transpose(kt, kn, j0, nc, D);
    fa_transpose(vt, vn, j0, nc, DV);
    for (long long x = 0; x < nc * D; ++x) dka[x] = 0;
    for (long long x = 0; x < nc * DV; ++x) dva[x] = 0;
    // Causal: rows i < j0 see none of these keys.
    for (long long i0 = causal ? j0 : 0; i0 < L; i0 += FA_BR) {
     const long long nr = L - i0 < FA_BR ? L - i0 : FA_BR;
     fa_dots(s, qn + i0 * D, nr, kt, D);
     fa_dots(dp, gn + i0 * DV, nr, vt, DV);
     for (long long r = 0; r < nr; ++r) {
      const long long i = i0 + r;
      const T lse = fn[i * (DV + 1) + DV], di = dn[i];
      const T* qi = qn + i * D;
      const T* gi = gn + i * DV;
      T* sr = s + r * FA_BC;
      T* dpr = dp + r * FA_BC;
      fa_finish_scores(sr, nc, sc, mask, mask_shape, div, n, i, j0, has_mask, causal);
      for (long long c = 0; c < nc; ++c) {
        sr[c] = fa_exp(sr[c] - lse);
        dpr[c] = sr[c] * (dpr[c] - di);
      }
      for (long long c = 0; c < nc; ++c) {
        const T p = sr[c], ds = dpr[c];
        T* va = dva + c * DV;
        T* ka = dka + c * D;
        for (long long e = 0; e < DV; ++e) va[e] += p * gi[e];
        for (long long d = 0; d < D; ++d) ka[d] += ds * qi[d];
      }
     }
    }
    for (long long c = 0; c < nc; ++c) {
      for (long long d = 0; d < D; ++d) dk[(j0 + c) * D + d] = dka[c * D + d] * sc;
      for (long long e = 0; e < DV; ++e) dv[(j0 + c) * DV + e] = dva[c * DV + e];
    }
  }
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
  s.cpu_tasks =
      "q_shape[0] * ((q_shape[1] + FA_BR - 1) / FA_BR + (k_shape[1] + FA_BC - 1) / FA_BC)";
  s.cuda_source = kBackwardCuda;
  s.cuda_block = 128;
  return s;
}

}  // namespace kiln::nn::detail
