#!/usr/bin/env bash
# The GPU check (docs/gpu.md): builds kiln on the GPU machine with the carried dependencies,
# runs the [cuda] tests, bench_cuda (kiln against a device copy, torch.matmul and PyTorch
# eager) and the [nvrtc] tests, and writes a summary table and the logs under $OUT. Every
# phase runs under `timeout` inside one overall budget, so the script always ends, within one
# device call, and writes what it has. On a machine without a GPU it runs the same way; the
# CUDA parts then report that there is no device.
#
# Usage (repo root):  bash scripts/gpu-check.sh
#   OUT                where results go (the device tool sets it; default build-gpu/out)
#   GPU_CHECK_BUDGET   seconds for everything (default 420: one 8-minute call with slack);
#                      each phase's own limit scales with it (a slow machine: give more)
#   GPU_CHECK_BUILD    build directory (default build-gpu, ignored by git)
#   GPU_CHECK_DEPS     carried CMake prefix (default .gpu-deps, from scripts/pack_gpu_deps.sh)
#   GPU_CHECK_CMAKE_ARGS  more configure arguments (word-split)
#   GPU_CHECK_NVRTC=0  skip the [nvrtc] tests (they also run on every CPU machine)
# Exit status: 0 when every phase that ran passed, 1 otherwise.
#
# Files under $OUT (the device tool returns at most 8): gpu-check.md (summary, the benchmark
# table), info.txt (machine, toolchain, `kiln info`), build.log, tests-cuda.log, tests-cuda-diff.log,
# tests-nvrtc.log, bench-cuda.log, bench-cuda.json (rows as in bench/results/latest.json).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${GPU_CHECK_BUILD:-$repo/build-gpu}
deps=${GPU_CHECK_DEPS:-$repo/.gpu-deps}
out=${OUT:-$build/out}
budget=${GPU_CHECK_BUDGET:-420}
reserve=10  # seconds kept for writing the summary
jobs=$(nproc 2>/dev/null || echo 4)
start=$SECONDS
mkdir -p "$out" "$build"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary=$out/gpu-check.md
info=$out/info.txt
: >"$info"
phases=()
failed=0

log() { printf '[%s +%3ds] %s\n' "$(date -u +%H:%M:%S)" $((SECONDS - start)) "$*"; }

# run_phase NAME CAP LOG CMD...: runs CMD with its output appended to LOG, under a limit of
# CAP seconds (for the default budget) or what is left of the budget; records the outcome.
run_phase() {
  local name=$1 cap=$(($2 * budget / 420)) logf=$3
  shift 3
  local left=$((budget - (SECONDS - start) - reserve))
  local limit=$((cap < left ? cap : left))
  if ((limit < 5)); then
    log "$name: skipped (budget spent)"
    phases+=("| $name | skipped: budget spent | 0 |")
    failed=1
    return 1
  fi
  log "$name: start (limit ${limit}s)"
  echo "\$ $* (limit ${limit}s)" >>"$logf"
  local t0=$SECONDS rc
  timeout -k 5 "$limit" "$@" >>"$logf" 2>&1
  rc=$?
  local dt=$((SECONDS - t0)) status
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMEOUT (limit ${limit}s)" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  ((rc == 0)) || failed=1
  log "$name: $status in ${dt}s"
  if ((rc != 0)); then
    echo "---- last lines of $(basename "$logf") ----"
    tail -n 25 "$logf"
    echo "----"
  fi
  phases+=("| $name | $status | $dt |")
  return $rc
}

# A Catch2 run's last summary line ("All tests passed (...)", "test cases: ...").
catch_summary() {
  grep -E '^(All tests passed|test cases:|No tests ran)' "$1" | tail -n 1 | tr '|' '/'
}

# A test phase that matched no test case has not tested anything: say so in the table.
note_tests() {
  local name=$1 logf=$2 line
  line=$(catch_summary "$logf")
  [[ -n $line ]] && phases[-1]="${phases[-1]} $line |"
  if [[ $line == "No tests ran" ]]; then
    failed=1
    phases[-1]="${phases[-1]} NO TESTS MATCHED |"
  fi
  return 0
}

# --- the machine and toolchain ------------------------------------------------------------
log "gpu-check: repo $repo, build $build, out $out, budget ${budget}s, $jobs jobs"
{
  echo "## machine"
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uname -srm); $jobs cores"
  echo "git: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')" \
    "($(git -C "$repo" status --porcelain 2>/dev/null | wc -l) changed files)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu \
      --format=csv 2>&1
  else
    echo "nvidia-smi: not found"
  fi
  echo "## toolchain"
  for tool in c++ cmake ninja nvcc python3; do
    printf '%s: ' "$tool"
    if command -v "$tool" >/dev/null 2>&1; then
      "$tool" --version 2>&1 | grep -m1 -iE 'version|[0-9]+\.[0-9]+' || echo '?'
    else
      echo "not found"
    fi
  done
  printf 'torch: '
  timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda,
    "devices", torch.cuda.device_count())' 2>&1 | tail -n 1
} >>"$info" 2>&1
cat "$info"
[[ -d $deps ]] || log "warning: no $deps (scripts/pack_gpu_deps.sh); relying on system packages"

# --- build ------------------------------------------------------------------------------------
generator=Ninja
command -v ninja >/dev/null 2>&1 || generator="Unix Makefiles"
# shellcheck disable=SC2206  # GPU_CHECK_CMAKE_ARGS is a list of words on purpose
cmake_args=(-S "$repo" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release
  -DKILN_WITH_LLVM=OFF -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON -DKILN_BUILD_EXAMPLES=OFF
  "-DCMAKE_PREFIX_PATH=$deps" ${GPU_CHECK_CMAKE_ARGS:-})
