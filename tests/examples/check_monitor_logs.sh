#!/usr/bin/env bash
# The training examples' TrainingMonitor end to end (docs/user-guide.md, "Watching a training
# run"): a short run of each prints progress lines "step N/M ... grad norm ... mem ... X/s"
# (plain lines: the output is not a terminal) and the closing "monitor:" summary, and
# --log-csv / --log-jsonl write one row / one JSON object per step with the documented
# columns, finite losses and gradient norms; a log path that cannot be written stops the
# program before it trains. digits_mlp runs where its data is.
# Usage: check_monitor_logs.sh CHAR_LSTM TINY_GPT [DIGITS_MLP DIGITS_CSV]
set -u
char_lstm=$1
tiny_gpt=$2
digits_mlp=${3:-}
digits_csv=${4:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export KILN_CACHE_DIR="$out/cache"
columns="step,loss,smoothed_loss,grad_norm,lr,samples,seconds,throughput,elapsed,memory_peak,memory_current,memory_reserved,memory_limit,memory_fraction"
fail() { echo "FAIL: $*"; exit 1; }

# check NAME STEPS UNIT COMMAND...: runs the command with both logs and checks them.
check() {
  local name=$1 steps=$2 unit=$3
  shift 3
  "$@" --log-csv "$out/$name.csv" --log-jsonl "$out/$name.jsonl" >"$out/$name.txt" 2>&1 ||
    { cat "$out/$name.txt"; fail "$name exited $?"; }
  grep -E "^step $steps/$steps  loss [0-9.]+  grad norm [0-9.e+-]+ .* mem [0-9.]+ [KMG]?i?B \([0-9.]+% of [0-9.]+ [KMG]?i?B RAM\)  [0-9.]+ $unit/s" \
    "$out/$name.txt" >/dev/null || { cat "$out/$name.txt"; fail "$name: no final progress line"; }
  grep -q "^monitor: $steps steps in " "$out/$name.txt" ||
    { cat "$out/$name.txt"; fail "$name: no monitor summary"; }
  if grep -q $'\r' "$out/$name.txt"; then fail "$name: carriage returns in output to a file"; fi
  [[ $(head -1 "$out/$name.csv") == "$columns" ]] || fail "$name: CSV header $(head -1 "$out/$name.csv")"
  awk -F, -v n="$steps" 'NR > 1 { rows++; if (NF != 14 || $1 != NR - 1 || $2 == "nan" || $4 == "nan" || $4 <= 0) bad = 1 }
    END { exit (rows == n && !bad) ? 0 : 1 }' "$out/$name.csv" || { cat "$out/$name.csv"; fail "$name: CSV rows"; }
  [[ $(wc -l <"$out/$name.jsonl") -eq $steps ]] || fail "$name: JSON lines"
  if command -v python3 >/dev/null; then
    python3 - "$out/$name.jsonl" "$columns" <<'PY' || fail "$name: JSON lines do not parse"
import json, sys
cols = sys.argv[2].split(",")
for n, line in enumerate(open(sys.argv[1]), 1):
    o = json.loads(line)
    assert list(o) == cols and o["step"] == n and o["grad_norm"] > 0, o
PY
  fi
  echo "$name: $(grep "^monitor: " "$out/$name.txt")"
}

check char_lstm 3 tokens "$char_lstm" --steps 3 --sample-length 4
check tiny_gpt 3 tokens "$tiny_gpt" --steps 3 --sample-length 4
if [[ -n $digits_mlp && -f $digits_csv ]]; then
  check digits_mlp 23 samples "$digits_mlp" --data "$digits_csv" --epochs 1
else
  echo "digits_mlp: skipped (no data/digits.csv.gz)"
fi

"$tiny_gpt" --steps 3 --log-csv "$out/missing/steps.csv" >"$out/path.txt" 2>&1
code=$?
((code == 1)) && grep -q "^tiny_gpt: error: \[--log-csv\] cannot write '$out/missing/steps.csv'" \
  "$out/path.txt" && ! grep -q '^text: ' "$out/path.txt" ||
  { cat "$out/path.txt"; fail "--log-csv to a missing directory exited $code or trained first"; }
echo "all monitor checks passed"
