#include "executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "../core/structural_hash.h"
#include "../core/tensor.h"
#include "../core/thread_pool.h"
#include "../ops/transfer.h"
#include "compiler.h"
#include "cuda_launch.h"
#include "fuse.h"
#include "kernel_cache.h"
#include "kernel_ir.h"
#include "nvrtc_check.h"
#include "printer_cpp.h"
#include "simplify.h"
#include "step_memory.h"

namespace kiln::jit {
namespace {

using KernelFn = void (*)(char**, const int64_t*, int64_t, int64_t, int64_t);

std::mutex g_stats_mutex;
EvalStats g_last_stats;

// Elements per chunk: enough work to amortise a thread hand-off.
constexpr int64_t kGrain = 1 << 14;

template <typename Acc>
Acc identity_of(ReduceOp op, DType dtype) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Or:
      return 0;
    case ReduceOp::Prod:
    case ReduceOp::And:
      return 1;
    default:
      break;
  }
  bool want_max = op == ReduceOp::Min;
  if constexpr (std::is_floating_point_v<Acc>) {
    return want_max ? INFINITY : -INFINITY;
  } else {
    return visit_dtype(dtype, [&](auto tag) -> Acc {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>)
        return want_max ? static_cast<Acc>(std::numeric_limits<T>::max())
                        : static_cast<Acc>(std::numeric_limits<T>::lowest());
      return 0;
    });
  }
}

template <typename Acc>
Acc combine(ReduceOp op, Acc a, Acc b) {
  switch (op) {
    case ReduceOp::Sum:
      if constexpr (std::is_integral_v<Acc>)
        return static_cast<Acc>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      else
        return a + b;
    case ReduceOp::Prod:
      if constexpr (std::is_integral_v<Acc>)
        return static_cast<Acc>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      else
        return a * b;
    case ReduceOp::Max:
      if constexpr (std::is_floating_point_v<Acc>)
        if (std::isnan(a) || std::isnan(b)) return a + b;
      return a > b ? a : b;
    case ReduceOp::Min:
      if constexpr (std::is_floating_point_v<Acc>)
        if (std::isnan(a) || std::isnan(b)) return a + b;
      return a < b ? a : b;
    case ReduceOp::And:
      return (a != 0) && (b != 0);
    case ReduceOp::Or:
      break;
  }
  return (a != 0) || (b != 0);
}

void run_whole_reduction(const LoweredKernel& lk, KernelFn fn, std::vector<char*>& bufs,
                         Node& root) {
  const int64_t n = lk.parallel_extent;
  ThreadPool& pool = thread_pool();
  const int64_t parts = std::max<int64_t>(chunk_count(n, kGrain, pool.size()), 1);
  DType acc = accumulator_dtype(lk.ir);
  std::vector<double> pd;
  std::vector<float> pf;
  std::vector<int64_t> pi;
  if (acc == DType::Float32)
    pf.resize(parts), bufs[lk.ir.inputs.size() + 1] = reinterpret_cast<char*>(pf.data());
  else if (acc == DType::Float64)
    pd.resize(parts), bufs[lk.ir.inputs.size() + 1] = reinterpret_cast<char*>(pd.data());
  else
    pi.resize(parts), bufs[lk.ir.inputs.size() + 1] = reinterpret_cast<char*>(pi.data());
  const int64_t* params = lk.params.data();
  if (n > 0) {
    pool.parallel_for(parts, 1, [&](int64_t kb, int64_t ke) {
      for (int64_t k = kb; k < ke; ++k)
        fn(bufs.data(), params, chunk_begin(n, parts, k), chunk_begin(n, parts, k + 1), k);
    });
  }
  // Partials combine in chunk order, so a fixed thread count gives fixed bits.
  ReduceOp op = lk.ir.reduce;
  if (acc == DType::Int64) {
    int64_t total = identity_of<int64_t>(op, root.dtype);
    if (n > 0)
      for (int64_t v : pi) total = combine(op, total, v);
    kiln::detail::store_int64(root.buffer->data(), root.dtype, 0, total);
  } else {
    double total = identity_of<double>(op, root.dtype);
    if (n > 0)
      for (int64_t k = 0; k < parts; ++k)
        total = combine(op, total, acc == DType::Float32 ? static_cast<double>(pf[k]) : pd[k]);
    kiln::detail::store_double(root.buffer->data(), root.dtype, 0, total);
  }
}

