#include <sstream>

#include "tensor.h"

namespace kiln {

std::string Tensor::str() const {
  std::ostringstream os;
  os << "tensor(shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype()) << ")";
  return os.str();
}

}  // namespace kiln
