"""What a new user sees: one clear line naming our own flag for each mistake, and no notices they cannot act on."""

from __future__ import annotations

import os
import socket

import pytest

from omnijax.demo.cli import main
from fixtures.child_path import run_without_torch



def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnijax: error: "), err
    return err[0]


def test_demo_on_a_port_in_use_names_the_port_flag(capsys, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr("omnijax.app.cli.load_pipeline", no_model)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--port", str(port)]) == 2
    line = one_error_line(capsys)
    assert f"port {port} on 127.0.0.1 is already in use: choose another with --port" in line
    assert "GRADIO" not in line and "server_port" not in line
    assert main(["demo", "--host", "203.0.113.7", "--port", "7861"]) == 2  # an address of another machine
    assert "check --host" in one_error_line(capsys)


@pytest.mark.parametrize("flag, value, name", [
    ("--temperature", "nan", "temperature"), ("--temperature", "-1", "temperature"),
    ("--temperature", "inf", "temperature"), ("--top-p", "0", "top_p"), ("--top-p", "1.5", "top_p"),
    ("--top-k", "-1", "top_k"), ("--top-k", str(2**40), "top_k"), ("--seed", str(2**64), "seed"),
    ("--max-new-tokens", "0", "max_new_tokens"),
])
def test_bad_sampling_flags_are_one_line_and_exit_2(capsys, monkeypatch, flag, value, name):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr("omnijax.app.cli.load_pipeline", no_model)
    monkeypatch.setattr("omnijax.demo.cli_caption.load_pipeline", no_model)
    assert main(["generate", "--prompt", "Hello", flag, value]) == 2
    assert name in one_error_line(capsys)


@pytest.mark.parametrize("flag", ["--image", "--audio"])
def test_missing_or_unreadable_media_is_reported_before_the_model_loads(capsys, monkeypatch, tmp_path, flag):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the media files were checked")

    monkeypatch.setattr("omnijax.app.cli.load_pipeline", no_model)
    assert main(["generate", "--prompt", "Hello", flag, str(tmp_path / "nope.png")]) == 2
    assert "file not found" in one_error_line(capsys)
    assert main(["generate", "--prompt", "Hello", flag, str(tmp_path)]) == 2  # a folder
    assert "not a regular file" in one_error_line(capsys)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["generate", "--prompt", "Hello", flag, str(fifo)]) == 2  # read, it would block
    assert "not a regular file" in one_error_line(capsys)
    assert main(["generate", "--prompt", "Hello", "--model", str(tmp_path / "no-model")]) == 2
    assert "--model" in one_error_line(capsys)


def test_bad_sampling_flags_in_caption(capsys, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"x")
    assert main(["caption", "--input", str(folder), "--out", str(tmp_path / "o.jsonl"), "--temperature", "nan"]) == 2
    assert "temperature" in one_error_line(capsys)
    assert not (tmp_path / "o.jsonl").exists()


def test_no_pytorch_notice_when_loading_a_tokenizer(tiny_gemma3_dir):
    proc = run_without_torch(f"from omnijax.preprocess.tokenizer import load_tokenizer\n"
                             f"import pathlib\nload_tokenizer(pathlib.Path({str(tiny_gemma3_dir)!r}))\n"
                             f"import transformers\nprint(transformers.is_torch_available())")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"  # the notice's condition holds ...
    assert "PyTorch was not found" not in proc.stderr  # ... and no notice is shown


def test_benchmark_without_pytorch_says_what_to_install():
    proc = run_without_torch("from bench.generation import main\nsys.exit(main(['--smoke']))")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "pip install -e '.[test]'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, expected", [([], "processor"), (["--video-size", "checkpoint"], "checkpoint")])
def test_the_video_size_flag_reaches_the_loader(monkeypatch, flags, expected):
    from omnijax.app.cli import load_pipeline, parser

    class Loaded(Exception):
        pass

    seen = {}

    def from_pretrained(folder, **kwargs):
        seen.update(kwargs)
        raise Loaded

    monkeypatch.setattr("omnijax.app.pipeline.Pipeline.from_pretrained", from_pretrained)
    with pytest.raises(Loaded):
        load_pipeline(parser().parse_args(["generate", "--prompt", "Hi", *flags]))
    assert seen["video_size"] == expected
