#!/usr/bin/env bash
# Refresh requirements-lock.txt: install the newest releases pyproject.toml allows (with the test and train extras)
# into a new virtual environment, run the whole suite there, and rewrite the lock only when it passes. Then review
# `git diff requirements-lock.txt` and commit it. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
venv="$work/venv"
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check --upgrade pip
index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
"$py" -m pip install -q --disable-pip-version-check ${index:+--extra-index-url "$index"} -e ".[test,train]"
# torchvision for tests/fixtures/llama4_reference.py, which installs it apart: the release series paired with torch
pair=$("$py" -c "import sys; sys.path.insert(0, 'tests'); import importlib.metadata as m, llama4_reference as r; print(r.torchvision_requirement(m.version('torch')))")
"$py" -m pip download -q --no-deps --dest "$work/tv" "$pair"
tv=$(ls "$work/tv" | sed -n 's/^torchvision-\([^-]*\)-.*/\1/p' | head -1)
{
  sed -n '1,/^# --- pins ---$/p' requirements-lock.txt
  "$py" -m pip freeze --all --exclude-editable | grep -v "^pip==" | sed "s/+[^+]*$//"
  sed -n '/^# \[optional/,/^# \[outside\]/p' requirements-lock.txt | sed '$d'
  echo "# [outside] installed apart by the tests (tests/fixtures/llama4_reference.py), never into the environment"
  echo "torchvision==$tv"
} > "$work/requirements-lock.txt"
OMNIJAX_LOCK="$work/requirements-lock.txt" OMNIJAX_VENV="$venv" "$py" -m pytest -q "$@"
"$py" scripts/check_lock.py --complete --lock "$work/requirements-lock.txt"
cp "$work/requirements-lock.txt" requirements-lock.txt
echo "requirements-lock.txt refreshed: review 'git diff requirements-lock.txt' and commit it"
