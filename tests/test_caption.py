"""Batch captioning: input discovery, sharding, resuming after a kill or Ctrl-C, merging, parity with generate."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import PIL.Image
import pytest

from omnijax.demo.cli_caption import main as caption_main
from omnijax.demo.caption import CaptionOptions, merge_parts, messages_for, read_rows, run_captions
from omnijax.demo.caption_items import (CaptionInputError, CaptionItem, check_parts, dedup_rows, discover,
                                finished_paths, parse_jsonl_manifest, parse_rows, part_path, shard_items)
from fixtures.four_devices import with_devices
from fixtures.child_path import child_python_path

MAX_NEW = 8
BATCH = 2  # every run here uses one batch size and one token budget, so the compiled programs are shared
OPTIONS = CaptionOptions(max_new_tokens=MAX_NEW, batch_size=BATCH, workers=2, progress=False)


def write_png(path: pathlib.Path, seed: int, size=(20, 14)) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    PIL.Image.fromarray(pixels).save(path)
    return path


@pytest.fixture
def mixed_folder(tmp_path):
    """Good images (nested), a corrupt and a truncated image sorted between them, a WAV file, non-media files
    and a hidden folder. Returns (folder, good paths, bad paths, audio path)."""
    folder = tmp_path / "media"
    good = [write_png(folder / "a0.png", 0), write_png(folder / "a2.png", 2), write_png(folder / "a4.png", 4),
            write_png(folder / "sub" / "deeper" / "b0.png", 5), write_png(folder / "sub" / "b1.jpg", 6)]
    (folder / "a1_corrupt.png").write_bytes(b"this is not a PNG file")
    whole = (folder / "a2.png").read_bytes()
    (folder / "a3_truncated.png").write_bytes(whole[:len(whole) // 2])
    audio = folder / "sub" / "sound.wav"
    audio.write_bytes(b"RIFF\x00\x00\x00\x00WAVE")
    (folder / "notes.txt").write_text("not media")
    (folder / "sub" / "meta.json").write_text("{}")
    write_png(folder / ".hidden" / "h.png", 9)
    bad = [folder / "a1_corrupt.png", folder / "a3_truncated.png"]
    return folder, good, bad, audio


def expected_caption(pipe, path, prompt="Describe this image."):
    """``Pipeline.generate`` on the item, asked as a batch of two copies: the batch shape of the runs here, so the
    compiled programs are shared (each row of a batch is independent of the others)."""
    messages = messages_for(CaptionItem(str(path), "image"), prompt)
    return pipe.generate([messages, messages], max_new_tokens=MAX_NEW)[0]


def no_model():
    pytest.fail("the model was loaded although nothing was left to caption")


def rows_by_path(path) -> dict[str, dict]:
    rows = read_rows(path)
    by_path = {r["path"]: r for r in rows}
    assert len(by_path) == len(rows), "an item has more than one row"
    return by_path


# ---- pure functions ----------------------------------------------------------------------------------------------

def test_folder_discovery_keeps_media_only(mixed_folder):
    folder, good, bad, audio = mixed_folder
    items = discover(str(folder))
    assert sorted(i.path for i in items) == sorted(str(p) for p in good + bad + [audio])
    assert {i.path: i.kind for i in items}[str(audio)] == "audio"
    assert [i.path for i in items] == sorted(i.path for i in items)


def test_glob_and_single_file_inputs(mixed_folder, monkeypatch):
    folder, good, bad, audio = mixed_folder
    monkeypatch.chdir(folder)
    pngs = discover("**/*.png")  # relative glob, recursive; hidden folders are not matched by **
    assert [i.path for i in pngs] == sorted(str(p) for p in good + bad if p.suffix == ".png")
    assert [i.path for i in discover("sub/*")] == [str(folder / "sub" / "b1.jpg"), str(audio)]
    assert [i.path for i in discover("a0.png")] == [str(good[0])]
    with pytest.raises(CaptionInputError, match="matches no media files"):
        discover("*.gif")
    with pytest.raises(CaptionInputError, match="input not found"):
        discover("missing_folder")
    with pytest.raises(CaptionInputError, match="neither a folder"):
        discover("notes.txt")


def test_manifest_parsing_and_errors(tmp_path):
    text = '{"path": "x/a.png", "prompt": "Hi?"}\n\n{"path": "/abs/b.wav"}\n'
    with pytest.raises(CaptionInputError, match=r"m\.jsonl line 3: '/abs/b.wav' is outside the manifest's folder"):
        parse_jsonl_manifest(text, "m.jsonl", str(tmp_path))
    items = parse_jsonl_manifest(text, "m.jsonl", str(tmp_path), allow_outside=True)
    assert items == [CaptionItem(str(tmp_path / "x" / "a.png"), "image", "Hi?"), CaptionItem("/abs/b.wav", "audio")]
    with pytest.raises(CaptionInputError, match=r"m\.jsonl line 2 is not valid JSON"):
        parse_jsonl_manifest('{"path": "a.png"}\n{"path": \n', "m.jsonl", "/")
    with pytest.raises(CaptionInputError, match=r"m\.jsonl line 1: no 'path' value"):
        parse_jsonl_manifest('{"file": "a.png"}\n', "m.jsonl", "/")
    (tmp_path / "m.csv").write_text("file,prompt\na.png,hi\n")
    with pytest.raises(CaptionInputError, match="no 'path' column"):
        discover(str(tmp_path / "m.csv"))
    (tmp_path / "n.csv").write_text("image,question\na.png,What?\nb.png,\n")
    got = discover(str(tmp_path / "n.csv"), path_column="image", prompt_column="question")
    assert got == [CaptionItem(str(tmp_path / "a.png"), "image", "What?"),
                   CaptionItem(str(tmp_path / "b.png"), "image")]


def test_messages_for_images_and_audio():
    assert messages_for(CaptionItem("/a.wav", "audio"), "Hi", system="Be brief.") == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "audio", "audio": "/a.wav"}, {"type": "text", "text": "Hi"}]}]
    assert messages_for(CaptionItem("/a.png", "image"), "Hi") == [
        {"role": "user", "content": [{"type": "image", "image": "/a.png"}, {"type": "text", "text": "Hi"}]}]


def test_sharding_splits_every_item_exactly_once():
    items = [CaptionItem(f"/m/{i:03d}.png", "image") for i in range(23)]
    for count in (1, 2, 4, 7):
        shards = [shard_items(items, index, count) for index in range(count)]
        flat = [i.path for shard in shards for i in shard]
        assert sorted(flat) == [i.path for i in items] and len(set(flat)) == len(items)
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    with pytest.raises(ValueError, match="shard_index"):
        shard_items(items, 4, 4)
    assert part_path("out/captions.jsonl", 0, 1) == pathlib.Path("out/captions.jsonl")
    assert part_path("out/captions.jsonl", 1, 4) == pathlib.Path("out/captions.part-00001-of-00004.jsonl")


def test_rows_torn_last_line_dedup_and_parts():
    data = b'{"path": "/a", "status": "ok"}\nnot json\n{"path": "/b", "status": "error", "error": "x"}\n{"path": "/c'
    parsed = parse_rows(data)
    assert [r["path"] for r in parsed.rows] == ["/a", "/b"]
    assert parsed.bad_lines == 1 and data[:parsed.complete_bytes].endswith(b'"x"}\n')
    assert finished_paths(parsed.rows) == {"/a", "/b"}
    assert finished_paths(parsed.rows, retry_errors=True) == {"/a"}
    rows = [{"path": "/a", "status": "ok", "caption": "1"}, {"path": "/b", "status": "error"},
            {"path": "/a", "status": "error"}, {"path": "/b", "status": "ok", "caption": "2"}]
    assert dedup_rows(rows) == [rows[0], rows[3]]
    check_parts([(0, 2, "p0"), (1, 2, "p1")])
    with pytest.raises(CaptionInputError, match=r"missing part files for processes \[1\] of 3"):
        check_parts([(0, 3, "p0"), (2, 3, "p2")])
    with pytest.raises(CaptionInputError, match="different process counts"):
        check_parts([(0, 2, "p0"), (1, 3, "p1")])


def test_cli_reports_bad_input_before_loading_a_model(tmp_path, capsys):
    assert caption_main(["--input", str(tmp_path / "nope"), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "omnijax: error: input not found" in capsys.readouterr().err
    assert caption_main(["--merge", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "no part files" in capsys.readouterr().err
    folder = write_png(tmp_path / "in" / "a.png", 0).parent
    assert caption_main(["--input", str(folder), "--out", str(tmp_path / "o.jsonl"), "--top-p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err
    assert caption_main(["--input", str(folder), "--out", str(tmp_path / "o.jsonl"), "--process-index", "1"]) == 2
    assert "together" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


# ---- runs on the shared tiny model -------------------------------------------------------------------------------

def test_mixed_folder_gives_one_row_per_media_item(mixed_folder, tmp_path, gemma3_pipeline):
    folder, good, bad, audio = mixed_folder
    out = tmp_path / "captions.jsonl"
    summary = run_captions(gemma3_pipeline, discover(str(folder)), out, OPTIONS, log=None)
    assert (summary.done, summary.failed, summary.skipped, summary.interrupted) == (5, 2, 1, False)
    rows = rows_by_path(out)
    assert set(rows) == {str(p) for p in good + bad + [audio]}
    assert "cannot identify an image format" in rows[str(bad[0])]["error"]
    assert "corrupt or truncated" in rows[str(bad[1])]["error"]
    assert rows[str(audio)]["status"] == "skipped" and "no audio input" in rows[str(audio)]["error"]
    for path in good:  # the bad items shared batches with good ones
        row, want = rows[str(path)], expected_caption(gemma3_pipeline, path)
        assert row["status"] == "ok" and row["error"] is None
        assert (row["caption"], row["new_tokens"], row["prompt_tokens"], row["finish_reason"]) == \
            (want.text, len(want.token_ids), want.prompt_tokens, want.finish_reason)
    again = run_captions(no_model, discover(str(folder)), out, OPTIONS, log=None)  # nothing left: no model loaded
    assert (again.already, again.written) == (8, 0)
    retry = run_captions(gemma3_pipeline, discover(str(folder)), out, replace(OPTIONS, retry_errors=True), log=None)
    assert (retry.already, retry.failed) == (6, 2)
    assert rows_by_path(out).keys() == rows.keys()  # the retried items' old rows were replaced, not duplicated


def test_manifests_with_per_item_prompts(mixed_folder, tmp_path, gemma3_pipeline):
    folder, good, bad, audio = mixed_folder
    long_prompt = "Describe every pixel of this image. " * 600  # over the 4096-token context budget
    # batches of two: a good item beside the one over budget (its batch fails, then each item runs on its own),
    # a missing file beside a good item, and a last batch of one
    entries = [("a0.png", "What colours?"), ("a4.png", long_prompt), ("missing.png", "Where?"), ("a2.png", ""),
               ("sub/b1.jpg", "Count the dots.")]
    (folder / "m.jsonl").write_text("".join(json.dumps({"path": p, "prompt": q}) + "\n" for p, q in entries))
    with open(folder / "m.csv", "w", newline="") as f:
        csv.writer(f).writerows([("path", "prompt"), *entries])
    for name, workers in (("m.jsonl", 2), ("m.csv", 0)):  # 0 workers: prepared in the main thread
        out = tmp_path / f"{name}.out.jsonl"
        summary = run_captions(gemma3_pipeline, discover(str(folder / name)), out,
                               replace(OPTIONS, prompt="Describe it.", workers=workers), log=None)
        assert (summary.done, summary.failed) == (3, 2)
        rows = rows_by_path(out)
        assert "image file not found" in rows[str(folder / "missing.png")]["error"]
        assert "context budget" in rows[str(folder / "a4.png")]["error"]
        asked = [("a0.png", "What colours?"), ("a2.png", "Describe it."), ("sub/b1.jpg", "Count the dots.")]
        for path, prompt in asked:
            row = rows[str(folder / path)]
            assert row["prompt"] == prompt
            assert row["caption"] == expected_caption(gemma3_pipeline, folder / path, prompt).text


def test_simulated_processes_write_parts_that_merge(mixed_folder, tmp_path, gemma3_pipeline):
    folder, good, bad, audio = mixed_folder
    items = discover(str(folder))
    out = tmp_path / "captions.jsonl"
    for index in (1, 0):
        run_captions(gemma3_pipeline, items, out, OPTIONS, shard_index=index, shard_count=2, log=None)
    assert not out.exists()
    parts = [rows_by_path(part_path(out, i, 2)) for i in range(2)]
    assert not set(parts[0]) & set(parts[1]) and len(parts[0]) == len(parts[1]) == 4
    summary = merge_parts(out, remove_parts=True)
    assert (summary.rows, summary.ok, summary.failed, summary.skipped) == (8, 5, 2, 1)
    merged = rows_by_path(out)
    assert merged == {**parts[0], **parts[1]}
    assert list(merged) == list(parts[0]) + list(parts[1])  # process order
    assert not part_path(out, 0, 2).exists()
    again = run_captions(no_model, items, out, OPTIONS, shard_index=1, shard_count=2, log=None)
    assert (again.already, again.written) == (4, 0)  # the merged file counts


# ---- interrupted command-line runs -------------------------------------------------------------------------------

def caption_command() -> list[str]:
    """The ``omnijax caption`` command as ``python -m demo caption``."""
    return ["-m", "omnijax", "caption"]


# ``omnijax caption`` whose fifth row waits until a signal ends the run: the first four rows are written, then the
# run holds still, so a signal sent once four rows are there always lands mid-run. It waits as a row's caption is
# waited for (common/interruptible.py), which a signal delivered to any of the process's threads ends.
PAUSED_CAPTION = """
import sys, threading
import omnijax.demo.caption as caption
from omnijax.common.interruptible import wait_event
from omnijax.demo.cli import main
next_row = caption.InFlight.next_row
calls = []
def paused_next_row(self):
    calls.append(1)
    if len(calls) == 5:
        wait_event(threading.Event())
    return next_row(self)
