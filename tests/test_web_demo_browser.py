"""The web demo's page in headless Chromium.

These tests start the demo on a free 127.0.0.1 port (the tiny Gemma 3 checkpoint, the embedded default model, or
the tiny full Qwen3-Omni checkpoint that answers aloud)
and drive Debian's ``chromium`` through Playwright (scripts/test.sh installs both); every request the page makes
to anything but the loopback address is blocked and reported.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import tempfile
import time

import pytest

from omnijax.demo.chat_state import ERROR_TITLE
from fixtures.web_demo_parts import MAX_NEW, STATS_RE, _free_port, _text, _user

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class RecordingPipe:
    """The pipeline as the demo sees it, recording each stream: pieces given out and whether it was closed."""

    def __init__(self, pipe):
        self.pipe, self.name, self.family, self.config = pipe, pipe.name, pipe.family, pipe.config
        self.streams: list[dict] = []

    def stream(self, messages, **options):
        record = {"pieces": 0, "closed": False, "finished": False, "options": options}
        self.streams.append(record)
        try:
            result = yield from self._counted(self.pipe.stream(messages, **options), record)
        except GeneratorExit:
            record["closed"] = True
            raise
        record["finished"] = True
        return result

    @staticmethod
    def _counted(pieces, record):
        result = None
        try:
            while True:
                piece = next(pieces)
                record["pieces"] += 1
                yield piece
        except StopIteration as stop:
            result = stop.value
        finally:
            pieces.close()
        return result


@pytest.fixture(scope="module")
def served(gemma3_pipeline):
    """(url, RecordingPipe): the demo for the tiny pipeline on a free 127.0.0.1 port, uploads capped at 1 MB."""
    from omnijax.demo.web import build_demo, launch

    pipe = RecordingPipe(gemma3_pipeline)
    demo = build_demo(pipe, max_upload_mb=1)
    port = _free_port()
    launch(demo, host="127.0.0.1", port=port, max_upload_mb=1, block=False, quiet=True)
    yield f"http://127.0.0.1:{port}/", pipe
    demo.close()


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium context with a fresh profile; requests to anything but 127.0.0.1 are blocked."""
    from playwright import sync_api  # a test dependency (pyproject's "test" extra)

    assert os.path.exists(CHROMIUM), "the browser tests need Debian's chromium (scripts/test.sh installs it)"
    profile = tempfile.mkdtemp(prefix="omnijax-chromium-")
    blocked: list[str] = []

    def guard(route):
        if re.match(r"^(http://127\.0\.0\.1[:/]|data:|blob:)", route.request.url):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000})
        context.route("**/*", guard)
        context.set_default_timeout(60_000)
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)
    assert not blocked, f"the page tried to reach non-loopback addresses: {blocked}"


def _open(browser, url: str, max_new: int = MAX_NEW):
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector("#chat-input textarea")
    box = page.get_by_label("number input for Max new tokens")
    box.fill(str(max_new))
    box.press("Enter")
    return page


def _choose(page, elem_id: str, option: str) -> None:
    """Pick ``option`` of the dropdown ``elem_id`` by clicking it in the opened list (typed text and Enter can come
    before the list has filtered, and then select nothing), and wait until the dropdown shows it as chosen."""
    page.locator(f"#{elem_id} input").click()
    page.locator("[data-testid=dropdown-option]", has_text=option).click()
    page.wait_for_function(f"document.querySelector('#{elem_id} input').value === {option!r}")


def _send(page, text: str, files=()):
    if files:
        page.set_input_files("#chat-input input[type=file]", list(files))
        page.wait_for_function(  # the upload has finished when its thumbnail is in the box
            f"document.querySelectorAll('#chat-input .thumbnail-item, #chat-input img').length >= {len(files)}")
    page.fill("#chat-input textarea", text)
    page.click("#chat-input [data-testid=submit-button]")


def _bot_messages(page) -> list[str]:
    """The raw text of each assistant message (its aria-label holds the text before markdown rendering)."""
    return [e.get_attribute("aria-label").removeprefix("bot's message: ")
            for e in page.query_selector_all("#chatbot [data-testid=bot]")]


