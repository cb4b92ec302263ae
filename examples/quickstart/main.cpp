// A tour of kiln: build a lazy graph, look at it, evaluate it, read the results.
// Run with `make demo`.
#include <kiln/kiln.h>

#include <chrono>
#include <iostream>

#include "common/flags.h"

namespace {
void section(const char* title) { std::cout << "\n== " << title << " ==\n"; }
}  // namespace

int tour() {
  using namespace kiln;

  section("1. Broadcasting: a [3,1] + b [4] -> [3,4]");
  Tensor a = from_vector<float>({0, 1, 2}, {3, 1});
  Tensor b = from_vector<float>({0.5f, 1.5f, 2.5f, 3.5f});
  Tensor c = a * 10 + b;
  // Nothing has run yet: c is a description of the work.
  std::cout << "c is evaluated? " << std::boolalpha << c.is_evaluated() << "\n";

  section("2. Reductions: sum over an axis, mean of all");
  Tensor row_sums = sum(c, 1);
  Tensor avg = mean(c);
  std::cout << "sum(c, 1): shape " << shape_str(row_sums.shape()) << ", mean(c): shape "
            << shape_str(avg.shape()) << " (shapes are known before anything runs)\n";

  section("3. The graph before evaluation (dump_graph)");
  // broadcast_to becomes a reindex, sum a reindex_reduce: kiln's meta-ops.
  std::cout << dump_graph({row_sums, avg});

  section("4. Results (evaluating both shares the work for c)");
  eval({row_sums, avg});
  std::cout << "c = a * 10 + b:\n" << c << "\n";
  std::cout << "sum(c, 1): " << row_sums << "\n";
  std::cout << "mean(c):   " << avg << "\n";

  section("5. Matmul by composition: reindex to [m,k,n], mul, reduce over k");
  Tensor m = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor n = ones({3, 2});
  Tensor p = matmul(m, n);
  std::cout << dump_graph({p});
  std::cout << "matmul(m, n):\n" << p << "\n";

  section("6. Random numbers: counter-based, reproducible");
  manual_seed(0);
  Tensor r1 = randn({2, 3});
  manual_seed(0);
  Tensor r2 = randn({2, 3});
  std::cout << r1 << "\n";
  std::cout << "same seed, same values? " << (all(r1 == r2).item<bool>() ? "yes" : "no") << "\n";

  section("7. Re-evaluating is free");
  // An evaluated tensor is a leaf holding its value: its input edges are gone, so reading
  // it again runs nothing and the graph behind it has been freed.
  std::cout << dump_graph({row_sums});
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) row_sums.eval();
  auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
  std::cout << "1000 more eval() calls: " << static_cast<int>(us.count()) << " us in total\n";
  return 0;
}

int main(int argc, char** argv) {
  example::Flags flags("quickstart",
                       "A tour of kiln: builds a lazy graph, prints it, evaluates it and reads "
                       "the results.");
  // A kiln::Error (a bad KILN_* variable, say) prints "quickstart: error: ..." and exits 1.
  return flags.main(argc, argv, [](const example::Flags&) { return tour(); });
}
