// The simplify pass and the structural key. Every case builds its graph twice from the same
// seed: one copy goes through simplify and the reference evaluator runs the rewritten
// schedule; the other is evaluated untouched. Values must agree bit for bit, with the same
// dtype and shape, whether or not a rule fired.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/structural_hash.h"
#include "frontend/kiln.h"
#include "jit/simplify.h"

using namespace kiln;
using kiln::jit::SimplifyResult;

namespace {

using Builder = std::function<std::vector<Tensor>(uint64_t seed)>;

std::vector<Node*> nodes_of(const std::vector<Tensor>& ts) {
  std::vector<Node*> out;
  for (const Tensor& t : ts) out.push_back(t.node().get());
  return out;
}

int count_op(const std::vector<Node*>& schedule, OpCode op) {
  int n = 0;
  for (Node* x : schedule) n += x->op == op;
  return n;
}

// The simplification of a graph, together with the graph's outputs so its nodes stay alive
// while a test inspects the schedule.
struct Outcome : SimplifyResult {
  std::vector<Tensor> graph;
};

// Builds the graph twice; simplifies and runs one copy, runs the other as is, and compares
// every output bit for bit. Returns the simplification of the first copy.
Outcome run_and_compare(const Builder& build, uint64_t seed = 7) {
  std::vector<Tensor> a = build(seed);
  std::vector<Tensor> b = build(seed);
  REQUIRE(a.size() == b.size());
  std::vector<Node*> outs_a = nodes_of(a), outs_b = nodes_of(b);

  Outcome r;
  std::vector<Node*> original = pending_subgraph(outs_a);
  static_cast<SimplifyResult&>(r) = jit::simplify(original, outs_a);
  r.graph = a;
  // The rewritten schedule is topological and holds only pending nodes.
  std::unordered_set<Node*> seen;
  for (Node* n : r.schedule) {
    REQUIRE_FALSE(n->is_evaluated());
    for (const NodePtr& in : n->inputs) REQUIRE((in->is_evaluated() || seen.count(in.get())));
    seen.insert(n);
  }
  reference_execute(r.schedule, jit::aliased_outputs(r, outs_a));
  // evaluate_nodes walks the schedule it passed in after the executor returns; nodes that
  // simplify cut loose must still be alive then (r.retained holds them).
  size_t done = 0;
  for (Node* n : original) done += n->is_evaluated();
  CHECK(done <= original.size());
  reference_execute(pending_subgraph(outs_b), outs_b);

  for (size_t k = 0; k < a.size(); ++k) {
    Node* got = outs_a[k];
    if (auto it = r.alias.find(got); it != r.alias.end()) got = it->second;
    const Node& want = *outs_b[k];
    INFO("output " << k);
    REQUIRE(got->dtype == want.dtype);
    REQUIRE(got->shape == want.shape);
    REQUIRE(got->buffer != nullptr);
    REQUIRE(want.buffer != nullptr);
    CHECK(std::memcmp(got->buffer->data(), want.buffer->data(), want.nbytes()) == 0);
  }
  return r;
}

Tensor rn(const Shape& shape, uint64_t seed, DType dtype = DType::Float32) {
  Generator gen(seed);
  return randn(shape, dtype, gen);
}

Tensor ri(const Shape& shape, uint64_t seed, DType dtype = DType::Int32) {
  Generator gen(seed);
  return cast(randint(-50, 50, shape, gen), dtype);
}

// A node built directly (builders skip some no-op nodes that other passes may still create).
Tensor raw_node(OpCode op, const std::vector<Tensor>& inputs, const Shape& shape, DType dtype) {
  std::vector<NodePtr> in;
  for (const Tensor& t : inputs) in.push_back(t.node());
  return Tensor(std::make_shared<Node>(op, std::move(in), shape, dtype, Device::cpu()));
}

struct EnvGuard {
  explicit EnvGuard(const char* value) { setenv("KILN_DISABLE_SIMPLIFY", value, 1); }
  ~EnvGuard() { unsetenv("KILN_DISABLE_SIMPLIFY"); }
};

}  // namespace

