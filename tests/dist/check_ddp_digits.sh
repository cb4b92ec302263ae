#!/usr/bin/env bash
# examples/ddp_digits under mpiexec trains to the accuracy of one process.
#   check_ddp_digits.sh PROGRAM DATA
# Runs 8 epochs in one process, on 2 ranks, and on 2 ranks with ZeRO stage 2 (--zero 2), and
# requires the test accuracies within one percentage point of one process's (the 2-rank
# sampler pads the odd training split by one example, so the runs are not bit-identical).
# Exits 77 (skipped) without mpiexec or the data file.
set -u
prog=$1
data=$2
if ! command -v mpiexec >/dev/null 2>&1; then
  echo "skipped: mpiexec not found"
  exit 77
fi
if [[ ! -f "$data" ]]; then
  echo "skipped: $data is missing (scripts/fetch_digits.sh fetches it)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-ddp-XXXXXX")
trap 'rm -rf "$work"' EXIT
export KILN_CACHE_DIR="$work/cache" KILN_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

accuracy() { sed -n 's/^test accuracy: \([0-9.]*\)%$/\1/p' "$1"; }
timeout 120 "$prog" --data "$data" --epochs 8 >"$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
timeout 120 mpiexec --oversubscribe -n 2 "$prog" --data "$data" --epochs 8 >"$work/two.log" 2>&1 ||
  { cat "$work/two.log"; exit 1; }
timeout 120 mpiexec --oversubscribe -n 2 "$prog" --data "$data" --epochs 8 --zero 2 \
  >"$work/zero2.log" 2>&1 || { cat "$work/zero2.log"; exit 1; }
one=$(accuracy "$work/one.log")
two=$(accuracy "$work/two.log")
zero2=$(accuracy "$work/zero2.log")
echo "test accuracy: one process ${one}%, two ranks ${two}%, two ranks with ZeRO-2 ${zero2}%"
for run in two zero2; do
  grep -q "on 2 rank(s); parameters identical on every rank" "$work/$run.log" ||
    { echo "FAILED: the $run run did not report identical parameters"; cat "$work/$run.log"; exit 1; }
done
grep -q "ZeRO-2: parameters" "$work/zero2.log" ||
  { echo "FAILED: the ZeRO-2 run did not report its per-rank bytes"; cat "$work/zero2.log"; exit 1; }
for acc in "$two" "$zero2"; do
  awk -v a="$one" -v b="$acc" 'BEGIN { d = a - b; if (a == "" || b == "" || d > 1 || d < -1) exit 1 }' ||
    { echo "FAILED: accuracies differ by more than 1 point"; exit 1; }
done
echo PASS
