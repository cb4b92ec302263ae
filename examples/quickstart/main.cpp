#include <iostream>
#include <kiln/kiln.h>
int main() {
  kiln::Tensor a = kiln::arange(0, 6, 1, kiln::DType::Float32);
  kiln::Tensor b = a * 2.0f + 1;
  std::cout << b.to_vector<float>()[5] << "\n";
}
