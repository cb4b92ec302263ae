// Shape composites against plain C++ loop implementations on random inputs, over several
// dtypes, ranks 0-5, zero-size shapes and negative axes; then their error messages.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "op_harness.h"

using Catch::Contains;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

namespace {

const DType kDTypes[] = {DType::Float32, DType::Float64, DType::Int32,
                         DType::Int64,   DType::Bool,    DType::Float16};

using Coords = std::vector<int64_t>;

Coords unravel(int64_t flat, const Shape& shape) {
  Coords c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

int64_t ravel(const Coords& c, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + c[d];
  return flat;
}

int64_t count(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// Values of `shape` computed per output coordinate.
std::vector<double> build(const Shape& shape, const std::function<double(const Coords&)>& f) {
  std::vector<double> v(static_cast<size_t>(count(shape)));
  for (int64_t i = 0; i < count(shape); ++i) v[i] = f(unravel(i, shape));
  return v;
}

// A random non-zero tensor of `dtype` and the exact values it holds.
struct Sample {
  Tensor t;
  std::vector<double> v;
  double at(const Coords& c) const { return v[ravel(c, t.shape())]; }
};

Sample sample(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(1, 9);
  std::vector<double> raw(static_cast<size_t>(count(shape)));
  for (double& x : raw) {
    x = pick(rng) * (rng() % 2 ? 1 : -1);
    if (kiln::is_floating(dtype)) x += pick(rng) / 16.0;
  }
  Tensor t = kiln::cast(kiln::from_vector<double>(raw, shape), dtype);
  return {t, t.to_vector<double>()};
}

std::vector<int64_t> random_indices(int64_t n, int64_t bound, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t& x : v) x = static_cast<int64_t>(rng() % static_cast<uint32_t>(bound));
  return v;
}

void check_values(const Tensor& got, const Shape& shape, DType dtype,
                  const std::vector<double>& want) {
  CHECK(got.shape() == shape);
  CHECK(got.dtype() == dtype);
  CHECK(got.to_vector<double>() == want);
}

// Python's slice.indices(n) followed by range(): the positions a slice visits.
std::vector<int64_t> python_slice(int64_t n, int64_t start, int64_t stop, int64_t step) {
  auto fix = [n](int64_t v) {
    if (v < 0) v += n;
    return v < 0 ? 0 : (v > n ? n : v);
  };
  std::vector<int64_t> out;
  for (int64_t i = fix(start); i < fix(stop); i += step) out.push_back(i);
  return out;
}

const std::vector<Shape> kShapes = {
    {}, {5}, {0}, {3, 4}, {2, 0, 3}, {2, 3, 4}, {2, 1, 3, 2}, {2, 3, 1, 2, 2}, {1, 2, 2, 1, 3, 2}};

}  // namespace

TEST_CASE("reshape keeps row-major order for every dtype and rank", "[shape]") {
  const std::vector<std::pair<Shape, Shape>> cases = {{{}, {1, 1}},
                                                      {{1, 1}, {}},
                                                      {{6}, {2, 3}},
                                                      {{2, 3}, {3, 2}},
                                                      {{2, 3, 4}, {4, -1}},
                                                      {{2, 3, 4}, {-1}},
                                                      {{4, 6}, {2, 2, 3, 2}},
                                                      {{2, 2, 3, 2}, {3, 8}},
                                                      {{0, 3}, {3, 0, 5}},
                                                      {{2, 0}, {-1, 4}},
                                                      {{1, 6, 1}, {1, 2, 1, 3, 1}},
                                                      {{2, 3, 2, 2, 1}, {6, 4}}};
  uint32_t seed = 1;
  for (DType dt : kDTypes) {
    for (const auto& [from, to] : cases) {
      CAPTURE(kiln::dtype_name(dt), kiln::shape_str(from), kiln::shape_str(to));
      Sample x = sample(from, dt, seed++);
      Tensor y = kiln::reshape(x.t, to);
      Shape want = to;
      for (int64_t& s : want)
        if (s == -1) s = count(from) / -count(to);
      check_values(y, want, dt, x.v);
    }
  }
}

TEST_CASE("reshape is a reindex named reshape with a readable map, or no node at all", "[shape]") {
  Tensor x = kiln::rand({6});
  CHECK(kiln::reshape(x, {6}).node() == x.node());
  Tensor y = kiln::reshape(x, {2, 3});
  CHECK(y.node()->op == kiln::OpCode::Reindex);
  CHECK(std::string(y.node()->origin) == "reshape");
  REQUIRE(y.node()->index_map.size() == 1);
  CHECK(y.node()->index_map[0].str() == "i0*3 + i1");
  Tensor z = kiln::reshape(kiln::rand({2, 3, 4}), {6, 4});
  CHECK(z.node()->index_map[0].str() == "i0 // 3");
  CHECK(z.node()->index_map[1].str() == "i0 % 3");
  CHECK(z.node()->index_map[2].str() == "i1");
}

TEST_CASE("flatten, squeeze and unsqueeze give PyTorch's shapes", "[shape]") {
  Sample x = sample({2, 1, 3, 1, 2}, DType::Int32, 7);
  check_values(kiln::flatten(x.t), {12}, DType::Int32, x.v);
  check_values(kiln::flatten(x.t, 1, 3), {2, 3, 2}, DType::Int32, x.v);
  check_values(kiln::flatten(x.t, -3, -1), {2, 1, 6}, DType::Int32, x.v);
  check_values(kiln::flatten(x.t, 2, 2), {2, 1, 3, 1, 2}, DType::Int32, x.v);
  check_values(kiln::flatten(kiln::tensor(2.5f)), {1}, DType::Float32, {2.5});
  check_values(kiln::squeeze(x.t), {2, 3, 2}, DType::Int32, x.v);
  check_values(kiln::squeeze(x.t, -2), {2, 1, 3, 2}, DType::Int32, x.v);
  check_values(kiln::squeeze(x.t, 0), {2, 1, 3, 1, 2}, DType::Int32, x.v);  // size 2: no-op
  CHECK(kiln::squeeze(x.t, 0).node() == x.t.node());
  check_values(kiln::squeeze(kiln::tensor(int64_t{4})), {}, DType::Int64, {4});
  check_values(kiln::squeeze(kiln::zeros({1, 0, 1})), {0}, DType::Float32, {});
  check_values(kiln::unsqueeze(x.t, 0), {1, 2, 1, 3, 1, 2}, DType::Int32, x.v);
  check_values(kiln::unsqueeze(x.t, -1), {2, 1, 3, 1, 2, 1}, DType::Int32, x.v);
  check_values(kiln::unsqueeze(x.t, 2), {2, 1, 1, 3, 1, 2}, DType::Int32, x.v);
  check_values(kiln::unsqueeze(kiln::tensor(true), 0), {1}, DType::Bool, {1});
  check_values(kiln::unsqueeze(kiln::zeros({0, 2}), 1), {0, 1, 2}, DType::Float32, {});
}

TEST_CASE("permute and transpose match a loop for ranks 0-5", "[shape]") {
  std::mt19937 rng(3);
  uint32_t seed = 10;
  for (DType dt : kDTypes) {
    for (const Shape& shape : kShapes) {
      std::vector<int64_t> axes(shape.size());
      std::iota(axes.begin(), axes.end(), 0);
      std::shuffle(axes.begin(), axes.end(), rng);
      CAPTURE(kiln::dtype_name(dt), kiln::shape_str(shape), kiln::shape_str(axes));
      Sample x = sample(shape, dt, seed++);
      Shape out(shape.size());
      for (size_t k = 0; k < axes.size(); ++k) out[k] = shape[axes[k]];
      auto at = [&](const Coords& c) {
        Coords in(shape.size());
        for (size_t k = 0; k < axes.size(); ++k) in[axes[k]] = c[k];
        return x.at(in);
      };
      check_values(kiln::permute(x.t, axes), out, dt, build(out, at));
      // The same permutation written with negative axes.
      std::vector<int64_t> negative = axes;
      for (int64_t& a : negative) a -= static_cast<int64_t>(shape.size());
      check_values(kiln::permute(x.t, negative), out, dt, build(out, at));
      if (shape.size() >= 2) {
        Shape tout = shape;
        std::swap(tout[0], tout.back());
        auto tat = [&](const Coords& c) {
          Coords in = c;
          std::swap(in[0], in.back());
          return x.at(in);
        };
        check_values(kiln::transpose(x.t, -1, 0), tout, dt, build(tout, tat));
      }
    }
  }
  Tensor m = kiln::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(kiln::transpose(m, 0, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 4, 2, 5, 3, 6});
  CHECK(std::string(kiln::transpose(m, 0, 1).node()->origin) == "transpose");
  CHECK(kiln::transpose(m, 1, 1).node() == m.node());
}

TEST_CASE("slice follows Python's rules for negative and clamped bounds", "[shape]") {
  Tensor r = kiln::arange(10);
  CHECK(kiln::slice(r, 0, -3, 100, 2).to_vector<int64_t>() == std::vector<int64_t>{7, 9});
  CHECK(kiln::slice(r, 0, 2, 9, 3).to_vector<int64_t>() == std::vector<int64_t>{2, 5, 8});
  CHECK(kiln::slice(r, 0, 8, 2).numel() == 0);
  CHECK(kiln::slice(r, 0, 0, 10).node() == r.node());
  const int64_t bounds[] = {-20, -7, -1, 0, 1, 3, 5, 7, 20};
  uint32_t seed = 30;
  for (DType dt : {DType::Float32, DType::Int64, DType::Bool, DType::Float16}) {
    Shape shape{2, 7, 3};
    Sample x = sample(shape, dt, seed++);
    for (int64_t axis : {1, -1, 0}) {
      int a = axis < 0 ? static_cast<int>(axis + 3) : static_cast<int>(axis);
      for (int64_t start : bounds) {
        for (int64_t stop : bounds) {
          for (int64_t step : {1, 2, 3, 5}) {
            CAPTURE(kiln::dtype_name(dt), axis, start, stop, step);
            std::vector<int64_t> pos = python_slice(shape[a], start, stop, step);
            Shape out = shape;
            out[a] = static_cast<int64_t>(pos.size());
            auto at = [&](const Coords& c) {
              Coords in = c;
              in[a] = pos[c[a]];
              return x.at(in);
            };
            check_values(kiln::slice(x.t, axis, start, stop, step), out, dt, build(out, at));
          }
        }
      }
    }
  }
  check_values(kiln::slice(kiln::zeros({0, 3}), 0, 0, 5), {0, 3}, DType::Float32, {});
  check_values(kiln::slice(kiln::zeros({2, 3}), 1, 1, 1), {2, 0}, DType::Float32, {});
}

TEST_CASE("flip reverses each listed axis", "[shape]") {
  uint32_t seed = 50;
  for (DType dt : kDTypes) {
    for (const Shape& shape : kShapes) {
      std::vector<int64_t> axes;
      for (size_t d = 0; d < shape.size(); d += 2) axes.push_back(-1 - static_cast<int64_t>(d));
      CAPTURE(kiln::dtype_name(dt), kiln::shape_str(shape), kiln::shape_str(axes));
      Sample x = sample(shape, dt, seed++);
      auto at = [&](const Coords& c) {
        Coords in = c;
        for (int64_t a : axes) {
          size_t d = shape.size() + a;
          in[d] = shape[d] - 1 - c[d];
        }
        return x.at(in);
      };
      check_values(kiln::flip(x.t, axes), shape, dt, build(shape, at));
    }
  }
  CHECK(kiln::flip(kiln::arange(4), {0}).to_vector<int64_t>() == std::vector<int64_t>{3, 2, 1, 0});
}

TEST_CASE("pad fills with the value and crops with negative pads", "[shape]") {
  using Pads = std::vector<std::pair<int64_t, int64_t>>;
  const std::vector<std::pair<Shape, Pads>> cases = {
      {{3}, {{2, 1}}},
      {{2, 3}, {{1, 0}, {0, 2}}},
      {{2, 3}, {{-1, 1}, {1, -2}}},
      {{4, 5}, {{-2, -1}, {-1, -1}}},
      {{0, 2}, {{1, 1}, {0, 0}}},
      {{2, 1, 3, 2}, {{0, 1}, {1, 1}, {0, 0}, {2, -1}}},
      {{1, 2, 1, 2, 2}, {{1, 0}, {0, 0}, {0, 1}, {1, 0}, {0, 1}}},
  };
  uint32_t seed = 70;
  for (DType dt : kDTypes) {
    for (const auto& [shape, pads] : cases) {
      CAPTURE(kiln::dtype_name(dt), kiln::shape_str(shape));
      Sample x = sample(shape, dt, seed++);
      double fill = dt == DType::Bool ? 1.0 : 7.0;
      Shape out = shape;
      for (size_t d = 0; d < shape.size(); ++d) out[d] += pads[d].first + pads[d].second;
      auto at = [&](const Coords& c) {
        Coords in = c;
        for (size_t d = 0; d < shape.size(); ++d) {
          in[d] = c[d] - pads[d].first;
          if (in[d] < 0 || in[d] >= shape[d]) return fill;
        }
        return x.at(in);
      };
      check_values(kiln::pad(x.t, pads, fill), out, dt, build(out, at));
    }
  }
  Tensor s = kiln::tensor(3.0f);
  CHECK(kiln::pad(s, {}).node() == s.node());
}

TEST_CASE("concat joins along an axis with torch.cat's promotion", "[shape]") {
  const std::vector<std::vector<Shape>> cases = {
      {{2}, {3}, {1}},
      {{2, 3}, {2, 0}, {2, 4}},
      {{0, 3}, {2, 3}},
      {{2, 2, 3}, {2, 1, 3}, {2, 3, 3}},
      {{1, 2, 3, 1, 2}, {1, 2, 3, 2, 2}},
      {{0, 2}, {0, 2}},
  };
  const std::vector<int64_t> axes = {0, 1, 0, -2, 3, 0};
  uint32_t seed = 90;
  for (DType dt : kDTypes) {
    for (size_t c = 0; c < cases.size(); ++c) {
      CAPTURE(kiln::dtype_name(dt), c);
      std::vector<Sample> xs;
      std::vector<Tensor> ts;
      for (const Shape& s : cases[c]) {
        xs.push_back(sample(s, dt, seed++));
        ts.push_back(xs.back().t);
      }
      int a = static_cast<int>(axes[c] < 0 ? axes[c] + cases[c][0].size() : axes[c]);
      Shape out = cases[c][0];
      out[a] = 0;
      for (const Shape& s : cases[c]) out[a] += s[a];
      auto at = [&](const Coords& co) {
        Coords in = co;
        for (const Sample& x : xs) {
          if (in[a] < x.t.shape()[a]) return x.at(in);
          in[a] -= x.t.shape()[a];
        }
        return -1000.0;
      };
      check_values(kiln::concat(ts, axes[c]), out, dt, build(out, at));
    }
  }
  Tensor i32 = kiln::from_vector<int32_t>({1, 2});
  CHECK(kiln::concat({i32, kiln::from_vector<int64_t>({3})}).dtype() == DType::Int64);
  CHECK(kiln::concat({kiln::from_vector<bool>({true}), i32}).dtype() == DType::Int32);
  Tensor mixed = kiln::concat({i32, kiln::from_vector<float>({0.5f})});
  check_values(mixed, {3}, DType::Float32, {1, 2, 0.5});
  CHECK(kiln::concat({i32, kiln::cast(kiln::from_vector<float>({0.5f}), DType::Float16)}).dtype() ==
        DType::Float16);
}

TEST_CASE("concat copies values exactly: -0.0, NaN, large int64", "[shape]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor a = kiln::from_vector<double>({-0.0, 1.0});
  Tensor b = kiln::from_vector<double>({nan, -0.0, -2.5});
  std::vector<double> got = kiln::concat({a, b}).to_vector<double>();
  REQUIRE(got.size() == 5);
  CHECK(std::signbit(got[0]));
  CHECK(got[1] == 1.0);
  CHECK(std::isnan(got[2]));
  CHECK((std::signbit(got[3]) && got[3] == 0.0));
  CHECK(got[4] == -2.5);
  const int64_t big = (int64_t{1} << 62) + 1;
  Tensor c =
      kiln::concat({kiln::from_vector<int64_t>({big, -big}), kiln::from_vector<int64_t>({7})});
  CHECK(c.to_vector<int64_t>() == std::vector<int64_t>{big, -big, 7});
  Tensor f = kiln::concat({kiln::from_vector<float>({-0.0f}), kiln::from_vector<float>({-0.0f})});
  for (float v : f.to_vector<float>()) CHECK(std::bit_cast<uint32_t>(v) == 0x80000000u);
}

TEST_CASE("concat_tree joins any number of pieces exactly as concat does", "[shape]") {
  // Pieces of one and of several steps, NaN and -0.0 among them: the tree's stored inner
  // joins must copy bits as the flat concat does, for every count (and every tree shape).
  for (int n = 1; n <= 19; ++n) {
    CAPTURE(n);
    std::vector<Tensor> pieces;
    for (int k = 0; k < n; ++k) {
      kiln::Generator gen(static_cast<uint64_t>(500 + 31 * n + k));
      Tensor p = kiln::randn({1 + k % 3, 2, 5}, DType::Float32, gen);
      if (k == n / 2) p = kiln::where(p > 0.5f, kiln::full({1}, NAN), p * -0.0f);
      pieces.push_back(p);
    }
    std::vector<float> want;
    {
      kiln::test::ExecutorScope ref("reference");
      want = kiln::concat(pieces, 0).to_vector<float>();
    }
    const std::vector<float> got = kiln::detail::concat_tree(pieces, 0).to_vector<float>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      CHECK(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]));
    }
  }
}