// Sets elements [b, e) of `data` (elements of `size` bytes) to the element stored at the
// start of `bits`.
void fill_elements(void* data, size_t size, uint64_t bits, int64_t b, int64_t e) {
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    T v;
    std::memcpy(&v, &bits, sizeof v);
    std::fill(p + b, p + e, v);
  };
  switch (size) {
    case 1:
      return fill(static_cast<uint8_t*>(data));
    case 2:
      return fill(static_cast<uint16_t*>(data));
    case 4:
      return fill(static_cast<uint32_t*>(data));
    default:
      return fill(static_cast<uint64_t*>(data));
  }
}

template <typename Acc>
void run_scatter(const LoweredKernel& lk, KernelFn fn, std::vector<char*>& bufs, Node& root) {
  const auto n = static_cast<int64_t>(root.numel());
  const Acc identity = identity_of<Acc>(lk.ir.reduce, root.dtype);
  // The kernel writes the output itself when it is float64 (it accumulates in place) or
  // the scatter is one-to-one (each output stored once, converted): the output starts as
  // the identity, converted as an untouched accumulator would be. Other scatters go
  // through an accumulator array converted at the end.
  const bool direct = lk.ir.injective || root.dtype == DType::Float64;
  std::vector<Acc> acc(direct ? 0 : static_cast<size_t>(n));
  void* out = root.buffer->data();
  if (direct) {
    uint64_t bits = 0;  // the identity as one element of the output's dtype
    if constexpr (std::is_floating_point_v<Acc>)
      kiln::detail::store_double(&bits, root.dtype, 0, identity);
    else
      kiln::detail::store_int64(&bits, root.dtype, 0, identity);
    thread_pool().parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      fill_elements(out, itemsize(root.dtype), bits, b, e);
    });
    bufs[0] = static_cast<char*>(out);
  } else {
    thread_pool().parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      std::fill(acc.data() + b, acc.data() + e, identity);
    });
    bufs[0] = reinterpret_cast<char*>(acc.data());
  }
  const int64_t* params = lk.params.data();
  bool any = true;
  for (int64_t s : root.inputs[0]->shape) any = any && s > 0;
  if (any) {
    if (lk.ir.parallel_var >= 0) {
      thread_pool().parallel_for(lk.parallel_extent, 1,
                                 [&](int64_t b, int64_t e) { fn(bufs.data(), params, b, e, 0); });
    } else {
      fn(bufs.data(), params, 0, 1, 0);
    }
  }
  if (direct) return;
  thread_pool().parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_floating_point_v<Acc>) {
      if (root.dtype == DType::Float32) {
        float* o = static_cast<float*>(out);
        for (int64_t i = b; i < e; ++i) o[i] = static_cast<float>(acc[static_cast<size_t>(i)]);
        return;
      }
      for (int64_t i = b; i < e; ++i)
        kiln::detail::store_double(out, root.dtype, i, acc[static_cast<size_t>(i)]);
    } else {
      for (int64_t i = b; i < e; ++i)
        kiln::detail::store_int64(out, root.dtype, i, acc[static_cast<size_t>(i)]);
    }
  });
}

