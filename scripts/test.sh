#!/usr/bin/env bash
# Set up and run the test suite: the package with its test extra, Debian's headless Chromium for the browser
# tests (Playwright drives it; no browser is downloaded), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
pip install -q -e ".[test]"
python -m pytest -q "$@"
