// The data layer: datasets and batching (order, sizes, seeded shuffles), index helpers,
// CSV and text reading through plain and gzip files, and the errors for malformed input.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "frontend/data.h"
#include "frontend/kiln.h"
#include "test_files.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using test::read_bytes;
using test::write_bytes;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("kiln_data") {}
};

// Ten examples: features row i is (3i, 3i+1, 3i+2), target i is i.
data::TensorDataset ten_examples() {
  return data::TensorDataset(reshape(arange(0, 30, 1, DType::Float32), {10, 3}), arange(10));
}

// The targets of every batch of one epoch, checking each feature row matches its target.
std::vector<std::vector<int64_t>> epoch_targets(data::DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (const data::Batch& b : loader) {
    std::vector<int64_t> t = b.targets().to_vector<int64_t>();
    std::vector<float> f = b.features().to_vector<float>();
    REQUIRE(b.features().shape() == Shape{b.size(), 3});
    for (size_t i = 0; i < t.size(); ++i) {
      for (int k = 0; k < 3; ++k) REQUIRE(f[i * 3 + k] == static_cast<float>(3 * t[i] + k));
    }
    out.push_back(t);
  }
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  std::vector<int64_t> expect(static_cast<size_t>(n));
  std::iota(expect.begin(), expect.end(), 0);
  return v == expect;
}

}  // namespace