// Whether `a` and `b` print the same kernel: every field structure_hash() covers, compared
// exactly, so that a collision of the 64-bit hash cannot hand out another kernel.
bool same_structure(const KernelIR& a, const KernelIR& b) {
  if (a.kind != b.kind || a.dims != b.dims || a.kept != b.kept ||
      a.parallel_var != b.parallel_var || a.injective != b.injective || a.inputs != b.inputs ||
      a.out_dtype != b.out_dtype || a.result != b.result || a.reduce != b.reduce ||
      !(a.store_index == b.store_index) || a.store_guard != b.store_guard ||
      a.can_fail != b.can_fail || a.values.size() != b.values.size() ||
      a.stages.size() != b.stages.size())
    return false;
  for (size_t i = 0; i < a.values.size(); ++i) {
    const IrValue &x = a.values[i], &y = b.values[i];
    if (x.kind != y.kind || x.dtype != y.dtype || x.op != y.op || x.args != y.args ||
        x.buffer != y.buffer || !(x.index == y.index) || x.guard != y.guard || x.param != y.param ||
        // A literal passed as a parameter is not in the kernel (it prints P[k]).
        (x.param < 0 && (x.value.kind() != y.value.kind() || !(x.value == y.value))) ||
        x.normal != y.normal || x.seed_param != y.seed_param || x.stage != y.stage ||
        x.bounds != y.bounds || x.bound_is_error != y.bound_is_error ||
        x.bound_site != y.bound_site)
      return false;
  }
  for (size_t i = 0; i < a.stages.size(); ++i) {
    const RowStage &x = a.stages[i], &y = b.stages[i];
    if (x.reduce != y.reduce || x.dtype != y.dtype || x.dims != y.dims ||
        x.first_var != y.first_var || x.value != y.value)
      return false;
  }
  return true;
}

// Whether `ir`'s results are the same bits at every optimisation level, so that it may run
// from a quick build first (tiers): a float sum or product reduction is vectorized with
// reordered combines at -O3 (printer_cpp.cpp, reduce_loop) and not at -O0; everything else
// is IEEE arithmetic without contraction, and float max/min fold integer keys.
bool exact_at_any_optimisation(const KernelIR& ir) {
  auto reorders = [](ReduceOp op, DType acc) {
    return is_floating(acc) && (op == ReduceOp::Sum || op == ReduceOp::Prod);
  };
  if (ir.kind == KernelIR::Kind::InnerReduce && reorders(ir.reduce, accumulator_dtype(ir)))
    return false;
  for (const RowStage& st : ir.stages)
    if (reorders(st.reduce, st.dtype)) return false;
  return true;
}

// Compiled kernels by IR structure, so that a launch of a known kernel skips printing and
// hashing its source. The 64-bit hash finds a bucket; same_structure() decides a hit.
// Evaluations are serialized (core/node.cpp), so no lock is needed beyond that; the mutex
// only guards against executors called directly from tests.
struct MemoEntry {
  KernelIR ir;
  KernelHandle handle;
};
std::mutex g_memo_mutex;
std::unordered_map<uint64_t, std::vector<MemoEntry>> g_memo;

// The memo's handle of `ir` (counted as a memory hit), or nullptr.
const KernelHandle* memo_find(const KernelIR& ir, uint64_t hash) {
  auto it = g_memo.find(hash);
  if (it == g_memo.end()) return nullptr;
  for (const MemoEntry& m : it->second) {
    if (!same_structure(m.ir, ir)) continue;
    count_use(m.handle.record, m.handle.record_mutex, 1, 0, 0);
    kernel_cache().note_memory_hits(1);
    return &m.handle;
  }
  return nullptr;
}

