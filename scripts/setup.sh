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
# install loses one package's retries, not ten. pip byte-compiles nothing (--no-compile: it would compile package
# after package on one core); once the environment matches the lock, every package is byte-compiled at once on all
# cores (compileall -j 0; about 30 s for the test environment on 2 cores, skipped while the lock and the extras stay
# the same), and so are omnijax's own folders (a few files, when they changed). Python does not keep what it
# compiles at import where PYTHONDONTWRITEBYTECODE is set, so without this every process compiled jax, transformers
# and torch again (a process importing omnijax's pipeline started in 4.8 s instead of 2.3 s on the 2-core Xeon).
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
# byte-compile (files that cannot be, such as one of torch's test helpers written for a newer Python, stay source)
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stamp="$venv/.omnijax-bytecode"
want="$(sha256sum "$lock" | cut -d' ' -f1) $extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$py" -m compileall -qq -j 0 "$site" >/dev/null || true
  echo "$want" > "$stamp"
fi
"$py" -m compileall -qq -j 0 app bench common decoder demo encoders preprocess tests training >/dev/null || true
