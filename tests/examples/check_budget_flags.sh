#!/usr/bin/env bash
# The training examples' memory flags end to end (docs/memory.md, "Step traces and memory
# timelines"): tiny_gpt under --memory-budget keeps its measured peak within the budget and
# writes both pictures; a budget below the step's lower bound fails with the typed error
# that names the smallest budget that works; a malformed budget (a bare fraction included)
# is a usage error (exit 2) naming the flag, and an output path that cannot be written
# stops the program (exit 1) before it trains. With digits_mlp and its data: a budget that
# fits training but not the test pass saves the weights first and names the test pass.
# Usage: check_budget_flags.sh TINY_GPT [DIGITS_MLP DIGITS_CSV]
set -u
tiny_gpt=$1
digits_mlp=${2:-}
digits_csv=${3:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$tiny_gpt" --steps 3 --sample-length 8 --memory-budget 16MiB \
  --memory-timeline "$out/step.svg" --trace "$out/step.json" >"$out/run.txt" 2>&1 ||
  { cat "$out/run.txt"; fail "tiny_gpt under a 16 MiB budget exited $?"; }
line=$(grep '^last training step: ' "$out/run.txt") || { cat "$out/run.txt"; fail "no step line"; }
echo "$line"
[[ $line == *"within a 16.0 MiB budget"* ]] || fail "the peak is not within the budget"
[[ $line =~ ([0-9]+)\ rebuilds ]] && ((BASH_REMATCH[1] > 0)) ||
  fail "a budget at half the unplanned peak should rebuild values"
grep -q '<svg' "$out/step.svg" || fail "no SVG timeline"
grep -q 'budget' "$out/step.svg" || fail "the timeline has no budget line"
grep -q '"traceEvents"' "$out/step.json" || fail "no Chrome trace"
grep -q '\[plan\] budget 16.0 MiB' "$out/run.txt" || fail "the closing report has no budget"

"$tiny_gpt" --steps 3 --sample-length 8 --memory-budget 3MiB >"$out/low.txt" 2>&1
code=$?
((code == 1)) || { cat "$out/low.txt"; fail "an infeasible budget exited $code, expected 1"; }
grep -q 'cannot run within the memory budget of 3.0 MiB' "$out/low.txt" &&
  grep -q 'smallest budget the planner fits it into is' "$out/low.txt" ||
  { cat "$out/low.txt"; fail "the error does not state the budget and the smallest that works"; }

"$tiny_gpt" --steps 3 --memory-budget lots >"$out/bad.txt" 2>&1
code=$?
((code == 2)) && grep -q "\[--memory-budget\] 'lots' is not accepted" "$out/bad.txt" ||
  { cat "$out/bad.txt"; fail "a malformed budget exited $code without naming it"; }

# A bare fraction is bytes that are not whole: refused, with the percentage to write.
"$tiny_gpt" --steps 3 --memory-budget 0.5 >"$out/fraction.txt" 2>&1
code=$?
((code == 2)) && grep -q "\[--memory-budget\] '0.5' is not accepted" "$out/fraction.txt" &&
  grep -q "write 50%" "$out/fraction.txt" && grep -q '^usage: tiny_gpt' "$out/fraction.txt" ||
  { cat "$out/fraction.txt"; fail "a bare fraction exited $code without suggesting 50%"; }

# Outputs that cannot be written stop the program before it trains a step.
for flag in --memory-timeline --trace; do
  "$tiny_gpt" --steps 3 "$flag" "$out/missing/x" >"$out/path.txt" 2>&1
  code=$?
  ((code == 1)) && grep -q "^tiny_gpt: error: \[$flag\] cannot write '$out/missing/x'" \
    "$out/path.txt" && ! grep -q '^text: ' "$out/path.txt" ||
    { cat "$out/path.txt"; fail "$flag to a missing directory exited $code or trained first"; }
done
KILN_PLAN_DUMP="$out/missing/step-%n.graph" "$tiny_gpt" --steps 3 >"$out/dump.txt" 2>&1
code=$?
((code == 1)) && grep -q "^tiny_gpt: error: \[KILN_PLAN_DUMP\] '$out/missing/step-%n.graph' is not accepted" \
  "$out/dump.txt" ||
  { cat "$out/dump.txt"; fail "KILN_PLAN_DUMP to a missing directory exited $code"; }

if [[ -n $digits_mlp && -f $digits_csv ]]; then
  # 2 MiB holds digits' training steps (batches of 64) but not its test pass (360 samples
  # at once): the weights are saved before the test pass, whose error names it.
  "$digits_mlp" --data "$digits_csv" --epochs 1 --memory-budget 2MiB \
    --save "$out/digits.safetensors" >"$out/digits.txt" 2>&1
  code=$?
  ((code == 1)) || { cat "$out/digits.txt"; fail "digits_mlp under 2 MiB exited $code, expected 1"; }
  [[ -s $out/digits.safetensors ]] || { cat "$out/digits.txt"; fail "the weights were not saved"; }
  grep -q '^digits_mlp: error: the test pass after epoch 1 does not fit the memory budget' \
    "$out/digits.txt" && grep -q 'not a training step' "$out/digits.txt" ||
    { cat "$out/digits.txt"; fail "the error does not name the test pass"; }
  "$digits_mlp" --data "$digits_csv" --epochs 1 --save "$out/none/w.safetensors" \
    >"$out/save.txt" 2>&1
  code=$?
  ((code == 1)) && grep -q "^digits_mlp: error: \[--save\] cannot write" "$out/save.txt" &&
    ! grep -q '^digits: ' "$out/save.txt" ||
    { cat "$out/save.txt"; fail "--save to a missing directory exited $code or trained first"; }
else
  echo "digits_mlp part skipped (no digits_mlp or no data at '$digits_csv')"
fi
echo "PASS"