// The kernels of `irs`, in order: memo hits first, then the missing ones printed and
// requested from the cache in one batch, compiled in parallel (KernelCache::get_many).
std::vector<KernelHandle> kernels_for(const std::vector<const KernelIR*>& irs) {
  std::vector<KernelHandle> out(irs.size());
  std::vector<size_t> missing;
  std::vector<uint64_t> hashes(irs.size());
  {
    std::lock_guard lock(g_memo_mutex);
    for (size_t i = 0; i < irs.size(); ++i) {
      hashes[i] = irs[i]->structure_hash();
      if (const KernelHandle* h = memo_find(*irs[i], hashes[i]))
        out[i] = *h;
      else
        missing.push_back(i);
    }
  }
  if (missing.empty()) return out;
  std::vector<KernelRequest> requests;
  requests.reserve(missing.size());
  for (size_t i : missing) {
    // KILN_NVRTC_CHECK: every new CPU kernel must also compile for CUDA (tests use it to
    // prove the CUDA printer on machines without a GPU).
    nvrtc_check_kernel(*irs[i]);
    PrintedKernel pk = print_cpp(*irs[i]);
    requests.push_back({std::move(pk.source), std::move(pk.entry), irs[i]->source_ops,
                        exact_at_any_optimisation(*irs[i])});
  }
  std::vector<KernelHandle> got = kernel_cache().get_many(requests, cpu_compiler());
  std::lock_guard lock(g_memo_mutex);
  for (size_t k = 0; k < missing.size(); ++k) {
    const size_t i = missing[k];
    out[i] = got[k];
    std::vector<MemoEntry>& bucket = g_memo[hashes[i]];
    bool known = false;
    for (const MemoEntry& m : bucket) known = known || same_structure(m.ir, *irs[i]);
    if (!known) bucket.push_back({*irs[i], got[k]});
  }
  return out;
}

KernelHandle kernel_for(const KernelIR& ir) {
  {
    std::lock_guard lock(g_memo_mutex);
    if (const KernelHandle* h = memo_find(ir, ir.structure_hash())) return *h;
  }
  return kernels_for({&ir})[0];
}

void run_group(const FusionGroup& group) {
  Node& target = *group.root;
  if (target.op == OpCode::Transfer) {
    target.buffer = kiln::detail::copy_buffer(*group.inputs.at(0)->buffer, target.device);
    return;
  }
  if (group.library) return group.conv.root ? run_conv(group.conv) : run_gemm(group.gemm);
  LoweredKernel lk = lower(group);
  if (target.device.is_cuda()) return run_cuda_kernel(lk, target);
  KernelHandle h = kernel_for(lk.ir);
  auto fn = reinterpret_cast<KernelFn>(h.entry());
  Node& root = *group.root;
  // The memory plan may have handed the root a dying input's buffer (in-place reuse).
  if (!root.buffer) root.buffer = std::make_shared<Buffer>(root.nbytes(), root.device);
  std::shared_ptr<Buffer> buffer = root.buffer;
  std::vector<char*> bufs(lk.ir.inputs.size() + 3, nullptr);
  bufs[0] = static_cast<char*>(buffer->data());
  for (size_t k = 0; k < lk.input_nodes.size(); ++k)
    bufs[k + 1] = static_cast<char*>(lk.input_nodes[k]->buffer->data());
  int64_t err[4] = {0, 0, 0, 0};
  bufs[lk.ir.inputs.size() + 2] = reinterpret_cast<char*>(err);
  const int64_t* params = lk.params.data();
  auto started = std::chrono::steady_clock::now();
  try {
    switch (lk.ir.kind) {
      case KernelIR::Kind::Map:
        if (lk.parallel_extent > 0)
          thread_pool().parallel_for(lk.parallel_extent, kGrain, [&](int64_t b, int64_t e) {
            fn(bufs.data(), params, b, e, 0);
          });
        break;
      case KernelIR::Kind::InnerReduce:
        if (lk.ir.kept == 0) {
          run_whole_reduction(lk, fn, bufs, root);
        } else if (lk.parallel_extent > 0) {
          int64_t per = std::max<int64_t>(
              root.inputs[0]->numel() / std::max<int64_t>(lk.parallel_extent, 1), 1);
          int64_t grain = std::max<int64_t>(kGrain / per, 1);
          thread_pool().parallel_for(lk.parallel_extent, grain, [&](int64_t b, int64_t e) {
            fn(bufs.data(), params, b, e, 0);
          });
        }
        break;
      case KernelIR::Kind::Rows:
        if (lk.parallel_extent > 0) {
          const int64_t per = std::max<int64_t>(lk.work / lk.parallel_extent, 1);
          thread_pool().parallel_for(
              lk.parallel_extent, std::max<int64_t>(kGrain / per, 1),
              [&](int64_t b, int64_t e) { fn(bufs.data(), params, b, e, 0); });
        }
        break;
      case KernelIR::Kind::Scatter:
        if (accumulator_dtype(lk.ir) == DType::Float64)
          run_scatter<double>(lk, fn, bufs, root);
        else
          run_scatter<int64_t>(lk, fn, bufs, root);
        break;
    }
  } catch (...) {
    root.buffer.reset();
    throw;
  }
  count_use(h.record, h.record_mutex, 0, 1,
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
                .count());
  if (err[0] != 0) {
    root.buffer.reset();
    raise_kernel_index_error(lk.ir, root, err);
  }
}

