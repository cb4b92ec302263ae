#pragma once
// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}
// padded with spaces to a multiple of 8 bytes, then the tensors' row-major little-endian
// bytes. Files written here are byte-identical to those of the reference implementation
// for the same tensors and metadata.
#include <map>
#include <string>

#include "state_dict.h"

namespace kiln {

/// Writes `tensors` (evaluating them) and string `metadata` to `path`, atomically: a
/// temporary file in the same directory is renamed over `path`. Throws ValueError for an
/// undefined tensor or an empty or reserved ("__metadata__") name, IOError if writing fails.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a safetensors file as an evaluated constant. The file is checked
/// completely first; a malformed one raises IOError naming the file and the problem, a
/// dtype kiln lacks (U16, U32, U64, F8_*) raises DTypeError.
StateDict load_safetensors(const std::string& path);

/// The "__metadata__" map of a safetensors file (empty when it has none), checked like
/// load_safetensors but without reading the tensor data.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

}  // namespace kiln
