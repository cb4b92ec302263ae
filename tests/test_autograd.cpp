// Autograd semantics: accumulation, tied weights, intermediate values, second derivatives,
// no_grad, detach, assign, and the errors a user meets. The gradient check of every op is
// tests/test_gradcheck.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "frontend/kiln.h"
#include "jit/blas.h"
#include "jit/library_gemm.h"
#include "op_harness.h"

using namespace kiln;
using kiln::test::ExecutorScope;

// The gradient check of every op (float64 central differences over one registry of op
// cases) is tests/test_gradcheck.cpp.

TEST_CASE("cast passes gradients back in the input's dtype", "[autograd]") {
  // Central differences cannot see through float32 rounding, so this rule is checked exactly.
  Tensor x = from_vector<double>({0.25, -1.5}).requires_grad_();
  Tensor y = sum(cast(x, DType::Float32) * 3.0f);
  Tensor g = grad(y, {x})[0];
  REQUIRE(g.dtype() == DType::Float64);
  REQUIRE(g.to_vector<double>() == std::vector<double>{3.0, 3.0});
  REQUIRE_FALSE(cast(x, DType::Int32).requires_grad());
}

TEST_CASE("JIT and reference executors give the same gradients", "[autograd]") {
  manual_seed(7);
  Tensor x = randn({16, 8}, DType::Float32);
  Tensor w1 = (randn({8, 32}) * 0.3).eval().detach();
  Tensor w2 = (randn({32, 4}) * 0.3).eval().detach();
  w1.requires_grad_();
  w2.requires_grad_();
  auto run = [&] {
    Tensor loss = mean(square(matmul(relu(matmul(x, w1)), w2)));
    std::vector<Tensor> g = grad(loss, {w1, w2});
    return std::make_pair(g[0].to_vector<double>(), g[1].to_vector<double>());
  };
  auto jit = run();
  std::pair<std::vector<double>, std::vector<double>> ref;
  {
    ExecutorScope scope("reference");
    ref = run();
  }
  for (size_t i = 0; i < jit.first.size(); ++i)
    REQUIRE(jit.first[i] == Approx(ref.first[i]).margin(1e-5));
  for (size_t i = 0; i < jit.second.size(); ++i)
    REQUIRE(jit.second[i] == Approx(ref.second[i]).margin(1e-5));
}

TEST_CASE("backward accumulates into leaves and tied weights get summed gradients", "[autograd]") {
  Tensor w = from_vector<double>({1.5, -2.0, 0.5}).requires_grad_();
  Tensor x = from_vector<double>({2.0, 3.0, -1.0});
  // w is used twice: d/dw sum(w*x + w*w) = x + 2w.
  Tensor loss = sum(w * x + w * w);
  loss.backward();
  std::vector<double> g = w.grad().to_vector<double>();
  REQUIRE(g == std::vector<double>{2.0 + 3.0, 3.0 - 4.0, -1.0 + 1.0});
  // A second backward adds (gradient accumulation over micro-batches).
  sum(w * 2.0).backward();
  REQUIRE(w.grad().to_vector<double>() == std::vector<double>{7.0, 1.0, 2.0});
  w.set_grad(Tensor());
  REQUIRE_FALSE(w.grad().defined());
}