def _wait_for_answer(page, n: int) -> tuple[str, str]:
    """Wait for the n-th assistant message and its stats line; returns (answer text, stats line)."""
    page.wait_for_function(f"document.querySelectorAll('#chatbot [data-testid=bot]').length >= {n}")
    page.wait_for_function("/tokens\\/s/.test(document.querySelector('#answer-stats').innerText)")
    return _bot_messages(page)[n - 1], page.inner_text("#answer-stats").strip()


def _check_stats(stats: str, expected) -> None:
    match = STATS_RE.search(stats)
    assert match, f"no stats line: {stats!r}"
    assert int(match[1]) == expected.prompt_tokens
    assert int(match[2]) == len(expected.token_ids)


def test_browser_two_tabs_image_chat(served, browser, gemma3_pipeline, image_file):
    url, _ = served
    image_turn = _user({"type": "image", "image": image_file}, _text("Describe this image."))
    first = gemma3_pipeline.generate([image_turn], max_new_tokens=MAX_NEW)
    follow_up = gemma3_pipeline.generate(
        [image_turn, {"role": "assistant", "content": [_text(first.text)]}, _user(_text("What colours?"))],
        max_new_tokens=MAX_NEW)
    hello = gemma3_pipeline.generate([_user(_text("Hello there"))], max_new_tokens=MAX_NEW)

    page_a, page_b = _open(browser, url), _open(browser, url)
    assert "gemma3" in page_a.inner_text("#model-info")
    assert pathlib.Path(gemma3_pipeline.name).name in page_a.inner_text("#model-info")
    _send(page_a, "Describe this image.", [image_file])
    _send(page_b, "Hello there")  # a second tab at the same time: queued, answered in turn
    answer_a, stats_a = _wait_for_answer(page_a, 1)
    answer_b, stats_b = _wait_for_answer(page_b, 1)
    assert answer_a == first.text and answer_b == hello.text
    _check_stats(stats_a, first)
    _check_stats(stats_b, hello)
    assert page_a.locator("#chatbot img").count() >= 1  # the uploaded image is shown in the chat

    _send(page_a, "What colours?")  # the second turn sees the first turn, image included
    answer, stats = _wait_for_answer(page_a, 2)
    assert answer == follow_up.text
    _check_stats(stats, follow_up)
    page_a.close()
    page_b.close()


def test_browser_bad_image_then_valid_request(served, browser, gemma3_pipeline, broken_image):
    url, _ = served
    hello = gemma3_pipeline.generate([_user(_text("Hello there"))], max_new_tokens=MAX_NEW)
    page = _open(browser, url)
    _send(page, "What is this?", [broken_image])
    page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=bot]').length >= 1")
    report = _bot_messages(page)[0]
    assert "broken.png" in report and "image" in report and "/tmp" not in report
    assert ERROR_TITLE in page.inner_text("#chatbot")
    _send(page, "Hello there")  # the server still answers, and the failed turn is not in the model's history
    answer, stats = _wait_for_answer(page, 2)
    assert answer == hello.text
    _check_stats(stats, hello)

    page.locator("#chatbot").get_by_role("button", name="Clear").click()  # a new conversation
    page.wait_for_function("document.querySelectorAll('#chatbot [data-testid=bot]').length == 0")
    page.wait_for_function("document.querySelector('#answer-stats').innerText.trim() === ''")
    _send(page, "Hello there")
    answer, stats = _wait_for_answer(page, 1)
    assert answer == hello.text  # nothing of the cleared conversation reached the model
    _check_stats(stats, hello)
    page.close()