TEST_CASE("structural key ignores sizes but not structure", "[simplify]") {
  auto key_of = [](const Tensor& t, bool value) {
    std::unordered_map<Node*, uint64_t> keys;
    std::vector<Node*> sched = pending_subgraph({t.node().get()});
    auto k = [&](Node* n) {
      std::vector<uint64_t> in;
      for (const NodePtr& p : n->inputs) {
        auto it = keys.find(p.get());
        in.push_back(it != keys.end() ? it->second
                                      : (value ? node_value_key(*p, nullptr, 0) : node_key(*p, nullptr, 0)));
      }
      return value ? node_value_key(*n, in.data(), in.size()) : node_key(*n, in.data(), in.size());
    };
    for (Node* n : sched) keys[n] = k(n);
    return keys.at(t.node().get());
  };
  auto model = [](int64_t batch, bool relu_first) {
    Tensor x = from_vector(std::vector<float>(static_cast<size_t>(batch * 4), 1.0f), {batch, 4});
    Tensor w = from_vector(std::vector<float>(4, 0.5f), {1, 4});
    Tensor h = relu_first ? relu(x) * w : exp(x) * w;
    return sum(h + 1.0f, {1});
  };
  CHECK(key_of(model(8, true), false) == key_of(model(32, true), false));
  CHECK(key_of(model(8, true), false) != key_of(model(8, false), false));
  // A dimension of 1 broadcasts differently: a different kernel.
  CHECK(key_of(model(8, true), false) != key_of(model(1, true), false));
  // The value key sees sizes and which leaf is which.
  CHECK(key_of(model(8, true), true) != key_of(model(32, true), true));
  Tensor x = from_vector(std::vector<float>{1, 2, 3});
  CHECK(key_of(exp(x) + 1.0f, true) == key_of(exp(x) + 1.0f, true));
  Tensor y = from_vector(std::vector<float>{1, 2, 3});
  CHECK(key_of(exp(x) + 1.0f, true) != key_of(exp(y) + 1.0f, true));
  CHECK(key_of(exp(x) + 1.0f, false) == key_of(exp(y) + 1.0f, false));
  // Attributes count: fill values, index maps; random draws count in the value key only
  // (a kernel takes the generator state as a parameter, like a size).
  CHECK(key_of(x + 1.0f, false) != key_of(x + 2.0f, false));
  CHECK(key_of(rn({3}, 1), false) == key_of(rn({3}, 2), false));
  CHECK(key_of(rn({3}, 1), true) != key_of(rn({3}, 2), true));
  CHECK(key_of(transpose(rn({3, 3}, 1), 0, 1), false) != key_of(slice(rn({3, 3}, 1), 0, 0, 3), false));
  CHECK_FALSE(same_value(*(x + 1.0f).node(), *(x + 1.0f).node()));  // each builds its own fill
  Tensor e = exp(x);
  CHECK(same_value(*(e + x).node(), *(e + x).node()));
  CHECK_FALSE(same_value(*(e + x).node(), *(x + e).node()));
  CHECK_FALSE(same_value(*(e + x).node(), *(e - x).node()));
  CHECK_FALSE(same_value(*x.node(), *y.node()));
  CHECK(same_value(*x.node(), *x.node()));
}

TEST_CASE("CSE merges equal subexpressions and equal fills", "[simplify]") {
  Outcome r = run_and_compare([](uint64_t s) {
    Tensor a = rn({4, 5}, s);
    Tensor e1 = exp(a * 2.0f), e2 = exp(a * 2.0f);
    return std::vector<Tensor>{e1 + e2, e2};
  });
  // Full(2), mul and exp of the second copy go.
  CHECK(r.merged == 3);
  CHECK(count_op(r.schedule, OpCode::Exp) == 1);
  CHECK(count_op(r.schedule, OpCode::Mul) == 1);
  CHECK(r.alias.size() == 1);  // the second output takes the first exp's value

  SECTION("different random draws are different values") {
    Outcome q = run_and_compare([](uint64_t s) {
      Generator gen(s);
      Tensor a = randn({8}, DType::Float32, gen), b = randn({8}, DType::Float32, gen);
      return std::vector<Tensor>{a - b};
    });
    CHECK(q.merged == 0);
    CHECK(count_op(q.schedule, OpCode::RandNormal) == 2);
  }
  SECTION("same values of different dtype or shape stay apart") {
    Outcome q = run_and_compare([](uint64_t) {
      Tensor a = full({3}, 2, DType::Int32), b = full({3}, 2, DType::Int64), c = full({4}, 2, DType::Int32);
      return std::vector<Tensor>{a, b, c};
    });
    CHECK(q.merged == 0);
    CHECK(q.schedule.size() == 3);
  }
}

