#!/usr/bin/env bash
# Puts the UCI handwritten digits data set (8x8 images, 1,797 samples) at data/digits.csv.gz,
# byte for byte the CSV that scikit-learn ships (sklearn/datasets/data/digits.csv.gz): one
# row per image, 64 pixel values 0..16 then the label 0..9.
#
# Sources, in order: Debian's python3-sklearn package (`apt-get download`, unpacked with
# dpkg-deb; nothing is installed), then the scikit-learn wheel from PyPI (`pip download
# --no-deps`; only the one member is unzipped). Nothing else is downloaded.
#
# Idempotent: when the file is present and valid it prints nothing and exits 0. The data is
# checked by content (the decompressed CSV's SHA-256, plus its shape), not by the .gz bytes,
# because Debian recompresses the file.
#
# Usage: scripts/fetch_digits.sh [DEST]   (default: <repo>/data/digits.csv.gz)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$repo/data/digits.csv.gz}
member=sklearn/datasets/data/digits.csv.gz
# SHA-256 of the decompressed CSV, identical in Debian's 1.2.1+dfsg-1 and PyPI's 1.2.1 wheel.
expected_sha256=6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8

say() { echo "fetch_digits.sh: $*" >&2; }

# Succeeds when $1 is a gzip of 1,797 rows of 65 integer columns (pixels 0..16, label 0..9)
# with the expected content hash; otherwise says what is wrong (unless $2 is "quiet").
valid() {
  local file=$1 quiet=${2:-}
  local problem=""
  if ! gzip -t "$file" 2>/dev/null; then
    problem="not a readable gzip file"
  else
    problem=$(gzip -dc "$file" | awk -F, '
      NF != 65 { printf "row %d has %d columns, expected 65\n", NR, NF; bad = 1; exit }
      {
        for (i = 1; i <= 65; i++) {
          max = (i == 65) ? 9 : 16
          if ($i !~ /^[0-9]+$/ || $i + 0 > max) {
            printf "row %d column %d is \"%s\", expected an integer 0..%d\n", NR, i, $i, max
            bad = 1; exit
          }
        }
      }
      END { if (!bad && NR != 1797) printf "%d rows, expected 1797\n", NR }' || true)
    if [[ -z "$problem" ]]; then
      local sha
      sha=$(gzip -dc "$file" | sha256sum | cut -d' ' -f1)
      [[ "$sha" == "$expected_sha256" ]] || problem="content SHA-256 $sha, expected $expected_sha256"
    fi
  fi
  if [[ -n "$problem" ]]; then
    [[ "$quiet" == quiet ]] || say "$file: $problem"
    return 1
  fi
}

if [[ -f "$dest" ]]; then
  if valid "$dest" quiet; then
    exit 0
  fi
  valid "$dest" || say "$dest is not the expected digits data; fetching it again"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

from_debian() {
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 1
  # apt-get download writes into the current directory; the _apt sandbox user may not be able
  # to write to $tmp, in which case apt falls back to root and warns: the warning is noise.
  (cd "$tmp" && apt-get download -qq python3-sklearn </dev/null >/dev/null 2>&1) || return 1
  local deb
  deb=$(find "$tmp" -maxdepth 1 -name 'python3-sklearn_*.deb' | head -n 1)
  [[ -n "$deb" ]] || return 1
  mkdir -p "$tmp/deb" && dpkg-deb -x "$deb" "$tmp/deb" || return 1
  local found
  found=$(find "$tmp/deb" -path "*/$member" | head -n 1)
  [[ -n "$found" ]] || return 1
  cp "$found" "$tmp/digits.csv.gz"
}

from_pypi() {
  local python
  python=$(command -v python3 || command -v python) || return 1
  # --only-binary: an sdist would make pip build the package's metadata, which needs a
  # compiler toolchain and build dependencies; a wheel is a plain zip.
  "$python" -m pip download -q --no-deps --only-binary=:all: -d "$tmp/wheel" scikit-learn \
    </dev/null >/dev/null 2>&1 || return 1
  local wheel
  wheel=$(find "$tmp/wheel" -maxdepth 1 -name 'scikit_learn-*.whl' | head -n 1)
  [[ -n "$wheel" ]] || return 1
  "$python" - "$wheel" "$member" "$tmp/digits.csv.gz" <<'EOF' || return 1
import sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, open(out, "wb") as f:
    f.write(z.read(member))
EOF
}

if from_debian && valid "$tmp/digits.csv.gz"; then
  source="Debian package python3-sklearn"
elif from_pypi && valid "$tmp/digits.csv.gz"; then
  source="PyPI wheel scikit-learn"
else
  say "could not obtain $member (tried 'apt-get download python3-sklearn', then"
  say "'pip download scikit-learn --no-deps'); without network access, copy it from any"
  say "scikit-learn installation to $dest"
  exit 1
fi

mkdir -p "$(dirname "$dest")"
mv "$tmp/digits.csv.gz" "$dest.part"
mv "$dest.part" "$dest"
say "wrote $dest (from the $source)"