TEST_CASE("DataLoader batches in order, with a short last batch or drop_last", "[data]") {
  data::DataLoader loader(ten_examples(), {.batch_size = 4});
  CHECK(loader.num_batches() == 3);
  auto batches = epoch_targets(loader);
  REQUIRE(batches.size() == 3);
  CHECK(batches[0] == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(batches[2] == std::vector<int64_t>{8, 9});
  CHECK(loader.batch(0, 1).targets().to_vector<int64_t>() == std::vector<int64_t>{4, 5, 6, 7});

  data::DataLoader dropping(ten_examples(), {.batch_size = 4, .drop_last = true});
  CHECK(dropping.num_batches() == 2);
  CHECK(flat(epoch_targets(dropping)) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  data::DataLoader exact(ten_examples(), {.batch_size = 5, .drop_last = true});
  CHECK(exact.num_batches() == 2);
}

TEST_CASE("DataLoader shuffles reproducibly with a seed, differently every epoch", "[data]") {
  data::DataLoader a(ten_examples(), {.batch_size = 3, .shuffle = true, .seed = 42});
  data::DataLoader b(ten_examples(), {.batch_size = 3, .shuffle = true, .seed = 42});
  data::DataLoader c(ten_examples(), {.batch_size = 3, .shuffle = true, .seed = 43});
  std::vector<int64_t> a0 = flat(epoch_targets(a)), a1 = flat(epoch_targets(a));
  std::vector<int64_t> b0 = flat(epoch_targets(b)), c0 = flat(epoch_targets(c));
  CHECK(is_permutation_of_range(a0, 10));
  CHECK(is_permutation_of_range(a1, 10));
  CHECK(a0 == b0);
  CHECK(a0 != a1);
  CHECK(a0 != c0);
  CHECK(a0 == a.permutation(0));
  CHECK(a.next_epoch() == 2);
  a.set_epoch(1);
  CHECK(flat(epoch_targets(a)) == a1);
}

TEST_CASE("random_permutation is uniform over small permutations", "[data]") {
  std::map<std::vector<int64_t>, int> counts;
  const int draws = 6000;
  for (int s = 0; s < draws; ++s)
    counts[data::random_permutation(3, 5, static_cast<uint64_t>(s))]++;
  REQUIRE(counts.size() == 6);
  for (const auto& [perm, n] : counts) {
    INFO(perm[0] << perm[1] << perm[2]);
    CHECK(std::abs(n - draws / 6) < 150);  // about 4 standard deviations
  }
  CHECK(data::random_permutation(0, 1).empty());
  CHECK(data::random_permutation(1, 1) == std::vector<int64_t>{0});
  CHECK(data::random_permutation(50, 9) == data::random_permutation(50, 9));
  CHECK(is_permutation_of_range(data::random_permutation(1000, 3), 1000));
}

TEST_CASE("train_test_split partitions the indices reproducibly", "[data]") {
  auto [train, test] = data::train_test_split(10, 0.25, 7);
  CHECK(test.size() == 3);  // ceil(2.5)
  CHECK(train.size() == 7);
  std::vector<int64_t> all = train;
  all.insert(all.end(), test.begin(), test.end());
  CHECK(is_permutation_of_range(all, 10));
  CHECK(data::train_test_split(10, 0.25, 7).second == test);
  CHECK(data::train_test_split(10, 0.25, 8).second != test);
  CHECK(data::train_test_split(4, 0.0, 1).second.empty());
  data::TensorDataset sub = ten_examples().subset(test);
  CHECK(sub.size() == 3);
  CHECK(sub.tensors()[1].to_vector<int64_t>() == test);
}

TEST_CASE("TensorDataset takes any number of tensors sharing the first dimension", "[data]") {
  data::TensorDataset ds(
      {arange(6), reshape(arange(0, 12, 1, DType::Float64), {6, 2}), zeros({6, 0})});
  data::Batch b = ds.get({5, 0});
  REQUIRE(b.tensors.size() == 3);
  CHECK(b.tensors[0].to_vector<int64_t>() == std::vector<int64_t>{5, 0});
  CHECK(b.tensors[1].to_vector<double>() == std::vector<double>{10, 11, 0, 1});
  CHECK(b.tensors[1].dtype() == DType::Float64);
  CHECK(b.tensors[2].shape() == Shape{2, 0});
  CHECK(ds.get({}).size() == 0);
}

TEST_CASE("read_csv parses numeric tables with and without a header", "[data]") {
  TempDir dir;
  const std::string path = dir.file("t.csv");
  write_bytes(path, "\"a\", b ,c\r\n1,2,3\r\n\n  -1.5 ,+2e3,nan\r\n4,5,-inf\n");
  data::CsvTable t = data::read_csv(path, {.header = true});
  CHECK(t.columns == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(t.values.shape() == Shape{3, 3});
  CHECK(t.values.dtype() == DType::Float32);
  std::vector<double> v = t.values.to_vector<double>();
  CHECK(std::vector<double>(v.begin(), v.begin() + 5) == std::vector<double>{1, 2, 3, -1.5, 2000});
  CHECK(std::isnan(v[5]));
  CHECK(v[8] == -std::numeric_limits<double>::infinity());

  write_bytes(path, "1;-2\n3;4\n");
  data::CsvTable ints = data::read_csv(path, {.delimiter = ';', .dtype = DType::Int64});
  CHECK(ints.columns.empty());
  CHECK(ints.values.dtype() == DType::Int64);
  CHECK(ints.values.to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3, 4});

  write_bytes(path, "a,b\n");
  CHECK(data::read_csv(path, {.header = true}).values.shape() == Shape{0, 2});
  write_bytes(path, "");
  CHECK(data::read_csv(path).values.shape() == Shape{0, 0});
}

TEST_CASE("gzip files are read transparently", "[data]") {
  TempDir dir;
  // gzip.compress(b"x,y,z\n" + b"1,2,3\n" * 20 + b"-1.5,2e3,nan\n", mtime=0) from Python:
  // a real deflate stream produced outside kiln.
  const std::string golden_gz(
      "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xab\xd0\xa9\xd4\xa9\xe2\x32\xd4\x31\xd2\x31\x1e"
      "\x00\x52\xd7\x50\xcf\x54\xc7\x28\xd5\x58\x27\x2f\x31\x8f\x0b\x00\x27\x52\x91\x2d\x8b\x00"
      "\x00\x00",
      46);
  std::string text = "x,y,z\n";
  for (int i = 0; i < 20; ++i) text += "1,2,3\n";
  text += "-1.5,2e3,nan\n";
  const std::string gz = dir.file("golden.csv.gz");
  write_bytes(gz, golden_gz);
  CHECK(data::read_text_file(gz) == text);
  data::CsvTable t = data::read_csv(gz, {.header = true, .dtype = DType::Float64});
  CHECK(t.values.shape() == Shape{21, 3});
  CHECK(t.values.to_vector<double>()[61] == 2000.0);

  // kiln's own writer, compressed and plain.
  std::string big;
  for (int i = 0; i < 5000; ++i) big += "line " + std::to_string(i) + " of a small corpus\n";
  const std::string mine = dir.file("corpus.txt.gz"), plain = dir.file("corpus.txt");
  data::write_text_file(mine, big, true);
  data::write_text_file(plain, big);
  CHECK(fs::file_size(mine) < big.size() / 4);
  CHECK(fs::file_size(plain) == big.size());
  CHECK(data::read_text_file(mine) == big);
  CHECK(data::read_text_file(plain) == big);
  data::write_text_file(plain, "");
  CHECK(data::read_text_file(plain).empty());
}

TEST_CASE("malformed data files raise errors with the line and field", "[data][errors]") {
  TempDir dir;
  const std::string path = dir.file("bad.csv");
  write_bytes(path, "1,2,3\n4,5\n");
  REQUIRE_THROWS_AS(data::read_csv(path), ValueError);
  REQUIRE_THROWS_WITH(data::read_csv(path),
                      Catch::Contains("[read_csv] " + path + " line 2: expected 3 fields, got 2"));
  write_bytes(path, "a,b\n\n1,2\n3,x4\n");
  REQUIRE_THROWS_WITH(data::read_csv(path, {.header = true}),
                      Catch::Contains("line 4, field 2: 'x4' is not a number"));
  write_bytes(path, "1,,3\n");
  REQUIRE_THROWS_WITH(data::read_csv(path), Catch::Contains("line 1, field 2: '' is not a number"));
  write_bytes(path, "1.5\n");
  REQUIRE_THROWS_WITH(data::read_csv(path, {.dtype = DType::Int32}),
                      Catch::Contains("'1.5' is not an integer"));
  write_bytes(path, "100\n300\n");
  REQUIRE_THROWS_WITH(data::read_csv(path, {.dtype = DType::Int8}),
                      Catch::Contains("line 2, field 1: '300' is out of range for int8"));
  write_bytes(path, "-1\n");
  REQUIRE_THROWS_WITH(data::read_csv(path, {.dtype = DType::UInt8}),
                      Catch::Contains("'-1' is out of range for uint8"));
  write_bytes(path, "70000\n");
  REQUIRE_THROWS_WITH(data::read_csv(path, {.dtype = DType::Float16}),
                      Catch::Contains("'70000' is out of range for float16"));
  write_bytes(path, "1e999\n");
  REQUIRE_THROWS_WITH(data::read_csv(path), Catch::Contains("'1e999' is out of range for float32"));
  REQUIRE_THROWS_AS(data::read_csv(path, {.dtype = DType::Bool}), DTypeError);

  const std::string missing = dir.file("missing.csv");
  REQUIRE_THROWS_AS(data::read_csv(missing), IOError);
  REQUIRE_THROWS_WITH(data::read_csv(missing), Catch::Contains("[read_csv] cannot open " + missing));
  REQUIRE_THROWS_WITH(data::read_text_file(missing),
                      Catch::Contains("[read_text_file] cannot open " + missing));
  const std::string gz = dir.file("cut.gz");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += std::to_string(i * 7919 % 1000) + "\n";
  data::write_text_file(gz, text, true);
  std::string bytes = read_bytes(gz);
  write_bytes(gz, bytes.substr(0, bytes.size() / 2));
  REQUIRE_THROWS_AS(data::read_text_file(gz), IOError);
  REQUIRE_THROWS_WITH(data::read_text_file(gz),
                      Catch::Contains("[read_text_file] " + gz + ": reading failed"));
  bytes[bytes.size() - 6] ^= 0x55;  // damage the CRC
  write_bytes(gz, bytes);
  REQUIRE_THROWS_AS(data::read_text_file(gz), IOError);
}

TEST_CASE("data layer argument errors", "[data][errors]") {
  REQUIRE_THROWS_AS(data::TensorDataset(zeros({3, 2}), zeros({4})), ShapeError);
  REQUIRE_THROWS_WITH(data::TensorDataset(zeros({3, 2}), zeros({4})),
                      Catch::Contains("tensor 0 is float32[3, 2] and tensor 1 is float32[4]"));
  REQUIRE_THROWS_WITH(data::TensorDataset({tensor(1.0f)}),
                      Catch::Contains("must have a first (example) dimension"));
  REQUIRE_THROWS_WITH(data::TensorDataset(std::vector<Tensor>{}),
                      Catch::Contains("expected at least one tensor"));
  REQUIRE_THROWS_AS(ten_examples().get({10}), IndexError);
  REQUIRE_THROWS_WITH(ten_examples().get({-1}),
                      Catch::Contains("index -1 is out of range for 10 examples"));
  REQUIRE_THROWS_WITH(data::DataLoader(ten_examples(), {.batch_size = 0}),
                      Catch::Contains("expected batch_size >= 1"));
  data::DataLoader loader(ten_examples(), {.batch_size = 4});
  REQUIRE_THROWS_AS(loader.batch(0, 3), IndexError);
  REQUIRE_THROWS_WITH(data::train_test_split(5, 1.5, 0),
                      Catch::Contains("expected test_fraction in [0, 1]"));
  REQUIRE_THROWS_WITH(data::random_permutation(-1, 0), Catch::Contains("expected n >= 0"));
}
