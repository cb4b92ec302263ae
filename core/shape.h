#pragma once
// Shapes, numpy broadcasting and axis normalisation. Checks throw with the op's name so
// every caller reports errors the same way.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

/// Sizes of each dimension, outermost first. Rank 0 is a scalar; zero sizes are allowed.
using Shape = std::vector<int64_t>;

/// Number of elements (1 for rank 0, 0 when any dimension is 0). Unchecked: for shapes
/// that went through check_sizes, which every node's shape does when its op is built.
int64_t numel(const Shape& shape);
/// Number of elements; throws ValueError naming `op` and the shape when the count does
/// not fit int64 (e.g. [2^32, 2^32]) or a size is negative.
int64_t checked_numel(std::string_view op, const Shape& shape);
/// Bytes of a buffer of this shape with `itemsize`-byte elements; throws ValueError naming
/// `op` when numel * itemsize does not fit int64.
int64_t checked_nbytes(std::string_view op, const Shape& shape, size_t itemsize);
/// "[2, 3]", "[]" for rank 0.
std::string shape_str(const Shape& shape);
/// Row-major element strides of a contiguous buffer of this shape.
std::vector<int64_t> contiguous_strides(const Shape& shape);
/// Prints shape_str(): "[2, 3]". Shape is std::vector<int64_t>, so argument-dependent
/// lookup does not find this from outside kiln: `std::cout << t.shape()` compiles where
/// `using namespace kiln;` or `using kiln::operator<<;` is in scope.
std::ostream& operator<<(std::ostream& os, const Shape& shape);
/// numpy broadcasting of two shapes; throws ShapeError naming `op` and both shapes.
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);
/// Maps a possibly negative axis into [0, rank); throws ShapeError naming `op` and `shape`.
int normalize_axis(std::string_view op, int64_t axis, const Shape& shape);
/// Like normalize_axis for a position in [0, rank] (where unsqueeze/stack may insert).
int normalize_insert_axis(std::string_view op, int64_t axis, const Shape& shape);
/// Throws ValueError naming `op` if any size is negative, or if the element count (and,
/// with an itemsize, the byte size) does not fit int64: what every op checks on the shape of
/// a node it builds.
void check_sizes(std::string_view op, const Shape& shape, size_t itemsize = 1);

}  // namespace kiln
