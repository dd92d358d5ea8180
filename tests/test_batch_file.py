"""``omnijax batch``: OpenAI batch input lines answered as the server answers them, error lines kept beside, and a
run killed with SIGKILL mid-run then resumed with every custom_id answered or refused exactly once.

The answers come from the session's tiny Gemma 3 pipeline (greedy, so they equal ``Pipeline.generate`` and the
server's); the killed run is ``omnijax batch`` in a child process that holds still after a number of rows, so the
kill always lands mid-run with requests in flight; every wait is for a state (rows in the files), under a deadline
far above the real time.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import PIL.Image
import pytest

from omnijax.demo.batch_file import BatchOptions, batch_paths, default_errors_path, run_batch
from omnijax.demo.batch_rows import (BatchFileError, BatchLineError, Finished, parse_line, read_lines, read_rows)
from fixtures.child_path import child_python_path

MAX_NEW = 4
OPTIONS = BatchOptions(workers=2, progress=False)
DEADLINE_S = 300


def write_png(path: pathlib.Path, seed: int, size=(20, 14)) -> pathlib.Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    PIL.Image.fromarray(pixels).save(path)
    return path


def data_url(path: pathlib.Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def chat_line(custom_id: str, text: str, image: str | None = None, **body) -> dict:
    content = ([{"type": "image_url", "image_url": {"url": image}}] if image else []) + [{"type": "text", "text": text}]
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": content}], "max_tokens": MAX_NEW, "temperature": 0,
                     **body}}


def completion_line(custom_id: str, prompt: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": prompt, "max_tokens": MAX_NEW, "temperature": 0, **body}}


def write_lines(path: pathlib.Path, lines: list) -> pathlib.Path:
    with open(path, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def rows(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def messages_of(line: dict, root: pathlib.Path, inline: dict | None = None) -> list[dict]:
    """The chat of a chat line as Pipeline.generate takes it: a local image path named from ``root``, a data: URL
    as the file ``inline`` maps it to, a file: URL as its path."""
    content = []
    for part in line["body"]["messages"][0]["content"]:
        if part["type"] == "text":
            content.append(part)
        else:
            url = part["image_url"]["url"]
            path = (inline or {}).get(url) or (url[len("file://"):] if url.startswith("file://") else root / url)
            content.append({"type": "image", "image": str(path)})
    return [{"role": "user", "content": content}]


def close_logprobs(mine: dict | None, theirs: dict | None) -> None:
    """Completions log probabilities alike: the same tokens and offsets, values within 1e-4."""
    assert (mine is None) == (theirs is None)
    if mine is None:
        return
    assert mine["tokens"] == theirs["tokens"] and mine["text_offset"] == theirs["text_offset"]
    np.testing.assert_allclose(mine["token_logprobs"], theirs["token_logprobs"], atol=1e-4)
    for top_mine, top_theirs in zip(mine["top_logprobs"], theirs["top_logprobs"], strict=True):
        assert top_mine.keys() == top_theirs.keys()
        np.testing.assert_allclose([top_mine[k] for k in top_mine], [top_theirs[k] for k in top_mine], atol=1e-4)


# ---- lines and files, without a model ----------------------------------------------------------------------------

def test_lines_are_read_lazily_and_refused_with_their_reason(tmp_path):
    data = b'{"a": 1}\n\n' + b"x" * 100 + b"\n" + b'{"b": 2}'
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    with open(path, "rb") as f:
        assert list(read_lines(f, 50)) == [(1, b'{"a": 1}'), (3, None), (4, b'{"b": 2}')]
    good = json.dumps(chat_line("x", "hi")).encode()
    assert parse_line(1, good, 1000).custom_id == "x"
    cases = {b"{not json": ("invalid_json", None), b"[1]": ("invalid_line", None),
             b'{"method": "POST"}': ("missing_custom_id", None),
             b'{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}': ("invalid_method", "a"),
             b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}': ("invalid_url", "a"),
             b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": "x"}': ("invalid_body", "a")}
    for raw, (code, custom_id) in cases.items():
        with pytest.raises(BatchLineError) as e:
            parse_line(7, raw, 1000)
        assert (e.value.code, e.value.custom_id) == (code, custom_id) and "line 7" in str(e.value)
    with pytest.raises(BatchLineError, match="longer than"):
        parse_line(3, None, 2**20)


def test_files_are_checked_before_anything_loads(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", [completion_line("a", "x")])
    out = tmp_path / "out.jsonl"
    assert batch_paths(inp, out).errors == default_errors_path(out) == tmp_path / "out.errors.jsonl"
    for args, message in [((inp, inp), "is the input file"), ((inp, out, inp), "is the input file"),
                          ((inp, out, out), "are the same file"), ((tmp_path / "none.jsonl", out), "does not exist"),
                          ((tmp_path, out), "not a regular file")]:
        with pytest.raises(BatchFileError, match=message):
            batch_paths(*args)
    foreign = write_lines(tmp_path / "foreign.jsonl", [completion_line("a", "x")])  # an input, not an output
    with pytest.raises(BatchFileError, match="not a batch file written by omnijax"):
        run_batch(lambda: pytest.fail("the model was loaded"), inp, foreign, OPTIONS, log=None)
    assert foreign.read_text().count("\n") == 1  # left as it was
    torn = tmp_path / "torn.jsonl"
    whole = json.dumps({"id": "batch_req_1", "custom_id": "a", "response": {"status_code": 200}, "error": None})
    torn.write_text(whole + "\n" + '{"id": "batch_req_2", "custom_id": "b", "resp')
    finished = Finished()
    assert read_rows(torn, finished, "the output file") == len(whole) + 1
    assert finished.ids == {"a"}


# ---- answers and error lines -------------------------------------------------------------------------------------

def test_both_urls_images_and_error_lines(tmp_path, gemma3_pipeline):
    pipe = gemma3_pipeline
    media = tmp_path / "media"
    media.mkdir()
    write_png(media / "a.png", 1)
    inline = write_png(tmp_path / "inline.png", 2)
    (media / "corrupt.png").write_bytes(b"not a PNG")
    outside = write_png(tmp_path / "outside.png", 3)
    (media / "link.png").symlink_to(outside)
    good = [chat_line("chat-text", "Say hello."),
            chat_line("chat-path", "Describe this image.", "a.png"),
            chat_line("chat-data", "Describe this image.", data_url(inline)),
            chat_line("chat-file-url", "Describe this image.", f"file://{media / 'a.png'}"),
            completion_line("completion", "The capital of France is"),
            completion_line("completion-list", ["Once upon a time"]),
            completion_line("completion-n2", "Hello there", n=2)]
    context = pipe.scheduler.context
    bad = {"bad-temperature": chat_line("bad-temperature", "x", temperature="hot"),
           "outside": chat_line("outside", "x", str(outside)),
           "dotdot": chat_line("dotdot", "x", "../outside.png"),
           "link-out": chat_line("link-out", "x", "link.png"),
           "corrupt": chat_line("corrupt", "x", "corrupt.png"),
           "missing-file": chat_line("missing-file", "x", "nothere.png"),
           "too-long": completion_line("too-long", "hello", max_tokens=context),
           "stream": chat_line("stream", "x", stream=True),
           "other-model": completion_line("other-model", "x", model="gpt-4o"),
           "embeddings": {"custom_id": "embeddings", "method": "POST", "url": "/v1/embeddings", "body": {}}}
    lines = good[:3] + ["{not json"] + good[3:] + list(bad.values()) + \
        [completion_line("chat-text", "a repeated custom_id"), {"method": "POST", "url": "/v1/completions"}]
    inp = write_lines(tmp_path / "requests.jsonl", lines)
    out = tmp_path / "results.jsonl"
    summary = run_batch(pipe, inp, out, BatchOptions(workers=2, progress=False, media_root=media), log=None)
    assert (summary.done, summary.failed, summary.already, summary.interrupted) == (len(good), len(bad) + 3, 0,
                                                                                    False)
    answers = {row["custom_id"]: row for row in rows(out)}
    assert sorted(answers) == sorted(line["custom_id"] for line in good)
    for line in good:
        row = answers[line["custom_id"]]
        assert row["id"].startswith("batch_req_") and row["error"] is None
        assert row["response"]["status_code"] == 200
        body = row["response"]["body"]
        if line["url"] == "/v1/completions":
            prompt = line["body"]["prompt"]
            expected = pipe.generate(prompt if isinstance(prompt, str) else prompt[0], max_new_tokens=MAX_NEW)
            assert body["object"] == "text_completion" and body["choices"][0]["text"] == expected.text
        else:
            expected = pipe.generate(messages_of(line, media, {data_url(inline): inline}), max_new_tokens=MAX_NEW)
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["content"] == expected.text
        n = line["body"].get("n", 1)
        assert len(body["choices"]) == n and body["model"] == pipe.name
        assert body["usage"]["completion_tokens"] == n * len(expected.token_ids)
    assert answers["chat-path"]["response"]["body"]["choices"][0]["message"]["content"] == \
        answers["chat-file-url"]["response"]["body"]["choices"][0]["message"]["content"]
    errors = rows(default_errors_path(out))
    by_id = {row["custom_id"]: row for row in errors if row["custom_id"] is not None}
    assert sorted(by_id) == sorted(bad)
    assert all(row["response"] is None and row["error"]["message"] for row in errors)
    codes = {custom_id: row["error"]["code"] for custom_id, row in by_id.items()}
    assert codes["embeddings"] == "invalid_url"
    assert codes["outside"] == codes["dotdot"] == codes["link-out"] == "media_outside_root"
    assert codes["corrupt"] == codes["missing-file"] == "MediaError"
    assert codes["too-long"] == "PromptError" and "context" in by_id["too-long"]["error"]["message"]
    assert codes["other-model"] == "model_not_found" and codes["bad-temperature"] == "invalid_request_error"
    assert "stream" in by_id["stream"]["error"]["message"]
    nameless = {row["error"]["line"]: row["error"]["code"] for row in errors if row["custom_id"] is None}
    assert nameless == {4: "invalid_json", len(lines) - 1: "duplicate_custom_id", len(lines): "missing_custom_id"}
    progress = json.loads((tmp_path / "results.jsonl.progress.json").read_text())
    assert (progress["state"], progress["answered"], progress["error_lines"]) == ("finished", len(good), len(bad) + 3)
    assert not (tmp_path / ".results.jsonl.media").exists() and not (tmp_path / "results.jsonl.lock").exists()

    again = run_batch(lambda: pytest.fail("the model was loaded with nothing left"), inp, out, OPTIONS, log=None)
    assert (again.already, again.written) == (len(lines), 0)

    # The body of an output row is the JSON ``omnijax serve`` answers to the same request (ids and times aside).
    from starlette.testclient import TestClient

    from omnijax.demo.host_check import allowed_names
    from omnijax.demo.server import build_app, serving

    with serving(pipe) as server:
        client = TestClient(build_app(server, names=allowed_names("127.0.0.1")), base_url="http://127.0.0.1")
        for line in (good[2], good[4], good[6]):  # an image as a data: URL, a completion, n = 2
            served = client.post(line["url"], json=line["body"])
            assert served.status_code == 200
            served, answer = served.json(), answers[line["custom_id"]]["response"]["body"]
            for body in (served, answer):  # ids, times and prefix-cache hits differ
                assert body.pop("id") and body.pop("created") and body["usage"].pop("prompt_tokens_details")
            for mine, theirs in zip(answer["choices"], served["choices"]):  # float sums differ in the last bits
                close_logprobs(mine.pop("logprobs"), theirs.pop("logprobs"))
            assert answer == served


# ---- killed and resumed ------------------------------------------------------------------------------------------

# ``omnijax batch`` that holds still at its (N+1)-th row (N: the first argument): the first N rows are written, then
# the run waits as a row is waited for (common/interruptible.py), with requests in flight, until a signal ends it.
PAUSED_BATCH = """
import sys, threading
import omnijax.demo.batch_file as batch_file
from omnijax.common.interruptible import wait_event
from omnijax.demo.cli import main
pause_at = int(sys.argv[1]) + 1
write = batch_file._Run._write
calls = []
def paused_write(self, row, *, ok):
    calls.append(1)
    if len(calls) == pause_at:
        wait_event(threading.Event())
    return write(self, row, ok=ok)
