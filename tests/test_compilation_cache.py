"""The persistent compilation cache: a second ``omnijax generate`` on the same model compiles nothing.

Each run is a fresh process with its own OMNIJAX_HOME; JAX's compilation-cache events are counted in the child.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = r"""
import collections, json, sys
import jax.monitoring
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
from omnijax.app.cli import main
code = main(sys.argv[1:])
print("EVENTS" + json.dumps({"code": code, **events}), flush=True)
"""


def _run(home: pathlib.Path, folder, *extra) -> dict:
    env = dict(os.environ, OMNIJAX_HOME=str(home), PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("OMNIJAX_COMPILATION_CACHE", None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    args = ["generate", "--model", str(folder), "--prompt", "Hello there", "--max-new-tokens", "4", *extra]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("EVENTS"))[len("EVENTS"):])


def test_second_run_loads_every_program_from_the_cache(tmp_path, tiny_gemma3_dir):
    first = _run(tmp_path, tiny_gemma3_dir)
    second = _run(tmp_path, tiny_gemma3_dir)
    assert first["code"] == second["code"] == 0
    assert first.get("/jax/compilation_cache/cache_misses", 0) > 0
    assert second.get("/jax/compilation_cache/cache_misses", 0) == 0
    assert second.get("/jax/compilation_cache/cache_hits", 0) >= first["/jax/compilation_cache/cache_misses"]
    assert any((tmp_path / "jax-cache").iterdir())


def test_the_cache_can_be_turned_off(tmp_path, tiny_gemma3_dir):
    off = _run(tmp_path, tiny_gemma3_dir, "--no-compilation-cache")
    assert off["code"] == 0
    assert off.get("/jax/compilation_cache/cache_hits", 0) == 0 and off.get("/jax/compilation_cache/cache_misses", 0) == 0
    assert not (tmp_path / "jax-cache").exists()