TEST_CASE("CSE of a 1,000-duplicate graph", "[simplify]") {
  Outcome r = run_and_compare([](uint64_t s) {
    Tensor a = rn({16}, s);
    std::vector<Tensor> outs;
    Tensor acc = zeros({16});
    for (int k = 0; k < 1000; ++k) {
      Tensor y = tanh(a * 3.0f + 1.0f);
      acc = acc + y;
      if (k % 100 == 0) outs.push_back(y);
    }
    outs.push_back(acc);
    return outs;
  });
  // Per copy: Full(3), mul, Full(1), add, tanh; 999 copies merge.
  CHECK(r.merged == 999 * 5);
  CHECK(count_op(r.schedule, OpCode::Tanh) == 1);
  CHECK(r.schedule.size() == 1 + 5 + 1 + 1000);  // randn, one copy, zeros, the accumulation
}

TEST_CASE("constant folding of fills", "[simplify]") {
  SECTION("elementwise over fills") {
    Outcome r = run_and_compare([](uint64_t) {
      Tensor a = full({2, 3}, 2.5f), b = full({2, 3}, 4.0f);
      Tensor i8 = full({5}, 100, DType::Int8);
      Tensor h = full({2}, 60000.0, DType::Float16);
      Tensor zi = full({3}, 0, DType::Int32);
      return std::vector<Tensor>{
          (a + b) * a - b / a,          // float arithmetic, rounded to float32 as the reference does
          i8 + i8,                      // int8 wraparound
          h * 2.0,                      // float16 overflow to inf
          floor_div(full({3}, 7, DType::Int32), zi),  // integer division by zero gives 0
          full({4}, 0.0f) / full({4}, 0.0f),          // NaN, bit for bit
          where(full({3}, true, DType::Bool), full({3}, 1.5f), full({3}, -2.0f)),
          exp(full({3}, 1.0)), full({3}, 3.0f) > full({3}, 2.0f), sqrt(full({2}, 2, DType::Int32))};
    });
    CHECK(r.folded >= 9);
    for (Node* n : r.schedule) CHECK(n->op == OpCode::Full);
  }
  SECTION("casts of fills convert as a store would") {
    Outcome r = run_and_compare([](uint64_t) {
      return std::vector<Tensor>{cast(full({3}, 2.7f), DType::Int32), cast(full({3}, -1e10), DType::Int8),
                                 cast(full({3}, 0.1), DType::Float16), cast(full({3}, 300, DType::Int32), DType::UInt8),
                                 cast(full({3}, 0.5f), DType::Bool), cast(full({2}, NAN), DType::Int64),
                                 cast(full({2}, 1e300, DType::Float64), DType::Float32)};
    });
    CHECK(r.folded == 7);
    CHECK(count_op(r.schedule, OpCode::Cast) == 0);
  }
  SECTION("folds cascade and the consumed fills are removed") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor x = rn({4}, s);
      Tensor c = cast(full({4}, 3, DType::Int32), DType::Float32) * 0.5f;  // folded here, not by builders
      return std::vector<Tensor>{x + c};
    });
    CHECK(r.folded == 2);
    CHECK(r.schedule.size() == 3);  // randn, the folded fill, the add
    CHECK(r.removed == 4);          // the int fill, the cast, the 0.5 fill and the mul
  }
  SECTION("no folding of x*0 or through non-fills") {
    Outcome r = run_and_compare([](uint64_t) {
      Tensor x = from_vector(std::vector<float>{NAN, INFINITY, -1.0f, 0.0f});
      Tensor p = exp(rn({4}, 3));
      return std::vector<Tensor>{x * 0.0f, p * 0.0f};
    });
    CHECK(r.folded == 0);
    CHECK(count_op(r.schedule, OpCode::Mul) == 2);
  }
}

TEST_CASE("integer products with zero and sums of zeros fold, float products with zero stay",
          "[simplify]") {
  Outcome r = run_and_compare([](uint64_t s) {
    Tensor i = ri({3, 4}, s, DType::Int64);
    Tensor x = rn({3, 4}, s + 1);
    return std::vector<Tensor>{
        i * zeros({3, 4}, DType::Int64) + 1,      // 0 for every integer: folds, and so does + 1
        sum(zeros({6, 7}), 1) + 2.0f,             // a sum of +0.0 is +0.0
        x * broadcast_to(zeros({4}), {3, 4}),     // 0 * inf is NaN: stays
        sum(full({2, 3}, -0.0f), 1)};             // -0.0 terms: stays (the empty sum is +0.0)
  });
  CHECK(r.folded == 4);
  CHECK(count_op(r.schedule, OpCode::Mul) == 1);
  CHECK(count_op(r.schedule, OpCode::ReindexReduce) == 1);
}