TEST_CASE("stack inserts a new axis", "[shape]") {
  uint32_t seed = 120;
  for (DType dt : kDTypes) {
    for (const Shape& shape : {Shape{}, Shape{3}, Shape{2, 3}, Shape{0, 2}, Shape{2, 1, 2, 2}}) {
      for (int64_t axis : {int64_t{0}, int64_t{-1}, static_cast<int64_t>(shape.size() / 2)}) {
        CAPTURE(kiln::dtype_name(dt), kiln::shape_str(shape), axis);
        std::vector<Sample> xs;
        std::vector<Tensor> ts;
        for (int k = 0; k < 3; ++k) {
          xs.push_back(sample(shape, dt, seed++));
          ts.push_back(xs.back().t);
        }
        size_t a = static_cast<size_t>(axis < 0 ? axis + shape.size() + 1 : axis);
        Shape out = shape;
        out.insert(out.begin() + a, 3);
        auto at = [&](const Coords& c) {
          Coords in = c;
          in.erase(in.begin() + a);
          return xs[c[a]].at(in);
        };
        check_values(kiln::stack(ts, axis), out, dt, build(out, at));
      }
    }
  }
}

TEST_CASE("split and chunk give torch's pieces", "[shape]") {
  Sample x = sample({2, 7, 3}, DType::Float64, 140);
  auto check_pieces = [&](const std::vector<Tensor>& pieces, int axis,
                          const std::vector<int64_t>& sizes) {
    REQUIRE(pieces.size() == sizes.size());
    int64_t start = 0;
    for (size_t k = 0; k < pieces.size(); ++k) {
      Shape out = x.t.shape();
      out[axis] = sizes[k];
      auto at = [&](const Coords& c) {
        Coords in = c;
        in[axis] += start;
        return x.at(in);
      };
      check_values(pieces[k], out, DType::Float64, build(out, at));
      start += sizes[k];
    }
  };
  check_pieces(kiln::split(x.t, 3, 1), 1, {3, 3, 1});
  check_pieces(kiln::split(x.t, 7, -2), 1, {7});
  check_pieces(kiln::split(x.t, 100, 1), 1, {7});
  check_pieces(kiln::split(x.t, 1, 0), 0, {1, 1});
  check_pieces(kiln::split(x.t, std::vector<int64_t>{2, 0, 4, 1}, 1), 1, {2, 0, 4, 1});
  check_pieces(kiln::split(x.t, std::vector<int64_t>{1, 2}, -1), 2, {1, 2});
  check_pieces(kiln::chunk(x.t, 3, 1), 1, {3, 3, 1});
  check_pieces(kiln::chunk(x.t, 4, 1), 1, {2, 2, 2, 1});
  check_pieces(kiln::chunk(x.t, 2, -1), 2, {2, 1});
  check_pieces(kiln::chunk(x.t, 10, 0), 0, {1, 1});
  // torch.chunk(arange(5), 4) has three pieces: ceil(5/4) = 2 per piece.
  std::vector<Tensor> five = kiln::chunk(kiln::arange(5), 4);
  REQUIRE(five.size() == 3);
  CHECK(five[2].to_vector<int64_t>() == std::vector<int64_t>{4});
  CHECK(kiln::split(kiln::zeros({0, 2}), 2).size() == 1);
  CHECK(kiln::split(kiln::zeros({0, 2}), 0).size() == 1);
  std::vector<Tensor> empty_chunks = kiln::chunk(kiln::zeros({0, 2}), 3);
  REQUIRE(empty_chunks.size() == 3);
  CHECK(empty_chunks[1].shape() == Shape{0, 2});
  std::vector<Tensor> b = kiln::split(kiln::from_vector<bool>({true, false, true}), 2);
  CHECK(b[1].dtype() == DType::Bool);
  CHECK(b[1].to_vector<int64_t>() == std::vector<int64_t>{1});
}

