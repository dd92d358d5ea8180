"""The web demo: pure chat-state functions, the chat function on the tiny pipeline, the page built for any family
and the server (the page in a browser: test_web_demo_browser.py)."""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import threading
import time
import types
import wave

import numpy as np
import pytest

from omnijax.common.errors import MediaError, PromptError
from omnijax.demo.chat_state import (
    ERROR_TITLE,
    AnswerStats,
    answer_message,
    build_messages,
    error_message,
    format_stats,
    history_to_messages,
    is_error_message,
    media_kind,
    model_header,
    sampling_options,
    user_content,
    validate_upload,
)

from fixtures.web_demo_parts import MAX_NEW, STATS_RE, _free_port, _text, _user


def _gr_file(path: str, mime: str = "image/png") -> dict:
    """A file part as gradio's Chatbot hands it to the chat function."""
    return {"type": "file", "file": {"path": path, "mime_type": mime, "orig_name": pathlib.Path(path).name,
                                      "meta": {"_type": "gradio.FileData"}}, "alt_text": None}


# ---- pure functions --------------------------------------------------------------------------------------------

def test_media_kind_by_extension_then_mime():
    assert media_kind("/x/a.PNG") == "image" and media_kind("b.jpeg") == "image" and media_kind("c.webp") == "image"
    assert media_kind("rec/audio.wav") == "audio" and media_kind("song.MP3") == "audio"
    assert media_kind("notes.txt") is None and media_kind("vector.svg") is None and media_kind("clip.mp4") == "video"
    assert media_kind("upload", "video/webm") == "video"
    assert media_kind("pasted", "image/png") == "image" and media_kind("blob", "audio/wav") == "audio"
    assert media_kind("pasted", "image/svg+xml") is None and media_kind("noext") is None
    assert media_kind("a.txt", "image/png") is None  # a known extension that is not media decides


def test_validate_upload_accepts_and_names_each_problem(tmp_path, image_file):
    assert validate_upload(image_file, max_bytes=2**20, modalities=("image",)) == "image"
    wav = tmp_path / "voice.wav"
    wav.write_bytes(b"RIFF....WAVE")
    assert validate_upload(wav, max_bytes=2**20, modalities=("image", "audio")) == "audio"
    with pytest.raises(MediaError, match=r"voice\.wav: this model takes no audio input; it takes image files"):
        validate_upload(wav, max_bytes=2**20, modalities=("image",))
    txt = tmp_path / "notes.txt"
    txt.write_text("hi")
    with pytest.raises(MediaError, match=r"notes\.txt: unsupported file type; this model takes image or audio"):
        validate_upload(txt, max_bytes=2**20, modalities=("image", "audio"))
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(MediaError, match=r"empty\.png: the file is empty"):
        validate_upload(empty, max_bytes=2**20, modalities=("image",))
    size = os.path.getsize(image_file)
    with pytest.raises(MediaError, match=r"photo\.png: .* MB is over the .* MB upload limit"):
        validate_upload(image_file, max_bytes=size - 1, modalities=("image",))
    assert validate_upload(image_file, max_bytes=size, modalities=("image",)) == "image"
    with pytest.raises(MediaError, match=r"gone\.png: cannot read the uploaded file"):
        validate_upload(tmp_path / "gone.png", max_bytes=2**20, modalities=("image",))


def test_user_content_puts_media_first_and_drops_blank_text():
    assert user_content("What is it?", [("image", "/a.png"), ("audio", "/b.wav")]) == [
        {"type": "image", "image": "/a.png"}, {"type": "audio", "audio": "/b.wav"}, _text("What is it?")]
    assert user_content("  \n", [("image", "/a.png")]) == [{"type": "image", "image": "/a.png"}]
    assert user_content("", []) == []


