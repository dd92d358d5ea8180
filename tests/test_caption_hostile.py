"""Batch captioning under hostile input: manifests naming files outside their folder, oversized or deeply nested
manifest fields, absurd flags, control characters in file names, a full disk, SIGTERM and the leftovers of a killed
rewrite. Each is refused (or stops) with a one-line CaptionInputError / OmnijaxError, before the model loads where
it can be, in bounded time and memory, and a run afterwards works."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from dataclasses import replace

import numpy as np
import PIL.Image
import pytest

from omnijax.demo.caption import CaptionOptions, run_captions
from omnijax.demo.caption_items import CaptionInputError, discover, parse_rows
from omnijax.demo.caption_output import lock_path
from omnijax.demo.cli_caption import main as caption_main
from fixtures.child_path import child_python_path

OPTIONS = CaptionOptions(max_new_tokens=6, batch_size=1, workers=0, progress=False)


def write_png(path: pathlib.Path, seed: int = 0) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.Image.fromarray(np.random.default_rng(seed).integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(path)
    return path


def no_model():
    raise AssertionError("the model was loaded")


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnijax: error:"), err
    return err[0]


def bounded(fn, max_mb: float = 8.0, max_seconds: float = 30.0):
    """Run ``fn``; assert it took less than ``max_seconds`` and its Python allocations peaked under ``max_mb``."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        return fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        assert time.perf_counter() - start < max_seconds and peak < max_mb, (time.perf_counter() - start, peak)


@pytest.fixture
def dataset(tmp_path):
    """A manifest's folder with two images, and a secret image next to it (outside)."""
    for i in range(2):
        write_png(tmp_path / "data" / f"img{i}.png", i)
    write_png(tmp_path / "outside" / "secret.png", 9)
    return tmp_path / "data"


def test_a_manifest_is_confined_to_its_folder(dataset, tmp_path, capsys, gemma3_pipeline):
    secret = tmp_path / "outside" / "secret.png"
    for listed in ("../outside/secret.png", str(secret), "img0.png/../../outside/secret.png"):
        manifest = dataset / "list.jsonl"
        manifest.write_text(json.dumps({"path": "img0.png"}) + "\n" + json.dumps({"path": listed}) + "\n")
        with pytest.raises(CaptionInputError, match=r"list.jsonl line 2: .* is outside the manifest's folder"):
            discover(str(manifest))
        out = tmp_path / "captions.jsonl"
        assert caption_main(["--input", str(manifest), "--out", str(out)]) == 2
        assert "--allow-outside-paths" in one_error_line(capsys) and not out.exists()
    csv = dataset / "list.csv"
    csv.write_text("path\nimg1.png\n../outside/secret.png\n")
    with pytest.raises(CaptionInputError, match=r"list.csv line 3: .* is outside"):
        discover(str(csv))
    items = discover(str(manifest), allow_outside=True)  # the flag lets it through
    assert [item.path for item in items] == [str(dataset / "img0.png"), str(secret)]
    summary = run_captions(gemma3_pipeline, items, tmp_path / "captions.jsonl", OPTIONS, log=None)
    assert (summary.done, summary.failed) == (2, 0)


def test_an_oversized_csv_field_is_one_error_line(dataset, tmp_path, capsys):
    manifest = dataset / "list.csv"
    manifest.write_text("path,prompt\nimg0.png," + "x" * (200 * 1024) + "\n")
    with pytest.raises(CaptionInputError, match=r"list.csv line \d+: not readable CSV .*at most 128 KB"):
        bounded(lambda: discover(str(manifest)))
    assert caption_main(["--input", str(manifest), "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "not readable CSV" in one_error_line(capsys)


def test_deeply_nested_json_in_a_manifest_or_an_existing_output(dataset, tmp_path, capsys):
    deep = '{"a": ' * 10_000 + "1" + "}" * 10_000
    manifest = dataset / "list.jsonl"
    manifest.write_text(json.dumps({"path": "img0.png"}) + "\n" + deep + "\n")
    with pytest.raises(CaptionInputError, match=r"list.jsonl line 2 nests too deeply"):
        bounded(lambda: discover(str(manifest)))
    out = tmp_path / "captions.jsonl"
    out.write_text(deep + "\n")
    before = out.read_bytes()
    assert caption_main(["--input", str(dataset), "--out", str(out)]) == 2
    assert "not a caption file written by omnijax (line 1" in one_error_line(capsys)
    assert out.read_bytes() == before


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "10000000"], r"batch_size must be an integer in \[1, 1024\]"),
    (["--workers", "100000"], r"workers must be an integer in \[0, 256\]"),
    (["--max-new-tokens", "3000000000"], r"max_new_tokens must be an integer in \[1, 16777216\]"),
])
def test_absurd_flags_are_refused_before_the_model_loads(dataset, tmp_path, capsys, monkeypatch, flags, message):
    import re

    monkeypatch.setattr("omnijax.app.cli.load_pipeline", lambda args: no_model())
    out = tmp_path / "captions.jsonl"
    assert bounded(lambda: caption_main(["--input", str(dataset), "--out", str(out), *flags])) == 2
    assert re.search(message, one_error_line(capsys))
    assert not out.exists()