TEST_CASE("gather reads along an axis through an index tensor", "[shape]") {
  struct Case {
    Shape x, index;
    int64_t axis;
  };
  const std::vector<Case> cases = {
      {{5}, {8}, 0},        {{3, 4}, {3, 6}, 1},        {{3, 4}, {2, 4}, 0},
      {{3, 4}, {2, 3}, -1}, {{2, 3, 4}, {2, 5, 3}, -2}, {{2, 3, 2, 4}, {1, 3, 2, 2}, 3},
      {{3, 4}, {0, 4}, 0},  {{3, 0}, {3, 0}, 1},        {{2, 1, 2, 2, 3}, {2, 1, 2, 2, 4}, 4},
  };
  uint32_t seed = 160;
  for (DType dt : kDTypes) {
    for (const Case& c : cases) {
      CAPTURE(kiln::dtype_name(dt), kiln::shape_str(c.x), kiln::shape_str(c.index), c.axis);
      Sample x = sample(c.x, dt, seed++);
      int a = static_cast<int>(c.axis < 0 ? c.axis + c.x.size() : c.axis);
      std::vector<int64_t> idx =
          random_indices(count(c.index), std::max<int64_t>(c.x[a], 1), seed++);
      for (DType it : {DType::Int64, DType::Int32}) {
        Tensor index = kiln::cast(kiln::from_vector(idx, c.index), it);
        auto at = [&](const Coords& co) {
          Coords in = co;
          in[a] = idx[ravel(co, c.index)];
          return x.at(in);
        };
        check_values(kiln::gather(x.t, c.axis, index), c.index, dt, build(c.index, at));
      }
    }
  }
  Tensor s = kiln::gather(kiln::tensor(2.5), 0, kiln::tensor(int64_t{0}));
  check_values(s, {}, DType::Float64, {2.5});
}

