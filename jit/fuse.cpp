#include "fuse.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "../core/settings.h"
#include "../memory/pools/budget.h"
#include "kernel_ir.h"

namespace kiln::jit {
namespace {

// Rough per-element cost of computing a node inline, used only to decide whether a value
// shared by several consumers is cheaper to duplicate or to store.
int own_cost(const Node& n) {
  switch (n.op) {
    case OpCode::Full:
    case OpCode::Iota:
      return 0;  // literals and loop coordinates
    case OpCode::RandUniform:
    case OpCode::RandNormal:
      return 12;
    case OpCode::Exp:
    case OpCode::Exp2:
    case OpCode::Log:
    case OpCode::Log2:
    case OpCode::Log1p:
    case OpCode::Expm1:
    case OpCode::Sin:
    case OpCode::Cos:
    case OpCode::Tan:
    case OpCode::Tanh:
    case OpCode::Sigmoid:
    case OpCode::Erf:
    case OpCode::Pow:
      return 4;
    case OpCode::Div:
    case OpCode::Sqrt:
    case OpCode::Rsqrt:
    case OpCode::Reciprocal:
    case OpCode::FloorDiv:
    case OpCode::Mod:
      return 2;
    default:
      return 1;
  }
}

constexpr int kDuplicateBudget = 12;
constexpr int kMaxInlineDepth = 48;
// Stored values one kernel may read. Every one of them must be resident while the kernel
// runs, so a long sum of stored terms (gradient accumulation over an unrolled sequence)
// fused into one kernel would hold them all at once; cut, the terms die as they are added.
constexpr int kMaxKernelReads = 8;
// Inline cost from which a value read through a widening reindex (a broadcast) is stored
// instead: exp(x) feeding a matmul operand would otherwise be recomputed per output column.
constexpr int kBroadcastBudget = 4;
// Whether reduction `n` may run as a row stage inside its consumer's kernel at its sizes. A
// reduction over everything is a stage (one row, one thread) only while small; larger ones
// are split across threads by the executor's partials.
bool row_stage_shape(const Node& n) {
  const int kept = standard_reduction_kept(n);
  return kept > 0 || (kept == 0 && n.inputs[0]->numel() <= kSerialRowElements);
}

}  // namespace

uint64_t fusion_size_class(const Node& n) {
  // Any value may be the root of a one-row kernel, which it allows only while small.
  const uint64_t large = n.numel() > kSerialRowElements ? 4 : 0;
  if (n.op != OpCode::ReindexReduce) return large;
  return large | (1 + static_cast<uint64_t>(row_stage_shape(n)));
}

bool pass_disabled(const char* pass) {
  static std::mutex mutex;
  static std::unordered_map<std::string, bool> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(pass);
  if (it != cache.end()) return it->second;
  const bool off = settings::flag("KILN_DISABLE_" + std::string(pass));
  cache.emplace(pass, off);
  return off;
}

bool StoreHints::stored(const Node& n) {
  if (n.store_hint == StoreHint::None || n.store_hint == StoreHint::Always)
    return n.store_hint == StoreHint::Always;
  bool budgeted = false;
  auto known = std::find_if(budgeted_.begin(), budgeted_.end(),
                            [&](const auto& entry) { return entry.first == n.device; });
  if (known != budgeted_.end()) {
    budgeted = known->second;
  } else {
    budgeted = memory::budget(n.device) > 0;
    budgeted_.emplace_back(n.device, budgeted);
  }
  return n.store_hint == StoreHint::Budgeted ? budgeted : !budgeted;
}

FusionPlan fuse(const std::vector<Node*>& schedule, const std::unordered_set<Node*>& outputs) {
  const bool no_fusion = pass_disabled("FUSION");
  const bool regenerate = !pass_disabled("REGENERATE");
  StoreHints hints;
  std::unordered_map<Node*, int> consumers;
  std::unordered_set<Node*> forced;                // must be materialized whatever its cost
  std::unordered_map<Node*, int64_t> widest_read;  // largest consumer numel through a reindex
  for (Node* n : schedule) {
    for (size_t k = 0; k < n->inputs.size(); ++k) {
      Node* in = n->inputs[k].get();
      consumers[in]++;
      bool index_tensor = k > 0 && (n->op == OpCode::Reindex || n->op == OpCode::ReindexReduce);
      // A transfer copies a stored value, so what it reads is stored too; so does a user
      // kernel, which reads its inputs through plain pointers.
      if (index_tensor || n->op == OpCode::Transfer || n->op == OpCode::Custom) forced.insert(in);
      if (n->op == OpCode::Reindex && k == 0) {
        widest_read[in] = std::max(widest_read[in], n->numel());
      }
    }
  }

  auto single_use = [&](Node* n) { return consumers[n] == 1 && !outputs.count(n); };
  // conv2d's products first: a convolution call reads the image, so its patches and the
  // GEMMs over them are never made. The sums it computes inside (backward data's product)
  // are not stored on their own.
  std::unordered_map<Node*, ConvMatch> convs;  // by root
  std::unordered_set<Node*> conv_inner;
  std::unordered_set<Node*> conv_absorbed;
  // Consumers first: a forward that stores NCHW (a permute of the product) takes the
  // product in, rather than the product matching alone.
  if (!no_fusion && !pass_disabled("LIBRARY") && !pass_disabled("CONV")) {
    for (auto it = schedule.rbegin(); it != schedule.rend(); ++it) {
      Node* n = *it;
      ConvMatch m;
      if ((n->op == OpCode::ReindexReduce || n->op == OpCode::Reindex || n->op == OpCode::Add) &&
          !conv_absorbed.count(n) && match_conv(n, single_use, &m)) {
        for (Node* x : m.absorbed) {
          conv_absorbed.insert(x);
          if (x->op == OpCode::ReindexReduce) conv_inner.insert(x);
        }
        forced.insert(m.a);
        forced.insert(m.b);
        if (m.bias) forced.insert(m.bias);
        convs[n] = m;
      }
    }
  }
  std::unordered_map<Node*, GemmMatch> gemms;
  std::unordered_set<Node*> absorbed;
  if (!no_fusion && !pass_disabled("LIBRARY")) {
    for (Node* n : schedule) {
      GemmMatch m;
      if (n->op == OpCode::ReindexReduce && !convs.count(n) && !conv_inner.count(n) &&
          match_gemm(n, single_use, &m)) {
        for (Node* x : m.absorbed) absorbed.insert(x);
        // The library reads buffers, so its operands are stored whatever they cost.
        forced.insert(m.a);
        forced.insert(m.b);
        gemms[n] = m;
      }
    }
  }
  // add(P, product) with P stored anyway (an earlier product or accumulation, or an
  // evaluated tensor) runs as the product added into P: gradient sums over many steps then
  // hold one running total instead of 8 live terms per fused sum.
  std::unordered_map<Node*, GemmMatch> accumulations;  // by the add
  std::unordered_set<Node*> accumulated;  // products absorbed into an add or a rounding
  // A product still free to be absorbed (by an add below, or by a rounding).
  auto gemm_of = [&](Node* n) -> const GemmMatch* {
    auto it = gemms.find(n);
    return it == gemms.end() || accumulated.count(n) ? nullptr : &it->second;
  };
  if (!no_fusion && !pass_disabled("LIBRARY") && !pass_disabled("ACCUMULATE")) {
    auto stored = [&](Node* n) {
      return n->is_evaluated() || (gemms.count(n) && !accumulated.count(n)) ||
             accumulations.count(n);
    };
    for (Node* n : schedule) {
      GemmMatch m;
      if (match_accumulate(n, single_use, gemm_of, stored, &m)) {
        accumulated.insert(m.reduce);
        forced.insert(n);
        accumulations[n] = m;
      }
    }
  }
  // cast(product, half) of half operands: the library stores the rounded result, and the
  // float32 product never exists (an autocast layer keeps and passes on half the bytes).
  std::unordered_map<Node*, GemmMatch> roundings;  // by the cast
  if (!no_fusion && !pass_disabled("LIBRARY") && !pass_disabled("ROUNDING")) {
    for (Node* n : schedule) {
      GemmMatch m;
      if (match_rounding(n, single_use, gemm_of, &m)) {
        accumulated.insert(m.reduce);  // absorbed into the cast's group, as into an add's
        forced.insert(n);
        roundings[n] = m;
      }
    }
  }

  // Reductions that may run as row stages of the one kernel that reads them (softmax's
  // max and sum inside the kernel that writes its output): not stored, unless the groups
  // built below put one in several kernels or lowering cannot make it a stage.
  std::unordered_set<Node*> row_candidates;
  if (!no_fusion && !pass_disabled("ROWS"))
    for (Node* n : schedule)
      if (n->op == OpCode::ReindexReduce && !outputs.count(n) && !forced.count(n) &&
          !gemms.count(n) && !accumulated.count(n) && !convs.count(n) && !conv_inner.count(n) &&
          row_stage_shape(*n))
        row_candidates.insert(n);
  std::unordered_set<Node*> stored_rows;  // candidates a check below sent back to storage

  for (;;) {
    std::unordered_map<Node*, int> cost;   // inline cost; 0 once materialized
    std::unordered_map<Node*, int> depth;  // longest inlined chain below the node
    std::unordered_map<Node*, int> reads;  // stored values the inlined tree below reads
    // Inlined values that read no stored value but scalars: computed from sources alone.
    std::unordered_set<Node*> from_sources;
    std::unordered_set<Node*> materialized;
    // Inlined values that read a row stage: they are computed per row (their coordinates
    // are the kernel's rows), so a broadcast along the row does not repeat their work.
    std::unordered_set<Node*> per_row;
    for (Node* n : schedule) {
      int c = own_cost(*n);
      int dep = 1, r = 0;
      bool reads_stage = false, sources_only = true;
      for (const NodePtr& in : n->inputs) {
        if (!in->is_evaluated() && !materialized.count(in.get())) {
          reads_stage = reads_stage || per_row.count(in.get());
          c += cost[in.get()];
          dep = std::max(dep, depth[in.get()] + 1);
          r += reads[in.get()];
          sources_only = sources_only && from_sources.count(in.get());
        } else {
          ++r;
          // A stored scalar (a probability evaluated in an earlier step) keeps nothing alive.
          sources_only = sources_only && in->numel() <= 1;
        }
      }
      depth[n] = dep;
      reads[n] = r;
      const bool row_stage = row_candidates.count(n) && !stored_rows.count(n);
      // A row stage's total is computed once per row: per element it costs nothing.
      if (row_stage) c = 0;
      bool keep = no_fusion || outputs.count(n) || forced.count(n) || hints.stored(*n) ||
                  convs.count(n) ||
                  (n->op == OpCode::ReindexReduce && !accumulated.count(n) && !row_stage &&
                   !conv_inner.count(n)) ||
                  n->op == OpCode::Transfer || n->op == OpCode::Custom;
      // Long chains are cut into kernels of bounded depth: lowering walks them recursively
      // and one huge expression compiles slowly.
      if (!keep && dep >= kMaxInlineDepth) keep = true;
      if (!keep && r > kMaxKernelReads && op_family(n->op) == OpFamily::Elementwise) keep = true;
      // Shared and costly: store once instead of recomputing per consumer. A value that
      // reads no buffer but scalars (a dropout mask: a draw compared with a probability) is
      // the exception: stored, it would be kept from the forward kernel to the backward one,
      // bytes per element for the whole step, where regenerating it from its counters costs
      // each reader a few operations per element and gives the same bits.
      const bool regenerated = regenerate && sources_only;
      if (!keep && consumers[n] > 1 && c > kDuplicateBudget && !regenerated) keep = true;
      // Read through a broadcast that multiplies the work (matmul operands): store it.
      if (row_stage || (reads_stage && op_family(n->op) == OpFamily::Elementwise))
        per_row.insert(n);
      if (!keep && c >= kBroadcastBudget && widest_read.count(n) && !per_row.count(n) &&
          widest_read[n] > 2 * std::max<int64_t>(n->numel(), 1))
        keep = true;
      if (keep) {
        materialized.insert(n);
        cost[n] = 0;
        depth[n] = 0;
        reads[n] = 0;
      } else {
        cost[n] = c;
        if (sources_only) from_sources.insert(n);
      }
    }

    FusionPlan plan;
    for (Node* root : schedule) {
      if (!materialized.count(root)) continue;
      FusionGroup g;
      g.root = root;
      // A GEMM absorbed into the add or the cast that roots the group.
      const GemmMatch* absorbing = nullptr;
      if (auto it = accumulations.find(root); it != accumulations.end()) absorbing = &it->second;
      if (auto it = roundings.find(root); it != roundings.end()) absorbing = &it->second;
      if (absorbing) {
        const GemmMatch& m = *absorbing;
        g.library = true;
        g.gemm = m;
        g.members = m.absorbed;
        g.members.push_back(m.reduce);
        g.members.push_back(root);
        for (Node* in : {m.a, m.b, m.accumulate})
          if (in && std::find(g.inputs.begin(), g.inputs.end(), in) == g.inputs.end())
            g.inputs.push_back(in);
        plan.groups.push_back(std::move(g));
        continue;
      }
      if (auto cv = convs.find(root); cv != convs.end()) {
        g.library = true;
        g.conv = cv->second;
        g.members = cv->second.absorbed;
        g.members.push_back(root);
        for (Node* in : {cv->second.a, cv->second.b, cv->second.bias})
          if (in && std::find(g.inputs.begin(), g.inputs.end(), in) == g.inputs.end())
            g.inputs.push_back(in);
        plan.groups.push_back(std::move(g));
        continue;
      }
      auto gm = gemms.find(root);
      if (gm != gemms.end()) {
        g.library = true;
        g.gemm = gm->second;
        g.members = gm->second.absorbed;
        g.members.push_back(root);
        for (Node* in : {gm->second.a, gm->second.b})
          if (std::find(g.inputs.begin(), g.inputs.end(), in) == g.inputs.end())
            g.inputs.push_back(in);
        plan.groups.push_back(std::move(g));
        continue;
      }
      std::unordered_set<Node*> seen{root};
      std::unordered_set<Node*> input_seen;
      // Collect the inline tree (post-order so members are inputs-first).
      std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
      while (!stack.empty()) {
        auto& [n, next] = stack.back();
        if (next < n->inputs.size()) {
          Node* in = n->inputs[next++].get();
          if (in->is_evaluated() || materialized.count(in)) {
            if (input_seen.insert(in).second) g.inputs.push_back(in);
          } else if (seen.insert(in).second) {
            stack.push_back({in, 0});
          }
        } else {
          g.members.push_back(n);
          stack.pop_back();
        }
      }
      plan.groups.push_back(std::move(g));
    }
    if (row_candidates.empty()) return plan;
    // A row stage must sit in exactly one kernel (else each would reduce again) and lower as
    // a stage of it; the others are stored and the plan is made again.
    const size_t before = stored_rows.size();
    std::unordered_map<Node*, int> kernels_of;
    for (const FusionGroup& g : plan.groups)
      for (Node* m : g.members)
        if (m != g.root && row_candidates.count(m) && !stored_rows.count(m)) ++kernels_of[m];
    for (const auto& [m, k] : kernels_of)
      if (k > 1) stored_rows.insert(m);
    if (stored_rows.size() == before) {
      for (const FusionGroup& g : plan.groups) {
        if (g.library) continue;
        bool has_stage = false;
        for (Node* m : g.members) has_stage = has_stage || (m != g.root && kernels_of.count(m));
        if (!has_stage) continue;
        try {
          (void)lower(g);
        } catch (const RowsUnsupported& e) {
          if (e.reduction != g.root && kernels_of.count(e.reduction)) {
            stored_rows.insert(e.reduction);
          } else {
            for (Node* m : g.members)
              if (m != g.root && kernels_of.count(m)) stored_rows.insert(m);
          }
        }
      }
    }
    if (stored_rows.size() == before) return plan;
  }
}

}  // namespace kiln::jit
