#include "structural_hash.h"

#include <cstring>

#include "custom_op.h"

namespace kiln {
namespace {

// splitmix64's finalizer: a bijection on 64 bits with full avalanche, so combining with it
// keeps keys of similar graphs far apart.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Distinct starting points keep the two key flavours and leaves from ever coinciding by
// construction.
constexpr uint64_t kStructSeed = 0x6b696c6e2d6b6579ULL;  // "kiln-key"
constexpr uint64_t kValueSeed = 0x6b696c6e2d76616cULL;   // "kiln-val"
constexpr uint64_t kLeafTag = 0x6c656166ULL;             // "leaf"

uint64_t scalar_bits(const Scalar& s) {
  if (s.kind() == Scalar::Kind::Float) {
    double d = s.to_double();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    return bits;
  }
  return static_cast<uint64_t>(s.to_int64());
}

uint64_t hash_device(uint64_t h, const Device& d) {
  h = hash_combine(h, static_cast<uint64_t>(d.kind));
  return hash_combine(h, static_cast<uint64_t>(static_cast<int64_t>(d.index)));
}

// Rank and, per dimension, whether it is 1: exactly what decides broadcasting.
uint64_t hash_shape_pattern(uint64_t h, const Shape& shape) {
  h = hash_combine(h, shape.size());
  uint64_t word = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) word |= uint64_t{1} << (d % 64);
    if (d % 64 == 63) {
      h = hash_combine(h, word);
      word = 0;
    }
  }
  return hash_combine(h, word);
}

// Attributes are hashed for every op: unused ones keep their defaults, so hashing them costs
// no sharing, and an op that starts using one can never be merged wrongly.
uint64_t hash_attributes(uint64_t h, const Node& n, bool generator_state) {
  h = hash_combine(h, static_cast<uint64_t>(n.scalar.kind()));
  h = hash_combine(h, scalar_bits(n.scalar));
  h = hash_combine(h, n.index_map.size());
  for (const IndexExpr& e : n.index_map) h = hash_combine(h, static_cast<uint64_t>(e.hash()));
  h = hash_combine(h, static_cast<uint64_t>(n.reduce));
  h = hash_combine(h, n.check_indices ? 1 : 0);
  h = hash_combine(h, static_cast<uint64_t>(static_cast<int64_t>(n.axis)));
  if (generator_state) {
    h = hash_combine(h, n.seed);
    h = hash_combine(h, n.offset);
  }
  if (n.custom) h = hash_combine(h, n.custom->hash());
  return hash_combine(h, n.weak_scalar ? 1 : 0);
}

uint64_t hash_own(uint64_t h, const Node& n, bool generator_state) {
  h = hash_combine(h, static_cast<uint64_t>(n.op));
  h = hash_combine(h, static_cast<uint64_t>(n.dtype));
  h = hash_device(h, n.device);
  h = hash_shape_pattern(h, n.shape);
  return hash_attributes(h, n, generator_state);
}

uint64_t hash_inputs(uint64_t h, const uint64_t* input_keys, size_t num_inputs) {
  h = hash_combine(h, num_inputs);
  for (size_t k = 0; k < num_inputs; ++k) h = hash_combine(h, input_keys[k]);
  return h;
}

bool is_leaf(const Node& n) { return n.is_evaluated() || n.op == OpCode::Constant; }

}  // namespace

uint64_t hash_combine(uint64_t seed, uint64_t value) {
  return mix64(seed ^ (mix64(value + 0x9e3779b97f4a7c15ULL) + (seed << 6) + (seed >> 2)));
}

uint64_t node_key(const Node& n, const uint64_t* input_keys, size_t num_inputs) {
  if (is_leaf(n)) {
    uint64_t h = hash_combine(kStructSeed, kLeafTag);
    h = hash_combine(h, static_cast<uint64_t>(n.dtype));
    h = hash_device(h, n.device);
    return hash_shape_pattern(h, n.shape);
  }
  return hash_inputs(hash_own(kStructSeed, n, /*generator_state=*/false), input_keys, num_inputs);
}

uint64_t node_value_key(const Node& n, const uint64_t* input_keys, size_t num_inputs) {
  if (is_leaf(n)) {
    uint64_t h = hash_combine(kValueSeed, kLeafTag);
    return hash_combine(h, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&n)));
  }
  uint64_t h = hash_own(kValueSeed, n, /*generator_state=*/true);
  for (int64_t s : n.shape) h = hash_combine(h, static_cast<uint64_t>(s));
  return hash_inputs(h, input_keys, num_inputs);
}

bool same_value(const Node& a, const Node& b) {
  if (&a == &b) return true;
  if (is_leaf(a) || is_leaf(b)) return false;
  // Each application of a custom autograd function is its own gradient edge.
  if (a.custom_grad || b.custom_grad) return false;
  if ((a.custom == nullptr) != (b.custom == nullptr) || (a.custom && !a.custom->same_as(*b.custom)))
    return false;
  if (a.op != b.op || a.dtype != b.dtype || !(a.device == b.device) || a.shape != b.shape)
    return false;
  if (!(a.scalar == b.scalar) || a.index_map.size() != b.index_map.size() || a.reduce != b.reduce ||
      a.check_indices != b.check_indices || a.axis != b.axis || a.seed != b.seed ||
      a.offset != b.offset || a.weak_scalar != b.weak_scalar) {
    return false;
  }
  for (size_t d = 0; d < a.index_map.size(); ++d)
    if (!(a.index_map[d] == b.index_map[d])) return false;
  if (a.inputs.size() != b.inputs.size()) return false;
  for (size_t k = 0; k < a.inputs.size(); ++k)
    if (a.inputs[k].get() != b.inputs[k].get()) return false;
  return true;
}

}  // namespace kiln