def test_history_to_messages_reads_gradio_history():
    history = [
        {"role": "user", "metadata": None, "options": None,
         "content": [_gr_file("/tmp/gradio/1/cat.png"), _gr_file("/tmp/gradio/2/dog.jpg", "image/jpeg"),
                     _text("Compare them.")]},
        {"role": "assistant", "metadata": None, "content": [_text("A cat and a dog.")]},
        {"role": "user", "content": "And this sound?"},  # plain-string content
        {"role": "user", "content": [_gr_file("/tmp/gradio/3/bark.wav", "audio/wav")]},  # same turn, 2nd bubble
        {"role": "assistant", "metadata": {"title": "Thinking"}, "content": [_text("hmm")]},  # a gradio "thought"
        {"role": "assistant", "content": [_text("A bark.")]},
    ]
    assert history_to_messages(history) == [
        _user({"type": "image", "image": "/tmp/gradio/1/cat.png"}, {"type": "image", "image": "/tmp/gradio/2/dog.jpg"},
              _text("Compare them.")),
        {"role": "assistant", "content": [_text("A cat and a dog.")]},
        _user(_text("And this sound?"), {"type": "audio", "audio": "/tmp/gradio/3/bark.wav"}),
        {"role": "assistant", "content": [_text("A bark.")]},
    ]
    assert history_to_messages([]) == []
    with pytest.raises(PromptError, match="role 'tool'"):
        history_to_messages([{"role": "tool", "content": "x"}])


def test_history_drops_turns_answered_by_an_error():
    history = [
        {"role": "user", "content": [_text("Hi")]},
        {"role": "assistant", "content": [_text("Hello!")]},
        {"role": "user", "content": [_gr_file("/tmp/gradio/9/broken.png"), _text("What is this?")]},
        error_message(MediaError("cannot decode image file broken.png")),
        {"role": "user", "content": [_text("Sorry, try this")]},
        {"role": "assistant", "content": "Sure."},
    ]
    assert history_to_messages(history) == [
        _user(_text("Hi")), {"role": "assistant", "content": [_text("Hello!")]},
        _user(_text("Sorry, try this")), {"role": "assistant", "content": [_text("Sure.")]},
    ]


def test_build_messages_appends_the_new_turn(image_file):
    history = [{"role": "user", "content": [_text("Hi")]}, {"role": "assistant", "content": [_text("Hello!")]}]
    assert build_messages(history, "Describe it.", [("image", image_file)]) == [
        _user(_text("Hi")), {"role": "assistant", "content": [_text("Hello!")]},
        _user({"type": "image", "image": image_file}, _text("Describe it."))]
    # an earlier turn stopped before any answer: the new turn joins it (the chat template needs alternating roles)
    assert build_messages([{"role": "user", "content": [_text("Hi")]}], "again", []) == [
        _user(_text("Hi"), _text("again"))]
    with pytest.raises(PromptError, match="the message is empty"):
        build_messages(history, "   ", [])


def test_sampling_options_convert_and_check_the_controls():
    assert sampling_options(64.0, 0.7, 0.9, 40.0, 3.0) == dict(max_new_tokens=64, temperature=0.7, top_p=0.9,
                                                                 top_k=40, seed=3)
    for args, match in [((None, 0, 1, 0, 0), "max new tokens is not set"),
                        ((0, 0, 1, 0, 0), r"max new tokens must be in \[1, inf\]"),
                        ((8.5, 0, 1, 0, 0), "max new tokens must be a whole number"),
                        ((8, -0.1, 1, 0, 0), "temperature must be in"),
                        ((8, 0, 0.0, 0, 0), "top-p must be above 0"),
                        ((8, 0, 1.5, 0, 0), "top-p must be in"),
                        ((8, 0, 1, 2.5, 0), "top-k must be a whole number"),
                        ((8, 0, 1, 0, "x"), "seed must be a number")]:
        with pytest.raises(PromptError, match=match):
            sampling_options(*args)