caption.InFlight.next_row = paused_next_row
sys.exit(main(["caption", *sys.argv[1:]]))
"""


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    """A persistent compilation cache shared by this file's command-line runs: the first one compiles, the rest
    load the programs (the same shapes, and weights are arguments, so any tiny Gemma 3 folder hits)."""
    return tmp_path_factory.mktemp("jax_cache")


def start_cli(args, tmp_path, jax_cache, *, paused: bool = False, env_extra: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, **(env_extra or {}), OMNIJAX_HOME=str(tmp_path / "home"), PYTHONPATH=child_python_path(),
               JAX_COMPILATION_CACHE_DIR=str(jax_cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", PYTHONFAULTHANDLER="1")
    command = ["-c", PAUSED_CAPTION] if paused else caption_command()
    return subprocess.Popen([sys.executable, *command, *args], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc, timeout: float) -> str:
    """The child's stderr once it exits; if it is still running after ``timeout`` seconds, fail with every thread's
    stack (SIGABRT makes the fault handler print them)."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        err = proc.communicate(timeout=60)[1]
        pytest.fail(f"the run had not exited after {timeout} s; its threads:\n{err[-6000:]}")


def count_lines(path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def stop_after_rows(proc, out, rows: int, sig, timeout=120.0) -> int:
    """Wait until ``out`` has ``rows`` lines, then send ``sig``; returns the lines seen just before."""
    deadline = time.monotonic() + timeout
    while count_lines(out) < rows:
        assert proc.poll() is None, f"the run ended before writing {rows} rows: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "no rows written in time"
        time.sleep(0.01)
    seen = count_lines(out)
    proc.send_signal(sig)
    return seen


def many_images(folder, n) -> list[pathlib.Path]:
    return [write_png(folder / f"img{i:03d}.png", 100 + i, size=(12, 12)) for i in range(n)]


@pytest.mark.slow
def test_sigkill_then_rerun_captions_every_item_once(tmp_path, tiny_gemma3_dir, gemma3_pipeline, jax_cache):
    images = many_images(tmp_path / "many", 32)
    out = tmp_path / "captions.jsonl"
    args = ["--model", str(tiny_gemma3_dir), "--input", str(tmp_path / "many"), "--out", str(out),
            "--batch-size", str(BATCH), "--workers", "2", "--max-new-tokens", str(MAX_NEW)]
    proc = start_cli(args, tmp_path, jax_cache, paused=True)
    stop_after_rows(proc, out, 4, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = out.read_bytes()
    kept = before[:before.rfind(b"\n") + 1]
    assert kept.count(b"\n") == 4
    first = parse_rows(kept).rows
    with open(out, "ab") as f:  # what a kill in the middle of a write leaves behind
        f.write(b'{"path": "' + str(images[-1]).encode() + b'", "caption": "tor')
    summary = run_captions(gemma3_pipeline, discover(str(tmp_path / "many")), out, OPTIONS, log=None)
    assert summary.already == len(first) and summary.done == len(images) - len(first)
    assert out.read_bytes().startswith(kept)  # nothing written before the kill was lost or changed
    rows = rows_by_path(out)
    assert sorted(rows) == sorted(str(p) for p in images)
    assert all(r["status"] == "ok" for r in rows.values())
    for row in first[:2] + parse_rows(out.read_bytes()).rows[-2:]:  # the subprocess and this process agree
        assert row["caption"] == expected_caption(gemma3_pipeline, row["path"]).text


@pytest.mark.slow
def test_ctrl_c_then_rerun_with_the_default_model(tmp_path, jax_cache):
    images = many_images(tmp_path / "many", 32)
    out = tmp_path / "captions.jsonl"
    args = ["--input", str(tmp_path / "many"), "--out", str(out), "--batch-size", str(BATCH),
            "--max-new-tokens", str(MAX_NEW)]
    proc = start_cli(args, tmp_path, jax_cache, paused=True)
    stop_after_rows(proc, out, 4, signal.SIGINT)
    err = finish(proc, 60)
    assert proc.returncode == 130, err[-2000:]
    assert "embedded default model" in err and "[omnijax] interrupted:" in err and "Traceback" not in err
    written = parse_rows(out.read_bytes())
    assert out.read_bytes().endswith(b"\n") and written.bad_lines == 0
    assert len(written.rows) == 4
    assert not (out.parent / (out.name + ".lock")).exists()
    proc = start_cli(args, tmp_path, jax_cache)
    err = finish(proc, 120)
    assert proc.returncode == 0, err[-2000:]
    assert f"{len(images) - len(written.rows)} done, 0 failed, 0 skipped, {len(written.rows)} already" in err
    rows = rows_by_path(out)
    assert sorted(rows) == sorted(str(p) for p in images)
    assert all(r["status"] == "ok" and r["new_tokens"] > 0 for r in rows.values())


def test_audio_files_are_captioned_by_a_family_with_audio(tmp_path, qwen_pipeline):
    import soundfile

    folder = tmp_path / "media"
    folder.mkdir()
    t = np.arange(24000) / 16000
    soundfile.write(folder / "tone.wav", (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 16000)
    PIL.Image.fromarray(np.random.default_rng(7).integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(folder / "a.png")
    out = tmp_path / "captions.jsonl"
    run_captions(qwen_pipeline, discover(str(folder)), out, OPTIONS, log=None)
    rows = {pathlib.Path(r["path"]).name: r for r in read_rows(out)}
    assert set(rows) == {"tone.wav", "a.png"}
    for name, row in rows.items():
        assert row["status"] == "ok", row
        item = CaptionItem(str(folder / name), "audio" if name.endswith(".wav") else "image")
        expected = qwen_pipeline.generate(messages_for(item, row["prompt"]), max_new_tokens=MAX_NEW)
        assert row["caption"] == expected.text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multidevice
def test_distributed_run_shares_one_mesh_and_process_0_writes(mixed_folder, tmp_path, tiny_gemma3_dir,
                                                            gemma3_pipeline, jax_cache):
    """Two JAX processes (2 CPU devices each) run `omnijax caption --distributed`: the model runs on one mesh
    spanning both, process 0 writes the output, and its rows are what one process writes."""
    folder, good, bad, audio = mixed_folder
    out = tmp_path / "captions.jsonl"
    port = str(_free_port())
    env = {"XLA_FLAGS": with_devices(2), "JAX_PLATFORMS": "cpu"}
    args = ["--model", str(tiny_gemma3_dir), "--input", str(folder), "--out", str(out), "--batch-size", "2",
            "--max-new-tokens", str(MAX_NEW), "--no-progress", "--distributed", "--coordinator", f"127.0.0.1:{port}",
            "--num-processes", "2"]
    procs = [start_cli([*args, "--process-id", str(i)], tmp_path, jax_cache, env_extra=env) for i in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "[omnijax]" in outs[0][1] and "[omnijax]" not in outs[1][1]  # only process 0 reports
    rows = rows_by_path(out)
    assert set(rows) == {str(p) for p in good + bad + [audio]}
    assert not any(tmp_path.glob("captions.part-*"))
    for path in good:
        want = expected_caption(gemma3_pipeline, path)
        assert (rows[str(path)]["caption"], rows[str(path)]["new_tokens"]) == (want.text, len(want.token_ids))
