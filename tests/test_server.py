"""``omnijax serve`` on the tiny Gemma 3 checkpoint, driven with the official ``openai`` client: answers equal
``Pipeline.generate``, streams join to the same text, concurrent requests keep their own answers, bad requests get
their 4xx JSON while the server keeps serving, a dropped stream frees its slot, different images never share keys
and values, a repeated prefix is a cache hit, and SIGTERM stops it with its uploads removed.

One server process serves the whole module (two slots, a queue of two); every wait is for a state (the health
check answering, /metrics counters), under a deadline far above the real time.
"""

from __future__ import annotations

import base64
import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from test_gemma3_parity import LONG_TEXT, image
from fixtures.child_path import child_python_path

DEADLINE_S = 900
MAX_BODY_MB = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data_url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def start_server(model_dir, tmp, flags: list[str], stdout=subprocess.DEVNULL) -> tuple[str, subprocess.Popen]:
    """``omnijax serve`` on ``model_dir`` (served as "tiny", with ``flags``, temporary files under ``tmp``) on a
    free loopback port -> (base URL, process), once its /health answers (a state, not a time)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=child_python_path(), TMPDIR=str(tmp), JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-m", "omnijax", "serve", "--model", str(model_dir), "--port", str(port),
                             "--served-model-name", "tiny", *flags],
                            env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + DEADLINE_S
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the server did not start"
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return url, proc
        except httpx.TransportError:
            time.sleep(0.2)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_gemma3_dir):
    """(base URL, process, its temporary folder) of ``omnijax serve`` on the tiny checkpoint."""
    tmp = tmp_path_factory.mktemp("serve_tmp")
    url, proc = start_server(tiny_gemma3_dir, tmp, ["--max-batch", "2", "--max-queue", "2", "--max-context", "4096",
                                                    "--max-body-mb", str(MAX_BODY_MB)], stdout=subprocess.PIPE)
    yield url, proc, tmp
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", timeout=DEADLINE_S, max_retries=0)


def metric(url: str, name: str, **labels) -> float:
    text = httpx.get(url + "/metrics", timeout=60).text
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"no metric {name} {labels} in /metrics")


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def user(*parts) -> list[dict]:
    content = [{"type": "image_url", "image_url": {"url": data_url(p)}} if isinstance(p, Image.Image)
               else {"type": "text", "text": p} for p in parts]
    return [{"role": "user", "content": content}]


def ours(*parts) -> list[dict]:
    content = [{"type": "image", "image": p} if isinstance(p, Image.Image) else {"type": "text", "text": p}
               for p in parts]
    return [{"role": "user", "content": content}]


def test_health_and_models(server, client):
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_with_an_image_equals_the_pipeline(client, gemma3_pipeline):
    img = image(21)
    reply = client.chat.completions.create(model="tiny", messages=user(img, "Describe this image."), max_tokens=12,
                                           temperature=0)
    expected = gemma3_pipeline.generate(ours(img, "Describe this image."), max_new_tokens=12)
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == ("length" if expected.finish_reason == "length" else "stop")
    assert reply.usage.prompt_tokens == expected.prompt_tokens
    assert reply.usage.completion_tokens == len(expected.token_ids)


def test_streamed_deltas_join_to_the_answer(client):
    messages = user("Write a short poem about the sea.")
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_completions_continue_a_raw_prompt(client, gemma3_pipeline):
    reply = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert reply.choices[0].text == gemma3_pipeline.generate("The capital of France is", max_new_tokens=8).text


def test_concurrent_requests_each_get_their_own_answer(client, gemma3_pipeline):
    questions = ["Tell me about the wind.", "Count to five.", "What is a fox?", LONG_TEXT]
    answers: dict[int, str] = {}

    def ask(i):
        answers[i] = client.chat.completions.create(model="tiny", messages=user(questions[i]), max_tokens=10,
                                                    temperature=0).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    expected = gemma3_pipeline.generate([ours(q) for q in questions], max_new_tokens=10)
    assert [answers[i] for i in range(len(questions))] == [e.text for e in expected]


BAD = {
    "invalid JSON": (dict(content=b"{not json"), 400, None),
    "unknown model": (dict(json={"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}), 404,
                      "model_not_found"),
    "body too large": (dict(json={"model": "tiny", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}),
                       413, "body_too_large"),
    "temperature out of range": (dict(json={"messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
                                 400, None),
    "temperature beyond float": (dict(content=b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1'
                                              + b"0" * 400 + b"}", headers={"content-type": "application/json"}),
                                 400, None),
    "max_tokens 0": (dict(json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}), 400, None),
    "prompt over the context": (dict(json={"messages": [{"role": "user", "content": "many words " * 2500}]}),
                                400, None),
    "unknown role": (dict(json={"messages": [{"role": "robot", "content": "hi"}]}), 400, None),
    "unreadable image": (dict(json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"nope").decode()}},
        {"type": "text", "text": "What is it?"}]}]}), 400, None),
    "file URL": (dict(json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}), 400, None),
    "remote URL": (dict(json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/cat.png"}}]}]}), 400, None),
    "too many choices": (dict(json={"messages": [{"role": "user", "content": "hi"}], "n": 9}), 400, None),
    "tools": (dict(json={"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}), 400,
              None),
    "messages missing": (dict(json={"model": "tiny"}), 400, None),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_requests_get_their_4xx_and_the_server_keeps_serving(server, client, case):
    kwargs, status, code = BAD[case]
    r = httpx.post(server[0] + "/v1/chat/completions", timeout=DEADLINE_S, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code
    assert client.chat.completions.create(model="tiny", messages=user("hi"), max_tokens=2).choices


def test_unknown_path_is_a_json_404(server):
    r = httpx.get(server[0] + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"]


def long_stream(url: str, messages: list[dict]):
    """A streamed request of 4,000 tokens: it runs far longer than the test needs before its stream is closed."""
    return httpx.stream("POST", url + "/v1/chat/completions", timeout=DEADLINE_S,
                        json={"model": "tiny", "messages": messages, "max_tokens": 4000, "ignore_eos": True,
                              "temperature": 0, "stream": True})


def test_a_dropped_stream_frees_its_slot(server):
    url = server[0]
    cancelled = metric(url, "omnijax_requests_finished_total", finish_reason="cancelled")
    with long_stream(url, user("Tell me a long story.")) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        wait_for(lambda: metric(url, "omnijax_requests_running") == 1, "the request to run")
    wait_for(lambda: metric(url, "omnijax_requests_finished_total", finish_reason="cancelled") == cancelled + 1,
             "the dropped request to be cancelled")
    wait_for(lambda: metric(url, "omnijax_requests_running") == 0, "its slot to be free")


def test_a_full_queue_is_a_503(server, client):
    """Two slots busy and two requests waiting (the queue's bound): one more is refused with 503."""
    url = server[0]
    streams = [long_stream(url, user(f"Story number {i}.")) for i in range(4)]
    responses = []
    try:
        for s in streams[:2]:
            responses.append(s.__enter__())
        wait_for(lambda: metric(url, "omnijax_requests_running") == 2, "two running requests")
        for s in streams[2:]:  # queued: their responses have started (a role chunk comes before any token)
            responses.append(s.__enter__())
            assert responses[-1].status_code == 200
        wait_for(lambda: metric(url, "omnijax_requests_waiting") == 2, "two waiting requests")
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="tiny", messages=user("One more."), max_tokens=2)
        assert refused.value.status_code == 503 and refused.value.body["code"] == "queue_full"
    finally:
        for s in streams:
            s.__exit__(None, None, None)
    wait_for(lambda: metric(url, "omnijax_requests_running") == 0 and metric(url, "omnijax_requests_waiting") == 0,
             "every request to end")
    assert client.chat.completions.create(model="tiny", messages=user("hi"), max_tokens=2).choices