# The programs are removed first so that a rerun never runs a stale one; the build keeps
# going past a failing target, and each run below needs only its own program.
targets=(tools/kiln tests/kiln_tests bench/bench_cuda)
for t in "${targets[@]}"; do rm -f "${build:?}/$t"; done
keep_going=(-k 0)
[[ $generator == Ninja ]] || keep_going=(-k)
if run_phase configure 120 "$out/build.log" cmake "${cmake_args[@]}"; then
  run_phase build 300 "$out/build.log" cmake --build "$build" -j "$jobs" \
    --target kiln_cli kiln_tests bench_cuda -- "${keep_going[@]}"
fi
for t in "${targets[@]}"; do
  [[ -x $build/$t ]] || log "not built: $t"
done

# --- run ----------------------------------------------------------------------------------------
# Every kernel compiles cold into a fresh cache (bench_cuda makes its own).
export KILN_CACHE_DIR=$work/kernel-cache
echo "## kiln info" >>"$info"
if [[ -x $build/tools/kiln ]]; then
  run_phase "kiln info" 60 "$info" "$build/tools/kiln" info
fi
# The quick [cuda] cases first, then the benchmarks, then the GPU differential run (about
# 700 kernels, each compiled by NVRTC on first use), so a slow phase cannot starve the rest.
if [[ -x $build/tests/kiln_tests ]]; then
  run_phase "tests [cuda]" 100 "$out/tests-cuda.log" "$build/tests/kiln_tests" "[cuda]~[differential]" --durations yes
  note_tests "tests [cuda]" "$out/tests-cuda.log"
fi
if [[ -x $build/bench/bench_cuda ]]; then
  run_phase "bench_cuda" 180 "$out/bench-cuda.log" "$build/bench/bench_cuda" --json "$work/bench.jsonl"
fi
if [[ -x $build/tests/kiln_tests ]]; then
  run_phase "tests [cuda][differential]" 200 "$out/tests-cuda-diff.log" "$build/tests/kiln_tests" "[cuda][differential]" --durations yes
  note_tests "tests [cuda][differential]" "$out/tests-cuda-diff.log"
  # [nvrtc] last: CPU machines run it too, so here it only gets the time that is left.
  if [[ ${GPU_CHECK_NVRTC:-1} != 0 ]]; then
    run_phase "tests [nvrtc]" 600 "$out/tests-nvrtc.log" "$build/tests/kiln_tests" "[nvrtc]"
    note_tests "tests [nvrtc]" "$out/tests-nvrtc.log"
  fi
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "## after the runs" >>"$info"
  timeout 20 nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
    --format=csv >>"$info" 2>&1
fi

# --- results ------------------------------------------------------------------------------------
# JSON lines -> one list, as bench/run_all.sh writes latest.json.
if [[ -s $work/bench.jsonl ]]; then
  {
    echo "["
    awk 'NR > 1 { print prev "," } { prev = "  " $0 } END { if (NR) print prev }' "$work/bench.jsonl"
    echo "]"
  } >"$out/bench-cuda.json"
fi

# The benchmark rows as a markdown table (python3: present wherever PyTorch is).
bench_table() {
  [[ -s $out/bench-cuda.json ]] || {
    echo "No benchmark rows: $(grep -m1 -E 'no CUDA device|FAILED|disagree' "$out/bench-cuda.log" 2>/dev/null ||
      echo 'bench_cuda did not run')"
    return
  }
  python3 - "$out/bench-cuda.json" <<'EOF' || echo "(could not format $out/bench-cuda.json)"
import json, sys

def num(v, digits=4):
    return "-" if v is None else f"{v:.{digits}g}"

rows = json.load(open(sys.argv[1]))
rates = {"kiln_gbs": "kiln GB/s", "copy_gbs": "copy GB/s", "torch_gbs": "torch GB/s",
         "torch_copy_gbs": "torch copy GB/s", "kiln_tflops": "kiln TFLOP/s",
         "torch_tflops": "torch TFLOP/s"}
print("| workload | kiln ms | baseline | baseline ms | kiln/baseline | rates | target | met | note |")
print("| --- | ---: | --- | ---: | ---: | --- | --- | --- | --- |")
for r in rows:
    rate = [f"{label} {r[key]:.4g}" for key, label in rates.items() if r.get(key) is not None]
    met = {True: "met", False: "MISSED"}.get(r.get("target_met"), "")
    print(f"| {r['workload']} | {num(r.get('kiln_ms'))} | {r.get('baseline', '')} | "
          f"{num(r.get('baseline_ms'))} | {num(r.get('ratio'), 3)} | {', '.join(rate)} | "
          f"{r.get('target', '')} | {met} | {r.get('note', '')} |")
EOF
}

{
  echo "# kiln GPU check"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $((SECONDS - start)) s of a ${budget} s budget." \
    "Times are medians (bench/bench_cuda.cpp says how each is taken)."
  echo
  echo '```'
  sed -n '/^## machine/,/^## kiln info/p' "$info" | grep -v '^## kiln info'
  grep -m3 -iE 'cuda|device' <(sed -n '/^## kiln info/,$p' "$info") || true
  echo '```'
  echo
  echo "| phase | result | seconds | tests |"
  echo "| --- | --- | ---: | --- |"
  printf '%s\n' "${phases[@]}"
  echo
  bench_table
} >"$summary"

echo
cat "$summary"
log "gpu-check: done; files in $out: $(find "$out" -maxdepth 1 -type f -printf '%f\n' | sort | tr '\n' ' ')"
exit $failed
