#!/usr/bin/env bash
# Copies into .gpu-deps/ what the GPU machine lacks for building kiln (docs/gpu.md): it has a
# compiler, CMake, ninja, nvcc and PyTorch, but no -dev packages and no network. The folder is
# a CMake prefix (include/, lib/, lib/cmake/, share/cmake/) that scripts/gpu-check.sh passes
# as CMAKE_PREFIX_PATH; the device tool sends it along when a run names it in `carry`.
#
# Carried (from this machine's Debian packages):
#   nlohmann_json   headers + CMake package             (required: kernel cache, kiln tool)
#   Catch2 v2       headers + CMake package, Catch.cmake and CatchAddTests.cmake
#                   (catch_discover_tests), libCatch2WithMain.a (its targets file checks
#                   that the file exists)                (required: kiln_tests)
#   zlib            zlib.h, zconf.h, libz.so            (required: frontend/data.cpp)
# Not carried: OpenBLAS (optional in jit/CMakeLists.txt; 36 MB plus libgfortran, and no CPU
# GEMM speed is measured there) and LLVM (the GPU build is -DKILN_WITH_LLVM=OFF).
#
# Plain files only, no symbolic links: the device tool sends a link as a link, and what it
# points to outside the checkout stays behind. Idempotent; prints the size it packed.
#
# Usage: scripts/pack_gpu_deps.sh        (from anywhere; writes <repo>/.gpu-deps)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
dest=$repo/.gpu-deps

die() {
  echo "pack_gpu_deps.sh: $*" >&2
  exit 1
}

# Where each package's files live here; overridable for other layouts.
json_prefix=${JSON_PREFIX:-/usr}
catch_prefix=${CATCH_PREFIX:-/usr}
zlib_header=${ZLIB_HEADER:-/usr/include/zlib.h}
zlib_library=${ZLIB_LIBRARY:-$(readlink -f /usr/lib/x86_64-linux-gnu/libz.so 2>/dev/null || true)}

[[ -f $json_prefix/include/nlohmann/json.hpp ]] ||
  die "no nlohmann/json.hpp under $json_prefix/include (apt-get install nlohmann-json3-dev)"
[[ -f $json_prefix/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ]] ||
  die "no nlohmann_jsonConfig.cmake under $json_prefix/share/cmake/nlohmann_json"
[[ -f $catch_prefix/include/catch2/catch.hpp ]] ||
  die "no catch2/catch.hpp under $catch_prefix/include (apt-get install catch2)"
[[ -f $catch_prefix/lib/cmake/Catch2/Catch2Config.cmake ]] ||
  die "no Catch2Config.cmake under $catch_prefix/lib/cmake/Catch2"
[[ -f $zlib_header && -f $(dirname "$zlib_header")/zconf.h ]] ||
  die "no zlib.h/zconf.h at $zlib_header (apt-get install zlib1g-dev)"
[[ -n $zlib_library && -f $zlib_library ]] || die "no libz.so found (apt-get install zlib1g-dev)"

rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib/cmake" "$dest/share/cmake"

# The CMake packages compute their prefix from their own location (three folders up), so
# the relative layout below the prefix is kept exactly.
cp -rL "$json_prefix/include/nlohmann" "$dest/include/"
cp -rL "$json_prefix/share/cmake/nlohmann_json" "$dest/share/cmake/"

cp -rL "$catch_prefix/include/catch2" "$dest/include/"
cp -rL "$catch_prefix/lib/cmake/Catch2" "$dest/lib/cmake/"
[[ -f $catch_prefix/lib/libCatch2WithMain.a ]] && cp -L "$catch_prefix/lib/libCatch2WithMain.a" "$dest/lib/"

cp -L "$zlib_header" "$(dirname "$zlib_header")/zconf.h" "$dest/include/"
# The link-time name and the SONAME (libz.so.1) as two plain copies; the GPU machine's own
# libz.so.1 (Python needs it) would serve at run time too.
cp -L "$zlib_library" "$dest/lib/libz.so"
cp -L "$zlib_library" "$dest/lib/libz.so.1"

# Ignored by git (so `git status` stays clean) but named in the device tool's `carry`.
exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
[[ $exclude = /* ]] || exclude=$repo/$exclude
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu-deps/' "$exclude" 2>/dev/null || echo '/.gpu-deps/' >>"$exclude"

if find "$dest" -type l | grep -q .; then die "symbolic links left in $dest"; fi
kb=$(du -sk "$dest" | cut -f1)
((kb < 16 * 1024)) || die "$dest is ${kb} KiB; expected a few MiB (the device tool carries 64 MiB in all)"
echo "pack_gpu_deps.sh: packed $dest ($((kb / 1024)) MiB, $(find "$dest" -type f | wc -l) files)"