batch_file._Run._write = paused_write
sys.exit(main(["batch", *sys.argv[2:]]))
"""


def count_rows(*paths) -> int:
    return sum(path.read_bytes().count(b"\n") for path in paths if path.exists())


def many_lines(n: int) -> tuple[list, set, dict]:
    """``n`` lines: chat and completions requests, and every tenth line one that cannot be answered. Returns
    (lines, the custom_ids answered, {line number: code} of the lines refused without one)."""
    lines, answered, nameless = [], set(), {}
    for i in range(n):
        number = i + 1
        if i % 10 == 9:
            kind = (i // 10) % 4
            if kind == 0:
                lines.append("{torn json")
                nameless[number] = "invalid_json"
            elif kind == 1:
                lines.append(completion_line(f"r{i - 1:03d}", "repeated"))
                nameless[number] = "duplicate_custom_id"
            elif kind == 2:
                lines.append(chat_line(f"r{i:03d}", "x", "../escape.png"))
            else:
                lines.append({"custom_id": f"r{i:03d}", "method": "POST", "url": "/v1/images", "body": {}})
            continue
        if i % 3 == 0:
            lines.append(completion_line(f"r{i:03d}", f"Line {i} says"))
        else:
            lines.append(chat_line(f"r{i:03d}", f"Count to {i}."))
        answered.add(f"r{i:03d}")
    return lines, answered, nameless


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_answers_every_custom_id_once(tmp_path, tiny_gemma3_dir, gemma3_pipeline):
    lines, answered, nameless = many_lines(200)
    inp = write_lines(tmp_path / "requests.jsonl", lines)
    out = tmp_path / "results.jsonl"
    errors = default_errors_path(out)
    stop_at = 30
    stderr = tmp_path / "stderr.txt"
    # The child compiles into a cache folder of its own (it may be killed while writing an entry), with two slots:
    # fewer programs to compile than the eight this process's pipeline answers the rest with.
    env = dict(os.environ, PYTHONPATH=child_python_path(), OMNIJAX_HOME=str(tmp_path / "home"), PYTHONFAULTHANDLER="1",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-cache"))
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", PAUSED_BATCH, str(stop_at), str(inp), str(out), "--model",
                                 str(tiny_gemma3_dir), "--max-batch", "2", "--workers", "2", "--no-progress"],
                                env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while count_rows(out, errors) < stop_at:  # a state, not a time: the rows are there
            assert proc.poll() is None, f"the run ended before {stop_at} rows: {stderr.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no rows written in time"
            time.sleep(0.05)
        progress = json.loads((tmp_path / "results.jsonl.progress.json").read_text())
        assert progress["state"] == "running" and progress["lines"] == len(lines)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = {path: path.read_bytes() for path in (out, errors)}
    assert sum(data.count(b"\n") for data in before.values()) == stop_at
    killed = rows(out)
    assert killed, "no answer was written before the kill"
    with open(out, "ab") as f:  # what a kill in the middle of a write leaves behind
        f.write(b'{"id": "batch_req_0", "custom_id": "r199", "response": {"status_code": 2')

    summary = run_batch(gemma3_pipeline, inp, out, OPTIONS, log=None)
    assert not summary.interrupted
    assert summary.already == stop_at and summary.written == len(lines) - stop_at
    for path, data in before.items():
        assert path.read_bytes().startswith(data)  # nothing written before the kill was lost or changed
    ok, refused = rows(out), rows(errors)
    ids = [row["custom_id"] for row in ok + refused if row["custom_id"] is not None]
    assert len(ids) == len(set(ids)), "a custom_id has more than one row"
    assert {row["custom_id"] for row in ok} == answered
    assert all(row["error"] is None and row["response"]["body"]["usage"]["completion_tokens"] > 0 for row in ok)
    named = {f"r{i:03d}" for i in range(len(lines))} - answered - {f"r{number - 1:03d}" for number in nameless}
    assert {row["custom_id"] for row in refused if row["custom_id"] is not None} == named
    nameless_rows = [(row["error"]["line"], row["error"]["code"]) for row in refused if row["custom_id"] is None]
    assert sorted(nameless_rows) == sorted(nameless.items())  # each once: kept across the kill, not repeated
    line_of = {}
    for line in lines:
        if isinstance(line, dict):
            line_of.setdefault(line["custom_id"], line)
    for row in killed[:2] + ok[-2:]:  # the killed process and this one answer as Pipeline.generate does
        line, choice = line_of[row["custom_id"]], row["response"]["body"]["choices"][0]
        if line["url"] == "/v1/completions":
            assert choice["text"] == gemma3_pipeline.generate(line["body"]["prompt"], max_new_tokens=MAX_NEW).text
        else:
            expected = gemma3_pipeline.generate(messages_of(line, tmp_path), max_new_tokens=MAX_NEW).text
            assert choice["message"]["content"] == expected


def test_ctrl_c_stops_the_run_cleanly_and_a_rerun_finishes_it(tmp_path, gemma3_pipeline, monkeypatch):
    """Ctrl-C (SIGINT, here sent by the run to itself once it has written its fifth row) ends the run at once: the
    rows written are whole and kept, the requests in flight are cancelled, and a rerun answers the rest once."""
    import omnijax.demo.batch_file as batch_file

    lines, answered, nameless = many_lines(40)
    inp = write_lines(tmp_path / "requests.jsonl", lines)
    out = tmp_path / "results.jsonl"
    write, written = batch_file._Run._write, []

    def write_then_interrupt(self, row, *, ok):
        write(self, row, ok=ok)
        written.append(row)
        if len(written) == 5:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(batch_file._Run, "_write", write_then_interrupt)
    summary = run_batch(gemma3_pipeline, inp, out, OPTIONS, log=None)
    assert summary.interrupted and summary.written == len(written) == 5
    assert json.loads((tmp_path / "results.jsonl.progress.json").read_text())["state"] == "interrupted"
    assert not (tmp_path / "results.jsonl.lock").exists() and not (tmp_path / ".results.jsonl.media").exists()
    monkeypatch.setattr(batch_file._Run, "_write", write)
    again = run_batch(gemma3_pipeline, inp, out, OPTIONS, log=None)
    assert not again.interrupted and (again.already, again.written) == (5, len(lines) - 5)
    ok, refused = rows(out), rows(default_errors_path(out))
    assert sorted(row["custom_id"] for row in ok) == sorted(answered)
    assert sorted(row["error"]["line"] for row in refused if row["custom_id"] is None) == sorted(nameless)
    assert len(ok) + len(refused) == len(lines)  # one row per line
