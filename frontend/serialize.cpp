// safetensors reading and writing. The reader trusts nothing in the file: every length,
// offset and size is checked (with overflow checks) before anything is allocated or read
// from the data section, so a damaged file gives one IOError and no partial result.
#include "serialize.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "../ops/sources.h"

namespace kiln {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping here");

// The reference implementation's limit on the JSON header; larger values are corruption.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeCode {
  DType dtype;
  const char* code;
  // Position in the reference implementation's dtype enum: its writer orders tensors by
  // this (descending), then by name, which also keeps every tensor aligned to its size.
  int rank;
};

constexpr DTypeCode kCodes[] = {
    {DType::Bool, "BOOL", 0}, {DType::UInt8, "U8", 1},    {DType::Int8, "I8", 2},
    {DType::Int16, "I16", 3}, {DType::Float16, "F16", 4}, {DType::BFloat16, "BF16", 5},
    {DType::Int32, "I32", 6}, {DType::Float32, "F32", 7}, {DType::Float64, "F64", 8},
    {DType::Int64, "I64", 9},
};

// Dtypes of the format that kiln has no element type for.
constexpr const char* kUnsupportedCodes[] = {"U16",     "U32", "U64",     "F8_E5M2", "F8_E4M3",
                                             "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64"};

const DTypeCode& code_of(DType dtype) {
  for (const DTypeCode& c : kCodes) {
    if (c.dtype == dtype) return c;
  }
  throw DTypeError("[save_safetensors] dtype " + std::string(dtype_name(dtype)) +
                   " has no safetensors code");
}

std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
}

// ---------------------------------------------------------------------------------------
// Reading

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> tensors;  // sorted by data offset
  uint64_t data_start = 0;           // file offset of the data section
};

class Reader {
 public:
  Reader(std::string op, std::string path) : op_(std::move(op)), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw IOError("[" + op_ + "] " + path_ + ": " + problem);
  }

  Header read_header() {
    std::error_code ec;
    auto size = std::filesystem::file_size(path_, ec);
    if (ec) fail("cannot read the file (" + ec.message() + ")");
    file_size_ = size;
    in_.open(path_, std::ios::binary);
    if (!in_) fail(std::string("cannot open the file (") + std::strerror(errno) + ")");
    if (file_size_ < 8) {
      fail("the file is " + std::to_string(file_size_) +
           " bytes, shorter than the 8-byte header length; not a safetensors file");
    }
    unsigned char len_bytes[8];
    read_at(0, len_bytes, 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n > kMaxHeaderBytes) {
      fail("header length " + std::to_string(n) + " exceeds the format's limit of " +
           std::to_string(kMaxHeaderBytes) + " bytes");
    }
    if (n > file_size_ - 8) {
      fail("header length " + std::to_string(n) + " runs past the end of the file (" +
           std::to_string(file_size_ - 8) + " bytes follow the length)");
    }
    std::string text(n, '\0');
    read_at(8, text.data(), n);
    Header h;
    h.data_start = 8 + n;
    parse(text, h);
    validate_layout(h, file_size_ - h.data_start);
    return h;
  }

  void read_at(uint64_t offset, void* dst, uint64_t n) {
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_ || static_cast<uint64_t>(in_.gcount()) != n) {
      fail("reading " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
           " failed (was the file changed while it was read?)");
    }
  }

 private:
  void parse(const std::string& text, Header& h) {
    if (text.empty() || text[0] != '{') fail("the header does not start with '{'");
    // nlohmann keeps the last of repeated keys; the format forbids them, so the callback
    // records the top-level keys to reject a repeat.
    std::set<std::string> keys;
    std::optional<std::string> repeated;
    auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
          !keys.insert(parsed.get<std::string>()).second && !repeated) {
        repeated = parsed.get<std::string>();
      }
      return true;
    };
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(text, callback);
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("the header is not valid JSON (") + e.what() + ")");
    }
    if (repeated) fail("the header names '" + *repeated + "' twice");
    if (!root.is_object()) fail("the header is not a JSON object");
    for (auto& [name, value] : root.items()) {
      if (name == "__metadata__") {
        if (!value.is_object()) fail("__metadata__ is not an object of strings");
        for (auto& [key, v] : value.items()) {
          if (!v.is_string()) fail("__metadata__ entry '" + key + "' is not a string");
          h.metadata[key] = v.get<std::string>();
        }
        continue;
      }
      h.tensors.push_back(parse_entry(name, value));
    }
  }

  TensorEntry parse_entry(const std::string& name, const nlohmann::json& v) {
    const std::string what = "tensor '" + name + "'";
    if (!v.is_object()) fail(what + " is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!v.contains(field)) fail(what + " has no " + field);
    }
    TensorEntry e;
    e.name = name;
    const auto& dt = v["dtype"];
    if (!dt.is_string()) fail(what + " has a dtype that is not a string");
    const std::string code = dt.get<std::string>();
    const DTypeCode* found = nullptr;
    for (const DTypeCode& c : kCodes) {
      if (code == c.code) found = &c;
    }
    if (!found) {
      for (const char* u : kUnsupportedCodes) {
        if (code == u) {
          throw DTypeError("[" + op_ + "] " + path_ + ": " + what + " has dtype " + code +
                           ", which kiln does not support");
        }
      }
      fail(what + " has unknown dtype '" + code + "'");
    }
    e.dtype = found->dtype;
    const auto& shape = v["shape"];
    if (!shape.is_array()) fail(what + " has a shape that is not an array");
    uint64_t count = 1;
    bool overflow = false;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned())
        fail(what + " has a shape entry that is not a non-negative integer");
      auto size = d.get<uint64_t>();
      if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
      e.shape.push_back(static_cast<int64_t>(size));
      if (size != 0 && count > std::numeric_limits<uint64_t>::max() / size) overflow = true;
      count *= size;
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      fail(what + " has data_offsets that are not two non-negative integers");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    const uint64_t item = itemsize(e.dtype);
    if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / item) overflow = true;
    if (overflow) fail(what + " has a shape whose size overflows: " + shape.dump());
    if (e.end < e.begin || e.end - e.begin != count * item) {
      fail(what + " of dtype " + code + " and shape " + shape_str(e.shape) + " needs " +
           std::to_string(count * item) + " bytes but data_offsets [" + std::to_string(e.begin) +
           ", " + std::to_string(e.end) + "] give " +
           (e.end < e.begin ? std::string("a negative length") : std::to_string(e.end - e.begin)));
    }
    return e;
  }

  // The format requires the tensors to tile the data section exactly: sorted by offset,
  // each starts where the previous ended, and the last ends at the end of the file.
  void validate_layout(Header& h, uint64_t data_bytes) {
    std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    for (const TensorEntry& e : h.tensors) {
      if (e.begin != at) {
        fail("tensor '" + e.name + "' starts at data offset " + std::to_string(e.begin) +
             " but the previous tensors end at " + std::to_string(at) +
             (e.begin < at ? " (overlap)" : " (gap)"));
      }
      at = e.end;
    }
    if (at != data_bytes) {
      fail("the tensors cover " + std::to_string(at) + " data bytes but the file holds " +
           std::to_string(data_bytes) + (at > data_bytes ? " (truncated?)" : " (trailing bytes)"));
    }
  }

  std::string op_, path_;
  std::ifstream in_;
  uint64_t file_size_ = 0;
};

