// The install test's case generator, built against the installed package like examples/embed.
//
//   make_case write DIR            writes a 6-layer MLP's weights with save_safetensors, input
//                                  CSVs, and the predictions computed here in float64 without
//                                  kiln (the independent expectation embed is checked against)
//   make_case check EXPECTED OUT   compares embed's CSV output with an expectation
//
// Six Linear layers sit at Sequential indices 0, 2, ..., 10, so a loader ordering layers by
// name ("10" < "2") instead of by index meets mismatched sizes.
#include <kiln/frontend/serialize.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int kSamples = 8;
const std::vector<int> kSizes = {5, 7, 6, 8, 5, 6, 4};  // in, hidden..., classes
constexpr double kScale = 0.5;                          // the --scale case

// A fixed linear congruential sequence: the case must not depend on kiln's generator.
struct Lcg {
  uint64_t state = 0x853c49e6748fea9bULL;
  double uniform() {  // [-1, 1)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }
};

struct Layer {
  std::vector<float> weight;  // [out, in]
  std::vector<float> bias;    // [out]
  int in = 0, out = 0;
};

std::vector<double> probabilities(const std::vector<Layer>& layers, std::vector<double> h) {
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& layer = layers[l];
    std::vector<double> next(static_cast<size_t>(layer.out));
    for (int o = 0; o < layer.out; ++o) {
      double acc = layer.bias[static_cast<size_t>(o)];
      for (int i = 0; i < layer.in; ++i) {
        acc += static_cast<double>(layer.weight[static_cast<size_t>(o * layer.in + i)]) *
               h[static_cast<size_t>(i)];
      }
      next[static_cast<size_t>(o)] = (l + 1 < layers.size()) ? std::max(acc, 0.0) : acc;
    }
    h = std::move(next);
  }
  const double top = *std::max_element(h.begin(), h.end());
  double total = 0;
  for (double& v : h) total += (v = std::exp(v - top));
  for (double& v : h) v /= total;
  return h;
}

struct Prediction {
  int cls = 0;
  double p = 0, margin = 0;  // margin: gap to the runner-up's probability
};

Prediction predict(const std::vector<Layer>& layers, const std::vector<double>& x) {
  const std::vector<double> p = probabilities(layers, x);
  std::vector<double> sorted = p;
  std::sort(sorted.rbegin(), sorted.rend());
  Prediction out;
  out.cls = static_cast<int>(std::max_element(p.begin(), p.end()) - p.begin());
  out.p = sorted[0];
  out.margin = sorted[0] - sorted[1];
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
  if (!file) throw std::runtime_error("cannot write " + path);
}

std::string expectation(const std::vector<Prediction>& predictions) {
  std::string text = "sample,class,probability\n";
  char line[64];
  for (size_t i = 0; i < predictions.size(); ++i) {
    std::snprintf(line, sizeof line, "%zu,%d,%.9f\n", i, predictions[i].cls, predictions[i].p);
    text += line;
  }
  return text;
}