struct Plan {
  SimplifyResult simplified;
  FusionPlan fusion;
  std::unordered_set<Node*> outputs;
};

// The plan cache: the structural signature of a simplified schedule (node keys without
// sizes, which leaves repeat, which nodes are outputs) maps to its fusion plan in
// positional form, so a training loop fuses once. Fusion choices never affect results,
// so reusing one made for other sizes is always correct.
struct CachedGroup {
  int root = 0;
  std::vector<int> members;
  bool library = false;
  int gemm_a = 0, gemm_b = 0;  // schedule position, or -1 - leaf index
  std::vector<int> absorbed;
  bool accumulates = false;  // an accumulation: the root is the add
  bool rounds = false;       // a rounding: the root is the cast to half
  int gemm_reduce = 0;       // its product's position
  int gemm_accumulate = 0;   // what it adds into (position or -1 - leaf index)
  int conv_pass = -1;        // a convolution call (ConvPass), reading gemm_a and gemm_b
  int conv_product = 0;      // its product's position
  int conv_bias = 0;         // its bias (position or -1 - leaf index), with conv_has_bias
  bool conv_has_bias = false;
};
std::mutex g_plan_mutex;
std::unordered_map<uint64_t, std::vector<CachedGroup>> g_plans;
constexpr size_t kMaxCachedPlans = 4096;

struct Positions {
  std::unordered_map<Node*, int> pos;
  std::vector<Node*> leaves;
  std::unordered_map<Node*, int> leaf_index;
  int ref(Node* n) const {
    auto it = pos.find(n);
    return it != pos.end() ? it->second : -1 - leaf_index.at(n);
  }
  Node* node(const std::vector<Node*>& schedule, int r) const {
    return r >= 0 ? schedule[r] : leaves[-1 - r];
  }
};

uint64_t signature(const std::vector<Node*>& schedule, const std::unordered_set<Node*>& outputs,
                   Positions& p) {
  std::unordered_map<Node*, uint64_t> key;
  uint64_t sig = schedule.size();
  std::vector<uint64_t> in_keys;
  StoreHints hints;
  for (size_t i = 0; i < schedule.size(); ++i) {
    Node* n = schedule[i];
    p.pos[n] = static_cast<int>(i);
    in_keys.clear();
    for (const NodePtr& in : n->inputs) {
      auto it = key.find(in.get());
      if (it != key.end()) {
        in_keys.push_back(it->second);
        continue;
      }
      auto [li, fresh] = p.leaf_index.emplace(in.get(), static_cast<int>(p.leaves.size()));
      if (fresh) p.leaves.push_back(in.get());
      in_keys.push_back(hash_combine(node_key(*in, nullptr, 0), static_cast<uint64_t>(li->second)));
    }
    uint64_t k = hash_combine(node_key(*n, in_keys.data(), in_keys.size()), fusion_size_class(*n));
    key[n] = k;
    // Fusion reads the store hint too, so two schedules differing in it (or in whether a
    // budget turns it off) fuse differently.
    const uint64_t role = (outputs.count(n) ? 1 : 0) | (hints.stored(*n) ? 2 : 0);
    sig = hash_combine(sig, hash_combine(k, role));
  }
  return sig;
}