def test_format_stats_and_header():
    stats = AnswerStats(prompt_tokens=51, generated_tokens=32, first_token_s=0.8412, total_s=2.0)
    assert stats.tokens_per_s == 16.0
    assert format_stats(stats) == "prompt 51 tokens · generated 32 tokens · first token 0.84 s · 16.0 tokens/s"
    assert format_stats(AnswerStats(None, None, None, 1.0)) == (
        "prompt n/a tokens · generated n/a tokens · first token n/a · n/a tokens/s")
    header = model_header("gemma-3-4b-it", "gemma3", ("image",), notice="random weights")
    assert "`gemma-3-4b-it`" in header and "`gemma3`" in header and "text, image" in header
    assert "audio" not in header and header.endswith("random weights")
    assert "text, image, audio" in model_header("omni", "qwen3_omni", ("audio", "image"))


def test_error_and_answer_messages():
    report = error_message(MediaError("cannot decode image file /tmp/gradio/abc123/broken.png (corrupt?)"),
                           ["/tmp/gradio/abc123/broken.png"])
    assert report == {"role": "assistant", "content": "cannot decode image file broken.png (corrupt?)",
                      "metadata": {"title": ERROR_TITLE}}
    assert is_error_message(report) and not is_error_message(answer_message("fine"))
    assert error_message(RuntimeError())["content"] == "RuntimeError"
    assert answer_message("  indented\n    code") == {"role": "assistant",
                                                      "content": [_text("  indented\n    code")]}


# ---- the chat function on the tiny pipeline ---------------------------------------------------------------------

def _run(respond, message, history=(), max_new=MAX_NEW):
    return list(respond(message, list(history), max_new, 0.0, 1.0, 0, 0))


def _answer_text(message) -> str:
    return message["content"][0]["text"]


def test_responder_streams_the_generate_answer_with_stats(gemma3_pipeline, image_file):
    from omnijax.demo.web import make_responder

    respond = make_responder(gemma3_pipeline)
    messages = [_user({"type": "image", "image": image_file}, _text("Describe this image."))]
    expected = gemma3_pipeline.generate(messages, max_new_tokens=MAX_NEW)
    outputs = _run(respond, {"text": "Describe this image.", "files": [image_file]})
    texts = [_answer_text(m) for m, _ in outputs]
    assert texts[-1] == expected.text
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and len(outputs) >= 2  # streamed, growing
    assert outputs[0][1] == ""  # the first piece clears the previous answer's stats
    match = STATS_RE.fullmatch(outputs[-1][1])
    assert match, outputs[-1][1]
    assert int(match[1]) == expected.prompt_tokens, "prompt tokens differ from Pipeline.generate"
    assert int(match[2]) == len(expected.token_ids), (
        "generated tokens differ from Pipeline.generate (Pipeline.stream must return its GenerationResult)")


