// The libtorch-style tensor API (issue 29 section 1): Tensor methods, printing, indexing,
// index_put_, compound assignment, max/min with indices, sort, topk, cumsum, cumprod, eye,
// linspace, cat, isclose/allclose, multinomial and set_num_threads. Values are derived by
// hand or are what PyTorch 2 prints for the same call (noted where so); gradients go
// through the central-difference harness of tests/op_harness.h, and a PyTorch parity run
// (tests/torch_parity.h) compares outputs and gradients where torch is importable.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "op_harness.h"
#include "torch_parity.h"

using namespace kiln;
using kiln::indexing::Ellipsis;
using kiln::indexing::None;
using kiln::indexing::Slice;

namespace {

const double nan_ = std::numeric_limits<double>::quiet_NaN();
const double inf_ = std::numeric_limits<double>::infinity();

Tensor f64(const std::vector<double>& v, const Shape& s) { return from_vector<double>(v, s); }
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }
std::vector<int64_t> ints(const Tensor& t) { return t.to_vector<int64_t>(); }
// 0, 1, ..., n-1 as float64 of `shape`.
Tensor ramp(const Shape& shape) {
  return cast(arange(numel(shape)), DType::Float64).reshape(shape);
}

bool same(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

template <typename E, typename F>
void check_error(F&& build, const std::vector<std::string>& parts) {
  try {
    build();
    FAIL_CHECK("no error was raised");
  } catch (const E& e) {
    for (const std::string& p : parts) CHECK_THAT(e.what(), Catch::Contains(p));
  }
}

// A central-difference check of `fn` on random float64 inputs of the given shapes.
void check_gradient(const std::string& name, std::vector<Shape> shapes,
                    std::function<Tensor(const std::vector<Tensor>&)> fn,
                    std::vector<kiln::test::GradEdge> edges = {}) {
  kiln::test::GradCase c{name, name, {}, std::move(fn), std::move(edges)};
  for (const Shape& s : shapes) c.inputs.push_back(kiln::test::GradInput{s});
  INFO(name);
  for (uint64_t seed : {1u, 2u}) CHECK(kiln::test::check_random(c, seed) == "");
  for (const kiln::test::GradEdge& e : c.edges) CHECK(kiln::test::check_edge(c, e) == "");
}

}  // namespace

// Outside namespace kiln and without `using namespace kiln`: DType and Device print through
// argument-dependent lookup; Shape is std::vector<int64_t>, so it needs the using-declaration.
namespace outside_kiln {
std::string print(const kiln::Tensor& t) {
  std::ostringstream os;
  os << t.dtype() << ' ' << t.device();
  using kiln::operator<<;
  os << ' ' << t.shape();
  return os.str();
}
}  // namespace outside_kiln

