// safetensors: bit-exact round trips of every dtype, a byte-level golden file built by
// hand from the format description, corrupt files (each must raise a typed error naming
// the file and the problem), atomic writes, and interop with the reference implementation
// (the Python `safetensors` package) when it is installed.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "frontend/kiln.h"
#include "frontend/serialize.h"
#include "python_support.h"
#include "test_files.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using test::python3;
using test::python_has;
using test::read_bytes;
using test::write_bytes;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("kiln_safetensors") {}
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file made of a header text (padded to 8 bytes as the reference writer does) and data.
std::string make_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

std::string bytes_of(const Tensor& t) {
  const auto* p = static_cast<const char*>(t.raw_data());
  return std::string(p, p + t.node()->nbytes());
}

// Random bytes for `shape` in `dtype`, with special float values planted at the front:
// signed zero, infinities, NaNs with payloads and subnormals must all survive bit for bit.
Tensor random_bit_pattern(const Shape& shape, DType dtype, std::mt19937_64& rng) {
  std::string bytes(numel(shape) * itemsize(dtype), '\0');
  for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
  if (dtype == DType::Bool) {
    for (char& c : bytes) c = static_cast<char>(c & 1);
  }
  auto plant = [&](const auto* values, size_t count) {
    size_t n = std::min(count * sizeof(values[0]), bytes.size());
    std::memcpy(bytes.data(), values, n);
  };
  if (dtype == DType::Float32) {
    const uint32_t v[] = {0x80000000u, 0x7f800000u, 0xff800000u,
                          0x7fc12345u, 0xffa00001u, 0x00000001u};
    plant(v, 6);
  } else if (dtype == DType::Float64) {
    const uint64_t v[] = {0x8000000000000000ull, 0x7ff0000000000001ull, 0xfff8000000abcdefull,
                          0x1ull};
    plant(v, 4);
  } else if (dtype == DType::Float16 || dtype == DType::BFloat16) {
    const uint16_t v[] = {0x8000u, 0x7c01u, 0xfe37u, 0x7f81u, 0x0001u};
    plant(v, 5);
  }
  return from_data(bytes.data(), shape, dtype);
}

const std::vector<DType> kAllDTypes = {
    DType::Bool,  DType::Int8,    DType::UInt8,    DType::Int16,   DType::Int32,
    DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};

// From the source tree's root: __FILE__ may be relative to the build directory (ccache's
// CCACHE_BASEDIR rewrites it), and the tests run from there.
std::string interop_script() {
  return std::string(KILN_SOURCE_DIR) + "/tests/safetensors_interop.py";
}

}  // namespace

TEST_CASE("safetensors round trip of every dtype is bit-exact", "[safetensors]") {
  TempDir dir;
  std::mt19937_64 rng(1234);
  StateDict saved;
  for (DType dt : kAllDTypes) {
    const std::string name(dtype_name(dt));
    saved[name + ".matrix"] = random_bit_pattern({3, 5}, dt, rng);
    saved[name + ".scalar"] = random_bit_pattern({}, dt, rng);
    saved[name + ".empty"] = random_bit_pattern({2, 0, 3}, dt, rng);
  }
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, saved);
  StateDict loaded = load_safetensors(path);
  REQUIRE(loaded.size() == saved.size());
  for (const auto& [name, t] : saved) {
    INFO(name);
    REQUIRE(loaded.count(name));
    const Tensor& u = loaded.at(name);
    CHECK(u.dtype() == t.dtype());
    CHECK(u.shape() == t.shape());
    CHECK(u.is_evaluated());
    CHECK(bytes_of(u) == bytes_of(t));
  }
  // The data of every tensor starts at a multiple of its element size.
  const std::string raw = read_bytes(path);
  uint64_t header = 0;
  std::memcpy(&header, raw.data(), 8);
  CHECK(header % 8 == 0);
  CHECK(raw.size() == 8 + header + [&] {
    size_t n = 0;
    for (const auto& kv : saved) n += kv.second.node()->nbytes();
    return n;
  }());
}