TEST_CASE("index_select picks slices along an axis", "[shape]") {
  uint32_t seed = 200;
  for (DType dt : kDTypes) {
    for (const Shape& shape :
         {Shape{5}, Shape{3, 4}, Shape{2, 3, 4}, Shape{2, 0, 3}, Shape{1, 2, 3, 2, 2}}) {
      for (int64_t axis : {int64_t{0}, int64_t{-1}}) {
        CAPTURE(kiln::dtype_name(dt), kiln::shape_str(shape), axis);
        Sample x = sample(shape, dt, seed++);
        int a = static_cast<int>(axis < 0 ? axis + shape.size() : axis);
        std::vector<int64_t> idx =
            shape[a] == 0 ? std::vector<int64_t>{} : random_indices(7, shape[a], seed++);
        Shape out = shape;
        out[a] = static_cast<int64_t>(idx.size());
        auto at = [&](const Coords& c) {
          Coords in = c;
          in[a] = idx[c[a]];
          return x.at(in);
        };
        check_values(kiln::index_select(x.t, axis, kiln::from_vector(idx)), out, dt,
                     build(out, at));
      }
    }
  }
}

TEST_CASE("scatter_add sums src into x at index positions", "[shape]") {
  struct Case {
    Shape x, index, src;
    int64_t axis;
  };
  const std::vector<Case> cases = {
      {{5}, {9}, {9}, 0},
      {{3, 4}, {3, 6}, {3, 6}, 1},
      {{3, 4}, {5, 2}, {6, 3}, 0},
      {{2, 3, 4}, {2, 2, 4}, {2, 3, 4}, -2},
      {{2, 3, 2, 2, 3}, {2, 3, 2, 2, 5}, {2, 3, 2, 2, 5}, -1},
      {{3, 4}, {0, 4}, {1, 4}, 0},
  };
  uint32_t seed = 240;
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64}) {
    for (const Case& c : cases) {
      CAPTURE(kiln::dtype_name(dt), kiln::shape_str(c.x), kiln::shape_str(c.index), c.axis);
      Sample x = sample(c.x, dt, seed++);
      Sample src = sample(c.src, dt, seed++);
      int a = static_cast<int>(c.axis < 0 ? c.axis + c.x.size() : c.axis);
      std::vector<int64_t> idx = random_indices(count(c.index), c.x[a], seed++);
      std::vector<double> want = x.v;
      for (int64_t i = 0; i < count(c.index); ++i) {
        Coords co = unravel(i, c.index);
        Coords to = co;
        to[a] = idx[i];
        want[ravel(to, c.x)] += src.at(co);
      }
      Tensor index = kiln::from_vector(idx, c.index);
      check_values(kiln::scatter_add(x.t, c.axis, index, src.t), c.x, dt, want);
    }
  }
  Tensor z = kiln::zeros({3}, DType::Int64);
  Tensor counts = kiln::scatter_add(z, 0, kiln::from_vector<int64_t>({2, 0, 2, 2}),
                                    kiln::ones({4}, DType::Int64));
  CHECK(counts.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 3});
}