TEST_CASE("Tensor methods give what the free functions give", "[tensor_api]") {
  Tensor x = f64({1, -2, 3, -4, 5, -6}, {2, 3});
  CHECK(x.sum().item<double>() == -3);
  CHECK(vals(x.sum(1)) == std::vector<double>{2, -5});
  CHECK(x.sum({0, 1}, true).shape() == Shape{1, 1});
  CHECK(x.sum({}).shape() == Shape{});  // {} is every dimension, not dimension 0
  CHECK(vals(x.mean(0)) == std::vector<double>{-1.5, 1.5, -1.5});
  CHECK(x.mean().item<double>() == -0.5);
  CHECK(vals(x.prod({1})) == std::vector<double>{-6, 120});
  CHECK(x.max().item<double>() == 5);
  CHECK(x.min().item<double>() == -6);
  CHECK(x.argmax().item<int64_t>() == 4);
  CHECK(vals(x.abs()) == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK(vals(x.relu()) == std::vector<double>{1, 0, 3, 0, 5, 0});
  CHECK(vals(x.neg()) == vals(-x));
  CHECK(vals(x.square()) == std::vector<double>{1, 4, 9, 16, 25, 36});
  CHECK(vals(x.abs().sqrt()) == vals(kiln::sqrt(kiln::abs(x))));
  CHECK(vals(x.exp()) == vals(kiln::exp(x)));
  CHECK(vals(x.abs().log()) == vals(kiln::log(kiln::abs(x))));
  CHECK(vals(x.sigmoid()) == vals(kiln::sigmoid(x)));
  CHECK(vals(x.tanh()) == vals(kiln::tanh(x)));
  CHECK(vals(x.pow(2)) == vals(x.square()));
  CHECK(vals(x.pow(f64({2}, {1}))) == vals(x.square()));

  CHECK(x.t().shape() == Shape{3, 2});
  CHECK(vals(x.t()) == std::vector<double>{1, -4, -2, 5, 3, -6});
  CHECK(vals(x.transpose(0, 1)) == vals(x.t()));
  CHECK(f64({1, 2}, {2}).t().shape() == Shape{2});
  check_error<ShapeError>([] { return ramp({2, 2, 2}).t(); }, {"[t]", "[2, 2, 2]", "transpose"});
  CHECK(x.view({3, 2}).shape() == Shape{3, 2});
  CHECK(x.reshape({-1}).shape() == Shape{6});
  CHECK(ramp({2, 3, 4}).flatten(1).shape() == Shape{2, 12});
  CHECK(x.unsqueeze(1).shape() == Shape{2, 1, 3});
  CHECK(x.unsqueeze(0).squeeze().shape() == Shape{2, 3});
  CHECK(x.unsqueeze(0).squeeze(0).shape() == Shape{2, 3});
  CHECK(ramp({2, 3, 4}).permute({2, 0, 1}).shape() == Shape{4, 2, 3});
  CHECK(vals(x.matmul(x.t())) == std::vector<double>{14, -32, -32, 77});
  CHECK(x.contiguous().node() == x.node());
}

TEST_CASE("to(DType) and to(Device, DType) cast lazily, and to(Device) still moves", "[tensor_api]") {
  Tensor x = f64({1.5, -2.5, 3.75}, {3});
  Tensor f = x.to(DType::Float32);
  CHECK(f.dtype() == DType::Float32);
  CHECK(vals(f) == std::vector<double>{1.5, -2.5, 3.75});
  CHECK(x.to(DType::Float64).node() == x.node());
  Tensor i = x.to(Device::cpu(), DType::Int32);
  CHECK(i.dtype() == DType::Int32);
  CHECK(ints(i) == std::vector<int64_t>{1, -2, 3});  // toward zero, as torch
  CHECK(x.to(Device::cpu()).node() == x.node());
  // Differentiable: d sum(to(float32)) / dx = 1.
  Tensor w = f64({1, 2}, {2});
  w.requires_grad_();
  CHECK(vals(grad(sum(w.to(DType::Float32)), {w})[0]) == std::vector<double>{1, 1});
}

TEST_CASE("clone is a new value with the same history", "[tensor_api]") {
  Tensor x = f64({1, 2, 3}, {3});
  Tensor c = x.clone();
  CHECK(c.node() != x.node());
  CHECK(vals(c) == vals(x));
  c.requires_grad_();
  CHECK_FALSE(x.requires_grad());  // flags on the copy stay on the copy
  Tensor w = f64({1, 2, 3}, {3});
  w.requires_grad_();
  Tensor wc = w.clone();
  CHECK_FALSE(wc.is_leaf());
  CHECK(vals(grad(sum(wc * wc), {w})[0]) == std::vector<double>{2, 4, 6});
}

TEST_CASE("shapes, dtypes and devices print", "[tensor_api]") {
  Tensor x = zeros({2, 3});
  std::ostringstream os;
  os << x.shape() << ' ' << x.dtype() << ' ' << x.device() << ' ' << DType::Int64 << ' ' << Shape{};
  CHECK(os.str() == "[2, 3] float32 cpu int64 []");
  CHECK(outside_kiln::print(x) == "float32 cpu [2, 3]");
}

TEST_CASE("indexing by an integer and index() follow Python's indexing rules", "[tensor_api]") {
  Tensor t = ramp({2, 3, 4});
  CHECK(t[1].shape() == Shape{3, 4});
  CHECK(vals(t[1]) == vals(ramp({12}) + 12.0));
  CHECK(vals(t[-1]) == vals(t[1]));
  CHECK(vals(t[0][2]) == std::vector<double>{8, 9, 10, 11});

  // t[1:, 2, ..., None] (PyTorch: shape [1, 4, 1]).
  Tensor a = t.index({Slice(1, None), 2, Ellipsis, None});
  CHECK(a.shape() == Shape{1, 4, 1});
  CHECK(vals(a) == std::vector<double>{20, 21, 22, 23});
  Tensor b = t.index({Ellipsis, -1});
  CHECK(b.shape() == Shape{2, 3});
  CHECK(vals(b) == std::vector<double>{3, 7, 11, 15, 19, 23});
  CHECK(vals(t.index({0, 0, Slice(None, None, 2)})) == std::vector<double>{0, 2});
  CHECK(vals(t.index({0, 0, Slice(-2, None)})) == std::vector<double>{2, 3});
  CHECK(vals(t.index({0, 0, Slice(1, 100)})) == std::vector<double>{1, 2, 3});  // clamped
  CHECK(t.index({0, 0, Slice(3, 1)}).shape() == Shape{0});
  CHECK(t.index({}).node() == t.node());
  CHECK(t.index({true}).shape() == Shape{1, 2, 3, 4});
  CHECK(t.index({false}).shape() == Shape{0, 2, 3, 4});
  CHECK(t.index({None, Ellipsis, None}).shape() == Shape{1, 2, 3, 4, 1});

  // An integer tensor index of any rank replaces its dimension by the index's shape
  // (PyTorch: t[:, [[0, 2], [1, 1]]] has shape [2, 2, 2, 4]); negative entries count from
  // the end.
  Tensor idx = from_vector<int64_t>({0, 2, 1, -2}, {2, 2});
  Tensor g = t.index({Slice(), idx});
  REQUIRE(g.shape() == Shape{2, 2, 2, 4});
  std::vector<double> gv = vals(g), tv = vals(t);
  const int64_t rows[4] = {0, 2, 1, 1};
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t k = 0; k < 4; ++k)
        CHECK(gv[(n * 4 + r) * 4 + k] == tv[(n * 3 + rows[r]) * 4 + k]);
  CHECK(vals(t.index({0, from_vector<int32_t>({-1, 0})})) ==
        std::vector<double>{8, 9, 10, 11, 0, 1, 2, 3});

  // A bool mask selects in row-major order (PyTorch: t[t > 20] is [21, 22, 23]).
  CHECK(vals(t.index({gt(t, 20)})) == std::vector<double>{21, 22, 23});
  Tensor rows_kept = t.index({0, from_vector<bool>({true, false, true})});
  CHECK(rows_kept.shape() == Shape{2, 4});
  CHECK(vals(rows_kept) == std::vector<double>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(t.index({Slice(), Slice(), gt(ramp({4}), 9)}).shape() == Shape{2, 3, 0});
}

TEST_CASE("indexing errors name the call, the index and the shape", "[tensor_api]") {
  Tensor t = ramp({2, 3});
  check_error<IndexError>([&] { return t[2]; }, {"[index]", "index 2", "dimension 0", "size 2"});
  check_error<IndexError>([&] { return t[-3]; }, {"[index]", "-3", "[2, 3]"});
  check_error<IndexError>([&] { return t.index({0, 3}); }, {"dimension 1", "size 3"});
  check_error<IndexError>([&] { return ramp({}).index({0}); }, {"too many indices"});
  check_error<IndexError>([&] { return ramp({})[0]; }, {"rank-0", "item()"});
  check_error<IndexError>([&] { return t.index({0, 0, 0}); }, {"too many indices", "[2, 3]"});
  check_error<ValueError>([&] { return t.index({Ellipsis, 0, Ellipsis}); }, {"single Ellipsis"});
  check_error<ValueError>([&] { return t.index({Slice(0, 2, 0)}); }, {"step", "positive"});
  check_error<DTypeError>([&] { return t.index({f64({0}, {1})}); }, {"integer or bool", "float64"});
  check_error<IndexError>(
      [&] {
        return t.index({from_vector<bool>({true, false, true})});
      },
      {"mask", "[3]", "[2, 3]"});
  check_error<ValueError>(
      [&] {
        Tensor i = from_vector<int64_t>({0});
        return t.index({i, i});
      },
      {"at most one"});
  // A tensor index out of range is found when the value is computed.
  check_error<IndexError>([&] { return t.index({from_vector<int64_t>({5})}).eval(); }, {});
  check_error<ValueError>([&] { return Tensor()[0]; }, {"undefined"});
}

TEST_CASE("indexing is differentiable", "[tensor_api]") {
  using V = std::vector<Tensor>;
  check_gradient("t[i]", {{3, 4}}, [](const V& x) { return x[0][1] * 2.0 + x[0][-1]; });
  check_gradient("index: slices, None, Ellipsis", {{3, 4, 2}}, [](const V& x) {
    return x[0].index({Slice(1, None), Ellipsis, None, Slice(None, None, 2)});
  });
  check_gradient("index: integer tensor with repeats", {{4, 3}}, [](const V& x) {
    return x[0].index({Slice(), from_vector<int64_t>({2, 0, 2, -1}, {2, 2})});
  });
  check_gradient("index: bool mask", {{2, 3}}, [](const V& x) {
    return x[0].index({from_vector<bool>({true, false, true, false, true, true}, {2, 3})});
  });
  // Hand-derived: rows 0, 0 and 2 are read, so row 0 gets 2 and row 2 gets 1.
  Tensor w = ramp({3, 2});
  w.requires_grad_();
  Tensor picked = w.index({from_vector<int64_t>({0, 0, 2})});
  CHECK(vals(grad(sum(picked), {w})[0]) == std::vector<double>{2, 2, 0, 0, 1, 1});
}

TEST_CASE("index_put_ assigns through every copy of the handle", "[tensor_api]") {
  Tensor x = zeros({3, 4}, DType::Float64);
  Tensor alias = x;  // a copy of the handle, as with assign()
  x.index_put_({1, Slice(1, 3)}, 5.0);
  CHECK(vals(x) == std::vector<double>{0, 0, 0, 0, 0, 5, 5, 0, 0, 0, 0, 0});
  CHECK(vals(alias) == vals(x));
  x.index_put_({Slice(), 0}, f64({1, 2, 3}, {3}));  // a value of the indexed shape
  CHECK(vals(x.index({Slice(), 0})) == std::vector<double>{1, 2, 3});
  x.index_put_({Ellipsis, -1}, f64({7}, {1}));  // broadcast
  CHECK(vals(x.index({Slice(), 3})) == std::vector<double>{7, 7, 7});
  x.index_put_({gt(x, 4)}, 0.0);  // a mask
  CHECK(vals(x) == std::vector<double>{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0});
  // A position named twice takes the last value.
  Tensor d = zeros({4}, DType::Float64);
  d.index_put_({from_vector<int64_t>({1, 3, 1})}, f64({7, 8, 9}, {3}));
  CHECK(vals(d) == std::vector<double>{0, 9, 0, 8});
  // Integers, bools and an empty selection.
  Tensor i = zeros({3}, DType::Int32);
  i.index_put_({Slice(1, None)}, 2.9);
  CHECK(ints(i) == std::vector<int64_t>{0, 2, 2});
  Tensor m = zeros({3}, DType::Bool);
  m.index_put_({0}, true);
  CHECK(m.to_vector<uint8_t>() == std::vector<uint8_t>{1, 0, 0});
  i.index_put_({Slice(0, 0)}, 5);
  CHECK(ints(i) == std::vector<int64_t>{0, 2, 2});

  check_error<ShapeError>(
      [&] {
        x.index_put_({0}, f64({1, 2}, {2}));
      },
      {"[index_put_]", "[2]", "[4]"});
  check_error<IndexError>([&] { x.index_put_({3}, 1.0); }, {"index 3", "size 3"});
}

TEST_CASE("index_put_ keeps the gradient history of a computed value, and leaves need no_grad",
          "[tensor_api]") {
  Tensor w = ramp({2, 3}) + 1.0;
  w.requires_grad_();
  Tensor v = f64({10, 20, 30}, {3});
  v.requires_grad_();
  Tensor y = w * 2.0;
  y.index_put_({0}, v);
  Tensor weights = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  std::vector<Tensor> g = grad(sum(y * weights), {w, v});
  CHECK(vals(g[0]) == std::vector<double>{0, 0, 0, 8, 10, 12});
  CHECK(vals(g[1]) == std::vector<double>{1, 2, 3});
  check_gradient("index_put_", {{3, 4}, {4}}, [](const std::vector<Tensor>& x) {
    Tensor y = x[0] * 1.5;
    y.index_put_({Slice(1, None), Slice()}, x[1]);
    return y;
  });

  check_error<ValueError>([&] { w.index_put_({0}, 0.0); }, {"[index_put_]", "leaf", "NoGradGuard"});
  {
    NoGradGuard no_grad;
    w.index_put_({0, 0}, -1.0);
  }
  CHECK(w.is_leaf());
  CHECK(w.requires_grad());
  CHECK(vals(w)[0] == -1);
}

TEST_CASE("compound assignment rebinds the variable, not the other handles", "[tensor_api]") {
  Tensor x = ones({2}, DType::Float64);
  Tensor y = x;
  x += 1;
  CHECK(vals(x) == std::vector<double>{2, 2});
  CHECK(vals(y) == std::vector<double>{1, 1});  // unlike PyTorch's in-place +=
  x -= y;
  CHECK(vals(x) == std::vector<double>{1, 1});
  x *= f64({3, 4}, {2});
  CHECK(vals(x) == std::vector<double>{3, 4});
  x /= 2;
  CHECK(vals(x) == std::vector<double>{1.5, 2});
  CHECK(vals(y) == std::vector<double>{1, 1});

  // The dtype stays, as torch's in-place ops: float32 += float64 stays float32; an integer
  // tensor cannot take a float result.
  Tensor f = ones({2});
  f += f64({0.5, 0.25}, {2});
  CHECK(f.dtype() == DType::Float32);
  CHECK(vals(f) == std::vector<double>{1.5, 1.25});
  Tensor n = from_vector<int32_t>({1, 2});
  n += 3;
  n *= from_vector<int64_t>({2, 2});
  CHECK(n.dtype() == DType::Int32);
  CHECK(ints(n) == std::vector<int64_t>{8, 10});
  check_error<DTypeError>([&] { n /= 2; }, {"[operator/=]", "float32", "int32"});
  check_error<DTypeError>([&] { n += 1.5; }, {"[operator+=]"});
  check_error<ShapeError>([&] { f += ones({3, 2}); }, {"[operator+=]", "[3, 2]", "[2]"});

  // Gradients flow through: h = (2w + w) * w = 3w^2, so dh/dw = 6w.
  Tensor w = f64({1, -2, 3}, {3});
  w.requires_grad_();
  Tensor h = w * 2.0;
  h += w;
  h *= w;
  CHECK(vals(grad(sum(h), {w})[0]) == std::vector<double>{6, -12, 18});
  check_gradient("compound assignment", {{2, 3}, {3}}, [](const std::vector<Tensor>& x) {
    Tensor r = x[0] * 1.0;
    r += x[1];
    r -= 0.5;
    r *= x[0];
    r /= x[1] * x[1] + 1.0;
    return r;
  });
}

TEST_CASE("max and min along a dim return values and the first index, as torch", "[tensor_api]") {
  // PyTorch: max -> values [3, nan], indices [1, 0]; min -> values [0, nan], indices [3, 0].
  Tensor x = f64({1, 3, 3, 0, nan_, 2, nan_, 5}, {2, 4});
  auto [values, indices] = max(x, 1);
  CHECK(same(vals(values), {3, nan_}));
  CHECK(ints(indices) == std::vector<int64_t>{1, 0});
  CHECK(indices.dtype() == DType::Int64);
  auto [lo, lo_at] = min(x, -1, true);
  CHECK(lo.shape() == Shape{2, 1});
  CHECK(same(vals(lo), {0, nan_}));
  CHECK(ints(lo_at) == std::vector<int64_t>{3, 0});
  auto [mv, mi] = x.max(0);
  CHECK(same(vals(mv), {nan_, 3, nan_, 5}));
  CHECK(ints(mi) == std::vector<int64_t>{1, 0, 1, 1});
  auto [iv, ii] = max(from_vector<int32_t>({4, 9, 9}), 0);
  CHECK(ints(iv) == std::vector<int64_t>{9});
  CHECK(iv.shape() == Shape{});
  CHECK(ints(ii) == std::vector<int64_t>{1});
  auto [sv, si] = max(f64({2}, {}), 0);
  CHECK(ints(si) == std::vector<int64_t>{0});
  CHECK(vals(max(x, {1})).size() == 2);  // the vector form is still values only

  check_error<ShapeError>([&] { return max(x, 2); }, {"[max]", "2", "[2, 4]"});
  check_error<ValueError>([&] { return min(zeros({2, 0}), 1); }, {"[min]", "size 0", "[2, 0]"});
}

TEST_CASE("sort is stable and puts NaN above +inf, as torch.sort", "[tensor_api]") {
  // PyTorch: sort([2, 1, 2, 1, nan, 0, inf]) -> indices [5, 1, 3, 0, 2, 6, 4];
  // descending -> [4, 6, 0, 2, 1, 3, 5].
  Tensor x = f64({2, 1, 2, 1, nan_, 0, inf_}, {7});
  auto [v, i] = sort(x);
  CHECK(same(vals(v), {0, 1, 1, 2, 2, inf_, nan_}));
  CHECK(ints(i) == std::vector<int64_t>{5, 1, 3, 0, 2, 6, 4});
  auto [dv, di] = sort(x, 0, true);
  CHECK(same(vals(dv), {nan_, inf_, 2, 2, 1, 1, 0}));
  CHECK(ints(di) == std::vector<int64_t>{4, 6, 0, 2, 1, 3, 5});

  Tensor m = from_vector<int32_t>({3, 1, 2, 0, 5, 2}, {2, 3});
  auto [mv, mi] = sort(m, 0);
  CHECK(mv.dtype() == DType::Int32);
  CHECK(ints(mv) == std::vector<int64_t>{0, 1, 2, 3, 5, 2});
  CHECK(ints(mi) == std::vector<int64_t>{1, 0, 0, 0, 1, 1});
  auto [rv, ri] = sort(m, 1, true);
  CHECK(ints(rv) == std::vector<int64_t>{3, 2, 1, 5, 2, 0});
  CHECK(ints(ri) == std::vector<int64_t>{0, 2, 1, 1, 2, 0});
  CHECK(sort(zeros({2, 0}), 1).values.shape() == Shape{2, 0});
  check_error<ShapeError>([&] { return sort(m, 2); }, {"[sort]", "[2, 3]"});
}

TEST_CASE("topk returns the k largest or smallest, earlier positions first on ties",
          "[tensor_api]") {
  // PyTorch: topk([1, 3, 3, 2, 3], 2) -> values [3, 3] (its indices, [2, 4], come from a
  // partial sort and are not specified); kiln takes the earliest, [1, 2].
  Tensor x = f64({1, 3, 3, 2, 3}, {5});
  auto [v, i] = topk(x, 2);
  CHECK(vals(v) == std::vector<double>{3, 3});
  CHECK(ints(i) == std::vector<int64_t>{1, 2});
  // PyTorch: topk(..., 2, largest=False) -> values [1, 2], indices [0, 3].
  auto [sv, si] = topk(x, 2, 0, false);
  CHECK(vals(sv) == std::vector<double>{1, 2});
  CHECK(ints(si) == std::vector<int64_t>{0, 3});
  Tensor m = f64({4, 8, 6, 1, 7, 9}, {3, 2});
  auto [mv, mi] = topk(m, 2, 0);
  CHECK(mv.shape() == Shape{2, 2});
  CHECK(vals(mv) == std::vector<double>{7, 9, 6, 8});
  CHECK(ints(mi) == std::vector<int64_t>{2, 2, 1, 0});
  CHECK(topk(x, 0).values.shape() == Shape{0});
  CHECK(topk(x, 5).values.shape() == Shape{5});
  check_error<ValueError>([&] { return topk(x, 6); }, {"[topk]", "k = 6", "size 5"});
  check_error<ValueError>([&] { return topk(x, -1); }, {"[topk]", "k = -1"});
  check_error<ShapeError>([&] { return topk(m, 1, 2); }, {"[topk]", "[3, 2]"});
}

TEST_CASE("cumsum and cumprod follow torch's values and dtypes", "[tensor_api]") {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(vals(cumsum(x, 1)) == std::vector<double>{1, 3, 6, 4, 9, 15});
  CHECK(vals(cumsum(x, 0)) == std::vector<double>{1, 2, 3, 5, 7, 9});
  CHECK(vals(cumprod(x, -1)) == std::vector<double>{1, 2, 6, 4, 20, 120});
  CHECK(vals(cumprod(x, 0)) == std::vector<double>{1, 2, 3, 4, 10, 18});
  CHECK(cumsum(x, 1).dtype() == DType::Float64);
  // torch: bool and integer inputs accumulate in int64.
  Tensor b = cumsum(from_vector<bool>({true, false, true}), 0);
  CHECK(b.dtype() == DType::Int64);
  CHECK(ints(b) == std::vector<int64_t>{1, 1, 2});
  CHECK(cumprod(from_vector<int32_t>({2, 3}), 0).dtype() == DType::Int64);
  CHECK(cumsum(ones({2}, DType::Float32), 0).dtype() == DType::Float32);
  CHECK(vals(cumsum(f64({4}, {}), 0)) == std::vector<double>{4});
  CHECK(cumsum(zeros({0}), 0).shape() == Shape{0});
  CHECK(same(vals(cumsum(f64({1, nan_, 1}, {3}), 0)), {1, nan_, nan_}));
  check_error<ShapeError>([&] { return cumsum(x, 2); }, {"[cumsum]", "[2, 3]"});
}

TEST_CASE("eye, linspace, cat and allclose", "[tensor_api]") {
  CHECK(vals(eye(2, 3)) == std::vector<double>{1, 0, 0, 0, 1, 0});
  CHECK(eye(3).shape() == Shape{3, 3});
  CHECK(eye(2, -1, DType::Int64).dtype() == DType::Int64);
  CHECK(eye(0).shape() == Shape{0, 0});
  check_error<ValueError>([] { return eye(-1); }, {"[eye]", "-1"});

  // PyTorch: linspace(-1.5, 2.25, 7) = [-1.5, -0.875, -0.25, 0.375, 1, 1.625, 2.25].
  CHECK(vals(linspace(-1.5, 2.25, 7)) ==
        std::vector<double>{-1.5, -0.875, -0.25, 0.375, 1, 1.625, 2.25});
  CHECK(linspace(0, 1, 3).dtype() == DType::Float32);
  CHECK(ints(linspace(0, 1, 5, DType::Int64)) == std::vector<int64_t>{0, 0, 0, 0, 1});
  CHECK(vals(linspace(3, 7, 1)) == std::vector<double>{3});
  CHECK(linspace(3, 7, 0).shape() == Shape{0});
  std::vector<double> l = vals(linspace(0, 1, 10, DType::Float64));
  CHECK(l.front() == 0);
  CHECK(l.back() == 1);  // both ends exact
  check_error<ValueError>([] { return linspace(0, 1, -2); }, {"[linspace]", "-2"});

  Tensor a = ramp({2, 2}), b = ramp({1, 2});
  CHECK(vals(cat({a, b})) == vals(concat({a, b})));

  // PyTorch: isclose([1, inf, nan, 1e-9], [1.00001, inf, nan, 0]) = [F, T, F, T] in float32.
  Tensor p = from_vector<float>({1, INFINITY, NAN, 1e-9f});
  Tensor q = from_vector<float>({1.00001f, INFINITY, NAN, 0});
  CHECK(isclose(p, q).to_vector<uint8_t>() == std::vector<uint8_t>{0, 1, 0, 1});
  CHECK(isclose(p, q, 1e-5, 1e-8, true).to_vector<uint8_t>() == std::vector<uint8_t>{0, 1, 1, 1});
  CHECK_FALSE(allclose(p, q));
  CHECK(allclose(p, q, 1e-4, 1e-8, true));
  CHECK(allclose(ones({2, 3}), ones({3})));  // broadcasts
  CHECK_FALSE(allclose(f64({1, -inf_}, {2}), f64({1, inf_}, {2})));
  CHECK(allclose(from_vector<int64_t>({3}), from_vector<int64_t>({3})));
  check_error<DTypeError>([] { return allclose(ones({2}), ones({2}, DType::Float64)); },
                          {"[isclose]", "float32", "float64"});
}

TEST_CASE("multinomial samples by weight, with and without replacement", "[tensor_api]") {
  Generator gen(7);
  Tensor p = from_vector<float>({0.1f, 0.2f, 0.0f, 0.7f});
  Tensor s = multinomial(p, 20000, true, gen);
  CHECK(s.shape() == Shape{20000});
  CHECK(s.dtype() == DType::Int64);
  std::map<int64_t, int> count;
  for (int64_t k : ints(s)) ++count[k];
  CHECK(count[2] == 0);  // zero weight is never drawn
  CHECK(count[0] + count[1] + count[3] == 20000);
  CHECK(std::abs(count[0] / 20000.0 - 0.1) < 0.015);
  CHECK(std::abs(count[1] / 20000.0 - 0.2) < 0.015);
  CHECK(std::abs(count[3] / 20000.0 - 0.7) < 0.015);

  // Without replacement, every category once when all are drawn; unnormalised rows.
  Tensor rows = from_vector<double>({1, 2, 3, 4, 5, 5, 5, 5}, {2, 4});
  Tensor perm = multinomial(rows, 4, false, gen);
  REQUIRE(perm.shape() == Shape{2, 4});
  std::vector<int64_t> pv = ints(perm);
  for (int r = 0; r < 2; ++r) {
    std::vector<int64_t> row(pv.begin() + 4 * r, pv.begin() + 4 * r + 4);
    std::sort(row.begin(), row.end());
    CHECK(row == std::vector<int64_t>{0, 1, 2, 3});
  }
  // The first draw without replacement follows the weights: [1, 3] -> about 1/4, 3/4.
  Tensor many = broadcast_to(from_vector<double>({1, 3}, {1, 2}), {4000, 2});
  std::vector<int64_t> first = ints(multinomial(many, 1, false, gen));
  double share = std::count(first.begin(), first.end(), 1) / 4000.0;
  CHECK(std::abs(share - 0.75) < 0.03);
  // Reproducible from the generator's seed.
  Generator g1(3), g2(3);
  CHECK(ints(multinomial(p, 10, true, g1)) == ints(multinomial(p, 10, true, g2)));

  check_error<ValueError>([&] { return multinomial(p, 5, false, gen); },
                          {"[multinomial]", "5", "4 categories"});
  check_error<ValueError>([&] { return multinomial(p, 0, true, gen); }, {"[multinomial]"});
  check_error<DTypeError>(
      [&] {
        return multinomial(from_vector<int64_t>({1, 2}), 1);
      },
      {"[multinomial]", "int64"});
  check_error<ShapeError>(
      [&] {
        return multinomial(ones({1, 2, 2}), 1);
      },
      {"[multinomial]", "[1, 2, 2]"});
}

TEST_CASE("set_num_threads resizes the pool between evaluations", "[tensor_api]") {
  const int before = get_num_threads();
  Tensor x = ramp({64, 64});
  std::vector<double> want = vals(matmul(x, x) + 1.0);
  set_num_threads(1);
  CHECK(get_num_threads() == 1);
  CHECK(&thread_pool() == &thread_pool());
  CHECK(vals(matmul(x, x) + 1.0) == want);
  set_num_threads(3);
  CHECK(get_num_threads() == 3);
  CHECK(vals(matmul(x, x) + 1.0) == want);
  set_num_threads(before);
  CHECK(get_num_threads() == before);
  check_error<ValueError>([] { set_num_threads(0); }, {"[set_num_threads]", "0"});
}

TEST_CASE("the tensor API matches PyTorch on float64 values and gradients", "[tensor_api][torch]") {
  using nn_test::TorchCase;
  std::vector<TorchCase> cases;
  auto add = [&](std::string label, std::string call, std::vector<Tensor> inputs,
                 std::function<std::vector<Tensor>(const std::vector<Tensor>&)> run) {
    TorchCase c;
    c.label = std::move(label);
    c.call = std::move(call);
    c.inputs = std::move(inputs);
    c.run = std::move(run);
    cases.push_back(std::move(c));
  };
  auto rnd = [](const Shape& s, uint64_t seed) {
    return f64(nn_test::random_values(numel(s), seed), s);
  };
  using V = std::vector<Tensor>;
  add("index",
      "(x[0][1:, 2, ..., None], x[0][..., -1], x[0][:, torch.tensor([[0, 2], [1, -1]])], "
      "x[0][0][1])",
      {rnd({2, 3, 4}, 1)}, [](const V& x) {
        Tensor idx = from_vector<int64_t>({0, 2, 1, -1}, {2, 2});
        return V{x[0].index({Slice(1, None), 2, Ellipsis, None}), x[0].index({Ellipsis, -1}),
                 x[0].index({Slice(), idx}), x[0][0][1]};
      });
  add("index with a mask", "(x[0][x[0] > 0],)", {rnd({3, 4}, 2)},
      [](const V& x) { return V{x[0].index({gt(x[0], 0)})}; });
  add("max, min with indices", "(*torch.max(x[0], 1), *torch.min(x[0], 0, True))", {rnd({3, 5}, 3)},
      [](const V& x) {
        auto [a, ai] = max(x[0], 1);
        auto [b, bi] = min(x[0], 0, true);
        return V{a, ai, b, bi};
      });
  add("sort", "(*torch.sort(x[0], 1), *torch.sort(x[0], 0, descending=True))", {rnd({4, 6}, 4)},
      [](const V& x) {
        auto [a, ai] = sort(x[0], 1);
        auto [b, bi] = sort(x[0], 0, true);
        return V{a, ai, b, bi};
      });
  add("topk", "(*torch.topk(x[0], 3, 1), *torch.topk(x[0], 2, 0, largest=False))", {rnd({4, 6}, 5)},
      [](const V& x) {
        auto [a, ai] = topk(x[0], 3, 1);
        auto [b, bi] = topk(x[0], 2, 0, false);
        return V{a, ai, b, bi};
      });
  add("cumsum, cumprod", "(torch.cumsum(x[0], 1), torch.cumprod(x[0], 0))", {rnd({3, 5}, 6)},
      [](const V& x) {
        return V{cumsum(x[0], 1), cumprod(x[0], 0)};
      });
  add("eye, linspace",
      "(torch.eye(3, 4, dtype=torch.float64), torch.linspace(-2, 3.3, 9, dtype=torch.float64))", {},
      [](const V&) {
        return V{eye(3, 4, DType::Float64), linspace(-2, 3.3, 9, DType::Float64)};
      });
  add("methods",
      "(x[0].t(), x[0].sum(1), x[0].mean(), x[0].abs().sqrt(), x[0].clone(), x[0].relu())",
      {rnd({3, 4}, 7)}, [](const V& x) {
        return V{x[0].t(), x[0].sum(1), x[0].mean(), x[0].abs().sqrt(), x[0].clone(), x[0].relu()};
      });
  NN_REQUIRE_TORCH_PARITY(cases);
}
