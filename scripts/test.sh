#!/usr/bin/env bash
# Set up and run the test suite: the package with its test and train extras (optax, for the training script's
# test), Debian's headless Chromium for the browser tests (Playwright drives it; no browser is downloaded), then
# pytest. The suite runs on CPU.
#
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/test.sh
#   installs the pinned PyTorch from that index first (the CPU-only build, about 200 MB, instead of the CUDA build
#   a default package index gives on Linux, several GB).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  TORCH_PIN=$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
  pip install -q "$TORCH_PIN" --index-url "$TORCH_INDEX_URL"
fi
pip install -q -e ".[test,train]"
python -m pytest -q "$@"
