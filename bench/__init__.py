"""Benchmarks, run as ``python -m bench.NAME`` from the repository root. They build their random checkpoints with
the tests' fixtures (tests/fixtures, the ``fixtures`` package), so that folder is put on the import path."""

import pathlib
import sys

_TESTS = str(pathlib.Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
