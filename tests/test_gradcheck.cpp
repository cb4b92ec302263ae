// The gradient check of every differentiable op: the cases of tests/op_harness.h, each on
// random float64 inputs and at its edges, against central differences on the reference
// executor (tolerance |analytic - numeric| <= tol (1 + |numeric|), tol 1e-6 unless a case
// says otherwise, step 1e-6), or against PyTorch's convention at a kink. Then: every public
// op and every meta-op has a case, the JIT computes the same gradients as the reference, and
// one regression test per class of gradient kiln once got wrong.
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "op_harness.h"

using namespace kiln;
using kiln::test::GradCase;

namespace {

const GradCase& find_case(const std::string& name) {
  for (const GradCase& c : kiln::test::grad_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no gradient case named " + name);
}

// Every failure of case `c`: random inputs (two seeds) and each edge.
std::vector<std::string> failures(const GradCase& c) {
  std::vector<std::string> out;
  for (uint64_t seed : {1u, 2u}) {
    if (!c.random) break;
    if (std::string m = kiln::test::check_random(c, seed); !m.empty()) out.push_back(m);
  }
  for (const kiln::test::GradEdge& e : c.edges)
    if (std::string m = kiln::test::check_edge(c, e); !m.empty()) out.push_back(m);
  return out;
}

void require_case(const std::string& name) {
  const GradCase& c = find_case(name);
  for (const std::string& m : failures(c)) FAIL_CHECK(m);
}

// The functions a header declares at namespace scope (outside namespace detail), as
// `Tensor name(` or `std::vector<Tensor> name(` at the start of a line.
std::set<std::string> declared_ops(const std::string& header) {
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/" + header);
  REQUIRE(in.good());
  static const std::regex decl(
      R"(^(?:inline )?(?:Tensor|std::vector<Tensor>|ValuesIndices) ([a-z_0-9]+)\()");
  std::set<std::string> names;
  std::string line;
  bool in_detail = false;
  while (std::getline(in, line)) {
    if (line.rfind("namespace detail", 0) == 0) in_detail = true;
    if (line.find("// namespace detail") != std::string::npos) in_detail = false;
    std::smatch m;
    if (!in_detail && std::regex_search(line, m, decl)) names.insert(m[1]);
  }
  return names;
}

// The meta-ops of the graph that computes `y` (before evaluation: every node is there).
void collect_ops(const Node* n, std::set<std::string>& ops, std::set<const Node*>& seen) {
  if (!seen.insert(n).second) return;
  ops.insert(std::string(op_name(n->op)));
  if (n->op == OpCode::ReindexReduce)
    ops.insert("reindex_reduce:" + std::string(reduce_name(n->reduce)));
  for (const NodePtr& in : n->inputs) collect_ops(in.get(), ops, seen);
}

}  // namespace

TEST_CASE("every differentiable op matches float64 central differences, edges included",
          "[gradcheck]") {
  size_t checked = 0;
  for (const GradCase& c : kiln::test::grad_cases()) {
    INFO(c.name);
    for (const std::string& m : failures(c)) FAIL_CHECK(m);
    checked += (c.random ? 2 : 0) + c.edges.size();
  }
  CHECK(checked > 300);
}

TEST_CASE("every public op and every meta-op has a gradient case or a stated exemption",
          "[gradcheck]") {
  const auto& cases = kiln::test::grad_cases();
  const auto& exempt = kiln::test::grad_exempt_ops();
  std::set<std::string> names, covered;
  for (const GradCase& c : cases) {
    INFO(c.name);
    CHECK(names.insert(c.name).second);  // unique
    covered.insert(c.op);
  }
  std::set<std::string> declared;
  for (const char* h :
       {"ops/elementwise.h", "ops/reduce_ops.h", "ops/shape_ops.h", "ops/linalg.h", "ops/reindex.h",
        "ops/transfer.h", "ops/selection.h", "frontend/nn/functional.h", "frontend/nn/loss.h",
        "frontend/nn/flash_attention.h"}) {
    std::set<std::string> d = declared_ops(h);
    declared.insert(d.begin(), d.end());
  }
  CHECK(declared.size() > 100);
  for (const std::string& op : declared) {
    INFO("public op " << op);
    CHECK((covered.count(op) + exempt.count(op)) == 1);  // a case, or an exemption, not both
  }
  for (const std::string& op : covered) {
    INFO("a case names " << op << ", which no header declares");
    CHECK(declared.count(op) == 1);
  }

  // Meta-ops, from the op table itself: a new op cannot be added without a case.
  std::set<std::string> used;
  std::set<const Node*> seen;
  std::vector<Tensor> keep;  // graphs stay alive (and their nodes distinct) until the walk ends
  for (const GradCase& c : cases) {
    std::vector<Tensor> xs;
    for (const kiln::test::GradInput& in : c.inputs) {
      xs.push_back(zeros(in.shape, DType::Float64));
      xs.back().requires_grad_();
    }
    keep.push_back(c.fn(xs));
    collect_ops(keep.back().node().get(), used, seen);
  }
  // Meta-ops share the public ops' exemptions (the comparisons, logic and bit ops), plus the
  // device copy, which needs a second device.
  auto meta_exempt = [](const std::string& op) {
    return op == "to_device" || kiln::test::grad_exempt_ops().count(op) > 0;
  };
  std::vector<std::string> wanted;
#define KILN_X(id, name, family, arity) \
  if (OpFamily::family != OpFamily::Source) wanted.push_back(name);
  KILN_META_OPS(KILN_X)
#undef KILN_X
  for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min})
    wanted.push_back("reindex_reduce:" + std::string(reduce_name(r)));
  for (const std::string& op : wanted) {
    if (meta_exempt(op)) continue;
    INFO("meta-op " << op << " appears in no gradient case");
    CHECK(used.count(op) == 1);
  }
}

