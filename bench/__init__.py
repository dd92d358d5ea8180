"""Benchmarks, run as ``python -m bench.NAME`` from the repository root. They build their random checkpoints with
the tests' fixtures (tests/fixtures, the ``fixtures`` package, which write their folders with training/'s Gemma 3
folder writers), so tests/ is put on the import path (the repository root, which holds training/, is on it
already: ``bench`` imports from there)."""

import pathlib
import sys

_TESTS = str(pathlib.Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