TEST_CASE("safetensors metadata round trip, and lazy tensors are evaluated on save",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  std::map<std::string, std::string> meta = {{"format", "pt"},
                                             {"quote\"back\\slash", "line\nbreak\ttab"},
                                             {"unicode", "größe ✓"},
                                             {"empty", ""}};
  Tensor lazy = arange(0, 6, 1, DType::Float32) * 2.0 + 1.0;
  save_safetensors(path, {{"x", lazy}}, meta);
  CHECK(load_safetensors_metadata(path) == meta);
  CHECK(load_safetensors(path).at("x").to_vector<float>() == std::vector<float>{1, 3, 5, 7, 9, 11});
  save_safetensors(path, {{"x", lazy}});
  CHECK(load_safetensors_metadata(path).empty());
  save_safetensors(path, {});
  CHECK(load_safetensors(path).empty());
  CHECK(read_bytes(path) == le64(8) + "{}      ");
}

TEST_CASE("safetensors writes the golden bytes of the format", "[safetensors]") {
  TempDir dir;
  // Built by hand from the format description: tensors ordered by decreasing dtype
  // (I64, F32, BOOL) as the reference writer orders them, "__metadata__" first, compact
  // JSON, padded with spaces to 208 = 0xd0 bytes, then the little-endian data.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"count":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("weight":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("mask":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}}  )";
  const std::string data = std::string("\x07\0\0\0\0\0\0\0", 8) +  // int64 7
                           std::string("\x00\x00\x80\x3f", 4) +    // float32 1.0
                           std::string("\x00\x00\x00\xc0", 4) +    // float32 -2.0
                           std::string("\x01\x00\x01", 3);         // true false true
  const std::string golden = std::string("\xd0\0\0\0\0\0\0\0", 8) + header + data;
  REQUIRE(header.size() == 208);

  const std::string path = dir.file("golden.safetensors");
  save_safetensors(path,
                   {{"weight", from_vector<float>({1.0f, -2.0f})},
                    {"count", tensor<int64_t>(7)},
                    {"mask", from_vector<bool>({true, false, true})}},
                   {{"format", "pt"}});
  CHECK(read_bytes(path) == golden);

  write_bytes(path, golden);
  StateDict t = load_safetensors(path);
  CHECK(t.at("weight").to_vector<float>() == std::vector<float>{1.0f, -2.0f});
  CHECK(t.at("count").shape().empty());
  CHECK(t.at("count").item<int64_t>() == 7);
  CHECK(t.at("mask").to_vector<bool>() == std::vector<bool>{true, false, true});
}

TEST_CASE("safetensors accepts what the format allows", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("ok.safetensors");
  // Entries in any order, no padding, whitespace, extra fields, and a bool byte other than 1.
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3],"extra":1},)"
      R"("a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}, "z":{"dtype":"I8","shape":[0],)"
      R"("data_offsets":[3,3]}}	)";
  REQUIRE(header.size() % 8 != 0);
  write_bytes(path, le64(header.size()) + header + "\x05\x09\xff");
  StateDict t = load_safetensors(path);
  CHECK(t.at("a").to_vector<bool>() == std::vector<bool>{true});
  CHECK(t.at("b").to_vector<int>() == std::vector<int>{9, 255});
  CHECK(t.at("z").numel() == 0);
}

