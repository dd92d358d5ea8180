"""Batch captioning never destroys files that are not its own, runs one at a time per output, keeps rows for any
file name, keeps the output's permissions, and honours Ctrl-C at any point."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import stat
import threading
from dataclasses import replace

import numpy as np
import PIL.Image
import pytest

from omnijax.demo.caption import CaptionOptions, merge_parts, run_captions
from omnijax.demo.caption_items import CaptionInputError, discover, parse_rows, part_path
from omnijax.demo.caption_output import MAX_OUTPUT_BYTES, OutputLock, lock_path
from omnijax.demo.cli_caption import main as caption_main

OPTIONS = CaptionOptions(max_new_tokens=8, batch_size=2, workers=2, progress=False)


def write_png(path: pathlib.Path, seed: int) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.Image.fromarray(np.random.default_rng(seed).integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(path)
    return path


def no_model():
    raise AssertionError("the model was loaded")


@pytest.fixture
def folder(tmp_path):
    for i in range(5):
        write_png(tmp_path / "in" / f"img{i}.png", i)
    return tmp_path / "in"


def foreign_files(tmp_path, folder) -> dict[str, pathlib.Path]:
    """Files a mistyped --out could name: an image, a CSV, a manifest, a text file, an empty JSON object line."""
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(p), "prompt": "Hi"}) + "\n" for p in sorted(folder.iterdir())))
    csv = tmp_path / "list.csv"
    csv.write_text("path,prompt\na.png,hi\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\nsecond line")
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"path": "/x", "status": "ok"}\n{"other": 1}\n')
    return {"png": folder / "img0.png", "csv": csv, "manifest": manifest, "notes": notes, "odd": odd}


def test_out_that_is_not_a_caption_file_is_refused_and_left_alone(tmp_path, folder, capsys):
    items = discover(str(folder))
    for kind, target in foreign_files(tmp_path, folder).items():
        before = target.read_bytes()
        with pytest.raises(CaptionInputError, match="not a caption file written by omnijax|one of the inputs"):
            run_captions(no_model, items, target, OPTIONS, log=None)
        assert target.read_bytes() == before, kind
        assert not lock_path(target).exists()
    for special in ("/dev/full", "/dev/zero", str(tmp_path)):  # reading them would never end, or is not a file
        with pytest.raises(CaptionInputError, match="not a regular file|is a folder"):
            run_captions(no_model, items, special, OPTIONS, log=None)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(CaptionInputError, match="not a regular file"):
        run_captions(no_model, items, fifo, OPTIONS, log=None)
    csv = foreign_files(tmp_path, folder)["csv"]
    assert caption_main(["--input", str(folder), "--out", str(csv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnijax: error:") and "not a caption file" in err[0]


def test_out_equal_to_an_input_is_refused(tmp_path, folder):
    # a previous output used as a manifest: its rows look like caption rows, but it is the input
    manifest = tmp_path / "captions.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(p), "status": "ok"}) + "\n" for p in sorted(folder.iterdir())))
    before = manifest.read_bytes()
    with pytest.raises(CaptionInputError, match="one of the inputs"):
        run_captions(no_model, discover(str(manifest)), manifest, OPTIONS, log=None, inputs=[manifest])
    link = tmp_path / "link.jsonl"
    link.symlink_to(manifest)
    with pytest.raises(CaptionInputError, match="one of the inputs"):
        run_captions(no_model, discover(str(manifest)), link, OPTIONS, log=None, inputs=[manifest])
    empty = folder / "empty.png"  # an (empty) input image: a caption file by content, an input by name
    empty.write_bytes(b"")
    with pytest.raises(CaptionInputError, match="one of the inputs"):
        run_captions(no_model, discover(str(folder)), empty, OPTIONS, log=None)
    assert manifest.read_bytes() == before and empty.read_bytes() == b""


def test_a_second_run_on_the_same_output_stops_with_a_message(tmp_path, folder, gemma3_pipeline):
    out = tmp_path / "captions.jsonl"
    run_captions(gemma3_pipeline, discover(str(folder))[:2], out, OPTIONS, log=None)
    before = out.read_bytes()
    with OutputLock(out):  # another run holds the output
        assert lock_path(out).exists()
        for retry in (False, True):
            with pytest.raises(CaptionInputError, match="another omnijax caption run is writing"):
                run_captions(gemma3_pipeline, discover(str(folder)), out, replace(OPTIONS, retry_errors=retry),
                             log=None)
        assert out.read_bytes() == before
    assert not lock_path(out).exists()
    summary = run_captions(gemma3_pipeline, discover(str(folder)), out, OPTIONS, log=None)
    assert (summary.already, summary.done) == (2, 3)
    rows = parse_rows(out.read_bytes()).rows
    assert len(rows) == len({r["path"] for r in rows}) == 5


def test_a_file_name_that_is_not_utf8_becomes_a_row(tmp_path, folder, gemma3_pipeline):
    good = os.fsencode(folder) + b"/caf\xe9.png"  # Latin-1 bytes: not valid UTF-8
    bad = os.fsencode(folder) + b"/broken\xff.png"
    with open(good, "wb") as f:
        PIL.Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(f, format="PNG")
    with open(bad, "wb") as f:
        f.write(b"not an image")
    items = discover(str(folder))
    assert len(items) == 7
    out = tmp_path / "captions.jsonl"
    summary = run_captions(gemma3_pipeline, items, out, OPTIONS, log=None)
    assert (summary.done, summary.failed, summary.interrupted) == (6, 1, False)
    data = out.read_bytes()
    data.decode("utf-8")  # the file stays valid UTF-8
    rows = {os.fsencode(r["path"]): r for r in parse_rows(data).rows}  # the escapes give the bytes back
    assert rows[good]["status"] == "ok" and rows[bad]["status"] == "error"
    assert len(rows) == 7
    again = run_captions(no_model, discover(str(folder)), out, OPTIONS, log=None)
    assert (again.already, again.written) == (7, 0)


def test_retrying_errors_keeps_the_output_permissions(tmp_path, folder, gemma3_pipeline):
    (folder / "bad.png").write_bytes(b"not an image")
    out = tmp_path / "captions.jsonl"
    run_captions(gemma3_pipeline, discover(str(folder)), out, OPTIONS, log=None)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    out.chmod(0o640)
    summary = run_captions(gemma3_pipeline, discover(str(folder)), out, replace(OPTIONS, retry_errors=True),
                           log=None)
    assert summary.failed == 1 and stat.S_IMODE(out.stat().st_mode) == 0o640
    merged = tmp_path / "merged.jsonl"
    for index in (0, 1):
        run_captions(gemma3_pipeline, discover(str(folder))[:2], merged, OPTIONS, shard_index=index, shard_count=2,
                     log=None)
    merge_parts(merged)
    assert stat.S_IMODE(merged.stat().st_mode) == 0o666 & ~umask
    assert part_path(merged, 0, 2).exists()


class Interrupting:
    """The pipeline as the captioner uses it, sending SIGINT to this process at one point of a run."""

    def __init__(self, pipe, phase: str, at: int):
        self.pipe, self.phase, self.at = pipe, phase, at
        self.config, self.family, self.name = pipe.config, pipe.family, pipe.name
        self.calls = 0
        self.main = threading.main_thread().ident

    def _maybe_interrupt(self, phase: str) -> None:
        if phase == self.phase:
            self.calls += 1
            if self.calls == self.at:
                signal.pthread_kill(self.main, signal.SIGINT)  # from a worker thread too: the main thread gets it

    def prepare(self, messages):
        self._maybe_interrupt("prepare")
        return self.pipe.prepare(messages)

    def submit(self, prompt, **kwargs):
        return self.pipe.submit(prompt, **kwargs)

    def wait(self, handle):
        self._maybe_interrupt("generate")
        return self.pipe.wait(handle)

    def loaded(self):
        self._maybe_interrupt("load")
        return self


@pytest.mark.parametrize("phase, at", [("load", 1), ("prepare", 1), ("prepare", 4), ("generate", 1),
                                       ("generate", 2)])
def test_ctrl_c_at_any_point_stops_the_run_and_keeps_every_row(tmp_path, folder, gemma3_pipeline, phase, at):
    for i in range(5, 9):
        write_png(folder / f"img{i}.png", i)
    out = tmp_path / "captions.jsonl"
    pipe = Interrupting(gemma3_pipeline, phase, at)
    summary = run_captions(pipe.loaded, discover(str(folder)), out, OPTIONS, log=None)
    assert summary.interrupted and pipe.calls >= at
    data = out.read_bytes() if out.exists() else b""
    rows = parse_rows(data).rows
    assert data.endswith(b"\n") or not data
    assert len(rows) == summary.written < 9 and all(r["status"] == "ok" for r in rows)
    assert not lock_path(out).exists()
    rest = run_captions(gemma3_pipeline, discover(str(folder)), out, OPTIONS, log=None)
    assert (rest.already, rest.done, rest.interrupted) == (len(rows), 9 - len(rows), False)
    assert len({r["path"] for r in parse_rows(out.read_bytes()).rows}) == 9


def test_output_size_limit_is_documented():
    assert MAX_OUTPUT_BYTES == 2 * 2**30