int write_case(const std::string& dir) {
  Lcg rng;
  std::vector<Layer> layers;
  kiln::StateDict weights;
  for (size_t l = 0; l + 1 < kSizes.size(); ++l) {
    Layer layer;
    layer.in = kSizes[l];
    layer.out = kSizes[l + 1];
    const double bound = 2.5 / std::sqrt(static_cast<double>(layer.in));
    for (int k = 0; k < layer.in * layer.out; ++k) {
      layer.weight.push_back(static_cast<float>(bound * rng.uniform()));
    }
    for (int k = 0; k < layer.out; ++k)
      layer.bias.push_back(static_cast<float>(0.3 * rng.uniform()));
    const std::string name = std::to_string(2 * l);
    weights[name + ".weight"] = kiln::from_vector(layer.weight, {layer.out, layer.in});
    weights[name + ".bias"] = kiln::from_vector(layer.bias, {layer.out});
    layers.push_back(std::move(layer));
  }
  kiln::save_safetensors(dir + "/model.safetensors", weights, {{"format", "pt"}});

  // The same file with layer 2 expecting 8 inputs where layer 0 produces 7.
  kiln::StateDict bad = weights;
  bad["2.weight"] = kiln::zeros({6, 8});
  kiln::save_safetensors(dir + "/bad_shapes.safetensors", bad);

  // Sample s is predicted as class s % classes (every class occurs, so a loader that ignored
  // its input could not pass), and its top class wins clearly with and without the scale, so
  // float32 rounding cannot flip it.
  const int classes = kSizes.back();
  std::vector<std::vector<float>> samples;
  std::vector<Prediction> plain, scaled;
  for (int attempt = 0; static_cast<int>(samples.size()) < kSamples; ++attempt) {
    if (attempt == 100000) throw std::runtime_error("no input found for every class");
    std::vector<float> x;
    for (int i = 0; i < kSizes.front(); ++i) x.push_back(static_cast<float>(3.0 * rng.uniform()));
    std::vector<double> xd(x.begin(), x.end()), xs;
    for (double v : xd) xs.push_back(v * kScale);
    const Prediction a = predict(layers, xd), b = predict(layers, xs);
    if (a.cls != static_cast<int>(samples.size()) % classes) continue;
    if (a.margin < 1e-3 || b.margin < 1e-3) continue;
    samples.push_back(x);
    plain.push_back(a);
    scaled.push_back(b);
  }

  std::string csv = "f0,f1,f2,f3,f4\n";
  std::string labelled =
      "# features then the true class; a header and this comment are skipped\n"
      "x0,x1,x2,x3,x4,label\n";
  char value[32];
  for (int s = 0; s < kSamples; ++s) {
    std::string row;
    for (size_t i = 0; i < samples[static_cast<size_t>(s)].size(); ++i) {
      std::snprintf(value, sizeof value, "%s%.9g", i ? "," : "",
                    static_cast<double>(samples[static_cast<size_t>(s)][i]));
      row += value;
    }
    csv += row + "\n";
    // Two wrong labels out of eight: the reported accuracy must be 75.00% (6/8).
    const int label = s < 6 ? plain[static_cast<size_t>(s)].cls
                            : (plain[static_cast<size_t>(s)].cls + 1) % classes;
    labelled += row + "," + std::to_string(label) + "\n";
  }
  write_text(dir + "/samples.csv", csv);
  write_text(dir + "/labelled.csv", labelled);
  write_text(dir + "/ragged.csv", "1,2,3,4,5\n1,2,3,4\n");
  write_text(dir + "/expected.csv", expectation(plain));
  write_text(dir + "/expected_scaled.csv", expectation(scaled));
  return 0;
}

std::vector<std::vector<std::string>> read_rows(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot read " + path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(file, line)) {
    std::vector<std::string> fields;
    std::stringstream stream(line);
    std::string field;
    while (std::getline(stream, field, ',')) fields.push_back(field);
    rows.push_back(fields);
  }
  return rows;
}

// Classes must match exactly, probabilities to 1e-4 (embed computes in float32).
int check(const std::string& expected_path, const std::string& actual_path) {
  const auto expected = read_rows(expected_path), actual = read_rows(actual_path);
  int errors = 0;
  if (actual.size() != expected.size()) {
    std::cerr << actual_path << ": " << actual.size() << " lines, expected " << expected.size()
              << "\n";
    return 1;
  }
  for (size_t r = 0; r < expected.size(); ++r) {
    const auto &e = expected[r], &a = actual[r];
    bool ok = a.size() >= 3;
    if (ok && r == 0) ok = a[0] == e[0] && a[1] == e[1] && a[2] == e[2];
    if (ok && r > 0) {
      ok = a[0] == e[0] && a[1] == e[1] && std::fabs(std::stod(a[2]) - std::stod(e[2])) <= 1e-4;
    }
    if (!ok) {
      std::cerr << actual_path << " line " << r + 1 << ": got '";
      for (const auto& f : a) std::cerr << f << ",";
      std::cerr << "' expected '" << e[0] << "," << e[1] << "," << e[2] << "'\n";
      ++errors;
    }
  }
  return errors ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 3) return write_case(argv[2]);
    if (mode == "check" && argc == 4) return check(argv[2], argv[3]);
    std::cerr << "usage: make_case write DIR | make_case check EXPECTED ACTUAL\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "make_case: " << error.what() << "\n";
    return 1;
  }
}