TEST_CASE("gradients of disjoint slices are joined, not summed as padded terms", "[autograd]") {
  // An RNN reads its input one step slice at a time. The slices' gradients are disjoint
  // pieces of the input's: joined with zeros between them (a tree of concats) they take
  // log8(T) passes; summed as padded full-size terms they took T/8. Values: the hand-derived
  // gradient of sum_t w_t * x[t] over the steps read, exactly; 0 on the steps never read.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  const int64_t steps = 70, rows = 3, cols = 5;
  std::vector<double> xv(static_cast<size_t>(steps * rows * cols)), wv(xv.size());
  for (double& v : xv) v = u(rng);
  for (double& v : wv) v = u(rng);
  Tensor x = from_vector<double>(xv, {steps, rows, cols}).requires_grad_();
  Tensor w = from_vector<double>(wv, {steps, rows, cols});
  std::vector<bool> read(static_cast<size_t>(steps), false);
  Tensor loss;
  for (int64_t t = 0; t < steps; ++t) {
    if (t % 7 == 3 || t == 40 || t == 41) continue;  // gaps, one of two steps
    read[static_cast<size_t>(t)] = true;
    Tensor term = sum(squeeze(slice(x, 0, t, t + 1), 0) * squeeze(slice(w, 0, t, t + 1), 0));
    loss = loss.defined() ? loss + term : term;
  }
  Tensor gx = grad(loss, {x})[0];
  // Joined: the gradient is a selection, not a chain of additions of padded terms.
  CHECK(gx.node()->op != OpCode::Add);
  const std::vector<double> got = gx.to_vector<double>();
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t k = 0; k < rows * cols; ++k) {
      const auto at = static_cast<size_t>(t * rows * cols + k);
      INFO("step " << t << ", element " << k);
      REQUIRE(got[at] == (read[static_cast<size_t>(t)] ? wv[at] : 0.0));
    }

  // Slices that overlap, or that differ along two axes, are summed as before.
  Tensor y = from_vector<double>(std::vector<double>(xv.begin(), xv.begin() + 20), {4, 5})
                 .requires_grad_();
  Tensor overlap = sum(slice(y, 0, 0, 3)) + sum(slice(y, 0, 2, 4) * 2.0);
  CHECK(grad(overlap, {y})[0].to_vector<double>() ==
        std::vector<double>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2});
  Tensor corners = sum(slice(slice(y, 0, 0, 2), 1, 0, 2)) + sum(slice(y, 1, 3, 5) * 2.0);
  CHECK(grad(corners, {y})[0].to_vector<double>() ==
        std::vector<double>{1, 1, 0, 2, 2, 1, 1, 0, 2, 2, 0, 0, 0, 2, 2, 0, 0, 0, 2, 2});
}

TEST_CASE("gradients with respect to an intermediate value and seeded outputs", "[autograd]") {
  Tensor x = from_vector<double>({1.0, 2.0, 3.0}).requires_grad_();
  Tensor h = x * 2.0;
  Tensor y = h * h;  // dy/dh = 2h
  std::vector<Tensor> g = grad(y, {h, x}, from_vector<double>({1.0, 0.5, -1.0}));
  REQUIRE(g[0].to_vector<double>() == std::vector<double>{4.0, 4.0, -12.0});
  REQUIRE(g[1].to_vector<double>() == std::vector<double>{8.0, 8.0, -24.0});
}

TEST_CASE("second derivatives through create_graph", "[autograd]") {
  Tensor x = from_vector<double>({0.5, -1.0}).requires_grad_();
  Tensor y = sum(x * x * x);
  Tensor dx = grad(y, {x}, Tensor(), false, true)[0];  // 3x^2
  Tensor ddx = grad(sum(dx), {x})[0];                  // 6x
  REQUIRE(dx.to_vector<double>() == std::vector<double>{0.75, 3.0});
  REQUIRE(ddx.to_vector<double>() == std::vector<double>{3.0, -6.0});
}

TEST_CASE("second derivatives through softmax", "[autograd]") {
  // f(x) = sum(softmax(x) * c), f'(x) = p * (c - sum(c * p)). The rule that skips the
  // softmax's inner nodes must still build a differentiable graph (create_graph).
  Tensor x = from_vector<double>({0.3, -1.2, 2.0, 0.7}).requires_grad_();
  Tensor c = from_vector<double>({1.5, -0.5, 0.25, 2.0});
  Tensor dx = grad(sum(softmax(x, 0) * c), {x}, Tensor(), false, true)[0];
  Tensor ddx = grad(sum(dx * c), {x})[0];
  // Hand-derived: with g = c, d/dx_j sum_i c_i p_i (c_i - m), m = sum_k c_k p_k, is
  // p_j (c_j^2 - 2 m c_j) - p_j (sum_i c_i^2 p_i - 2 m^2).
  std::vector<double> xv{0.3, -1.2, 2.0, 0.7}, cv{1.5, -0.5, 0.25, 2.0}, p(4);
  double z = 0, m = 0, q = 0;
  for (int i = 0; i < 4; ++i) z += std::exp(xv[i]);
  for (int i = 0; i < 4; ++i) p[i] = std::exp(xv[i]) / z, m += cv[i] * p[i];
  for (int i = 0; i < 4; ++i) q += cv[i] * cv[i] * p[i];
  std::vector<double> got_dx = dx.to_vector<double>(), got_ddx = ddx.to_vector<double>();
  for (int j = 0; j < 4; ++j) {
    INFO("element " << j);
    CHECK(got_dx[j] == Approx(p[j] * (cv[j] - m)).epsilon(1e-12));
    CHECK(got_ddx[j] ==
          Approx(p[j] * (cv[j] * cv[j] - 2 * m * cv[j]) - p[j] * (q - 2 * m * m)).epsilon(1e-10));
  }
}