TEST_CASE("the JIT computes the gradients the reference evaluator does", "[gradcheck][jit]") {
  for (const GradCase& c : kiln::test::grad_cases()) {
    if (!c.random) continue;
    INFO(c.name);
    auto [v, w] = kiln::test::grad_inputs(c, 3);
    std::vector<std::vector<double>> ref, jit;
    {
      kiln::test::ExecutorScope scope("reference");
      ref = kiln::test::analytic_gradient(c, v, w);
    }
    jit = kiln::test::analytic_gradient(c, v, w);
    for (size_t i = 0; i < ref.size(); ++i)
      for (size_t k = 0; k < ref[i].size(); ++k) {
        if (!kiln::test::close(jit[i][k], ref[i][k], {1e-9, 1e-12})) {
          FAIL_CHECK("input " << i << " element " << k << ": jit " << jit[i][k] << ", reference "
                              << ref[i][k]);
          break;
        }
      }
  }
}

// --- regressions: one per class of gradient that was wrong ---

TEST_CASE("prod's gradient at zeros is the product of the other elements, as torch.prod",
          "[gradcheck][autograd]") {
  for (const char* name :
       {"prod/axis", "prod/all", "prod/keepdim first axis", "prod/size-1 axis"}) {
    INFO(name);
    require_case(name);
  }
  // On the JIT as well: one zero and two zeros in a row, and no NaN anywhere.
  Tensor x = from_vector<double>({0, 2, 3, 0, 0, 4}, {2, 3});
  x.requires_grad_();
  std::vector<double> g = grad(sum(prod(x, 1)), {x})[0].to_vector<double>();
  CHECK(g == std::vector<double>{6, 0, 0, 0, 0, 0});
}

