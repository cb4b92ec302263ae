// The test binary's entry point. Unless KILN_CACHE_DIR is set, each test process gets a
// fresh kernel cache directory of its own (inherited by the child processes it starts, and
// removed at the end), so that no test depends on what earlier runs or concurrent CTest
// processes left in a shared ~/.cache/kiln.
#define CATCH_CONFIG_RUNNER
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "jit/kernel_cache.h"

int main(int argc, char** argv) {
  std::string own_cache;
  if (!std::getenv("KILN_CACHE_DIR")) {
    std::error_code ec;
    std::string pattern =
        (std::filesystem::temp_directory_path(ec) / "kiln-tests-cache-XXXXXX").string();
    if (!ec && ::mkdtemp(pattern.data())) {
      own_cache = pattern;
      ::setenv("KILN_CACHE_DIR", pattern.c_str(), 1);
    }
  }
  const int status = Catch::Session().run(argc, argv);
  if (!own_cache.empty()) {
    // Background full builds of tiered kernels would still write into the directory.
    kiln::jit::kernel_cache().stop_rebuilds();
    std::error_code ec;
    std::filesystem::remove_all(own_cache, ec);
  }
  return status;
}