namespace {

// The values of the forward graph of `loss` that the graph of `grads` reads directly.
std::unordered_set<const Node*> backward_reads(const Tensor& loss,
                                               const std::vector<Tensor>& grads) {
  std::vector<Node*> forward_nodes = pending_subgraph({loss.node().get()});
  std::unordered_set<const Node*> forward(forward_nodes.begin(), forward_nodes.end());
  std::vector<Node*> roots;
  for (const Tensor& g : grads) roots.push_back(g.node().get());
  std::unordered_set<const Node*> reads;
  for (Node* n : pending_subgraph(roots)) {
    if (forward.count(n)) continue;
    for (const NodePtr& in : n->inputs)
      if (forward.count(in.get())) reads.insert(in.get());
  }
  return reads;
}

// Whether `target` is `n` or one of its inputs, transitively.
bool depends_on(const Node* n, const Node* target) {
  std::vector<const Node*> stack{n};
  std::unordered_set<const Node*> seen{n};
  while (!stack.empty()) {
    const Node* m = stack.back();
    stack.pop_back();
    if (m == target) return true;
    for (const NodePtr& in : m->inputs)
      if (seen.insert(in.get()).second) stack.push_back(in.get());
  }
  return false;
}

}  // namespace

TEST_CASE("relu and softmax gradients read their outputs, not their inputs", "[autograd]") {
  // So a training step keeps one value per relu or softmax for the backward pass, as
  // PyTorch does, and not the pre-activation or the scores as well.
  Generator gen(5);
  Tensor x = randn({8, 16}, DType::Float32, gen).eval();
  Tensor w = randn({16, 16}, DType::Float32, gen).requires_grad_();
  w.eval();
  Tensor t = randn({8, 16}, DType::Float32, gen).eval();
  Tensor pre = matmul(x, w);
  Tensor h = relu(pre);
  Tensor loss = sum(h * t);
  std::unordered_set<const Node*> reads = backward_reads(loss, grad(loss, {w}));
  CHECK(reads.count(h.node().get()) == 1);
  // Besides h, only what the product reads (views of x): nothing computed from pre.
  for (const Node* n : reads) CHECK((n == h.node().get() || !depends_on(n, pre.node().get())));

  Tensor scores = matmul(x, w);
  Tensor p = softmax(scores * 0.5f, -1);
  Tensor loss2 = sum(p * t);
  reads = backward_reads(loss2, grad(loss2, {w}));
  CHECK(reads.count(p.node().get()) == 1);
  // Besides p, only constants and views of x: not the scores, exponentials or their sum.
  for (const Node* n : reads) CHECK((n == p.node().get() || !depends_on(n, scores.node().get())));
  // The values: dL/dscores = 0.5 * p * (t - sum(t * p)) against float64 by hand.
  std::vector<float> sv = scores.to_vector<float>(), tv = t.to_vector<float>();
  std::vector<double> dscores(sv.size());
  for (int r = 0; r < 8; ++r) {
    double zmax = -INFINITY, zsum = 0, m = 0;
    for (int j = 0; j < 16; ++j) zmax = std::max(zmax, 0.5 * sv[r * 16 + j]);
    std::vector<double> pr(16);
    for (int j = 0; j < 16; ++j) zsum += pr[j] = std::exp(0.5 * sv[r * 16 + j] - zmax);
    for (int j = 0; j < 16; ++j) m += tv[r * 16 + j] * (pr[j] /= zsum);
    for (int j = 0; j < 16; ++j) dscores[r * 16 + j] = 0.5 * pr[j] * (tv[r * 16 + j] - m);
  }
  std::vector<float> got =
      grad(sum(softmax(scores * 0.5f, -1) * t), {scores})[0].to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got[i] - dscores[i]) <= 1e-6 + 1e-5 * std::fabs(dscores[i]));
  }
}