def test_browser_stop_button_stops_generation(served, browser):
    url, recording = served
    page = _open(browser, url, max_new=2000)
    before = len(recording.streams)
    _send(page, "Keep talking.")  # the tiny model streams a piece per token for this one
    deadline = time.monotonic() + 60
    while not (len(recording.streams) > before and recording.streams[-1]["pieces"] >= 2):
        assert time.monotonic() < deadline, f"no 2 streamed pieces within 60 s: {recording.streams[before:]}"
        page.wait_for_timeout(50)  # (not time.sleep: the route guard runs while Playwright waits)
    record = recording.streams[-1]
    assert record["options"]["max_new_tokens"] == 2000
    page.locator("#chat-input").get_by_role("button", name="Stop").click()
    deadline = time.monotonic() + 30
    while not record["closed"]:
        assert not record["finished"], "the generation ran to its end: Stop did not stop it"
        assert time.monotonic() < deadline, "Stop did not close the generation"
        page.wait_for_timeout(50)  # (not time.sleep: the route guard runs while Playwright waits)
    page.wait_for_selector("#chat-input [data-testid=submit-button]")  # the page can send again
    page.close()
    # The pipeline is free again: a new conversation is answered. (A new page: gradio's own handling of a message
    # sent right after Stop in the same page is not what this checks.)
    page = _open(browser, url)
    asked = len(recording.streams)
    _send(page, "Hello there")
    deadline = time.monotonic() + 60
    while not (len(recording.streams) > asked and recording.streams[-1]["finished"]):
        assert time.monotonic() < deadline, \
            f"the message after Stop was not answered within 60 s: {recording.streams[asked:]}"
        page.wait_for_timeout(50)
    answer, stats = _wait_for_answer(page, 1)
    assert answer and STATS_RE.search(stats)
    page.close()


def test_browser_default_model_demo_offers_examples(browser):
    """``omnijax demo`` without --model: the default model's example pictures and prompts are on the page; a click
    on the first one puts it in the message box, and sending it gets its right answer."""
    import json

    from omnijax.demo.web import EXAMPLES_DIR, serve, stop

    first = json.loads((EXAMPLES_DIR / "examples.json").read_text())["examples"][0]
    port = _free_port()
    args = argparse.Namespace(model=None, dtype="float32", model_axis=None, host="127.0.0.1", port=port,
                              max_upload_mb=20.0)
    demo = serve(args, block=False)
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#chat-input textarea")
        assert "pictures of simple shapes" in page.inner_text("#model-info")
        page.locator("#chat-input").get_by_text(first["prompt"]).wait_for(state="detached")  # the box is empty
        page.get_by_text(first["prompt"]).first.click()
        page.wait_for_function(  # the example's picture is in the message box
            "document.querySelectorAll('#chat-input .thumbnail-item, #chat-input img').length >= 1")
        page.click("#chat-input [data-testid=submit-button]")
        answer, stats = _wait_for_answer(page, 1)
        assert answer == first["answer"] and STATS_RE.search(stats)
        box = page.locator("#answer-stats").bounding_box()  # in view with the chat, above the examples table
        examples = page.locator("#examples").bounding_box()
        assert box["y"] + box["height"] <= 1000 and box["y"] < examples["y"], (box, examples)
        page.close()
    finally:
        stop(demo)


def test_browser_plays_the_spoken_answer_as_it_comes(browser, qwen_speech_pipeline):
    """A model with a talker: with "Speak the answer" on, the page's player queues every audio chunk as it arrives
    (all the answer's samples, in order), and the whole spoken answer is left under the chat."""
    import io
    import wave

    import httpx

    from omnijax.app.wav import pcm16_bytes
    from omnijax.demo.web import build_demo, launch

    frames = 40  # a first chunk of 8 frames, then 25, then 7
    expected = qwen_speech_pipeline.generate([_user(_text("Hello there"))], max_new_tokens=MAX_NEW, speak=True,
                                             voice="ethan", max_speech_frames=frames)
    demo = build_demo(qwen_speech_pipeline, max_speech_frames=frames)
    port = _free_port()
    launch(demo, host="127.0.0.1", port=port, block=False, quiet=True)
    try:
        page = _open(browser, f"http://127.0.0.1:{port}/")
        page.locator("#speak input[type=checkbox]").check()
        _choose(page, "voice", "ethan")
        _send(page, "Hello there")
        page.wait_for_function("Number(document.querySelector('[data-chunks]')?.dataset.chunks || 0) >= 3")
        samples = page.evaluate("Number(document.querySelector('[data-samples]').dataset.samples)")
        assert samples == len(expected.audio)
        answer, stats = _wait_for_answer(page, 1)
        assert answer == expected.text and "spoken" in stats
        link = page.locator("#spoken-answer a[download]")
        link.wait_for(state="attached")
        wav = httpx.get(link.get_attribute("href"), timeout=30).content  # the whole spoken answer, to replay
        with wave.open(io.BytesIO(wav)) as f:
            assert f.getframerate() == 24000 and f.readframes(f.getnframes()) == pcm16_bytes(expected.audio)
        page.close()
    finally:
        demo.close()
