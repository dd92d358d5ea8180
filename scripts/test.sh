#!/usr/bin/env bash
# Set up and run the test suite on the locked versions: the package with its test and train extras in .venv
# (scripts/setup.sh: installed from requirements-lock.txt and checked against it, so the run fails when the
# environment differs from the lock), Debian's headless Chromium for the browser tests (Playwright drives it; no
# browser is downloaded; installed while the environment is set up), then pytest on CPU in two worker processes
# (pytest-xdist; a test file runs whole in one worker; OMNIJAX_TEST_WORKERS sets how many). Arguments go to pytest:
# `bash scripts/test.sh -m "not slow"` is the quick run (the markers are listed in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
browser=""
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null; } &
  browser=$!
fi
bash scripts/setup.sh test,train
[ -z "$browser" ] || wait "$browser"
exec "${OMNIJAX_VENV:-.venv}/bin/python" -m pytest -q -n "${OMNIJAX_TEST_WORKERS:-2}" --dist loadfile \
  --no-loadscope-reorder "$@"