TEST_CASE("softmax of float16 has the float64 gradient", "[autograd]") {
  // The rule works in the compute dtype (float32) and hands back a float16 gradient.
  Generator gen(6);
  Tensor x16 = cast(randn({3, 7}, DType::Float32, gen), DType::Float16).eval();
  x16.requires_grad_();
  Tensor w = randn({3, 7}, DType::Float32, gen).eval();
  Tensor g16 = grad(sum(cast(softmax(x16, -1), DType::Float32) * w), {x16})[0];
  REQUIRE(g16.dtype() == DType::Float16);
  std::vector<double> x = x16.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> got = g16.to_vector<double>();
  for (int r = 0; r < 3; ++r) {
    double z = 0, m = 0;
    std::vector<double> p(7);
    for (int j = 0; j < 7; ++j) z += std::exp(x[r * 7 + j]);
    for (int j = 0; j < 7; ++j) m += wv[r * 7 + j] * (p[j] = std::exp(x[r * 7 + j]) / z);
    for (int j = 0; j < 7; ++j) {
      const double want = p[j] * (wv[r * 7 + j] - m);
      INFO("row " << r << " column " << j);
      // float16 keeps 11 significant bits: about 5e-4 relative.
      CHECK(std::fabs(got[r * 7 + j] - want) <= 1e-3 * (1 + std::fabs(want)));
    }
  }
}

TEST_CASE("no_grad scopes and detach cut gradient flow", "[autograd]") {
  Tensor w = from_vector<float>({1, 2}).requires_grad_();
  Tensor a;
  {
    NoGradGuard guard;
    a = w * 3;
  }
  REQUIRE_FALSE(a.requires_grad());
  REQUIRE((w * 3).requires_grad());
  Tensor d = (w * 3).detach();
  REQUIRE_FALSE(d.requires_grad());
  REQUIRE(d.to_vector<float>() == std::vector<float>{3, 6});
  // Only the non-detached path contributes: d/dw sum(w*w.detach()) = w.
  Tensor loss = sum(w * w.detach());
  REQUIRE(grad(loss, {w})[0].to_vector<float>() == std::vector<float>{1, 2});
  // Integer results never require grad.
  REQUIRE_FALSE(argmax(w, 0).requires_grad());
}

TEST_CASE("a pending fill can be a leaf", "[autograd]") {
  Tensor a = ones({3});
  a.requires_grad_();
  sum(a * 2.0).backward();
  REQUIRE(a.grad().to_vector<float>() == std::vector<float>{2, 2, 2});
}

TEST_CASE("the reference evaluator keeps values evaluated by earlier calls", "[autograd]") {
  ExecutorScope reference("reference");
  Tensor u, v;
  {
    Tensor x = (randn({3}) * 2.0).eval();
    u = x + 1.0;
    v = x + 2.0;
  }
  std::vector<float> a = u.to_vector<float>(), b = v.to_vector<float>();
  for (size_t i = 0; i < 3; ++i) REQUIRE(b[i] - a[i] == Approx(1.0f));
}

TEST_CASE("evaluating the loss first keeps the graph for backward", "[autograd]") {
  Tensor w = from_vector<float>({0.5f, -1.5f}).requires_grad_();
  Tensor loss = sum(exp(w));
  REQUIRE(loss.item<float>() == Approx(std::exp(0.5f) + std::exp(-1.5f)));
  loss.backward();
  std::vector<float> g = w.grad().to_vector<float>();
  REQUIRE(g[0] == Approx(std::exp(0.5f)));
  REQUIRE(g[1] == Approx(std::exp(-1.5f)));
}

TEST_CASE("assign updates every copy and keeps training loops from growing the graph",
          "[autograd]") {
  manual_seed(3);
  Tensor w = (randn({4, 3}) * 0.5).eval().detach().requires_grad_();
  Tensor copy = w;  // an optimizer's copy of the parameter
  Tensor x = randn({8, 4}).eval();
  Tensor target = randn({8, 3}).eval();
  int64_t nodes_after_first = 0;
  float first_loss = 0, last_loss = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = mean(square(matmul(x, w) - target));
    loss.backward();
    {
      NoGradGuard no_grad;
      copy.assign(copy - 0.1 * copy.grad());
    }
    copy.set_grad(Tensor());
    float l = loss.item<float>();
    if (step == 0) first_loss = l;
    last_loss = l;
    if (step == 5) nodes_after_first = Node::live_count();
  }
  REQUIRE(w.node() == copy.node());
  Tensor plain = from_vector<float>(std::vector<float>(12, 1.0f), {4, 3});
  copy.assign(plain);
  REQUIRE_FALSE(plain.requires_grad());  // the value given stays what it was
  REQUIRE(copy.requires_grad());
  REQUIRE(w.is_leaf());
  REQUIRE(w.requires_grad());
  REQUIRE(last_loss < 0.7f * first_loss);
  REQUIRE(Node::live_count() <= nodes_after_first + 8);
}