def test_max_new_tokens_filling_the_context_is_refused_once(dataset, tmp_path, gemma3_pipeline):
    out = tmp_path / "captions.jsonl"
    budget = gemma3_pipeline.engine.max_context
    with pytest.raises(CaptionInputError, match=f"leaves no room for a prompt in the model's context budget of "
                                                f"{budget} tokens"):
        run_captions(gemma3_pipeline, discover(str(dataset)), out, replace(OPTIONS, max_new_tokens=budget), log=None)
    assert not out.exists() or out.read_bytes() == b""
    assert run_captions(gemma3_pipeline, discover(str(dataset)), out, OPTIONS, log=None).done == 2


def test_control_characters_in_file_names_are_escaped_in_messages(tmp_path, capsys):
    from omnijax.app.cli import main as generate_main

    name = tmp_path / "evil\nname\x1b[2J\x1b]0;pwned\x07.png"
    assert generate_main(["generate", "--image", str(name), "--prompt", "hi"]) == 2
    line = one_error_line(capsys)
    assert "evil\\nname\\x1b[2J\\x1b]0;pwned\\x07.png" in line and "\x1b" not in line and "\x07" not in line
    manifest = tmp_path / "list.jsonl"
    manifest.write_text(json.dumps({"path": "a\u202egnp.exe"}) + "\n" + "{bad json\n")
    assert caption_main(["--input", str(manifest), "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "\u202e" not in one_error_line(capsys)


def test_stale_temporary_files_of_a_killed_rewrite_are_removed(dataset, tmp_path, gemma3_pipeline):
    (dataset / "bad.png").write_bytes(b"not an image")
    out = tmp_path / "captions.jsonl"
    run_captions(gemma3_pipeline, discover(str(dataset)), out, OPTIONS, log=None)
    stale = [tmp_path / f".captions.jsonl.{pid}.0.tmp" for pid in (4242, 99999)]
    for file in stale:  # what a --retry-errors run killed in the middle of its rewrite leaves
        file.write_bytes(b'{"path": "x", "status": "ok"}\n')
    other = tmp_path / ".notes.txt.1.0.tmp"
    other.write_text("not ours")
    summary = run_captions(gemma3_pipeline, discover(str(dataset)), out, replace(OPTIONS, retry_errors=True), log=None)
    assert summary.failed == 1 and not any(f.exists() for f in stale) and other.exists()
    assert len(parse_rows(out.read_bytes()).rows) == 3


class Terminating:
    """The pipeline as the captioner uses it, sending SIGTERM to this process at its first generation."""

    def __init__(self, pipe):
        self.pipe, self.config, self.family, self.name, self.engine = pipe, pipe.config, pipe.family, pipe.name, \
            pipe.engine
        self.sent = False

    def prepare(self, messages):
        return self.pipe.prepare(messages)

    def submit(self, prompt, **kwargs):
        return self.pipe.submit(prompt, **kwargs)

    def wait(self, handle):
        if not self.sent:
            self.sent = True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        return self.pipe.wait(handle)


def test_sigterm_stops_a_run_like_ctrl_c(dataset, tmp_path, gemma3_pipeline):
    for i in range(2, 6):
        write_png(dataset / f"img{i}.png", i)
    out = tmp_path / "captions.jsonl"
    summary = run_captions(Terminating(gemma3_pipeline), discover(str(dataset)), out, OPTIONS, log=None)
    assert summary.interrupted and summary.written < 6 and not lock_path(out).exists()
    data = out.read_bytes() if out.exists() else b""
    assert data.endswith(b"\n") or not data
    rest = run_captions(gemma3_pipeline, discover(str(dataset)), out, OPTIONS, log=None)
    assert rest.already + rest.done == 6 and not rest.interrupted


FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk (ENOSPC)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from omnijax.demo.cli import main
sys.exit(main(["caption", *sys.argv[2:]]))
"""


@pytest.mark.slow
def test_a_full_disk_is_one_error_line_and_every_finished_row_is_kept(tmp_path, tiny_gemma3_dir, gemma3_pipeline):
    for i in range(4):
        write_png(tmp_path / "in" / f"img{i}.png", i)
    out = tmp_path / "captions.jsonl"
    items = discover(str(tmp_path / "in"))
    run_captions(gemma3_pipeline, items[:1], out, OPTIONS, log=None)  # one finished row
    kept = out.read_bytes()
    env = dict(os.environ, OMNIJAX_HOME=str(tmp_path / "home"), PYTHONPATH=child_python_path(), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(len(kept) + 20), "--model", str(tiny_gemma3_dir),
                           "--input", str(tmp_path / "in"), "--out", str(out), "--batch-size", "1",
                           "--max-new-tokens", "6", "--no-progress", "--no-compilation-cache"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("omnijax: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"cannot write to {out}" in errors[0] and "rows written before are kept" in errors[0]
    assert out.read_bytes() == kept  # no torn row, nothing lost
    assert not lock_path(out).exists()
    rest = run_captions(gemma3_pipeline, items, out, OPTIONS, log=None)  # with room again, the run completes
    assert (rest.already, rest.done) == (1, 3)
