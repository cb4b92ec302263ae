#pragma once
// The one structural key of kiln (STYLE item 2): common-subexpression elimination, the
// plan cache and kernel naming all derive their keys from these functions, so two places
// never disagree about whether two nodes are "the same".
//
// Keys are built bottom-up: a node's key combines its own structure with its inputs' keys,
// which the caller computes first (schedules are topological). Two flavours:
//  * node_key: shape-generic. It sees the rank and which dimensions are 1 (that is what a
//    kernel is specialised on: broadcasting), never the sizes, so changing a batch size
//    keeps the key. Nor does it see a random op's generator state (seed, offset): kernels
//    take it as a parameter, so dropout drawing new numbers each step keeps the key. Evaluated
//    nodes (leaves) count by dtype, device, rank and ones-pattern only, so it does not tell apart
//    *which* leaf feeds a node: a signature of a whole graph must also record which inputs are the
//    same leaf.
//  * node_value_key: exact. It adds the sizes and names leaves by identity (pointer), so
//    equal keys are a necessary condition for equal values (CSE checks same_value after).
// Keys are deterministic within a process; the leaf part of node_value_key depends on
// addresses, so only node_key is stable across processes.
#include <cstddef>
#include <cstdint>

#include "node.h"

namespace kiln {

/// Mixes `value` into `seed` (splitmix64 finalizer based; order-sensitive, not commutative).
uint64_t hash_combine(uint64_t seed, uint64_t value);

/// Hash of a node's own structure: op, dtype, device, attributes (scalar, index maps via
/// IndexExpr::hash, reduce, check_indices, axis, weak_scalar; not seed/offset), and the shape's
/// rank plus which dimensions are 1 (sizes excluded, so a batch-size change keeps the key)
/// — combined with the given input keys in order. Evaluated nodes hash as leaves (dtype,
/// device, rank, ones-pattern) and ignore `input_keys`.
uint64_t node_key(const Node& n, const uint64_t* input_keys, size_t num_inputs);

/// Same, but also hashing the exact sizes and seed/offset (CSE needs exact equality of
/// values); evaluated
/// nodes hash by their address.
uint64_t node_value_key(const Node& n, const uint64_t* input_keys, size_t num_inputs);

/// True when two nodes compute the same value: same op, dtype, device, exact shape,
/// attributes, and identical input nodes (pointer equality). An evaluated node (a leaf,
/// constants included) is only the same value as itself.
bool same_value(const Node& a, const Node& b);

}  // namespace kiln
