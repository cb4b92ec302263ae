#!/usr/bin/env bash
# Every program kiln ships answers --help with its usage (exit 0, quickly: it must not run
# its workload) and rejects an unknown flag (exit 2, naming the flag, usage on stderr). The
# examples also turn a bad KILN_* variable into one "error:" line naming it and exit 1,
# never an abort. Usage: check_program_flags.sh PROGRAM... (examples' names end in
# quickstart, custom_op, digits_mlp, char_lstm or tiny_gpt; benchmarks' in bench_*; the tool is kiln).
set -u
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export KILN_CACHE_DIR="$out/cache"
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

for prog in "$@"; do
  name=$(basename "$prog")
  timeout 30 "$prog" --help >"$out/help.out" 2>"$out/help.err"
  code=$?
  if ((code != 0)); then
    fail "$name --help exited $code"
    cat "$out/help.out" "$out/help.err"
  elif ! grep -q '^usage: ' "$out/help.out"; then
    fail "$name --help printed no usage line on stdout"
    cat "$out/help.out"
  fi

  timeout 30 "$prog" --bogus >"$out/bogus.out" 2>"$out/bogus.err"
  code=$?
  if ((code != 2)); then
    fail "$name --bogus exited $code, expected 2"
    cat "$out/bogus.out" "$out/bogus.err"
  elif ! grep -q -- '--bogus' "$out/bogus.err" || ! grep -q '^usage: ' "$out/bogus.err"; then
    fail "$name --bogus did not name the flag and print the usage on stderr"
    cat "$out/bogus.err"
  fi

  # The training examples seed first (KILN_SEED); quickstart and tiny_gpt (whose default
  # text is on every machine) also run kernels (KILN_NUM_THREADS) under a budget.
  vars=()
  case $name in
    quickstart | tiny_gpt)
      vars=(KILN_NUM_THREADS=lots KILN_SEED=-1 KILN_MEMORY_BUDGET=plenty KILN_MEMORY_BUDGET=0.5)
      ;;
    digits_mlp | char_lstm) vars=(KILN_SEED=-1) ;;
    custom_op) vars=(KILN_NUM_THREADS=lots KILN_MEMORY_BUDGET=plenty) ;;
  esac
  if ((${#vars[@]} > 0)); then
    for var in "${vars[@]}"; do
      env "$var" timeout 60 "$prog" >"$out/env.out" 2>"$out/env.err"
      code=$?
      if ((code != 1)); then
        fail "$name with $var exited $code, expected 1"
        tail -5 "$out/env.out" "$out/env.err"
      elif ! grep -q "^$name: error: \[${var%%=*}\] '${var#*=}' is not accepted" "$out/env.err"; then
        fail "$name with $var did not print the variable's error"
        cat "$out/env.err"
      fi
    done
  fi
  echo "checked $name"
done
((failures == 0)) && echo "PASS" || { echo "$failures failure(s)"; exit 1; }