def test_responder_stop_releases_the_pipeline(gemma3_pipeline):
    from omnijax.demo.web import make_responder

    respond = make_responder(gemma3_pipeline)
    message = {"text": "Tell me a long story.", "files": []}
    stream = respond(message, [], 64, 0.0, 1.0, 0, 0)
    next(stream)
    stream.close()  # what gradio's Stop does to the running generator
    done: list = []
    worker = threading.Thread(target=lambda: done.append(_run(respond, message)), daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert done, "a request after a stopped one never finished (the generation lock was not released)"
    expected = gemma3_pipeline.generate([_user(_text("Tell me a long story."))], max_new_tokens=MAX_NEW)
    assert _answer_text(done[0][-1][0]) == expected.text


def test_tabs_generate_at_the_same_time_and_stop_only_their_own(gemma3_pipeline):
    """Two tabs' answers stream side by side: the second tab's answer starts while the first one's is still
    generating (no global lock), and Stop in the first tab cancels only its request."""
    from omnijax.demo.web import make_responder

    respond = make_responder(gemma3_pipeline)
    long = gemma3_pipeline.generate([_user(_text("Tell me a long story."))], max_new_tokens=64)
    assert len(long.token_ids) == 64 and long.finish_reason == "length"  # premise: the first answer runs long
    stats = gemma3_pipeline.scheduler.stats
    cancelled = stats.finished["cancelled"]
    first = respond({"text": "Tell me a long story.", "files": []}, [], 64, 0.0, 1.0, 0, 0)
    next(first)  # the first tab's answer has begun
    second: list = []
    worker = threading.Thread(target=lambda: second.append(_run(respond, {"text": "Count to five.", "files": []})),
                              daemon=True)
    worker.start()
    worker.join(timeout=600)
    assert second, "the second tab got no answer while the first one was generating"
    assert gemma3_pipeline.scheduler.running >= 1  # the first tab's request is still generating
    first.close()  # the first tab's Stop
    expected = gemma3_pipeline.generate([_user(_text("Count to five."))], max_new_tokens=MAX_NEW)
    assert _answer_text(second[0][-1][0]) == expected.text
    deadline = time.monotonic() + 600
    while stats.finished["cancelled"] == cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stats.finished["cancelled"] == cancelled + 1


def test_responder_reports_bad_input_in_the_chat(gemma3_pipeline, broken_image, image_file, tmp_path):
    from omnijax.demo.web import make_responder

    respond = make_responder(gemma3_pipeline, max_upload_mb=1)
    outputs = _run(respond, {"text": "What is this?", "files": [broken_image]})
    assert len(outputs) == 1
    report, stats = outputs[0]
    assert is_error_message(report) and "broken.png" in report["content"] and stats == ""
    assert str(pathlib.Path(broken_image).parent) not in report["content"]  # the upload folder is not shown
    big = tmp_path / "big.png"
    big.write_bytes(b"\0" * (2**20 + 1))
    (report, _), = _run(respond, {"text": "and this?", "files": [str(big)]})
    assert is_error_message(report) and "over the 1 MB upload limit" in report["content"]
    (report, _), = _run(respond, {"text": "", "files": []})
    assert is_error_message(report) and "empty" in report["content"]
    (report, _), = respond({"text": "hi", "files": []}, [], 8, 0.0, 0.0, 0, 0)
    assert is_error_message(report) and "top-p" in report["content"]
    # the failed turn stays in the chat but not in what the model sees next
    history = [{"role": "user", "content": [_gr_file(broken_image), _text("What is this?")]}, outputs[0][0]]
    answer = _run(respond, {"text": "Describe this image.", "files": [image_file]}, history)[-1][0]
    expected = gemma3_pipeline.generate([_user({"type": "image", "image": image_file}, _text("Describe this image."))],
                                        max_new_tokens=MAX_NEW)
    assert _answer_text(answer) == expected.text


def test_responder_takes_audio_for_an_audio_model(qwen_pipeline, tmp_path):
    """The same chat function serves a family with audio input (Qwen3-Omni)."""
    from omnijax.demo.web import make_responder

    wav = tmp_path / "tone.wav"
    with wave.open(str(wav), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes((8000 * np.sin(np.arange(8000) * 2 * np.pi * 440 / 16000)).astype(np.int16).tobytes())
    expected = qwen_pipeline.generate([_user({"type": "audio", "audio": str(wav)}, _text("What is this?"))],
                                      max_new_tokens=MAX_NEW)
    outputs = _run(make_responder(qwen_pipeline), {"text": "What is this?", "files": [str(wav)]})
    assert _answer_text(outputs[-1][0]) == expected.text
    match = STATS_RE.fullmatch(outputs[-1][1])
    assert match and int(match[1]) == expected.prompt_tokens and int(match[2]) == len(expected.token_ids)


# ---- the page built for any family --------------------------------------------------------------------------------

def _fake_pipe(modalities):
    return types.SimpleNamespace(name="m", family="fam", config=types.SimpleNamespace(modalities=modalities,
                                                                                      max_context=2048))


def _textbox_props(demo) -> dict:
    config = demo.get_config_file()
    return next(c["props"] for c in config["components"] if c["props"].get("elem_id") == "chat-input")


def test_build_demo_takes_the_models_media_kinds():
    from omnijax.demo.web import build_demo

    image_only = _textbox_props(build_demo(_fake_pipe(("image",))))
    assert image_only["sources"] == ["upload"] and ".png" in image_only["file_types"]
    assert ".wav" not in image_only["file_types"]
    with_audio = _textbox_props(build_demo(_fake_pipe(("image", "audio"))))
    assert with_audio["sources"] == ["upload", "microphone"]
    assert {".png", ".wav", ".mp3"} <= set(with_audio["file_types"])
    assert _textbox_props(build_demo(_fake_pipe(())))["sources"] == []


def test_demo_command_line():
    from omnijax.demo.cli_web import add_demo_parser, is_loopback

    top = argparse.ArgumentParser()
    add_demo_parser(top.add_subparsers(dest="command"))
    args = top.parse_args(["demo"])
    assert (args.model, args.host, args.port, args.max_upload_mb) == (None, "127.0.0.1", 7860, 20.0)
    args = top.parse_args(["demo", "--model", "/m", "--host", "0.0.0.0", "--port", "8080", "--max-upload-mb", "5"])
    assert (args.model, args.host, args.port, args.max_upload_mb) == ("/m", "0.0.0.0", 8080, 5.0)
    for bad in (["--port", "0"], ["--port", "70000"], ["--max-upload-mb", "0"], ["--max-upload-mb", "x"]):
        with pytest.raises(SystemExit):
            top.parse_args(["demo", *bad])
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


def test_serve_binds_loopback_and_caps_uploads(tiny_gemma3_dir, tmp_path):
    import httpx

    from omnijax.demo.web import build_demo, launch, serve, stop

    port = _free_port()
    args = argparse.Namespace(model=str(tiny_gemma3_dir), dtype="float32", model_axis=None, host="127.0.0.1",
                              port=port, max_upload_mb=1.0)
    demo = serve(args, block=False)
    try:
        base = f"http://127.0.0.1:{port}"
        page = httpx.get(base + "/", timeout=30)
        assert page.status_code == 200 and pathlib.Path(tiny_gemma3_dir).name in page.text
        small, big = tmp_path / "small.png", tmp_path / "big.png"
        small.write_bytes(b"\0" * 1000)
        big.write_bytes(b"\0" * (2**20 + 10))
        ok = httpx.post(base + "/gradio_api/upload", files={"files": small.open("rb")}, timeout=30)
        assert ok.status_code == 200, ok.text
        too_big = httpx.post(base + "/gradio_api/upload", files={"files": big.open("rb")}, timeout=30)
        assert too_big.status_code == 413, too_big.text
        uploaded = pathlib.Path(ok.json()[0])
        assert uploaded.exists() and uploaded.is_relative_to(demo.omnijax_upload_dir)
    finally:
        stop(demo)
    assert not uploaded.exists() and not pathlib.Path(demo.omnijax_upload_dir).exists()  # uploads go with the demo
    with socket.socket() as taken:  # a port taken between the check and the launch: our message, not gradio's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        from omnijax.demo.cli_web import ServeError

        with pytest.raises(ServeError, match=f"port {taken.getsockname()[1]} on 127.0.0.1 is already in use: "
                                             f"choose another with --port"):
            launch(build_demo(_fake_pipe(("image",))), host="127.0.0.1", port=taken.getsockname()[1], block=False,
                   quiet=True)


def test_default_model_examples_come_from_the_manifest():
    import json

    from omnijax.demo.web import EXAMPLES_DIR, default_model_examples

    manifest = json.loads((EXAMPLES_DIR / "examples.json").read_text())
    examples = default_model_examples()
    assert [e["text"] for e in examples] == [e["prompt"] for e in manifest["examples"]]
    assert all(os.path.isfile(f) for e in examples for f in e["files"])
    assert default_model_examples(pathlib.Path("/nonexistent")) == []

