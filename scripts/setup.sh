#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build and test, and fetches the digits data set
# into data/. Idempotent: when everything is already there it prints nothing and exits 0, so
# `make` can call it on every run.
# Works unattended (CI=true, no stdin): apt never prompts.
set -euo pipefail

packages=(
  cmake g++ make catch2 libfmt-dev nlohmann-json3-dev libopenblas-dev libdnnl-dev zlib1g-dev
  libbenchmark-dev llvm-16-dev libclang-cpp16-dev libclang-16-dev clang-16 clang-format
  # kiln::dist's MPI backend and the mpiexec its multi-rank tests run under (optional at
  # configure time: without them kiln builds and those tests skip).
  libopenmpi-dev openmpi-bin
)

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup.sh: dpkg-query not found; this script supports Debian/Ubuntu only." >&2
  echo "setup.sh: install by hand: ${packages[*]}" >&2
  exit 1
fi

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

# The digits data set for examples/digits_mlp (scripts/fetch_digits.sh; silent when present).
# A failed fetch only warns: the build and tests do not need it, and the example says where
# the file is missing.
fetch_data() {
  local here
  here=$(dirname "${BASH_SOURCE[0]}")
  if ! "$here/fetch_digits.sh"; then
    echo "setup.sh: warning: data/digits.csv.gz is missing; examples/digits_mlp needs it" >&2
  fi
}

if [[ ${#missing[@]} -eq 0 ]]; then
  fetch_data
  exit 0
fi

# Root runs apt directly; otherwise go through sudo when it exists (non-interactively,
# since there may be no terminal to ask for a password).
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo -n)
  else
    echo "setup.sh: missing packages (${missing[*]}) and not root, and sudo is not available." >&2
    echo "setup.sh: run as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
if ! "${sudo_cmd[@]}" apt-get update -qq </dev/null; then
  echo "setup.sh: 'apt-get update' failed; cannot install: ${missing[*]}" >&2
  exit 1
fi
if ! "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null; then
  echo "setup.sh: 'apt-get install' failed for: ${missing[*]}" >&2
  exit 1
fi

echo "setup.sh: installed ${missing[*]}"
fetch_data