TEST_CASE("autograd misuse raises typed errors", "[autograd][errors]") {
  Tensor w = from_vector<float>({1, 2, 3}).requires_grad_();
  Tensor x = from_vector<float>({1, 2, 3});
  SECTION("output that does not require grad") {
    REQUIRE_THROWS_WITH(sum(x).backward(), Catch::Contains("does not require grad") &&
                                               Catch::Contains("requires_grad_()"));
  }
  SECTION("backward through a non-differentiable op names it") {
    Tensor idx = argmax(w * 2, 0);
    REQUIRE_THROWS_AS(cast(idx, DType::Float32).backward(), ValueError);
    REQUIRE_THROWS_WITH(cast(idx, DType::Float32).backward(), Catch::Contains("argmax"));
  }
  SECTION("non-scalar output without a seed") {
    REQUIRE_THROWS_AS((w * 2).backward(), ShapeError);
    REQUIRE_THROWS_WITH((w * 2).backward(), Catch::Contains("not a scalar"));
  }
  SECTION("seed of the wrong shape") { REQUIRE_THROWS_AS((w * 2).backward(ones({2})), ShapeError); }
  SECTION("unused input") {
    Tensor v = from_vector<float>({1}).requires_grad_();
    REQUIRE_THROWS_WITH(grad(sum(w), {v}),
                        Catch::Contains("not used") && Catch::Contains("allow_unused"));
    REQUIRE_FALSE(grad(sum(w), {v}, Tensor(), true)[0].defined());
  }
  SECTION("integer tensors cannot require grad") {
    REQUIRE_THROWS_AS(from_vector<int64_t>({1, 2}).requires_grad_(), DTypeError);
  }
  SECTION("assign with a different shape or dtype") {
    REQUIRE_THROWS_AS(w.assign(zeros({4})), ShapeError);
    REQUIRE_THROWS_WITH(w.assign(zeros({3}, DType::Float64)), Catch::Contains("set_data"));
  }
  SECTION("set_grad with a mismatching gradient") {
    REQUIRE_THROWS_AS(w.set_grad(zeros({2})), ShapeError);
  }
}

TEST_CASE("matrix product gradients run as library GEMMs and match the reference",
          "[autograd][matmul]") {
  if (!jit::cpu_gemm_available(DType::Float32)) {
    WARN("skipped: kiln was built without a BLAS");
    return;
  }
  manual_seed(11);
  struct Case {
    Shape a, b;
    bool linear;
    size_t library_calls;
  };
  const Case cases[] = {
      {{6, 5}, {5, 7}, false, 3},          {{2, 6, 5}, {2, 5, 7}, false, 3},
      {{3, 1, 6, 5}, {2, 5, 7}, false, 3}, {{6, 5}, {7, 5}, true, 3},
      {{2, 3, 5}, {4, 5}, true, 3},
  };
  for (const Case& c : cases) {
    INFO("a " << shape_str(c.a) << " b " << shape_str(c.b) << (c.linear ? " linear" : " matmul"));
    Tensor a = randn(c.a).eval().requires_grad_();
    Tensor b = randn(c.b).eval().requires_grad_();
    auto run = [&] {
      Tensor y = c.linear ? linear(a, b) : matmul(a, b);
      Tensor w = cos(y.detach());  // fixed non-uniform weights
      std::vector<Tensor> g = grad(sum(y * w), {a, b});
      eval({g[0], g[1]});
      return std::make_pair(g[0].to_vector<double>(), g[1].to_vector<double>());
    };
    auto jit_result = run();
    REQUIRE(jit::last_eval_stats().library_calls == c.library_calls);
    std::pair<std::vector<double>, std::vector<double>> ref;
    {
      ExecutorScope scope("reference");
      ref = run();
    }
    for (size_t i = 0; i < ref.first.size(); ++i)
      REQUIRE(jit_result.first[i] == Approx(ref.first[i]).margin(1e-4));
    for (size_t i = 0; i < ref.second.size(); ++i)
      REQUIRE(jit_result.second[i] == Approx(ref.second[i]).margin(1e-4));
  }
}

