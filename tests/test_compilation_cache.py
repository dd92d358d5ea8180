"""The persistent compilation cache: a second run on the same model compiles nothing and computes exactly what the
first one did; the folder is kept per jaxlib and kind of CPU, and files a killed process left half-written are
removed before use.

Each run is a fresh process with its own OMNIJAX_HOME; JAX's compilation-cache events are counted in the child.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from fixtures.child_path import child_python_path


COUNTING = r"""
import collections, json, sys
import jax.monitoring
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
"""

CLI = COUNTING + r"""
from omnijax.app.cli import main
code = main(sys.argv[1:])
print("EVENTS" + json.dumps({"code": code, **events}), flush=True)
"""

# A spoken answer (thinker, talker, code predictor, code2wav: every program of the speech path), its numbers hashed;
# twice: compiled fresh (and written to the cache), then, with every compiled program dropped from memory, by a new
# pipeline whose programs all come from the cache folder. The events of each half are counted apart.
SPEECH = COUNTING + r"""
import hashlib
import jax
import numpy as np
from omnijax.app.pipeline import Pipeline
digest = lambda a: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()  # noqa: E731
out = {}
for run in ("fresh", "loaded"):
    events.clear()
    pipe = Pipeline.from_pretrained(sys.argv[1])
    r = pipe.generate([{"role": "user", "content": "Hello there"}], max_new_tokens=10, speak=True, voice="ethan",
                      max_speech_frames=24)
    out[run] = {"tokens": r.token_ids, "audio": digest(r.audio), "codes": digest(r.audio_codes),
                "samples": int(r.audio.size), **events}
    pipe.close()
    del pipe
    jax.clear_caches()
print("EVENTS" + json.dumps(out), flush=True)
"""


def _child(home: pathlib.Path, script: str, *args) -> dict:
    env = dict(os.environ, OMNIJAX_HOME=str(home), PYTHONPATH=child_python_path(), JAX_PLATFORMS="cpu")
    for name in ("OMNIJAX_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                 "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
        env.pop(name, None)  # the user's defaults, not the suite's own cache
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("EVENTS"))[len("EVENTS"):])


def _cli(home: pathlib.Path, folder, *extra) -> dict:
    return _child(home, CLI, "generate", "--model", folder, "--prompt", "Hello there", "--max-new-tokens", "1", *extra)


@pytest.mark.slow
def test_a_second_pipeline_loads_every_program_and_speaks_the_same_samples(tmp_path, tiny_qwen_full_dir):
    """The first run compiles every program of a spoken answer and keeps it; the second compiles nothing, and its
    token ids, codec codes and waveform are bit-equal to the first's (a fresh compile)."""
    from omnijax.app.compilation_cache import cache_folder

    runs = _child(tmp_path, SPEECH, tiny_qwen_full_dir)
    fresh, loaded = runs["fresh"], runs["loaded"]
    assert fresh.get("/jax/compilation_cache/cache_misses", 0) > 0
    assert loaded.get("/jax/compilation_cache/cache_misses", 0) == 0
    assert loaded.get("/jax/compilation_cache/cache_hits", 0) >= fresh["/jax/compilation_cache/cache_misses"]
    assert fresh["samples"] > 0 and len(fresh["tokens"]) > 0
    assert (loaded["tokens"], loaded["codes"], loaded["audio"]) == (fresh["tokens"], fresh["codes"], fresh["audio"])
    folder = cache_folder(tmp_path)
    assert any(folder.glob("*-cache")) and [p.name for p in (tmp_path / "jax-cache").iterdir()] == [folder.name]


@pytest.mark.slow
def test_the_cache_can_be_turned_off(tmp_path, tiny_gemma3_dir):
    off = _cli(tmp_path, tiny_gemma3_dir, "--no-compilation-cache")
    assert off["code"] == 0
    assert off.get("/jax/compilation_cache/cache_hits", 0) == 0 and off.get("/jax/compilation_cache/cache_misses", 0) == 0
    assert not (tmp_path / "jax-cache").exists()


def test_the_folder_is_kept_per_jaxlib_and_kind_of_cpu(tmp_path):
    import jaxlib

    from omnijax.app.compilation_cache import cache_folder
    from omnijax.common.cpu import cpu_signature

    avx2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512_bf16"}
    assert cpu_signature(avx2, "x86_64") != cpu_signature(avx512, "x86_64") != cpu_signature(avx512, "aarch64")
    assert cpu_signature(avx2, "x86_64") == cpu_signature(frozenset(sorted(avx2, reverse=True)), "x86_64")
    folder = cache_folder(tmp_path)
    assert folder.parent == tmp_path / "jax-cache"
    assert folder.name == f"jaxlib-{jaxlib.__version__}-{cpu_signature()}"


def test_programs_a_killed_process_left_half_written_are_removed(tmp_path):
    """A program file without its access-time file (the writer died between the two) makes every later write of a
    size-bounded JAX cache fail; ``mend`` removes it, and only it."""
    from jax._src.lru_cache import LRUCache

    from omnijax.app.compilation_cache import mend

    cache = LRUCache(str(tmp_path), max_size=1 << 20)
    cache.put("whole", b"a complete program")
    (tmp_path / "torn-cache").write_bytes(b"the first half of a pro")  # no torn-atime: its writer was killed
    with pytest.raises(FileNotFoundError):
        cache.put("next", b"another program")
    assert mend(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["whole-atime", "whole-cache"]
    cache.put("next", b"another program")
    assert cache.get("next") == b"another program" and cache.get("whole") == b"a complete program"
    assert mend(tmp_path) == 0


def test_the_program_clock_counts_what_preparing_programs_took():
    """The CLI's last line reports the time spent preparing programs apart from the answer (app/program_clock.py):
    a new program is traced, lowered and compiled (or loaded) inside the interval, a program already prepared is
    not counted again."""
    import jax
    import jax.numpy as jnp

    from omnijax.app.program_clock import Preparation, start

    clock = start()
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())
    f(jnp.ones((7, 5))).block_until_ready()
    first = clock.since()
    assert first.programs >= 1 and first.seconds > 0
    again = start()
    f(jnp.ones((7, 5))).block_until_ready()
    assert again.since().programs == 0
    assert Preparation(1.5, 3, 3, 0).describe() == "1.50 s preparing 3 programs (loaded from the compilation cache)"
    assert "compiled: a first run" in Preparation(5.0, 2, 0, 2).describe()
    assert "1 compiled, 1 loaded" in Preparation(2.0, 2, 1, 1).describe()
    assert "cache is off" in Preparation(2.0, 1, 0, 0).describe()