TEST_CASE("tril and triu keep a triangle of the last two dimensions", "[shape]") {
  uint32_t seed = 280;
  for (DType dt : kDTypes) {
    for (const Shape& shape : {Shape{4, 4}, Shape{3, 5}, Shape{5, 2}, Shape{2, 3, 4},
                               Shape{2, 1, 2, 3, 3}, Shape{0, 3}, Shape{2, 0, 0}}) {
      for (int64_t k : {-2, -1, 0, 1, 3}) {
        CAPTURE(kiln::dtype_name(dt), kiln::shape_str(shape), k);
        Sample x = sample(shape, dt, seed++);
        size_t r = shape.size();
        auto lower = [&](const Coords& c) { return c[r - 1] - c[r - 2] <= k ? x.at(c) : 0.0; };
        auto upper = [&](const Coords& c) { return c[r - 1] - c[r - 2] >= k ? x.at(c) : 0.0; };
        check_values(kiln::tril(x.t, k), shape, dt, build(shape, lower));
        check_values(kiln::triu(x.t, k), shape, dt, build(shape, upper));
      }
    }
  }
  Tensor m = kiln::from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  CHECK(kiln::tril(m).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 4, 5, 0, 7, 8, 9});
  CHECK(kiln::triu(m, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 3, 0, 0, 6, 0, 0, 0});
}

