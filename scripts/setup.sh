#!/usr/bin/env bash
# Install omnijax into a virtual environment on exactly the versions of requirements-lock.txt, then check it.
#
#   bash scripts/setup.sh              the package alone: what the `omnijax` program needs
#   bash scripts/setup.sh test,train   with extras (scripts/test.sh): PyTorch, Playwright, the real checkpoint, optax
#
# The environment is .venv beside this folder (or $OMNIJAX_VENV); it is created when missing and brought to the
# lock when present (a newer package already there is moved to the locked version). PyTorch, which only the test
# extra needs, comes from PyTorch's CPU-only index (about 200 MB instead of the several-GB CUDA build some default
# indexes serve); TORCH_INDEX_URL names another index, TORCH_INDEX_URL= (empty) the default one alone. Only torch is
# asked of that index (its dependencies come with the rest from the default one), so where it cannot be reached the
# install loses one package's retries, not ten. Nothing is byte-compiled at install time (--no-compile): Python
# compiles a module the first time it is imported and keeps the result (pip would compile every file of every
# package, most of them never imported: a brand-new environment took 190 s, now 83 s on the 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${OMNIJAX_VENV:-.venv}
extras=${1:-}
lock=requirements-lock.txt
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
install=("$py" -m pip install -q --no-compile --disable-pip-version-check -c "$lock")
complete=()
if [[ ",$extras," == *",test,"* ]]; then
  complete=(--complete)
  index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
  "${install[@]}" --no-deps ${index:+--extra-index-url "$index"} "$(grep -E '^torch==' "$lock")"
fi
"${install[@]}" -e ".${extras:+[$extras]}" setuptools  # (the venv's own setuptools too: it is locked)
"$py" scripts/check_lock.py "${complete[@]}"
