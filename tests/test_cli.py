"""The command line as a user runs it: python -m app generate ..."""

import os
import pathlib
import re
import subprocess
import sys

from app.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMAGE = ROOT / "examples" / "shapes.png"


def run(args, tmp_path):
    env = dict(os.environ, OMNIJAX_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "app", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


def test_generate_with_the_embedded_default_model(tmp_path):
    proc = run(["generate", "--image", str(IMAGE), "--prompt", "Describe this image.", "--max-new-tokens", "6"],
               tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "embedded tiny demo model" in proc.stderr
    assert proc.stdout.strip() != ""
    assert (tmp_path / "home" / "default-gemma3-tiny" / "config.json").exists()


def test_cli_matches_the_python_api(tiny_gemma3_dir, gemma3_pipeline, capsys):
    messages = [{"role": "user", "content": [{"type": "image", "image": str(IMAGE)},
                                             {"type": "text", "text": "What shapes?"}]}]
    expected = gemma3_pipeline.generate(messages, max_new_tokens=8).text
    code = main(["generate", "--model", str(tiny_gemma3_dir), "--image", str(IMAGE), "--prompt", "What shapes?",
                 "--max-new-tokens", "8", "--no-stream"])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.out == expected + "\n"
    assert re.fullmatch(r"\[omnijax\] \d+ new tokens? in \d+\.\d\d s \([\d.]+ tokens/s, prompt \d+ tokens, "
                        r"ended by (eos|length|stop)\)", captured.err.strip().splitlines()[-1])


def test_cli_reports_bad_input_as_an_error_line(tmp_path):
    proc = run(["generate", "--model", str(tmp_path / "missing"), "--prompt", "hi"], tmp_path)
    assert proc.returncode == 2
    assert "omnijax: error:" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