TEST_CASE("one_hot puts a 1 at each class", "[shape]") {
  Tensor v = kiln::from_vector<int64_t>({2, 0, 1, 2});
  Tensor h = kiln::one_hot(v, 3);
  CHECK(h.dtype() == DType::Int64);
  CHECK(h.shape() == Shape{4, 3});
  CHECK(h.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1});
  for (const Shape& shape : {Shape{}, Shape{6}, Shape{2, 3}, Shape{0, 2}, Shape{2, 1, 2, 2}}) {
    CAPTURE(kiln::shape_str(shape));
    std::vector<int64_t> idx = random_indices(count(shape), 5, 300);
    Tensor index = kiln::cast(kiln::from_vector(idx, shape), DType::Int32);
    Shape out = shape;
    out.push_back(5);
    auto at = [&](const Coords& c) {
      Coords in(c.begin(), c.end() - 1);
      return idx[ravel(in, shape)] == c.back() ? 1.0 : 0.0;
    };
    check_values(kiln::one_hot(index, 5), out, DType::Int64, build(out, at));
  }
}

// --- errors ---

#define CHECK_ERROR(expr, type, ...)      \
  do {                                    \
    CHECK_THROWS_AS(expr, type);          \
    CHECK_THROWS_WITH(expr, __VA_ARGS__); \
  } while (0)

