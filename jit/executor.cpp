#include "executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "../core/evaluation_listener.h"
#include "../core/log.h"
#include "../core/structural_hash.h"
#include "../core/tensor.h"
#include "../core/thread_pool.h"
#include "../ops/transfer.h"
#include "compiler.h"
#include "cuda_launch.h"
#include "custom_kernel.h"
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

// A group's lowered kernel kept from an earlier evaluation of the same plan (the replay
// cache, below): its IR, parameters and compiled kernel, with its inputs as positions in
// the schedule so that a later evaluation rebinds them to its own nodes.
struct Launch {
  bool ready = false;
  LoweredKernel lk;
  std::vector<int> input_refs;  // lk.input_nodes as schedule positions (or -1 - leaf index)
  KernelHandle kernel;          // CPU kernels only
  bool fresh = false;           // prepared for this evaluation: its first run is no replay
};

struct Positions;

// Rebinds `launch` to this evaluation's nodes (`positions` in `schedule`), or lowers the
// group (and compiles its kernel) when the launch is not ready; `launch` may be null (no
// replay cache), and then `scratch` holds the lowered kernel.
const LoweredKernel& launch_for(const FusionGroup& group, Launch* launch, LoweredKernel& scratch,
                                KernelHandle& kernel, const Positions* positions,
                                const std::vector<Node*>* schedule);

