#!/usr/bin/env bash
# Installs PyTorch (CPU use only) into .venv-torch for the benchmark baselines, and writes
# .venv-torch/wrap/python3, a python3 that can `import torch`; bench/run_all.sh puts it
# first on PATH. Idempotent and quiet when done; failure only means baselines are skipped.
#
# PyPI has only the CUDA build of torch, whose dependency set is gigabytes of GPU
# libraries. The CUDA 13 toolkit already provides most of them, so the wheel is installed
# without dependencies plus the few libraries the toolkit lacks and the pure-Python
# requirements. Nothing runs on a GPU.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv-torch
wrap=$venv/wrap/python3

if [[ -x $wrap ]] && "$wrap" -c 'import torch' >/dev/null 2>&1; then
  exit 0
fi
echo "setup_torch.sh: installing PyTorch into $venv (about 1 GB from PyPI) for benchmark baselines"
python3 -m venv "$venv"
pip=$venv/bin/pip
"$pip" install -q --disable-pip-version-check --no-deps torch
# Libraries libtorch links that the CUDA toolkit here does not ship, pinned to what the wheel
# declares.
extra=$("$venv/bin/python" - <<'PY'
import importlib.metadata as m
wanted = ("nvidia-cusparselt", "nvidia-nccl", "nvidia-nvshmem")
for r in m.requires("torch") or []:
    name = r.split(";")[0].strip()
    if name.startswith(wanted):
        print(name)
PY
)
# shellcheck disable=SC2086
"$pip" install -q --disable-pip-version-check --no-deps $extra nvidia-cufile
"$pip" install -q --disable-pip-version-check --no-deps typing_extensions sympy mpmath filelock networkx jinja2 MarkupSafe fsspec numpy safetensors

mkdir -p "$(dirname "$wrap")"
cat >"$wrap" <<SH
#!/usr/bin/env bash
# python3 with PyTorch importable (written by scripts/setup_torch.sh).
libs=\$(find "$venv/lib" -path '*/nvidia/*' -name lib -type d | tr '\n' ':')
export LD_LIBRARY_PATH="\${libs}/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}"
exec "$venv/bin/python" "\$@"
SH
chmod +x "$wrap"
"$wrap" -c 'import torch; print("setup_torch.sh: torch", torch.__version__)'
