// bench/kept_for_backward.h: what a training step keeps for its backward pass, counted from
// its planning tables (the measure the mixed-precision benchmark rows report).
#include <catch2/catch.hpp>

#include "bench/kept_for_backward.h"

using namespace kiln;

TEST_CASE("kept_for_backward counts forward values that backward kernels read", "[amp][bench]") {
  // Leaves: the weight W (0) and the batch x (1). Forward: c = cast(W), h = linear(x, c),
  // a = relu(h), loss = f(a). Backward: g = grad(a, c), then the update u = W - g.
  memory::StepGraphFile file;
  memory::StepGraph& g = file.graph;
  auto value = [&](size_t bytes, int producer, bool output = false) {
    g.values.push_back({bytes, producer, output, false});
    return static_cast<int>(g.values.size()) - 1;
  };
  auto kernel = [&](std::vector<int> inputs, int output, const std::string& name) {
    g.kernels.push_back({std::move(inputs), output});
    file.kernel_names.push_back(name);
  };
  const int w = value(4000, -1), x = value(800, -1);
  const int c = value(2000, 0), h = value(300, 1), a = value(300, 2), loss = value(4, 3, true);
  const int grad = value(4000, 4), update = value(4000, 5, true);
  kernel({w}, c, "cast");
  kernel({x, c}, h, "cast+linear");
  kernel({h}, a, "relu");
  kernel({a}, loss, "log_softmax+mean");
  kernel({a, c}, grad, "full+gt+where+linear");
  kernel({w, grad}, update, "mul+sub");

  const bench::KeptForBackward kept = bench::kept_for_backward(file);
  REQUIRE(kept.found);
  CHECK(kept.forward_kernels == 4);  // cast, linear, relu and the loss
  CHECK(kept.activations == 300);    // a; h is read by the forward pass only
  CHECK(kept.values == 1);
  CHECK(kept.leaf_copies == 2000);  // the bfloat16 copy of W
  (void)update;
}

TEST_CASE("kept_for_backward finds nothing in a step without a backward pass", "[amp][bench]") {
  memory::StepGraphFile file;
  file.graph.values = {{800, -1, false, false}, {800, 0, false, false}, {4, 1, true, false}};
  file.graph.kernels = {{{0}, 1}, {{1}, 2}};
  file.kernel_names = {"relu", "sum"};
  CHECK_FALSE(bench::kept_for_backward(file).found);
}
