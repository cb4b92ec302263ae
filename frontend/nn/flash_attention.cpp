// flash_attention (flash_attention.h): the op around the two custom kernels. It validates
// as scaled_dot_product_attention does, flattens the leading dims into one batch-head
// axis N, reduces the mask to the [MN, ML, MS] form the kernels index (never broadcast
// to [N, L, S] where a row of batch-heads shares it), and records the backward kernel as
// the forward kernel's gradient.
#include "flash_attention.h"

#include <algorithm>
#include <cmath>

#include "../../memory/pools/budget.h"
#include "../../ops/elementwise.h"
#include "../../ops/reduce_ops.h"
#include "../../ops/reindex.h"
#include "../../ops/shape_ops.h"
#include "../../ops/sources.h"
#include "../custom_kernel.h"
#include "detail.h"
#include "flash_attention_kernels.h"

namespace kiln::nn {
namespace {

thread_local SDPBackend t_backend = SDPBackend::Auto;

// The CUDA bodies keep a row's accumulators in local arrays of this many elements
// (FA_MAX in flash_attention_kernels.cpp).
constexpr int64_t kCudaMaxHead = 256;

// Auto's rule without a budget: flash once the probabilities one call would keep for
// backward (batch x heads x L x S elements) reach 256 MiB. On the CPU both paths' products
// run on the same GEMM library; a flash training step costs about the composed one's from
// L = S = 512 up and more below (up to ~1.5x at 128: its backward recomputes the scores,
// and its tile products are smaller; docs/benchmarks.md, "Attention"), so it is taken by
// itself only where the composed path's memory, growing as L * S, is the larger danger;
// under a budget it is taken always (the planner would otherwise rebuild O(L * S) values).
constexpr int64_t kFlashWithoutBudgetBytes = int64_t{256} << 20;

// Backward tasks the CPU split aims for: a batch-head's keys are cut into chunks (each at
// least kFlashMinChunkKeys) until the batch-heads times the chunks reach this, so a few
// batch-heads of long sequences still fill the pool. Each chunk adds a partial dq (L x E
// more kept values, summed in chunk order); shapes alone decide the split, so the bits do
// not depend on the thread count.
constexpr int64_t kBackwardTasks = 32;

// Gradient of the packed forward output: the backward kernel, then dq, dk, dv cut out of
// its packed result. The log-sum-exp column never reaches a user, so its gradient is 0.
std::vector<Tensor> flash_grad(const std::vector<Tensor>& in, const std::vector<Tensor>& outs,
                               const std::vector<Tensor>& grad_outs);

const CustomKernel& forward_kernel() {
  static const CustomKernel k(detail::flash_forward_spec(), flash_grad);
  return k;
}

const CustomKernel& backward_kernel() {
  // A second backward would differentiate through this kernel: say so when it is built.
  static const CustomKernel k(
      detail::flash_backward_spec(),
      [](const std::vector<Tensor>&, const std::vector<Tensor>&,
         const std::vector<Tensor>&) -> std::vector<Tensor> {
        throw ValueError(
            "[flash_attention] is differentiable once: its backward kernel has no gradient "
            "(for a double backward use SDPBackend::Math, e.g. SDPBackendGuard)");
      });
  return k;
}

std::vector<Tensor> flash_grad(const std::vector<Tensor>& in, const std::vector<Tensor>& outs,
                               const std::vector<Tensor>& grad_outs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const int64_t n = q.size(0), l = q.size(1), d = q.size(2), s = k.size(1), dv = v.size(2);
  const Tensor& out = outs[0];
  Tensor o = slice(out, 2, 0, dv);
  Tensor dout = slice(grad_outs[0], 2, 0, dv);
  Tensor delta = sum(dout * o, {2});
  const int64_t chunks =
      q.device().is_cuda()
          ? 1
          : std::clamp<int64_t>((kBackwardTasks + n - 1) / n, 1,
                                (s + detail::kFlashMinChunkKeys - 1) / detail::kFlashMinChunkKeys);
  const int64_t dqs = chunks * l * d, g = dqs + s * d + s * dv;
  Tensor grads =
      backward_kernel()({q, k, v, in[3], in[4], in[5], out, dout, delta}, {{{n, g}, q.dtype()}})[0];
  Tensor dq = chunks == 1 ? reshape(slice(grads, 1, 0, dqs), {n, l, d})
                          : sum(reshape(slice(grads, 1, 0, dqs), {n, chunks, l, d}), {1});
  Tensor dk = reshape(slice(grads, 1, dqs, dqs + s * d), {n, s, d});
  Tensor dvv = reshape(slice(grads, 1, dqs + s * d, g), {n, s, dv});
  return {dq, dk, dvv, Tensor(), Tensor(), Tensor()};
}

// The mask as the kernels read it: [MN, ML, MS] in `dtype` plus the divisor `div`, so that
// batch-head n (of the leading dims `lead`, flattened) reads row (n / div) % MN. A mask
// whose leading dims are 1 except for one contiguous run that matches `lead` needs no
// copy; any other broadcast is expanded over the leading dims only.
Tensor kernel_mask(const Tensor& mask, const Shape& lead, DType dtype, int64_t* div) {
  Tensor m = mask.dtype() == DType::Bool ? where(mask, full({}, 0.0, dtype, mask.device()),
                                                 full({}, -INFINITY, dtype, mask.device()))
                                         : cast(mask, dtype);
  const int r = static_cast<int>(lead.size()) + 2;
  Shape ms = m.shape();
  while (static_cast<int>(ms.size()) < r) ms.insert(ms.begin(), 1);
  m = reshape(m, ms);
  const int64_t ml = ms[r - 2], mss = ms[r - 1];
  int first = -1, last = -1;
  for (int i = 0; i < r - 2; ++i)
    if (ms[i] != 1) {
      if (first < 0) first = i;
      last = i;
    }
  bool run = true;
  for (int i = first; first >= 0 && i <= last; ++i) run = run && ms[i] == lead[i];
  if (!run) {
    Shape full_shape = lead;
    full_shape.push_back(ml);
    full_shape.push_back(mss);
    m = broadcast_to(m, full_shape);
    first = 0, last = r - 3;
  }
  int64_t rows = 1;
  *div = 1;
  for (int i = 0; i < r - 2; ++i) {
    if (first >= 0 && i >= first && i <= last) rows *= lead[i];
    if (first >= 0 && i > last) *div *= lead[i];
  }
  return reshape(m, {rows, ml, mss});
}

}  // namespace

SDPBackend sdp_backend() { return t_backend; }

SDPBackend set_sdp_backend(SDPBackend backend) {
  SDPBackend previous = t_backend;
  t_backend = backend;
  return previous;
}

bool flash_attention_preferred(const Tensor& q, const Tensor& k, const Tensor& v) {
  // The CUDA bodies are compiled but unmeasured: Auto keeps CUDA on the composed path.
  if (q.device().is_cuda()) return false;
  if (memory::budget(q.device()) > 0) return true;
  const bool training =
      grad_mode_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const int64_t rows = q.numel() / q.size(-1);  // batch x heads x L
  const int64_t kept = rows * k.size(-2) * static_cast<int64_t>(itemsize(q.dtype()));
  return training && kept >= kFlashWithoutBudgetBytes;
}

namespace functional {

Tensor flash_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                       const Tensor& attn_mask, bool is_causal, std::optional<double> scale) {
  const char* op = "flash_attention";
  detail::require_attention_operands(q_in, k_in, v_in, op);
  const Shape lead(q_in.shape().begin(), q_in.shape().end() - 2);
  const int64_t l = q_in.size(-2), s = k_in.size(-2), e = q_in.size(-1), ev = v_in.size(-1);
  if (q_in.device().is_cuda() && (e > kCudaMaxHead || ev > kCudaMaxHead)) {
    throw ShapeError("[flash_attention] on CUDA head sizes up to " + std::to_string(kCudaMaxHead) +
                     " are supported, got query " + detail::describe(q_in) + " and value " +
                     detail::describe(v_in));
  }
  const bool has_mask = attn_mask.defined();
  if (has_mask) {
    Shape scores = lead;
    scores.push_back(l);
    scores.push_back(s);
    broadcast_shapes(op, attn_mask.shape(), scores);
    if (attn_mask.ndim() > q_in.ndim()) {
      throw ShapeError(
          "[flash_attention] expected attn_mask of rank <= the query's (it must "
          "broadcast to [..., L, S] = " +
          shape_str(scores) + "), got " + detail::describe(attn_mask));
    }
    if (attn_mask.dtype() != DType::Bool)
      detail::require_same_dtype(q_in, attn_mask, op, "attn_mask");
    if (attn_mask.requires_grad() && grad_mode_enabled()) {
      throw ValueError("[flash_attention] gives no gradient to attn_mask, which requires one (" +
                       detail::describe(attn_mask) + "); detach it or use SDPBackend::Math");
    }
  }
  // Half types run in float32 and return their own dtype, as autocast's softmax.
  const DType dtype = q_in.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  int64_t n = 1;
  for (int64_t x : lead) n *= x;
  auto flat = [&](const Tensor& t, int64_t rows) {
    return reshape(t.dtype() == dtype ? t : cast(t, dtype), {n, rows, t.size(-1)});
  };
  Tensor q = flat(q_in, l), k = flat(k_in, s), v = flat(v_in, s);
  int64_t div = 1;
  Tensor mask = has_mask ? kernel_mask(attn_mask.detach(), lead, dtype, &div)
                         : zeros({1, 1, 1}, dtype, q_in.device());
  Tensor opts = from_vector<int64_t>(
      {is_causal ? 1 : 0, div, has_mask ? 1 : 0, detail::flash_gemm_address()}, {4}, q_in.device());
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(e)));
  Tensor sct = full({1}, sc, dtype, q_in.device());
  Tensor out = forward_kernel()({q, k, v, mask, opts, sct}, {{{n, l, ev + 1}, dtype}})[0];
  Shape shape = lead;
  shape.push_back(l);
  shape.push_back(ev);
  Tensor o = reshape(slice(out, 2, 0, ev), shape);
  return o.dtype() == q_in.dtype() ? o : cast(o, q_in.dtype());
}

}  // namespace functional
}  // namespace kiln::nn