TEST_CASE("identities replace a node by its operand", "[simplify]") {
  SECTION("x*1, x/1, integer x+0 and x-0, float x-(+0) and x+(-0)") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor f = exp(rn({3, 4}, s));
      Tensor h = cast(rn({5}, s + 1), DType::Float16) * 1.0;
      Tensor i = ri({6}, s + 2);
      Tensor b = rn({6}, s + 3) > 0.0f;
      return std::vector<Tensor>{tanh(f * 1.0f), tanh(1.0f * f), tanh(f / 1.0f), exp(h), (i + 0) * 3,
                                 (0 + i) * 5, (i - 0) * 7, tanh(f - 0.0f), tanh(f + (-0.0f)), (b * true) + 1};
    });
    CHECK(r.identities == 9 + 1);  // one per listed identity (b*true included)
    CHECK(count_op(r.schedule, OpCode::Div) == 0);
    CHECK(count_op(r.schedule, OpCode::Sub) == 0);
  }
  SECTION("-0.0 flows through x*1 and x-0.0 unchanged") {
    Outcome r = run_and_compare([](uint64_t) {
      Tensor z = from_vector(std::vector<float>{-0.0f, 0.0f, -1.0f, NAN, -INFINITY});
      Tensor p = neg(z);  // pending
      return std::vector<Tensor>{p * 1.0f, p - 0.0f, p + (-0.0f)};
    });
    CHECK(r.identities == 3);
    CHECK(r.alias.size() == 3);  // every output now reads the neg node
    CHECK(r.schedule.size() == 1);
  }
  SECTION("x+0.0 on floats is not an identity") {
    Outcome r = run_and_compare([](uint64_t) {
      Tensor z = neg(from_vector(std::vector<float>{0.0f, -0.0f, 2.0f}));
      return std::vector<Tensor>{z + 0.0f, 0.0f + z, z - (-0.0f), z / 1};
    });
    CHECK(r.identities == 1);  // only z / 1
    CHECK(count_op(r.schedule, OpCode::Add) == 2);
    CHECK(count_op(r.schedule, OpCode::Sub) == 1);
  }
  SECTION("cast to the same dtype, where(c, x, x), where of a constant condition") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor x = exp(rn({4}, s));
      Tensor c = rn({4}, s + 1) > 0.0f;
      Tensor same = raw_node(OpCode::Cast, {x}, {4}, DType::Float32);
      return std::vector<Tensor>{same + 1.0f, where(c, x, x) + 2.0f,
                                 where(full({4}, false, DType::Bool), x, rn({4}, s + 2)) * 3.0f};
    });
    CHECK(r.identities == 3);
    CHECK(count_op(r.schedule, OpCode::Cast) == 0);
    CHECK(count_op(r.schedule, OpCode::Where) == 0);
  }
  SECTION("an output is never aliased to an evaluated leaf") {
    Tensor c = from_vector(std::vector<float>{1, 2, 3});
    Tensor y = c * 1.0f;
    std::vector<Node*> outs{y.node().get()};
    SimplifyResult r = jit::simplify(pending_subgraph(outs), outs);
    CHECK(r.alias.empty());
    CHECK(count_op(r.schedule, OpCode::Mul) == 1);
  }
}