TEST_CASE("corrupt safetensors files raise errors naming the file and the problem",
          "[safetensors][errors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string good_data(8, '\x01');
  const std::string good = make_file(good_header, good_data);
  write_bytes(path, good);
  REQUIRE(load_safetensors(path).at("w").numel() == 2);

  struct Case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  auto header_with = [&](const std::string& entry, const std::string& data) {
    return make_file("{" + entry + "}", data);
  };
  std::vector<Case> cases = {
      {"empty file", "", "shorter than the 8-byte header length"},
      {"truncated header length", std::string("\x10\0\0", 3),
       "shorter than the 8-byte header length"},
      {"truncated data", good.substr(0, good.size() - 3), "(truncated?)"},
      {"trailing bytes", good + "xyz", "(trailing bytes)"},
      {"header size too large", le64(1000) + good.substr(8),
       "header length 1000 runs past the end of the file"},
      {"header size absurd", le64(uint64_t(1) << 62) + good.substr(8),
       "exceeds the format's limit"},
      {"bad JSON", make_file(R"({"w":{"dtype":"F32",)", good_data), "the header is not valid JSON"},
      {"not JSON at all", le64(8) + "garbage!" + good_data, "the header does not start with '{'"},
      {"header not an object of tensors", make_file(R"({"w":[1,2]})", ""),
       "tensor 'w' is not an object"},
      {"offsets out of range",
       header_with(
           R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[8,12]})",
           good_data),
       "the tensors cover 12 data bytes but the file holds 8"},
      {"offsets with a gap",
       header_with(R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})", good_data),
       "tensor 'w' starts at data offset 4 but the previous tensors end at 0 (gap)"},
      {"overlapping offsets",
       header_with(
           R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})",
           good_data),
       "(overlap)"},
      {"reversed offsets",
       header_with(R"("w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]})", good_data),
       "a negative length"},
      {"size mismatch",
       header_with(R"("w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]})", good_data),
       "tensor 'w' of dtype F32 and shape [3] needs 12 bytes but data_offsets [0, 8] give 8"},
      {"shape overflow",
       header_with(R"("w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})",
                   good_data),
       "has a shape whose size overflows"},
      {"negative shape",
       header_with(R"("w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", good_data),
       "shape entry that is not a non-negative integer"},
      {"unknown dtype",
       header_with(R"("w":{"dtype":"F13","shape":[2],"data_offsets":[0,8]})", good_data),
       "tensor 'w' has unknown dtype 'F13'"},
      {"missing field", header_with(R"("w":{"dtype":"F32","shape":[2]})", good_data),
       "tensor 'w' has no data_offsets"},
      {"repeated name",
       header_with(
           R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})",
           good_data),
       "the header names 'w' twice"},
      {"metadata not strings", header_with(R"("__metadata__":{"n":1})", ""),
       "__metadata__ entry 'n' is not a string"},
  };
  const int64_t live_before = Node::live_count();
  for (const Case& c : cases) {
    INFO(c.what);
    write_bytes(path, c.bytes);
    REQUIRE_THROWS_AS(load_safetensors(path), IOError);
    REQUIRE_THROWS_WITH(
        load_safetensors(path),
        Catch::Contains("[load_safetensors] " + path + ": ") && Catch::Contains(c.message));
    REQUIRE_THROWS_AS(load_safetensors_metadata(path), IOError);
  }
  CHECK(Node::live_count() == live_before);

  write_bytes(path,
              header_with(R"("w":{"dtype":"U16","shape":[4],"data_offsets":[0,8]})", good_data));
  REQUIRE_THROWS_AS(load_safetensors(path), DTypeError);
  REQUIRE_THROWS_WITH(load_safetensors(path),
                      Catch::Contains("tensor 'w' has dtype U16, which kiln does not support"));
  const std::string missing = dir.file("missing.safetensors");
  REQUIRE_THROWS_AS(load_safetensors(missing), IOError);
  REQUIRE_THROWS_WITH(load_safetensors(missing),
                      Catch::Contains(missing + ": cannot read the file"));
}

TEST_CASE("save_safetensors writes atomically and rejects bad input", "[safetensors][errors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"a", ones({4})}});
  save_safetensors(path, {{"a", zeros({2})}});
  CHECK(load_safetensors(path).at("a").shape() == Shape{2});
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);  // no temporary left behind

  REQUIRE_THROWS_AS(save_safetensors(path, {{"__metadata__", ones({1})}}), ValueError);
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"__metadata__", ones({1})}}),
                      Catch::Contains("'__metadata__' is reserved"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", Tensor()}}),
                      Catch::Contains("tensor 'w' is undefined"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"\xff\xfe", ones({1})}}),
                      Catch::Contains("not valid UTF-8"));
  const std::string nowhere = dir.file("no/such/dir/x.safetensors");
  REQUIRE_THROWS_AS(save_safetensors(nowhere, {{"a", ones({1})}}), IOError);
  REQUIRE_THROWS_WITH(save_safetensors(nowhere, {{"a", ones({1})}}),
                      Catch::Contains("[save_safetensors] " + nowhere));
  CHECK(load_safetensors(path).at("a").shape() == Shape{2});  // the old file is intact
}