TEST_CASE("products of reshaped, sliced and permuted operands still run on the library",
          "[autograd][matmul]") {
  if (!jit::cpu_gemm_available(DType::Float32)) {
    WARN("skipped: kiln was built without a BLAS");
    return;
  }
  manual_seed(12);
  Tensor x = randn({3, 4, 6}).eval().requires_grad_();
  Tensor w = randn({10, 6}).eval().requires_grad_();
  auto run = [&] {
    Tensor rows = reshape(x, {12, 6});                            // merged batch dims
    Tensor a = matmul(rows, transpose(slice(w, 0, 2, 9), 0, 1));  // [12, 7], sliced weight
    Tensor b = reshape(a, {3, 4, 7});
    Tensor c = matmul(permute(b, {1, 0, 2}), slice(w, 0, 3, 10));  // [4, 3, 7] @ [7, 6]
    Tensor loss = sum(c * cos(c.detach()));
    std::vector<Tensor> grads = grad(loss, {x, w});
    eval({grads[0], grads[1], loss});
    return std::make_tuple(loss.item<double>(), grads[0].to_vector<double>(),
                           grads[1].to_vector<double>());
  };
  auto jit_result = run();
  size_t library_calls = jit::last_eval_stats().library_calls;
  decltype(jit_result) ref;
  {
    ExecutorScope scope("reference");
    ref = run();
  }
  CHECK(library_calls >= 3);  // a sum over permuted batch dims stays a generated kernel
  REQUIRE(std::get<0>(jit_result) == Approx(std::get<0>(ref)).epsilon(1e-4));
  for (size_t i = 0; i < std::get<1>(ref).size(); ++i)
    REQUIRE(std::get<1>(jit_result)[i] == Approx(std::get<1>(ref)[i]).margin(1e-3));
  for (size_t i = 0; i < std::get<2>(ref).size(); ++i)
    REQUIRE(std::get<2>(jit_result)[i] == Approx(std::get<2>(ref)[i]).margin(1e-3));
}

TEST_CASE("a product with a zero fill runs on the library and keeps NaN where a factor has one",
          "[autograd][matmul][simplify]") {
  if (!jit::cpu_gemm_available(DType::Float32)) {
    WARN("skipped: kiln was built without a BLAS");
    return;
  }
  // An LSTM's first step: h0 = 0, gates = x W_ih^T + h0 W_hh^T; W_hh's gradient there is
  // g^T h0. Folded, the broadcast zero had hidden both products from the library (the
  // gradient's became a float64 scatter). 0 * inf is NaN, so nothing folds to zero: a NaN or
  // an infinity in W_hh or in g must reach the results as in PyTorch.
  manual_seed(13);
  Tensor w = randn({8, 5}).eval().requires_grad_();
  for (bool poison : {false, true}) {
    INFO((poison ? "an infinity in the weight" : "finite values"));
    Tensor x = randn({4, 5}).eval();
    if (poison) x = where(reshape(arange(20), {4, 5}) == 7, full({4, 5}, INFINITY), x).eval();
    auto run = [&] {
      Tensor h0 = reshape(slice(zeros({2, 4, 5}), 0, 0, 1), {4, 5});
      Tensor y = linear(h0, w) + linear(x, w);  // [4, 8]
      std::vector<Tensor> g = grad(sum(y * cos(y.detach() + 1.0f)), {w});
      eval({g[0], y});
      return std::make_pair(y.to_vector<double>(), g[0].to_vector<double>());
    };
    auto got = run();
    const jit::EvalStats stats = jit::last_eval_stats();
    CHECK(stats.library_calls >= 3);  // h0 W^T, x W^T and the weight's gradient terms
    decltype(got) want;
    {
      ExecutorScope scope("reference");
      want = run();
    }
    for (auto [a, b] : {std::make_pair(&got.first, &want.first), {&got.second, &want.second}}) {
      REQUIRE(a->size() == b->size());
      for (size_t i = 0; i < a->size(); ++i) {
        INFO("element " << i << ": " << (*a)[i] << " vs " << (*b)[i]);
        if (std::isnan((*b)[i]))
          CHECK(std::isnan((*a)[i]));
        else
          CHECK((*a)[i] == Approx((*b)[i]).margin(1e-4));
      }
    }
  }
}
