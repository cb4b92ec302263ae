#include "checkpoint.h"

#include "../core/error.h"
#include "../core/node.h"
#include "../jit/step_memory.h"

namespace kiln {

std::vector<Tensor> checkpoint(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    const std::vector<Tensor>& inputs) {
  if (!fn)
    throw ValueError("[checkpoint] got an empty function; expected a callable to checkpoint");
  const uint32_t region = new_checkpoint_region();
  struct Scope {
    uint32_t previous;
    ~Scope() { set_checkpoint_region(previous); }
  } scope{set_checkpoint_region(region)};
  std::vector<Tensor> outputs = fn(inputs);
  // The results are kept like any value made outside the region; values they read are
  // released once read by what comes after the region.
  for (const Tensor& t : outputs)
    if (t.defined() && t.node()->checkpoint_region == region)
      t.node()->checkpoint_region = region | jit::kCheckpointResultBit;
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  if (!fn)
    throw ValueError("[checkpoint] got an empty function; expected a callable to checkpoint");
  return checkpoint([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    {input})[0];
}

}  // namespace kiln