TEST_CASE("reindex rules", "[simplify]") {
  SECTION("identity maps and transpose of transpose vanish") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor x = exp(rn({3, 4}, s));
      Tensor id = reindex(x, {3, 4}, {IndexExpr::var(0), IndexExpr::var(1)});
      return std::vector<Tensor>{id * 2.0f, transpose(transpose(x, 0, 1), 0, 1) * 3.0f};
    });
    CHECK(count_op(r.schedule, OpCode::Reindex) == 0);
    CHECK(r.identities == 3);  // the identity, the composition, the composed identity
  }
  SECTION("chains compose into one reindex") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor x = exp(rn({4, 6}, s));
      Tensor t = transpose(slice(x, 1, 1, 5), 0, 1);              // [4, 4]
      Tensor b = broadcast_to(reshape(slice(t, 0, 0, 4, 2), {2, 1, 4}), {2, 3, 4});
      Tensor padded = pad(transpose(x, 0, 1), {{1, 2}, {0, 1}}, 9.0f);  // carried coordinates
      Tensor flipped = flip(slice(x, 0, 1, 3), {0, 1});
      return std::vector<Tensor>{b + 1.0f, padded + 1.0f, flipped + 1.0f};
    });
    CHECK(count_op(r.schedule, OpCode::Reindex) == 3);
    CHECK(r.identities >= 4);
  }
  SECTION("no composition when the inner reindex can leave its input") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor x = exp(rn({5}, s));
      Tensor p = pad(x, {{2, 2}}, 7.0f);  // [9], out of range at the borders
      return std::vector<Tensor>{slice(p, 0, 1, 8) + 1.0f, slice(p, 0, 3, 5) + 1.0f};
    });
    CHECK(count_op(r.schedule, OpCode::Reindex) == 3);
  }
  SECTION("no composition when the outer fill would be lost") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor x = exp(rn({3}, s));
      Tensor b = broadcast_to(x, {2, 3});                 // reads x[i1]: i0 is not carried
      Tensor sl = slice(exp(rn({8}, s + 1)), 0, 2, 6);    // reads y[i0 + 2]: not carried either
      return std::vector<Tensor>{pad(b, {{1, 1}, {0, 0}}, 5.0f) + 1.0f, pad(sl, {{1, 1}}, 5.0f) + 1.0f};
    });
    CHECK(count_op(r.schedule, OpCode::Reindex) == 4);
  }
  SECTION("a slice of a concat inside one piece reads that piece") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor a = exp(rn({2, 3}, s)), b = exp(rn({4, 3}, s + 1)), c = exp(rn({1, 3}, s + 2));
      Tensor joined = concat({a, b, c}, 0);  // [7, 3]
      return std::vector<Tensor>{slice(joined, 0, 3, 5) + 1.0f,   // inside b
                                 slice(joined, 0, 6, 7) + 1.0f,   // c
                                 slice(joined, 0, 0, 2) * 2.0f};  // a
    });
    CHECK(count_op(r.schedule, OpCode::Where) == 0);
    CHECK(count_op(r.schedule, OpCode::Reindex) == 2);  // slices of a and b; c is read whole
  }
  SECTION("a slice across pieces keeps its selects") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor a = exp(rn({2, 3}, s)), b = exp(rn({4, 3}, s + 1));
      return std::vector<Tensor>{slice(concat({a, b}, 0), 0, 1, 4) + 1.0f};
    });
    CHECK(count_op(r.schedule, OpCode::Where) == 1);
  }
  SECTION("the gradient of a stack's step is a slice of the stack's gradient") {
    Outcome r = run_and_compare([](uint64_t s) {
      std::vector<Tensor> steps;
      std::vector<Tensor> pieces;
      for (int t = 0; t < 11; ++t) {
        steps.push_back(rn({2, 3}, s + t).requires_grad_());
        pieces.push_back(unsqueeze(exp(steps.back()), 0));
      }
      Tensor y = kiln::detail::concat_tree(pieces, 0);
      std::vector<Tensor> g = grad(sum(y * exp(rn({11, 2, 3}, s + 50))), steps);
      for (Tensor& x : g) x = x + 1.0f;
      return g;
    });
    CHECK(count_op(r.schedule, OpCode::Where) == 0);
  }
  SECTION("reindex of a fill") {
    Outcome r = run_and_compare([](uint64_t s) {
      Tensor x = exp(rn({2, 3}, s));
      Tensor f = full({3}, 1.25f);
      Tensor z = full({3}, 0.0f);
      return std::vector<Tensor>{
          x * broadcast_to(f, {2, 3}),      // a broadcast fill stays a reindex (GEMM operands)
          pad(f, {{1, 1}}, 1.25f) + 1.0f,   // out of range, but fill == value: folds
          pad(f, {{1, 1}}, 0.0f) + 1.0f,    // fill differs: stays
          pad(z, {{1, 1}}, -0.0f) + 1.0f,   // 0.0 vs -0.0 differ in bits: stays
          x * broadcast_to(full({3}, 1.0f), {2, 3}),  // seen through: x * 1 is x
          slice(f, 0, 1, 3) * 2.0f};        // narrowing: a fill, and fill * 2 folds
    });
    CHECK(r.folded == 3);  // that pad + 1, the slice, and the slice * 2
    CHECK(r.identities == 1);
    CHECK(count_op(r.schedule, OpCode::Reindex) == 3);
  }
}

