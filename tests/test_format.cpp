// Printing of tensors and graphs. Expected strings follow torch's output for the same
// values, with kiln's shape=/dtype= suffix.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <sstream>

#include "frontend/kiln.h"

using namespace kiln;

namespace {
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("str: float matrix in fixed notation", "[format]") {
  Tensor t = from_vector<float>({0.1940f, 2.1614f, -0.1721f, 0.8491f, -1.9244f, 0.6530f}, {2, 3});
  CHECK(t.str() ==
        "tensor([[ 0.1940,  2.1614, -0.1721],\n"
        "        [ 0.8491, -1.9244,  0.6530]], shape=[2, 3], dtype=float32)");
}

TEST_CASE("str: rank 0, empty, undefined", "[format]") {
  CHECK(tensor(3.5f).str() == "tensor(3.5000, shape=[], dtype=float32)");
  CHECK(tensor(int64_t{-7}).str() == "tensor(-7, shape=[], dtype=int64)");
  CHECK(zeros({0, 4}, DType::Int64).str() == "tensor([], shape=[0, 4], dtype=int64)");
  CHECK(zeros({0}).str() == "tensor([], shape=[0], dtype=float32)");
  CHECK(Tensor().str() == "tensor(undefined)");
}

TEST_CASE("str: integers and bools are right-aligned", "[format]") {
  CHECK(from_vector<int32_t>({1, -20, 300}).str() ==
        "tensor([  1, -20, 300], shape=[3], dtype=int32)");
  CHECK(from_vector<bool>({true, false}).str() == "tensor([ True, False], shape=[2], dtype=bool)");
  CHECK(from_vector<bool>({true, false, false, true}, {2, 2}).str() ==
        "tensor([[ True, False],\n"
        "        [False,  True]], shape=[2, 2], dtype=bool)");
}

TEST_CASE("str: integer-valued floats print as in torch", "[format]") {
  CHECK(from_vector<float>({1, 2, -30}).str() ==
        "tensor([  1.,   2., -30.], shape=[3], dtype=float32)");
  CHECK(zeros({2}).str() == "tensor([0., 0.], shape=[2], dtype=float32)");
}

TEST_CASE("str: scientific notation", "[format]") {
  // A range over 1000x.
  CHECK(from_vector<double>({1e10, 1.5}).str() ==
        "tensor([1.0000e+10, 1.5000e+00], shape=[2], dtype=float64)");
  // Tiny non-zero values.
  CHECK(from_vector<float>({1e-5f, -2e-5f}).str() ==
        "tensor([ 1.0000e-05, -2.0000e-05], shape=[2], dtype=float32)");
  // Large integral values.
  CHECK(from_vector<double>({2e8, 3e8}).str() ==
        "tensor([2.0000e+08, 3.0000e+08], shape=[2], dtype=float64)");
  // Zeros do not take part in the choice.
  CHECK(from_vector<float>({0.0f, 0.5f}).str() ==
        "tensor([0.0000, 0.5000], shape=[2], dtype=float32)");
}

TEST_CASE("str: nan and inf", "[format]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(from_vector<float>({1.5f, nan, inf, -inf}).str() ==
        "tensor([1.5000,    nan,    inf,   -inf], shape=[4], dtype=float32)");
  CHECK(from_vector<float>({-nan, 2.0f}).str() == "tensor([nan,  2.], shape=[2], dtype=float32)");
}

TEST_CASE("str: half precision prints through float", "[format]") {
  CHECK(cast(from_vector<float>({0.5f, -1.25f}), DType::Float16).str() ==
        "tensor([ 0.5000, -1.2500], shape=[2], dtype=float16)");
  CHECK(cast(from_vector<float>({3.0f}), DType::BFloat16).str() ==
        "tensor([3.], shape=[1], dtype=bfloat16)");
}

TEST_CASE("str: rank 3 separates blocks with blank lines", "[format]") {
  CHECK(arange(8).str() == "tensor([0, 1, 2, 3, 4, 5, 6, 7], shape=[8], dtype=int64)");
  std::vector<int64_t> v(8);
  for (int i = 0; i < 8; ++i) v[i] = i;
  CHECK(from_vector<int64_t>(v, {2, 2, 2}).str() ==
        "tensor([[[0, 1],\n"
        "         [2, 3]],\n"
        "\n"
        "        [[4, 5],\n"
        "         [6, 7]]], shape=[2, 2, 2], dtype=int64)");
}

TEST_CASE("str: long vectors wrap at 80 columns", "[format]") {
  std::vector<int64_t> v(30);
  for (int i = 0; i < 30; ++i) v[i] = 10 + i;
  // torch: (80 - 7) / (2 + 2) = 18 elements per line.
  CHECK(from_vector<int64_t>(v).str() ==
        "tensor([10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,\n"
        "        28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39], shape=[30], dtype=int64)");
}

