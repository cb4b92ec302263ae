#!/usr/bin/env bash
# Runs every benchmark in BUILD_DIR/bench and writes bench/results/latest.json: one JSON list
# of {"workload", "kiln_ms", "baseline", "baseline_ms", ...} objects (docs/benchmarks.md).
#
# bench_fused and bench_compile run once per CPU compiler (the compiler is chosen once per
# process); bench_gemm, bench_conv, bench_train, bench_plan, bench_seqlen, bench_cuda and bench_dist once
# (bench_cuda adds no rows without a CUDA device; scripts/gpu-check.sh runs it on the GPU
# machine; bench_dist starts its ranks with mpiexec).
# Every row carries wall and process CPU times, the CPU model, its ISA level, kiln's float32
# GEMM path and the load average when it was measured. Other bench_* executables
# (bench_pool) print their own tables and add nothing to the JSON. PyTorch baselines are
# used when importable, preferring the one scripts/setup_torch.sh installs into .venv-torch
# (`make bench` runs that first).
#
# Usage: bench/run_all.sh [BUILD_DIR]      (default: build)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
bench_dir=$build/bench
out_dir=$here/results
if [[ ! -d $bench_dir ]]; then
  echo "run_all.sh: no $bench_dir; build first (make build)" >&2
  exit 1
fi
mkdir -p "$out_dir"
if [[ -x $here/../.venv-torch/wrap/python3 ]]; then
  export PATH="$here/../.venv-torch/wrap:$PATH"
fi
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT

compilers=(external)
if grep -q '^KILN_WITH_LLVM:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  compilers=(llvm external)
fi

echo "kiln benchmarks: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
  "$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "compilers: ${compilers[*]}; KILN_NUM_THREADS=${KILN_NUM_THREADS:-all cores}"

status=0
run() {
  echo
  echo "== $*"
  "$@" || { echo "run_all.sh: '$*' failed" >&2; status=1; }
}

for c in "${compilers[@]}"; do
  [[ -x $bench_dir/bench_fused ]] && run env KILN_CPU_COMPILER="$c" "$bench_dir/bench_fused" --json "$lines"
  [[ -x $bench_dir/bench_compile ]] && run env KILN_CPU_COMPILER="$c" "$bench_dir/bench_compile" --json "$lines"
done
[[ -x $bench_dir/bench_gemm ]] && run "$bench_dir/bench_gemm" --json "$lines"
[[ -x $bench_dir/bench_conv ]] && run "$bench_dir/bench_conv" --json "$lines"
[[ -x $bench_dir/bench_train ]] && run "$bench_dir/bench_train" --json "$lines"
[[ -x $bench_dir/bench_plan ]] && run "$bench_dir/bench_plan" --json "$lines"
[[ -x $bench_dir/bench_seqlen ]] && run "$bench_dir/bench_seqlen" --json "$lines"
[[ -x $bench_dir/bench_cuda ]] && run "$bench_dir/bench_cuda" --json "$lines"
[[ -x $bench_dir/bench_dist ]] && run "$bench_dir/bench_dist" --json "$lines"

for exe in "$bench_dir"/bench_*; do
  case $(basename "$exe") in
    bench_fused | bench_compile | bench_gemm | bench_conv | bench_train | bench_plan | bench_seqlen | bench_cuda | bench_dist) continue ;;
  esac
  [[ -f $exe && -x $exe ]] && run "$exe"
done

# JSON lines -> one list, replaced atomically so a reader never sees half a file.
tmp=$(mktemp "$out_dir/.latest.XXXXXX")
{
  echo "["
  awk 'NR > 1 { print prev "," } { prev = "  " $0 } END { if (NR) print prev }' "$lines"
  echo "]"
} >"$tmp"
mv "$tmp" "$out_dir/latest.json"
echo
echo "run_all.sh: wrote $out_dir/latest.json ($(wc -l <"$lines") results)"
exit $status