TEST_CASE("reshape errors name the shapes", "[errors][shape]") {
  Tensor x = kiln::zeros({2, 3});
  CHECK_ERROR(kiln::reshape(x, {4}), kiln::ShapeError,
              "[reshape] cannot reshape tensor of shape [2, 3] (6 elements) into shape [4] "
              "(4 elements)");
  CHECK_ERROR(kiln::reshape(x, {-1, -1}), kiln::ValueError,
              Contains("[reshape]") && Contains("[-1, -1]") && Contains("[2, 3]"));
  CHECK_ERROR(kiln::reshape(x, {4, -1}), kiln::ShapeError,
              Contains("[reshape]") && Contains("[2, 3]") && Contains("[4, -1]"));
  CHECK_ERROR(kiln::reshape(x, {-2, -3}), kiln::ValueError,
              Contains("[reshape]") && Contains("[-2, -3]"));
  CHECK_ERROR(kiln::reshape(kiln::zeros({0, 2}), {0, -1}), kiln::ShapeError,
              Contains("[reshape]") && Contains("[0, 2]") && Contains("ambiguous"));
}

TEST_CASE("axis and permutation errors name the shape", "[errors][shape]") {
  Tensor x = kiln::zeros({2, 3, 4});
  CHECK_ERROR(kiln::transpose(x, 0, 3), kiln::ShapeError,
              Contains("[transpose]") && Contains("[2, 3, 4]") && Contains("axis 3"));
  CHECK_ERROR(kiln::unsqueeze(x, -5), kiln::ShapeError,
              Contains("[unsqueeze]") && Contains("[2, 3, 4]"));
  CHECK_ERROR(kiln::flatten(x, 2, 1), kiln::ShapeError,
              Contains("[flatten]") && Contains("[2, 3, 4]"));
  CHECK_ERROR(
      kiln::permute(x, {0, 0, 1}), kiln::ShapeError,
      Contains("[permute] axes [0, 0, 1] are not a permutation of 0..2 for shape [2, 3, 4]"));
  CHECK_ERROR(kiln::permute(x, {1, 0}), kiln::ShapeError,
              Contains("[permute]") && Contains("[1, 0]") && Contains("[2, 3, 4]"));
  CHECK_ERROR(kiln::flip(x, {1, -2}), kiln::ShapeError,
              Contains("[flip]") && Contains("[2, 3, 4]"));
}

TEST_CASE("slice, pad, split and chunk reject bad arguments", "[errors][shape]") {
  Tensor x = kiln::zeros({2, 3});
  CHECK_ERROR(kiln::slice(x, 1, 0, 3, 0), kiln::ValueError,
              Contains("[slice]") && Contains("step") && Contains("[2, 3]"));
  CHECK_ERROR(kiln::slice(kiln::tensor(1.0f), 0, 0, 1), kiln::ShapeError,
              Contains("[slice]") && Contains("[]"));
  CHECK_ERROR(kiln::pad(x, {{1, 1}}), kiln::ShapeError, Contains("[pad]") && Contains("[2, 3]"));
  CHECK_ERROR(kiln::pad(x, {{0, 0}, {-2, -2}}), kiln::ShapeError,
              Contains("[pad]") && Contains("[2, 3]") && Contains("-1"));
  CHECK_ERROR(kiln::split(x, 0, 1), kiln::ValueError,
              Contains("[split]") && Contains("[2, 3]") && Contains("split_size"));
  CHECK_ERROR(kiln::split(x, std::vector<int64_t>{1, 1}, 1), kiln::ShapeError,
              Contains("[split]") && Contains("[1, 1]") && Contains("[2, 3]"));
  CHECK_ERROR(kiln::chunk(x, 0, 0), kiln::ValueError, Contains("[chunk]") && Contains("[2, 3]"));
}

