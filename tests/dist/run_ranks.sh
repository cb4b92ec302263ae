#!/usr/bin/env bash
# Runs a kiln::dist program under mpiexec for CTest.
#   run_ranks.sh RANKS pass PROGRAM ARGS...             the job must succeed
#   run_ranks.sh RANKS fail:PATTERN PROGRAM ARGS...     the job must fail within 30 s, with
#                                                       PATTERN in its output
# Exits 77 (CTest's SKIP_RETURN_CODE) when mpiexec is missing. The ranks share one fresh
# kernel cache directory, removed afterwards, and one thread each (the machine's cores are
# shared by all ranks).
set -u
ranks=$1
expect=$2
shift 2

if ! command -v mpiexec >/dev/null 2>&1; then
  echo "skipped: mpiexec not found (install openmpi-bin; scripts/setup.sh does)"
  exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-dist-XXXXXX")
trap 'rm -rf "$work"' EXIT
export KILN_CACHE_DIR="$work/cache"
export KILN_NUM_THREADS=1
# Containers often forbid the cross-memory attach that Open MPI's shared-memory transport
# uses by default; plain copies work everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism=none

start=$(date +%s%N)
# The outer timeout only keeps a broken MPI from holding CTest; the checks below are tighter.
timeout 120 mpiexec --oversubscribe -n "$ranks" "$@" >"$work/log" 2>&1
status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$work/log"
echo "run_ranks: $ranks ranks, exit status $status after ${elapsed_ms} ms"

if [[ "$expect" == pass ]]; then
  exit "$status"
fi
pattern=${expect#fail:}
if [[ $status -eq 0 ]]; then
  echo "run_ranks: FAILED: the job succeeded although a rank failed"
  exit 1
fi
if [[ $status -eq 124 || $elapsed_ms -gt 30000 ]]; then
  echo "run_ranks: FAILED: the job took ${elapsed_ms} ms to end (at most 30000 expected)"
  exit 1
fi
if ! grep -q -- "$pattern" "$work/log"; then
  echo "run_ranks: FAILED: the output does not name the failure ('$pattern')"
  exit 1
fi
echo "run_ranks: the job failed fast, as expected"