TEST_CASE("dead nodes go and outputs keep their values", "[simplify]") {
  Outcome r = run_and_compare([](uint64_t s) {
    Tensor x = exp(rn({6}, s));
    Tensor t = transpose(transpose(reshape(x, {2, 3}), 0, 1), 0, 1);  // all reindexes fold away
    return std::vector<Tensor>{t * 1.0f, x};
  });
  CHECK(count_op(r.schedule, OpCode::Reindex) == 1);  // the reshape
  CHECK(r.alias.size() == 1);
  CHECK(r.removed >= 3);
}

TEST_CASE("KILN_DISABLE_SIMPLIFY turns the pass off", "[simplify]") {
  EnvGuard guard("1");
  Tensor a = rn({3}, 1);
  Tensor y = (a * 1.0f + exp(a)) + exp(a);
  std::vector<Node*> outs{y.node().get()};
  std::vector<Node*> sched = pending_subgraph(outs);
  SimplifyResult r = jit::simplify(sched, outs);
  CHECK(r.schedule == sched);
  CHECK(r.alias.empty());
  CHECK(r.merged + r.folded + r.removed + r.identities == 0);
}

TEST_CASE("random graphs keep their values bit for bit", "[simplify]") {
  // Small graphs mixing shared subexpressions, fills, identities and reindex chains.
  size_t fired = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    Outcome r = run_and_compare(
        [](uint64_t s) {
          std::mt19937_64 rng(s);
          auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
          DType dt = std::vector<DType>{DType::Float32, DType::Float64, DType::Int32, DType::Float16}[s % 4];
          std::vector<Tensor> pool;
          Generator gen(s);
          pool.push_back(cast(randn({3, 4}, DType::Float32, gen) * 4.0f, dt));
          pool.push_back(full({3, 4}, static_cast<double>(pick(3)), dt));
          pool.push_back(cast(randn({3, 4}, DType::Float32, gen), dt));
          const Scalar scalars[] = {0, 1, 2, -0.0, 0.0, 1.0};
          for (int step = 0; step < 12; ++step) {
            const Tensor& a = pool[pick(pool.size())];
            const Tensor& b = pool[pick(pool.size())];
            const Scalar& c = scalars[pick(6)];
            Tensor t;
            switch (pick(11)) {
              case 0: t = a + b; break;
              case 1: t = a * c; break;
              case 2: t = a - c; break;
              case 3: t = a + c; break;
              case 4: t = where(a > b, a, b); break;
              case 5: t = transpose(transpose(a, 0, 1), 0, 1); break;
              case 6: t = pad(slice(a, 1, 1, 3), {{0, 0}, {1, 1}}, c); break;
              case 7: t = flip(flip(a, {0}), {1}); break;
              case 8: t = a * b; break;
              case 9: t = cast(cast(a, DType::Float64), dt); break;
              default: t = maximum(a, c); break;
            }
            if (t.dtype() != dt) t = cast(t, dt);
            pool.push_back(t);
          }
          return std::vector<Tensor>{pool[pool.size() - 1], pool[pool.size() - 2], pool[pool.size() - 5]};
        },
        seed);
    fired += r.merged + r.folded + r.identities;
  }
  CHECK(fired > 100);
}

TEST_CASE("a 100,000-node chain simplifies without recursion", "[simplify]") {
  Tensor x = from_vector(std::vector<float>{0.5f, -3.0f});
  Tensor c = x;
  for (int i = 0; i < 100000; ++i) c = (c + 1.0f) * 1.0f;
  std::vector<Node*> outs{c.node().get()};
  std::vector<Node*> sched = pending_subgraph(outs);
  SimplifyResult r = jit::simplify(sched, outs);
  CHECK(r.merged == 2 * 100000 - 1);  // the fills of "+ 1" and "* 1" are all one value
  CHECK(r.identities == 100000);      // every * 1
  CHECK(r.schedule.size() == 100000 + 1);
  reference_execute(r.schedule, jit::aliased_outputs(r, outs));
  Node* got = r.alias.count(outs[0]) ? r.alias.at(outs[0]) : outs[0];
  const float* v = static_cast<const float*>(got->buffer->data());
  CHECK(v[0] == 100000.5f);
  CHECK(v[1] == 99997.0f);
}