// ---------------------------------------------------------------------------------------
// Writing

// Writes `bytes` to a temporary file next to `path` and renames it over `path`, so readers
// see the old file or the new one, never a partial one.
void write_atomically(const std::string& path, const std::vector<std::string>& pieces,
                      const std::vector<std::pair<const void*, size_t>>& blobs) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    throw IOError("[save_safetensors] " + path + ": " + what + " (" + reason + ")");
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    throw IOError("[save_safetensors] " + path + ": cannot create " + tmp + " (" +
                  std::strerror(errno) + ")");
  }
  bool ok = true;
  for (const std::string& p : pieces) ok = ok && std::fwrite(p.data(), 1, p.size(), f) == p.size();
  for (const auto& [data, n] : blobs) ok = ok && (n == 0 || std::fwrite(data, 1, n, f) == n);
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) fail("writing the temporary file failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming the temporary file failed");
}

}  // namespace

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> items;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") {
      throw ValueError("[save_safetensors] '__metadata__' is reserved and cannot name a tensor");
    }
    if (!t.defined()) throw ValueError("[save_safetensors] tensor '" + name + "' is undefined");
    items.emplace_back(name, t);
  }
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return code_of(a.second.dtype()).rank > code_of(b.second.dtype()).rank;
  });
  std::vector<Tensor> all;
  for (const auto& item : items) all.push_back(item.second);
  if (!all.empty()) eval(all);

  std::string header = "{";
  try {
    if (!metadata.empty()) {
      header += "\"__metadata__\":{";
      bool first = true;
      for (const auto& [k, v] : metadata) {
        header += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
        first = false;
      }
      header += "}";
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const Tensor& t = items[i].second;
      std::string shape;
      for (int64_t d : t.shape()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
      const uint64_t n = t.node()->nbytes();
      header += (i == 0 && metadata.empty() ? "" : ",") + json_string(items[i].first) +
                ":{\"dtype\":\"" + code_of(t.dtype()).code + "\",\"shape\":[" + shape +
                "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + n) +
                "]}";
      offset += n;
    }
  } catch (const nlohmann::json::exception& e) {
    throw ValueError("[save_safetensors] a tensor name or metadata string is not valid UTF-8 (" +
                     std::string(e.what()) + ")");
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::vector<std::pair<const void*, size_t>> blobs;
  for (const auto& item : items) {
    const Tensor& t = item.second;
    blobs.emplace_back(t.numel() > 0 ? t.raw_data() : nullptr, t.node()->nbytes());
  }
  write_atomically(path, {length, header}, blobs);
}

StateDict load_safetensors(const std::string& path) {
  Reader reader("load_safetensors", path);
  Header h = reader.read_header();
  StateDict out;
  std::vector<unsigned char> bytes;
  for (const TensorEntry& e : h.tensors) {
    const uint64_t n = e.end - e.begin;
    bytes.assign(std::max<uint64_t>(n, 1), 0);
    if (n > 0) reader.read_at(h.data_start + e.begin, bytes.data(), n);
    // A bool is one byte that must be 0 or 1 in kiln's buffers; other bytes mean true.
    if (e.dtype == DType::Bool) {
      for (uint64_t i = 0; i < n; ++i) bytes[i] = bytes[i] != 0;
    }
    out[e.name] = from_data(bytes.data(), e.shape, e.dtype);
  }
  return out;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  Reader reader("load_safetensors_metadata", path);
  return reader.read_header().metadata;
}

}  // namespace kiln