TEST_CASE(
    "std's gradient is 0 where the deviation is 0, and var and std follow torch at a zero divisor",
    "[gradcheck][autograd]") {
  for (const char* name : {"std/equal elements", "std/all equal", "std/size-1 axis biased",
                           "std/zero divisor", "std/size-1 unbiased", "var/all",
                           "var/size-1 axis biased", "var/zero divisor", "var/size-1 unbiased"}) {
    INFO(name);
    require_case(name);
  }
  Tensor x = from_vector<float>({2, 2, 2, 1, 2, 3}, {2, 3});
  x.requires_grad_();
  std::vector<float> g = grad(sum(kiln::std(x, 1)), {x})[0].to_vector<float>();
  CHECK(g == std::vector<float>{0, 0, 0, -0.5f, 0, 0.5f});
}

TEST_CASE("softmax and log_softmax of a row holding +inf are NaN, as torch, and logsumexp is inf",
          "[gradcheck][autograd]") {
  const double inf = std::numeric_limits<double>::infinity();
  for (const char* name : {"softmax/infinite rows", "log_softmax/infinite rows",
                           "softmax/last axis", "log_softmax/axis", "logsumexp/infinities"}) {
    INFO(name);
    require_case(name);
  }
  for (const char* executor : {"reference", "jit"}) {
    INFO(executor);
    kiln::test::ExecutorScope scope(executor);
    for (DType dtype : {DType::Float32, DType::Float64}) {
      // Rows: +inf with finite, all -inf, -inf with finite.
      Tensor x =
          cast(from_vector<double>({1, inf, 2, -inf, -inf, -inf, -inf, 0, 0}, {3, 3}), dtype);
      std::vector<double> p = softmax(x, 1).to_vector<double>();
      std::vector<double> lp = log_softmax(x, 1).to_vector<double>();
      for (int i = 0; i < 6; ++i) {
        CHECK(std::isnan(p[i]));
        CHECK(std::isnan(lp[i]));
      }
      CHECK(p[6] == 0);
      CHECK(p[7] == Approx(0.5));
      CHECK(lp[6] == -inf);
      CHECK(lp[7] == Approx(std::log(0.5)));
      std::vector<double> lse = logsumexp(x, 1).to_vector<double>();
      CHECK(lse[0] == inf);
      CHECK(lse[1] == -inf);
      CHECK(lse[2] == Approx(std::log(2.0)));
    }
  }
}

TEST_CASE("clamp passes the gradient to x on a bound, as torch.clamp", "[gradcheck][autograd]") {
  for (const char* name : {"clamp/scalars", "clamp/tensors"}) {
    INFO(name);
    require_case(name);
  }
  Tensor x = from_vector<float>({-1, 1, -2, 2, 0});
  x.requires_grad_();
  CHECK(grad(sum(clamp(x, -1.0, 1.0)), {x})[0].to_vector<float>() ==
        std::vector<float>{1, 1, 0, 0, 1});
}

TEST_CASE(
    "maximum and minimum pass the gradient to both sides of a NaN, and a NaN maximum takes it",
    "[gradcheck][autograd]") {
  for (const char* name : {"maximum", "minimum", "max/ties"}) {
    INFO(name);
    require_case(name);
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = from_vector<double>({1, nan, 2, nan, nan, 0}, {2, 3});
  x.requires_grad_();
  CHECK(grad(sum(max(x, {1})), {x})[0].to_vector<double>() ==
        std::vector<double>{0, 1, 0, 0.5, 0.5, 0});
}

TEST_CASE("binary_cross_entropy_with_logits has the derivative sigmoid(0) - target at a zero logit",
          "[gradcheck][autograd]") {
  for (const char* name :
       {"binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits/weights"}) {
    INFO(name);
    require_case(name);
  }
  Tensor x = from_vector<float>({0, 0, 0});
  x.requires_grad_();
  Tensor y = from_vector<float>({0, 1, 0.25f});
  std::vector<float> g =
      grad(nn::binary_cross_entropy_with_logits(x, y, {.reduction = nn::Reduction::Sum}), {x})[0]
          .to_vector<float>();
  CHECK(g == std::vector<float>{0.5f, -0.5f, 0.25f});
}