TEST_CASE("safetensors interop with the reference implementation through numpy", "[safetensors]") {
  if (!python_has("safetensors, numpy")) {
    WARN(
        "safetensors numpy interop skipped: python3 with the safetensors and numpy packages is not "
        "available");
    return;
  }
  TempDir dir;
  // kiln -> reference -> file: the reference reads kiln's file and writes it back byte for byte.
  std::mt19937_64 rng(99);
  StateDict tensors;
  for (DType dt : kAllDTypes) {
    if (dt == DType::BFloat16) continue;  // numpy has no bfloat16
    tensors[std::string(dtype_name(dt))] = random_bit_pattern({2, 3}, dt, rng);
  }
  tensors["scalar"] = tensor(2.5);
  tensors["empty"] = zeros({0, 4}, DType::Int32);
  const std::string ours = dir.file("kiln.safetensors"), theirs = dir.file("ref.safetensors");
  save_safetensors(ours, tensors, {{"writer", "kiln"}});
  REQUIRE(
      std::system((python3() + " " + interop_script() + " roundtrip numpy " + ours + " " + theirs)
                      .c_str()) == 0);
  CHECK(read_bytes(theirs) == read_bytes(ours));

  // reference -> kiln: values fixed in the script.
  const std::string fixed = dir.file("fixed.safetensors");
  REQUIRE(std::system((python3() + " " + interop_script() + " write numpy " + fixed).c_str()) == 0);
  StateDict t = load_safetensors(fixed);
  CHECK(load_safetensors_metadata(fixed) ==
        std::map<std::string, std::string>{{"source", "safetensors_interop.py"}});
  std::vector<float> f32;
  for (int i = 0; i < 12; ++i) f32.push_back(i * 0.5f - 2);
  CHECK(t.at("f32").shape() == Shape{3, 4});
  CHECK(t.at("f32").to_vector<float>() == f32);
  CHECK(t.at("f64").shape().empty());
  CHECK(t.at("f64").item<double>() == 3.25);
  std::vector<float> f16 = t.at("f16").to_vector<float>();
  CHECK(f16[0] == 1.5f);
  CHECK(std::signbit(f16[1]));
  CHECK(std::isinf(f16[2]));
  CHECK(f16[3] == -65504.0f);
  CHECK(t.at("i64").to_vector<int64_t>() == std::vector<int64_t>{0, -3, -6, -9, -12});
  CHECK(t.at("i32").shape() == Shape{0, 2});
  CHECK(t.at("i16").to_vector<int>() == std::vector<int>{-32768, 32767});
  CHECK(t.at("i8").to_vector<int>() == std::vector<int>{-128, 5, 7, 127});
  CHECK(t.at("u8").to_vector<int>() == std::vector<int>{0, 60, 120, 180});
  CHECK(t.at("flag").to_vector<bool>() == std::vector<bool>{true, false, true});
}

TEST_CASE("safetensors interop with PyTorch", "[safetensors]") {
  if (!python_has("torch, safetensors")) {
    WARN("safetensors torch interop skipped: python3 with torch and safetensors is not available");
    return;
  }
  TempDir dir;
  std::mt19937_64 rng(7);
  StateDict tensors;
  for (DType dt : kAllDTypes)
    tensors[std::string(dtype_name(dt))] = random_bit_pattern({4}, dt, rng);
  const std::string ours = dir.file("kiln.safetensors"), theirs = dir.file("torch.safetensors");
  save_safetensors(ours, tensors, {{"writer", "kiln"}});
  REQUIRE(
      std::system((python3() + " " + interop_script() + " roundtrip torch " + ours + " " + theirs)
                      .c_str()) == 0);
  CHECK(read_bytes(theirs) == read_bytes(ours));
  const std::string fixed = dir.file("fixed.safetensors");
  REQUIRE(std::system((python3() + " " + interop_script() + " write torch " + fixed).c_str()) == 0);
  StateDict t = load_safetensors(fixed);
  CHECK(t.at("bf16").dtype() == DType::BFloat16);
  CHECK(t.at("bf16").to_vector<float>() ==
        std::vector<float>{1.0f, -2.5f, static_cast<float>(BFloat16(3.0e38f))});
  CHECK(t.at("i64").to_vector<int64_t>() == std::vector<int64_t>{0, -3, -6, -9, -12});
}