// Rebuilds a fusion plan for this schedule from its positional form.
FusionPlan instantiate(const std::vector<CachedGroup>& cached, const std::vector<Node*>& schedule,
                       const Positions& p) {
  FusionPlan plan;
  for (const CachedGroup& c : cached) {
    FusionGroup g;
    g.root = schedule[c.root];
    for (int m : c.members) g.members.push_back(schedule[m]);
    std::unordered_set<Node*> inside(g.members.begin(), g.members.end());
    for (Node* m : g.members)
      for (const NodePtr& in : m->inputs)
        if (!inside.count(in.get()) &&
            std::find(g.inputs.begin(), g.inputs.end(), in.get()) == g.inputs.end())
          g.inputs.push_back(in.get());
    g.library = c.library;
    if (c.library && c.conv_pass >= 0) {
      g.conv.pass = static_cast<ConvPass>(c.conv_pass);
      g.conv.root = g.root;
      g.conv.product = schedule[c.conv_product];
      g.conv.a = p.node(schedule, c.gemm_a);
      g.conv.b = p.node(schedule, c.gemm_b);
      for (int a : c.absorbed) g.conv.absorbed.push_back(schedule[a]);
      g.inputs = {g.conv.a};
      if (g.conv.b != g.conv.a) g.inputs.push_back(g.conv.b);
      if (c.conv_has_bias) {
        g.conv.bias = p.node(schedule, c.conv_bias);
        if (std::find(g.inputs.begin(), g.inputs.end(), g.conv.bias) == g.inputs.end())
          g.inputs.push_back(g.conv.bias);
      }
    } else if (c.library) {
      g.gemm.reduce = c.accumulates || c.rounds ? schedule[c.gemm_reduce] : g.root;
      if (c.rounds) g.gemm.rounded = g.root;
      g.gemm.a = p.node(schedule, c.gemm_a);
      g.gemm.b = p.node(schedule, c.gemm_b);
      for (int a : c.absorbed) g.gemm.absorbed.push_back(schedule[a]);
      g.inputs = {g.gemm.a};
      if (g.gemm.b != g.gemm.a) g.inputs.push_back(g.gemm.b);
      if (c.accumulates) {
        g.gemm.sum = g.root;
        g.gemm.accumulate = p.node(schedule, c.gemm_accumulate);
        g.inputs.push_back(g.gemm.accumulate);
      }
    }
    plan.groups.push_back(std::move(g));
  }
  return plan;
}