def test_different_images_never_share_keys_and_values(client, gemma3_pipeline):
    """Two images behind the same text (the same token ids): the second request reuses nothing past the text
    before its image, and each answer is its own image's."""
    text = "What is in this picture?"
    first, second = image(31), image(32)
    replies = [client.chat.completions.create(model="tiny", messages=user(LONG_TEXT, img, text), max_tokens=8,
                                              temperature=0) for img in (first, second)]
    ids = gemma3_pipeline.prepare(ours(LONG_TEXT, second, text)).token_ids
    image_start = int(np.argmax(ids == gemma3_pipeline.config.media_token_id("image")))
    assert replies[1].usage.prompt_tokens_details.cached_tokens <= image_start
    expected = [gemma3_pipeline.generate(ours(LONG_TEXT, img, text), max_new_tokens=8).text for img in (first, second)]
    assert [r.choices[0].message.content for r in replies] == expected


def test_a_repeated_prefix_is_a_cache_hit(server, client, gemma3_pipeline):
    url = server[0]
    img = image(41)
    hits = metric(url, "omnijax_prefix_cache_hits_total")
    answers = [client.chat.completions.create(model="tiny", messages=user(LONG_TEXT, img, q), max_tokens=6,
                                              temperature=0) for q in ("What colour is it?", "How big is it?")]
    assert metric(url, "omnijax_prefix_cache_hits_total") == hits + 1
    assert answers[1].usage.prompt_tokens_details.cached_tokens > 0
    expected = gemma3_pipeline.generate(ours(LONG_TEXT, img, "How big is it?"), max_new_tokens=6)
    assert answers[1].choices[0].message.content == expected.text
    assert metric(url, "omnijax_media_cache_hits_total") >= 1


def test_sigterm_stops_the_server_and_removes_its_uploads(server):
    """Last in this module: SIGTERM ends the server cleanly, leaving no upload folder behind."""
    url, proc, tmp = server
    assert any(tmp.iterdir())  # the server's upload folder
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "server stopped" in err
    assert not any(tmp.iterdir())