TEST_CASE("str: summarises past 1000 elements", "[format]") {
  std::vector<int64_t> v(2000);
  for (int i = 0; i < 2000; ++i) v[i] = i;
  CHECK(from_vector<int64_t>(v).str() ==
        "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], shape=[2000], dtype=int64)");

  std::vector<float> f(2000);
  for (int i = 0; i < 2000; ++i) f[i] = static_cast<float>(i) + 0.5f;
  std::string s = from_vector<float>(f, {40, 50}).str();
  CHECK(s ==
        "tensor([[5.0000e-01, 1.5000e+00, 2.5000e+00,  ..., 4.7500e+01, 4.8500e+01,\n"
        "         4.9500e+01],\n"
        "        [5.0500e+01, 5.1500e+01, 5.2500e+01,  ..., 9.7500e+01, 9.8500e+01,\n"
        "         9.9500e+01],\n"
        "        [1.0050e+02, 1.0150e+02, 1.0250e+02,  ..., 1.4750e+02, 1.4850e+02,\n"
        "         1.4950e+02],\n"
        "        ...,\n"
        "        [1.8505e+03, 1.8515e+03, 1.8525e+03,  ..., 1.8975e+03, 1.8985e+03,\n"
        "         1.8995e+03],\n"
        "        [1.9005e+03, 1.9015e+03, 1.9025e+03,  ..., 1.9475e+03, 1.9485e+03,\n"
        "         1.9495e+03],\n"
        "        [1.9505e+03, 1.9515e+03, 1.9525e+03,  ..., 1.9975e+03, 1.9985e+03,\n"
        "         1.9995e+03]], shape=[40, 50], dtype=float32)");
  CHECK(s.find("1.0000e+03") == std::string::npos);  // the middle is elided

  Tensor cube = zeros({10, 10, 20});
  std::string c = cube.str();
  CHECK(c.find("]],\n\n        ...,\n\n        [[") != std::string::npos);
  CHECK(count(c, "0.") == 6 * 6 * 6);  // six edge items of each dimension
}

TEST_CASE("str: operator<< and evaluation of a pending tensor", "[format]") {
  Tensor t = from_vector<float>({1.0f, 2.0f}) * 0.5f;
  std::ostringstream os;
  os << t;
  CHECK(os.str() == "tensor([0.5000, 1.0000], shape=[2], dtype=float32)");
}

TEST_CASE("dump_graph: ops, shapes, maps and state", "[format]") {
  Tensor x = from_vector<float>({1, 2, 3});
  Tensor b = broadcast_to(x, {2, 3});
  Tensor y = b + ones({2, 3});
  Tensor s = reindex_reduce(y, ReduceOp::Sum, {2}, {IndexExpr::var(0)}, {}, false, "sum");
  std::string text = dump_graph({s});
  INFO(text);
  CHECK(count(text, "\n") == 5);
  CHECK(text.find("= constant() shape=[3] dtype=float32 [evaluated]") != std::string::npos);
  CHECK(text.find("= reindex(%" + std::to_string(x.node()->id) +
                  ") origin=broadcast_to shape=[2, 3] dtype=float32 map=(i1) fill=0") !=
        std::string::npos);
  CHECK(text.find("= full() shape=[2, 3] dtype=float32 value=1\n") != std::string::npos);
  CHECK(text.find("= add(%" + std::to_string(b.node()->id) + ", %") != std::string::npos);
  const std::string last = "%" + std::to_string(s.node()->id) + " = reindex_reduce.sum(%" +
                           std::to_string(y.node()->id) +
                           ") origin=sum shape=[2] dtype=float32 map=(i0) [output]\n";
  CHECK(text.size() >= last.size());
  CHECK(text.substr(text.size() - last.size()) == last);
  // Inputs come before their users.
  CHECK(text.find("= constant()") < text.find("= reindex("));
  CHECK(text.find("= reindex(") < text.find("= add("));

  // Weak scalars, iota, rand and several outputs.
  Tensor z = index({2, 2}, 1) * 3;
  manual_seed(5);
  Tensor r = rand({4});
  std::string two = dump_graph({z, r});
  INFO(two);
  CHECK(two.find("= index() shape=[2, 2] dtype=int64 axis=1") != std::string::npos);
  CHECK(two.find("= mul(%" + std::to_string(z.node()->inputs[0]->id)) != std::string::npos);
  CHECK(
      dump_graph({scalar_tensor(3)}).find("= full() shape=[] dtype=int64 value=3 weak [output]") !=
      std::string::npos);
  CHECK(two.find("= rand() shape=[4] dtype=float32 seed=5 offset=0 [output 1]") !=
        std::string::npos);
  CHECK(two.find("[output 0]") != std::string::npos);

  // After evaluation the output is a leaf holding its value.
  s.eval();
  CHECK(dump_graph({s}) == "%" + std::to_string(s.node()->id) +
                               " = reindex_reduce.sum() origin=sum shape=[2] dtype=float32 "
                               "map=(i0) [evaluated] [output]\n");
  CHECK_THROWS_AS(dump_graph({Tensor()}), ValueError);
}

TEST_CASE("graph_to_dot: valid structure", "[format]") {
  Tensor x = from_vector<float>({1, 2, 3});
  Tensor y = x * x + broadcast_to(tensor(2.0f), {3});
  std::string dot = graph_to_dot({y});
  INFO(dot);
  CHECK(dot.rfind("digraph kiln {", 0) == 0);
  CHECK(count(dot, "{") == count(dot, "}"));
  // mul(x, x): 2, reindex(c): 1, add: 2.
  CHECK(count(dot, "->") == 5);
  CHECK(count(dot, "[label=") == 5);
  CHECK(count(dot, "fillcolor=lightgrey") == 2);  // the two constants
  CHECK(count(dot, "peripheries=2") == 1);
  CHECK(dot.find("broadcast_to") != std::string::npos);

  // Quotes and backslashes in labels are escaped.
  Tensor q = reindex(x, {3}, {IndexExpr::var(0)}, 0, {}, false, "a\"b\\c");
  CHECK(graph_to_dot({q}).find("a\\\"b\\\\c") != std::string::npos);
}

TEST_CASE("dump_graph: a 100k-node chain does not overflow the stack", "[format]") {
  Tensor x = zeros({1});
  for (int i = 0; i < 100000; ++i) x = x + 1;
  std::string text = dump_graph({x});
  // Each step adds the add and its weak scalar operand; plus the initial zeros.
  CHECK(count(text, "\n") == 200001);
  CHECK(text.find("[output]") != std::string::npos);
  std::string dot = graph_to_dot({x});
  CHECK(count(dot, "->") == 200000);
}
