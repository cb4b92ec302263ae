#!/usr/bin/env bash
# The training examples' memory flags end to end (docs/memory.md, "Step traces and memory
# timelines"): tiny_gpt under --memory-budget keeps its measured peak within the budget and
# writes both pictures; a budget below the step's lower bound fails with the typed error
# that names the smallest budget that works. Usage: check_budget_flags.sh TINY_GPT
set -u
tiny_gpt=$1
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
((code == 1)) && grep -q "'lots' is not a memory size" "$out/bad.txt" ||
  { cat "$out/bad.txt"; fail "a malformed budget exited $code without naming it"; }
echo "PASS"