std::vector<CachedGroup> positional(const FusionPlan& plan, const Positions& p) {
  std::vector<CachedGroup> out;
  for (const FusionGroup& g : plan.groups) {
    CachedGroup c;
    c.root = p.pos.at(g.root);
    for (Node* m : g.members) c.members.push_back(p.pos.at(m));
    c.library = g.library;
    if (g.library && g.conv.root) {
      c.conv_pass = static_cast<int>(g.conv.pass);
      c.conv_product = p.pos.at(g.conv.product);
      c.gemm_a = p.ref(g.conv.a);
      c.gemm_b = p.ref(g.conv.b);
      for (Node* a : g.conv.absorbed) c.absorbed.push_back(p.pos.at(a));
      if (g.conv.bias) {
        c.conv_has_bias = true;
        c.conv_bias = p.ref(g.conv.bias);
      }
    } else if (g.library) {
      c.gemm_a = p.ref(g.gemm.a);
      c.gemm_b = p.ref(g.gemm.b);
      for (Node* a : g.gemm.absorbed) c.absorbed.push_back(p.pos.at(a));
      if (g.gemm.sum) {
        c.accumulates = true;
        c.gemm_reduce = p.pos.at(g.gemm.reduce);
        c.gemm_accumulate = p.ref(g.gemm.accumulate);
      }
      if (g.gemm.rounded) {
        c.rounds = true;
        c.gemm_reduce = p.pos.at(g.gemm.reduce);
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

FusionPlan fuse_cached(const std::vector<Node*>& schedule,
                       const std::unordered_set<Node*>& outputs) {
  if (pass_disabled("PLAN_CACHE")) return fuse(schedule, outputs);
  Positions p;
  uint64_t sig = signature(schedule, outputs, p);
  {
    std::lock_guard lock(g_plan_mutex);
    auto it = g_plans.find(sig);
    if (it != g_plans.end()) return instantiate(it->second, schedule, p);
  }
  FusionPlan plan = fuse(schedule, outputs);
  std::lock_guard lock(g_plan_mutex);
  if (g_plans.size() >= kMaxCachedPlans) g_plans.clear();
  g_plans[sig] = positional(plan, p);
  return plan;
}

// A replaced leaf (a parameter before an update) may hand its buffer to the update once its
// last reader in the step has run. A held value left to fusion stays pending after the step
// and would then read that leaf again when evaluated, so one that reaches a replaced leaf
// through pending values (the new parameter itself, read by `sum(w)` next to the loss) is
// kept: what it computes is taken from the leaf while the leaf is still there. `schedule`
// lists inputs before users, so one pass finds them; a kept value cuts the paths above it.
void keep_readers_of_replaced(const std::vector<Node*>& schedule,
                              const std::unordered_set<Node*>& req,
                              const std::unordered_set<Node*>& consumed, std::vector<Node*>& outs) {
  std::unordered_set<Node*> reaches;  // pending nodes that read a replaced leaf when run
  for (Node* n : schedule) {
    bool r = false;
    for (const NodePtr& in : n->inputs) {
      Node* m = in.get();
      r = r || (m->is_evaluated() ? m->replaced : reaches.count(m) > 0);
    }
    if (!r || req.count(n)) continue;
    if (consumed.count(n) && n->handles.load(std::memory_order_relaxed) > 0)
      outs.push_back(n);  // materialized here: its users after the step read its buffer
    else
      reaches.insert(n);
  }
}

Plan make_plan(const std::vector<Node*>& schedule, const std::vector<Node*>& requested) {
  Plan p;
  std::vector<Node*> outs(requested.begin(), requested.end());
  std::unordered_set<Node*> req(requested.begin(), requested.end());
  std::unordered_set<Node*> consumed;
  bool reads_replaced = false;  // some input is a parameter an update replaced
  for (Node* n : schedule)
    for (const NodePtr& in : n->inputs) {
      consumed.insert(in.get());
      reads_replaced = reads_replaced || (in->replaced && in->is_evaluated());
    }
  // Held results nothing here consumes (a loss next to an update) are kept. Held values
  // that feed others are left to fusion: forcing them out would split every kernel whose
  // temporaries are still alive, as in `sum(relu(a * b + c)).item<float>()`; if they were
  // fused away, reading them later recomputes them.
  for (Node* n : schedule)
    if (!req.count(n) && !consumed.count(n) && n->handles.load(std::memory_order_relaxed) > 0)
      outs.push_back(n);
  if (reads_replaced) keep_readers_of_replaced(schedule, req, consumed, outs);
  p.simplified = simplify(schedule, outs);
  for (Node* o : outs) {
    auto it = p.simplified.alias.find(o);
    p.outputs.insert(it == p.simplified.alias.end() ? o : it->second);
  }
  p.fusion = fuse_cached(p.simplified.schedule, p.outputs);
  return p;
}

void run_plan(const std::vector<Node*>& schedule, const std::vector<Node*>& requested) {
  Plan plan = make_plan(schedule, requested);
  const auto& groups = plan.fusion.groups;
  run_with_memory_plan(plan.fusion, plan.outputs, schedule, plan.simplified.schedule, run_group);
  for (auto& [out, rep] : plan.simplified.alias) {
    if (out != rep && rep->buffer) out->buffer = rep->buffer;
  }
  std::lock_guard lock(g_stats_mutex);
  size_t library = 0, conv = 0;
  for (const FusionGroup& g : groups) {
    library += g.library ? 1 : 0;
    conv += g.library && g.conv.root ? 1 : 0;
  }
  g_last_stats = EvalStats{plan.simplified.schedule.size(), groups.size() - library, library, conv};
}

const bool kRegistered = [] {
  register_executor("jit", 10, &jit_execute);
  return true;
}();

}  // namespace

void raise_kernel_index_error(const KernelIR& ir, const Node& root, const int64_t* err) {
  std::string op = root.user_op(), where = "a dimension";
  if (err[1] >= 0 && static_cast<size_t>(err[1]) < ir.error_sites.size()) {
    const KernelIR::ErrorSite& site = ir.error_sites[static_cast<size_t>(err[1])];
    op = site.op;
    where = "dimension " + std::to_string(site.dim) + " of shape " + shape_str(site.shape);
  }
  throw IndexError("[" + op + "] index " + std::to_string(err[2]) + " is out of range for " +
                   where + " (size " + std::to_string(err[3]) + "); expected 0 <= index < " +
                   std::to_string(err[3]));
}

void jit_execute(const std::vector<Node*>& schedule, const std::vector<Node*>& requested) {
  run_plan(schedule, requested);
}

EvalStats last_eval_stats() {
  std::lock_guard lock(g_stats_mutex);
  return g_last_stats;
}

std::string plan_to_dot(const std::vector<Node*>& outputs) {
  std::vector<Node*> schedule = pending_subgraph(outputs);
  Plan plan = make_plan(schedule, outputs);
  std::string dot =
      "digraph kiln_plan {\n  compound=true;\n  node [shape=box, fontname=\"monospace\"];\n";
  std::unordered_map<Node*, std::string> id;
  int cluster = 0;
  auto label = [](Node* n) {
    std::string l = std::string(op_name(n->op));
    if (n->origin && op_name(n->op) != n->origin) l += "\\n(" + std::string(n->origin) + ")";
    return l + "\\n" + shape_str(n->shape) + " " + std::string(dtype_name(n->dtype));
  };
  for (const FusionGroup& g : plan.fusion.groups) {
    dot += "  subgraph cluster_" + std::to_string(cluster) + " {\n    label=\"kernel " +
           std::to_string(cluster) + "\";\n";
    for (Node* m : g.members) {
      std::string nid = "k" + std::to_string(cluster) + "_n" + std::to_string(m->id);
      if (m == g.root) id[m] = nid;
      dot += "    " + nid + " [label=\"" + label(m) + "\"];\n";
      for (const NodePtr& in : m->inputs) {
        bool inside = std::find(g.members.begin(), g.members.end(), in.get()) != g.members.end();
        if (inside)
          dot += "    k" + std::to_string(cluster) + "_n" + std::to_string(in->id) + " -> " + nid +
                 ";\n";
      }
    }
    dot += "  }\n";
    ++cluster;
  }
  cluster = 0;
  for (const FusionGroup& g : plan.fusion.groups) {
    for (Node* in : g.inputs) {
      if (!id.count(in)) {
        id[in] = "leaf" + std::to_string(in->id);
        dot +=
            "  " + id[in] + " [label=\"" + label(in) + "\", style=filled, fillcolor=lightgrey];\n";
      }
      for (Node* m : g.members) {
        for (const NodePtr& x : m->inputs)
          if (x.get() == in)
            dot += "  " + id[in] + " -> k" + std::to_string(cluster) + "_n" +
                   std::to_string(m->id) + ";\n";
      }
    }
    ++cluster;
  }
  return dot + "}\n";
}

}  // namespace kiln::jit