void run_group(const FusionGroup& group, Launch* launch, const Positions* positions,
               const std::vector<Node*>* schedule) {
  Node& target = *group.root;
  if (target.op == OpCode::Transfer) {
    target.buffer = kiln::detail::copy_buffer(*group.inputs.at(0)->buffer, target.device);
    return;
  }
  if (group.library) return group.conv.root ? run_conv(group.conv) : run_gemm(group.gemm);
  if (target.op == OpCode::Custom) return run_custom_kernel(target);
  LoweredKernel scratch;
  KernelHandle h;
  const LoweredKernel& lk = launch_for(group, launch, scratch, h, positions, schedule);
  if (target.device.is_cuda()) return run_cuda_kernel(lk, target);
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

// The plan cache (replayed evaluations, issue 26): the structural signature of a simplified
// schedule (node keys without sizes, which leaves repeat, which nodes are outputs) maps to
// its fusion plan in positional form and to the lowered kernel of each group, so a training
// loop fuses, lowers and looks up its kernels once. A hit is confirmed node by node against
// an exact record of the schedule it was made for (a 64-bit signature alone could collide);
// nodes whose sizes changed mark the groups that read or compute them for lowering again.
// Fusion choices never affect results, so reusing a plan made for other sizes is correct.
struct CachedGroup {
  int root = 0;
  std::vector<int> members;
  std::vector<int> inputs;  // the group's inputs (positions or -1 - leaf index), in order
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

// What a schedule position held when its plan was made: everything the signature hashes
// (so that a colliding signature is caught) plus the sizes (which decide the lowering).
struct NodeRecord {
  OpCode op;
  DType dtype;
  Device device;
  Shape shape;
  Scalar scalar;
  std::vector<IndexExpr> index_map;
  ReduceOp reduce;
  bool check_indices, weak_scalar, output, stored;
  int axis;
  uint64_t seed, offset;
  const char* origin;  // named in kernels' error sites and metadata
  const char* composite;
  std::vector<int> inputs;                       // schedule positions, or -1 - leaf index
  std::shared_ptr<const CustomKernelOp> custom;  // a user kernel's payload (same_kernel)
};
struct LeafRecord {
  DType dtype;
  Device device;
  Shape shape;
};

struct CachedPlan {
  std::vector<CachedGroup> groups;
  std::vector<NodeRecord> nodes;  // by schedule position
  std::vector<LeafRecord> leaves;
  std::vector<Launch> launches;  // by group
  // Simplify left this exact schedule (sizes, fills and draws included) unchanged, so an
  // evaluation that matches the records exactly skips it (see make_plan).
  bool unsimplified = false;
};

std::mutex g_plan_mutex;
std::unordered_map<uint64_t, std::shared_ptr<CachedPlan>> g_plans;
// The last plan made for each sequence of ops and edges: what a miss is compared with to
// say which guard failed (ReplayStats' missed_* counts, KILN_LOG=debug).
std::unordered_map<uint64_t, std::shared_ptr<CachedPlan>> g_plans_by_ops;
size_t g_cached_groups = 0;  // over all plans: each holds its lowered kernels
constexpr size_t kMaxCachedPlans = 4096;
constexpr size_t kMaxCachedGroups = size_t{1} << 17;

std::atomic<int> g_signature_bits{64};
// ReplayStats' counters; launches_replayed is bumped once per launch, so no lock.
struct ReplayCounters {
  std::atomic<uint64_t> hits{0}, misses{0}, collisions{0}, hits_relowered{0}, groups_relowered{0},
      launches_replayed{0}, simplify_skipped{0};
  std::atomic<uint64_t> missed_new_graph{0}, missed_dtype{0}, missed_device{0}, missed_broadcast{0},
      missed_attributes{0}, missed_roles{0}, missed_dropped{0};
};
ReplayCounters g_replay;
void bump(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.fetch_add(n, std::memory_order_relaxed);
}

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
                   Positions& p, std::vector<char>& stored) {
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
    stored.push_back(hints.stored(*n) ? 1 : 0);
    const uint64_t role = (outputs.count(n) ? 1 : 0) | (stored.back() ? 2 : 0);
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
    g.index = static_cast<int>(plan.groups.size());
    g.root = schedule[c.root];
    for (int m : c.members) g.members.push_back(schedule[m]);
    for (int in : c.inputs) g.inputs.push_back(p.node(schedule, in));
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
    for (Node* in : g.inputs) c.inputs.push_back(p.ref(in));
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

NodeRecord record_of(const Node& n, const Positions& p, bool output, bool stored) {
  NodeRecord r{n.op,     n.dtype,         n.device,      n.shape,     n.scalar, n.index_map,
               n.reduce, n.check_indices, n.weak_scalar, output,      stored,   n.axis,
               n.seed,   n.offset,        n.origin,      n.composite, {},       n.custom};
  for (const NodePtr& in : n.inputs) r.inputs.push_back(p.ref(in.get()));
  return r;
}

// Whether `n` matches its record in everything but its sizes and random generator state
// (the plan's structure: what the signature hashes).
bool same_structure(const NodeRecord& r, const Node& n, const Positions& p, bool output,
                    bool stored) {
  if (r.op != n.op || r.dtype != n.dtype || !(r.device == n.device) ||
      r.shape.size() != n.shape.size() || r.reduce != n.reduce ||
      r.check_indices != n.check_indices || r.weak_scalar != n.weak_scalar || r.output != output ||
      r.stored != stored || r.axis != n.axis || r.origin != n.origin ||
      r.composite != n.composite || !(r.scalar == n.scalar) ||
      (r.custom == nullptr) != (n.custom == nullptr) ||
      (r.custom && !r.custom->same_kernel(*n.custom)) || r.index_map.size() != n.index_map.size() ||
      r.inputs.size() != n.inputs.size())
    return false;
  for (size_t d = 0; d < r.shape.size(); ++d)
    if ((r.shape[d] == 1) != (n.shape[d] == 1)) return false;  // broadcasting is structure
  for (size_t k = 0; k < r.inputs.size(); ++k)
    if (r.inputs[k] != p.ref(n.inputs[k].get())) return false;
  for (size_t d = 0; d < r.index_map.size(); ++d)
    if (!(r.index_map[d] == n.index_map[d])) return false;
  return true;
}

std::shared_ptr<CachedPlan> new_cached_plan(const FusionPlan& plan,
                                            const std::vector<Node*>& schedule,
                                            const std::unordered_set<Node*>& outputs,
                                            const Positions& p, const std::vector<char>& stored) {
  auto c = std::make_shared<CachedPlan>();
  c->groups = positional(plan, p);
  c->launches.resize(c->groups.size());
  c->nodes.reserve(schedule.size());
  for (size_t i = 0; i < schedule.size(); ++i)
    c->nodes.push_back(record_of(*schedule[i], p, outputs.count(schedule[i]) > 0, stored[i]));
  for (Node* l : p.leaves) c->leaves.push_back({l->dtype, l->device, l->shape});
  return c;
}

enum class Confirmed { No, Same, Resized };

// Checks a cached plan against this schedule. Returns No on a signature collision (some
// node differs in structure); otherwise marks the groups that touch a changed node (sizes,
// or the generator state of a random op: both are kernel parameters) for lowering again,
// updates the records, and returns Resized (Same when nothing changed).
Confirmed confirm(CachedPlan& c, const std::vector<Node*>& schedule,
                  const std::unordered_set<Node*>& outputs, const Positions& p,
                  const std::vector<char>& stored) {
  if (c.nodes.size() != schedule.size() || c.leaves.size() != p.leaves.size()) return Confirmed::No;
  std::vector<char> changed_node(schedule.size(), 0), changed_leaf(p.leaves.size(), 0);
  bool changed = false;
  for (size_t i = 0; i < schedule.size(); ++i) {
    const Node& n = *schedule[i];
    NodeRecord& r = c.nodes[i];
    if (!same_structure(r, n, p, outputs.count(schedule[i]) > 0, stored[i])) return Confirmed::No;
    if (r.shape != n.shape || r.seed != n.seed || r.offset != n.offset)
      changed_node[i] = 1, changed = true;
  }
  for (size_t i = 0; i < p.leaves.size(); ++i) {
    const Node& l = *p.leaves[i];
    LeafRecord& r = c.leaves[i];
    if (r.dtype != l.dtype || !(r.device == l.device) || r.shape.size() != l.shape.size())
      return Confirmed::No;
    for (size_t d = 0; d < r.shape.size(); ++d)
      if ((r.shape[d] == 1) != (l.shape[d] == 1)) return Confirmed::No;
    if (r.shape != l.shape) changed_leaf[i] = 1, changed = true;
  }
  if (!changed) return Confirmed::Same;
  auto touched = [&](int ref) {
    return ref >= 0 ? changed_node[static_cast<size_t>(ref)]
                    : changed_leaf[static_cast<size_t>(-1 - ref)];
  };
  size_t relowered = 0;
  for (size_t g = 0; g < c.groups.size(); ++g) {
    Launch& launch = c.launches[g];
    if (!launch.ready) continue;
    bool dirty = false;
    for (int m : c.groups[g].members) dirty = dirty || changed_node[static_cast<size_t>(m)];
    for (int in : launch.input_refs) dirty = dirty || touched(in);
    if (dirty) launch.ready = false, ++relowered;
  }
  for (size_t i = 0; i < schedule.size(); ++i) {
    if (!changed_node[i]) continue;
    c.nodes[i].shape = schedule[i]->shape;
    c.nodes[i].seed = schedule[i]->seed;
    c.nodes[i].offset = schedule[i]->offset;
  }
  for (size_t i = 0; i < p.leaves.size(); ++i)
    if (changed_leaf[i]) c.leaves[i].shape = p.leaves[i]->shape;
  c.unsimplified = false;  // certified for the old sizes only; make_plan certifies again
  bump(g_replay.hits_relowered);
  bump(g_replay.groups_relowered, relowered);
  if (debug_log())
    log_line("kiln: debug: replay of a plan of " + std::to_string(c.groups.size()) +
             " kernels with new sizes or random draws: " + std::to_string(relowered) +
             " lowered again");
  return Confirmed::Resized;
}

struct FusedPlan {
  FusionPlan plan;
  std::shared_ptr<CachedPlan> cached;  // null when the plan cache is off
  Positions positions;
};

// fuse(), with each group's position in the plan recorded in it (FusionGroup::index).
FusionPlan fuse_numbered(const std::vector<Node*>& schedule,
                         const std::unordered_set<Node*>& outputs) {
  FusionPlan plan = fuse(schedule, outputs);
  for (size_t g = 0; g < plan.groups.size(); ++g) plan.groups[g].index = static_cast<int>(g);
  return plan;
}

// The ops and edges of a schedule, without dtypes, shapes or attributes: plans that share
// it differ only in what the guards check.
uint64_t ops_key(const std::vector<Node*>& schedule, const Positions& p) {
  uint64_t k = hash_combine(schedule.size(), p.leaves.size());
  for (Node* n : schedule) {
    k = hash_combine(k, static_cast<uint64_t>(n->op));
    for (const NodePtr& in : n->inputs)
      k = hash_combine(k, static_cast<uint64_t>(static_cast<int64_t>(p.ref(in.get()))));
  }
  return k;
}

// Why an evaluation found no plan: the first guard that separates its schedule from `c`, the
// last plan made for the same ops and edges (null: none). Counts it and returns a line for
// KILN_LOG=debug.
std::string diagnose_miss(const CachedPlan* c, const std::vector<Node*>& schedule,
                          const std::unordered_set<Node*>& outputs, const Positions& p,
                          const std::vector<char>& stored) {
  bool same_ops = c && c->nodes.size() == schedule.size() && c->leaves.size() == p.leaves.size();
  for (size_t i = 0; same_ops && i < schedule.size(); ++i) {
    const NodeRecord& r = c->nodes[i];
    const Node& n = *schedule[i];
    same_ops = r.op == n.op && r.inputs.size() == n.inputs.size();
    for (size_t k = 0; same_ops && k < r.inputs.size(); ++k)
      same_ops = r.inputs[k] == p.ref(n.inputs[k].get());
  }
  if (!same_ops) {
    bump(g_replay.missed_new_graph);
    return "no plan of the same ops is cached";
  }
  auto what = [&](const std::string& who, std::atomic<uint64_t>& counter, const std::string& now,
                  const std::string& was) {
    bump(counter);
    return who + ": " + now + " where the cached plan of the same ops has " + was;
  };
  // The guards a node and a leaf share: dtype, device, rank and which dims are 1.
  auto type_differs = [&](const std::string& who, DType dtype, Device device, const Shape& shape,
                          DType was_dtype, Device was_device,
                          const Shape& was_shape) -> std::optional<std::string> {
    if (dtype != was_dtype)
      return what(who, g_replay.missed_dtype, std::string(dtype_name(dtype)),
                  std::string(dtype_name(was_dtype)));
    if (!(device == was_device))
      return what(who, g_replay.missed_device, device.str(), was_device.str());
    bool broadcast = shape.size() != was_shape.size();
    for (size_t d = 0; !broadcast && d < shape.size(); ++d)
      broadcast = (shape[d] == 1) != (was_shape[d] == 1);
    if (broadcast)
      return what(who, g_replay.missed_broadcast, "shape " + shape_str(shape),
                  "shape " + shape_str(was_shape));
    return std::nullopt;
  };
  auto roles = [](bool output, bool stored) {
    return std::string(output ? "an output" : "not an output") +
           (stored ? ", stored" : ", not stored");
  };
  for (size_t i = 0; i < schedule.size(); ++i) {
    const NodeRecord& r = c->nodes[i];
    const Node& n = *schedule[i];
    const std::string who = "node " + std::to_string(i) + " (" + n.user_op() + ")";
    if (auto why = type_differs(who, n.dtype, n.device, n.shape, r.dtype, r.device, r.shape))
      return *why;
    const bool output = outputs.count(schedule[i]) > 0;
    if (r.output != output || r.stored != (stored[i] != 0))
      return what(who, g_replay.missed_roles, roles(output, stored[i] != 0),
                  roles(r.output, r.stored));
  }
  for (size_t i = 0; i < p.leaves.size(); ++i) {
    const LeafRecord& r = c->leaves[i];
    const Node& l = *p.leaves[i];
    if (auto why = type_differs("input " + std::to_string(i), l.dtype, l.device, l.shape, r.dtype,
                                r.device, r.shape))
      return *why;
  }
  for (size_t i = 0; i < schedule.size(); ++i) {
    const Node& n = *schedule[i];
    if (!same_structure(c->nodes[i], n, p, outputs.count(schedule[i]) > 0, stored[i] != 0)) {
      bump(g_replay.missed_attributes);
      return "node " + std::to_string(i) + " (" + n.user_op() +
             "): a scalar, index map, reduction, axis or flag differs from the cached plan of "
             "the same ops";
    }
  }
  // The very graph had a plan: the cache dropped it (full, or its signature taken over).
  bump(g_replay.missed_dropped);
  return "the plan of this graph was dropped from the cache";
}

// The plan cache's answer for one schedule: a confirmed plan (its fusion rebuilt for these
// nodes), or the signature and positions to store a new one under.
struct Lookup {
  FusedPlan fused;
  uint64_t sig = 0;
  std::vector<char> stored;
  Confirmed confirmed = Confirmed::No;
  bool collision = false;
};

Lookup look_up(const std::vector<Node*>& schedule, const std::unordered_set<Node*>& outputs) {
  Lookup l;
  l.stored.reserve(schedule.size());
  l.sig = signature(schedule, outputs, l.fused.positions, l.stored);
  if (const int bits = g_signature_bits.load(std::memory_order_relaxed); bits < 64)
    l.sig &= (uint64_t{1} << std::max(bits, 0)) - 1;
  std::lock_guard lock(g_plan_mutex);
  auto it = g_plans.find(l.sig);
  if (it == g_plans.end()) return l;
  l.confirmed = confirm(*it->second, schedule, outputs, l.fused.positions, l.stored);
  if (l.confirmed == Confirmed::No) {
    l.collision = true;
    return l;
  }
  l.fused.cached = it->second;
  l.fused.plan = instantiate(l.fused.cached->groups, schedule, l.fused.positions);
  return l;
}

// Completes a lookup: a hit is counted, a miss fuses the schedule and caches the plan.
// `unsimplified`: the schedule is one simplify left unchanged.
FusedPlan finish_lookup(Lookup&& l, const std::vector<Node*>& schedule,
                        const std::unordered_set<Node*>& outputs, bool unsimplified) {
  if (l.fused.cached) {
    bump(g_replay.hits);
    if (unsimplified) {
      std::lock_guard lock(g_plan_mutex);
      l.fused.cached->unsimplified = true;
    }
    return std::move(l.fused);
  }
  FusedPlan f = std::move(l.fused);
  f.plan = fuse_numbered(schedule, outputs);
  f.cached = new_cached_plan(f.plan, schedule, outputs, f.positions, l.stored);
  f.cached->unsimplified = unsimplified;
  bump(g_replay.misses);
  bump(g_replay.collisions, l.collision ? 1 : 0);
  const uint64_t ops = ops_key(schedule, f.positions);
  std::lock_guard lock(g_plan_mutex);
  auto same_ops = g_plans_by_ops.find(ops);
  const std::string why =
      diagnose_miss(same_ops == g_plans_by_ops.end() ? nullptr : same_ops->second.get(), schedule,
                    outputs, f.positions, l.stored);
  if (debug_log())
    log_line("kiln: debug: plan of " + std::to_string(schedule.size()) + " nodes made (" +
             (l.collision ? "its signature collided with another graph's; " : "") + why +
             "): " + std::to_string(f.plan.groups.size()) + " kernels");
  if (g_plans.size() >= kMaxCachedPlans || g_cached_groups >= kMaxCachedGroups) {
    g_plans.clear();
    g_plans_by_ops.clear();
    g_cached_groups = 0;
  }
  g_plans[l.sig] = f.cached;
  g_plans_by_ops[ops] = f.cached;
  g_cached_groups += f.cached->groups.size();
  return f;
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

struct Plan {
  SimplifyResult simplified;
  FusedPlan fused;
  std::unordered_set<Node*> outputs;
};

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
  const bool cache_plans = !pass_disabled("PLAN_CACHE");
  // A small schedule is looked up before simplify: where simplify left this very schedule
  // (sizes, fills and draws included, all in the exact check) unchanged before, it would
  // again, and on a graph of a few ops it costs as much as the rest of the evaluation. Big
  // schedules (a training step) are rarely left unchanged, and hashing them twice would
  // cost more than it saves.
  constexpr size_t kLookUpBeforeSimplify = 64;
  std::optional<Lookup> early;
  if (cache_plans && schedule.size() <= kLookUpBeforeSimplify && !simplify_disabled()) {
    std::unordered_set<Node*> outputs(outs.begin(), outs.end());
    early = look_up(schedule, outputs);
    if (early->confirmed == Confirmed::Same && early->fused.cached->unsimplified) {
      bump(g_replay.simplify_skipped);
      p.simplified.schedule = schedule;
      p.outputs = std::move(outputs);
      p.fused = finish_lookup(std::move(*early), schedule, p.outputs, true);
      return p;
    }
  }
  p.simplified = simplify(schedule, outs);
  for (Node* o : outs) {
    auto it = p.simplified.alias.find(o);
    p.outputs.insert(it == p.simplified.alias.end() ? o : it->second);
  }
  const SimplifyResult& sr = p.simplified;
  const bool unchanged = sr.merged + sr.folded + sr.identities + sr.removed == 0 &&
                         sr.alias.empty() && sr.created.empty() && sr.schedule == schedule;
  if (!cache_plans) {
    p.fused.plan = fuse_numbered(sr.schedule, p.outputs);
  } else if (early && unchanged) {
    // The lookup before simplify was of this very schedule.
    p.fused = finish_lookup(std::move(*early), sr.schedule, p.outputs, true);
  } else {
    p.fused = finish_lookup(look_up(sr.schedule, p.outputs), sr.schedule, p.outputs, unchanged);
  }
  return p;
}

// Lowers `group` into `launch`, its inputs recorded as positions (not ready yet: no kernel).
void lower_into(Launch& launch, const FusionGroup& group, const Positions& positions) {
  launch.lk = lower(group);
  launch.input_refs.clear();
  for (Node* n : launch.lk.input_nodes) launch.input_refs.push_back(positions.ref(n));
}

const LoweredKernel& launch_for(const FusionGroup& group, Launch* launch, LoweredKernel& scratch,
                                KernelHandle& kernel, const Positions* positions,
                                const std::vector<Node*>* schedule) {
  const bool cpu = !group.root->device.is_cuda();
  if (launch && launch->ready) {
    // A replayed launch: this evaluation's nodes at the positions the kernel reads.
    std::vector<Node*>& in = launch->lk.input_nodes;
    for (size_t k = 0; k < in.size(); ++k)
      in[k] = positions->node(*schedule, launch->input_refs[k]);
    kernel = launch->kernel;
    if (!launch->fresh) bump(g_replay.launches_replayed);
    launch->fresh = false;
    return launch->lk;
  }
  if (!launch) {
    scratch = lower(group);
    if (cpu) kernel = kernel_for(scratch.ir);
    return scratch;
  }
  lower_into(*launch, group, *positions);
  if (cpu) kernel = kernel_for(launch->lk.ir);
  launch->kernel = kernel;
  launch->ready = true;
  return launch->lk;
}

// Lowers every CPU kernel group whose launch is not ready and asks for their kernels in one
// batch (kernels_for compiles the missing ones in parallel), so a step's first evaluation
// does not wait for its new kernels one at a time. A group that fails here is left to
// run_group, which lowers and compiles it again when it runs and raises the error there,
// after the groups before it, as an unprepared evaluation would.
void prepare_launches(const FusionPlan& plan, CachedPlan& c, const Positions& p) {
  std::vector<Launch*> lowered;  // launches lowered here that still need their kernel
  std::vector<const KernelIR*> irs;
  for (const FusionGroup& g : plan.groups) {
    if (g.library || g.root->op == OpCode::Transfer || g.root->op == OpCode::Custom ||
        g.root->device.is_cuda())
      continue;
    Launch& launch = c.launches.at(static_cast<size_t>(g.index));
    if (launch.ready) continue;
    try {
      lower_into(launch, g, p);
    } catch (...) {
      continue;
    }
    lowered.push_back(&launch);
    irs.push_back(&launch.lk.ir);
  }
  if (lowered.empty()) return;
  std::vector<KernelHandle> handles;
  try {
    handles = kernels_for(irs);
  } catch (...) {
    return;
  }
  for (size_t k = 0; k < lowered.size(); ++k) {
    lowered[k]->kernel = handles[k];
    lowered[k]->ready = true;
    lowered[k]->fresh = true;
  }
}

void run_plan(const std::vector<Node*>& schedule, const std::vector<Node*>& requested) {
  Plan plan = make_plan(schedule, requested);
  const auto& groups = plan.fused.plan.groups;
  // KILN_DISABLE_REPLAY=1 lowers and looks up every kernel again, for bisecting.
  CachedPlan* cached = pass_disabled("REPLAY") ? nullptr : plan.fused.cached.get();
  if (cached) prepare_launches(plan.fused.plan, *cached, plan.fused.positions);
  const Positions* positions = &plan.fused.positions;
  const std::vector<Node*>* simplified = &plan.simplified.schedule;
  // A listener hears of each requested value once the kernel computing it (the root of
  // its group, or of its simplify representative's) has run.
  EvaluationListener* listener = evaluation_listener();
  std::unordered_map<Node*, std::vector<Node*>> announce;
  if (listener) {
    for (Node* r : requested) {
      auto it = plan.simplified.alias.find(r);
      announce[it == plan.simplified.alias.end() ? r : it->second].push_back(r);
    }
  }
  run_with_memory_plan(
      plan.fused.plan, plan.outputs, schedule, plan.simplified.schedule, [&](const FusionGroup& g) {
        // A fused rebuild's group (index -1) is lowered for its run: it has no launch.
        Launch* launch =
            cached && g.index >= 0 ? &cached->launches.at(static_cast<size_t>(g.index)) : nullptr;
        run_group(g, launch, positions, simplified);
        if (!listener) return;
        if (auto it = announce.find(g.root); it != announce.end() && g.root->buffer) {
          for (Node* r : it->second) listener->value_ready(*r, g.root->buffer);
          announce.erase(it);  // a rebuild of the same value is not news
        }
        listener->kernel_done();
      });
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

void set_plan_signature_bits_for_testing(int bits) {
  g_signature_bits.store(std::clamp(bits, 0, 64), std::memory_order_relaxed);
}

ReplayStats replay_stats() {
  auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  ReplayStats r;
  r.hits = get(g_replay.hits);
  r.misses = get(g_replay.misses);
  r.collisions = get(g_replay.collisions);
  r.hits_relowered = get(g_replay.hits_relowered);
  r.groups_relowered = get(g_replay.groups_relowered);
  r.launches_replayed = get(g_replay.launches_replayed);
  r.simplify_skipped = get(g_replay.simplify_skipped);
  r.missed_new_graph = get(g_replay.missed_new_graph);
  r.missed_dtype = get(g_replay.missed_dtype);
  r.missed_device = get(g_replay.missed_device);
  r.missed_broadcast = get(g_replay.missed_broadcast);
  r.missed_attributes = get(g_replay.missed_attributes);
  r.missed_roles = get(g_replay.missed_roles);
  r.missed_dropped = get(g_replay.missed_dropped);
  return r;
}

EvalStats last_eval_stats() {
  std::lock_guard lock(g_stats_mutex);
  return g_last_stats;
}

std::string plan_to_dot(const std::vector<Node*>& outputs) {
  std::vector<Node*> schedule = pending_subgraph(outputs);
  Plan plan = make_plan(schedule, outputs);
  const FusionPlan& fusion = plan.fused.plan;
  std::string dot =
      "digraph kiln_plan {\n  compound=true;\n  node [shape=box, fontname=\"monospace\"];\n";
  std::unordered_map<Node*, std::string> id;
  int cluster = 0;
  auto label = [](Node* n) {
    std::string l = std::string(op_name(n->op));
    if (n->origin && op_name(n->op) != n->origin) l += "\\n(" + std::string(n->origin) + ")";
    return l + "\\n" + shape_str(n->shape) + " " + std::string(dtype_name(n->dtype));
  };
  for (const FusionGroup& g : fusion.groups) {
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
  for (const FusionGroup& g : fusion.groups) {
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