TEST_CASE("concat and stack errors name the tensors", "[errors][shape]") {
  Tensor a = kiln::zeros({2, 3}), b = kiln::zeros({2, 4});
  CHECK_ERROR(kiln::concat({a, b}, 0), kiln::ShapeError,
              Contains("[concat]") && Contains("[2, 3]") && Contains("[2, 4]"));
  CHECK_NOTHROW(kiln::concat({a, b}, 1));
  CHECK_ERROR(kiln::concat({a, kiln::zeros({2, 3, 1})}, 0), kiln::ShapeError,
              Contains("[concat]") && Contains("[2, 3, 1]"));
  CHECK_ERROR(kiln::concat({}, 0), kiln::ValueError, Contains("[concat]") && Contains("empty"));
  CHECK_ERROR(kiln::stack({}, 0), kiln::ValueError, Contains("[stack]") && Contains("empty"));
  CHECK_ERROR(kiln::stack({a, b}, 0), kiln::ShapeError,
              Contains("[stack]") && Contains("[2, 3]") && Contains("[2, 4]"));
  CHECK_ERROR(kiln::concat({a, a}, 2), kiln::ShapeError,
              Contains("[concat]") && Contains("axis 2") && Contains("[2, 3]"));
}

TEST_CASE("gather, index_select, scatter_add and one_hot check indices", "[errors][shape]") {
  Tensor x = kiln::zeros({2, 3});
  Tensor bad = kiln::from_vector<int64_t>({0, 3, 1, 2}, {2, 2});
  // Out-of-range index data is only known at evaluation.
  CHECK_ERROR(kiln::gather(x, 1, bad).eval(), kiln::IndexError,
              Contains("[gather]") && Contains("3") && Contains("[2, 3]"));
  Tensor negative = kiln::from_vector<int64_t>({0, -1}, {2, 1});
  CHECK_ERROR(kiln::gather(x, 1, negative).eval(), kiln::IndexError,
              Contains("[gather]") && Contains("-1"));
  CHECK_ERROR(kiln::gather(x, 1, kiln::from_vector<int64_t>({0, 1})), kiln::ShapeError,
              Contains("[gather]") && Contains("[2]") && Contains("[2, 3]"));
  CHECK_ERROR(kiln::gather(x, 0, kiln::zeros({2, 4}, DType::Int64)), kiln::ShapeError,
              Contains("[gather]") && Contains("[2, 4]") && Contains("[2, 3]"));
  CHECK_ERROR(kiln::gather(x, 1, kiln::zeros({2, 2})), kiln::DTypeError,
              Contains("[gather]") && Contains("float32"));
  CHECK_ERROR(kiln::index_select(x, 0, kiln::from_vector<int64_t>({1, 2})).eval(), kiln::IndexError,
              Contains("[index_select]") && Contains("2"));
  CHECK_ERROR(kiln::index_select(x, 0, bad), kiln::ShapeError,
              Contains("[index_select]") && Contains("[2, 2]"));
  CHECK_ERROR(kiln::scatter_add(x, 0, bad, x).eval(), kiln::IndexError,
              Contains("[scatter_add]") && Contains("3"));
  CHECK_ERROR(kiln::scatter_add(x, 0, bad, kiln::zeros({2, 3}, DType::Float64)), kiln::DTypeError,
              Contains("[scatter_add]") && Contains("float64") && Contains("float32"));
  CHECK_ERROR(kiln::one_hot(kiln::zeros({3}), 4), kiln::DTypeError,
              Contains("[one_hot]") && Contains("float32[3]"));
  CHECK_ERROR(kiln::one_hot(kiln::from_vector<int64_t>({1}), 0), kiln::ValueError,
              Contains("[one_hot]") && Contains("num_classes"));
  CHECK_ERROR(kiln::one_hot(kiln::from_vector<int64_t>({1, 4}), 4).eval(), kiln::IndexError,
              Contains("[one_hot]") && Contains("4"));
}

TEST_CASE("tril and triu need rank >= 2", "[errors][shape]") {
  CHECK_ERROR(kiln::tril(kiln::zeros({3})), kiln::ShapeError,
              Contains("[tril]") && Contains("[3]") && Contains("rank >= 2"));
  CHECK_ERROR(kiln::triu(kiln::tensor(1)), kiln::ShapeError, Contains("[triu]") && Contains("[]"));
}
