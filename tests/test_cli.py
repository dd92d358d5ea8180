"""The command line as a user runs it: python -m app generate ..."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from omnijax.app.cli import main
from training.dialogues import describe
from training.scenes import scene_from_dict
from fixtures.child_path import child_python_path

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMAGE = ROOT / "examples" / "shapes.png"


def run(args, tmp_path):
    env = dict(os.environ, OMNIJAX_HOME=str(tmp_path / "home"), PYTHONPATH=child_python_path())
    return subprocess.run([sys.executable, "-m", "omnijax", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


def test_generate_with_the_embedded_default_model(tmp_path):
    """The README's first command: the shipped default model describes the example picture correctly (the
    expected sentence is the template's description of the scene the picture was drawn from)."""
    manifest = json.loads((ROOT / "examples" / "examples.json").read_text())
    expected = describe(scene_from_dict(manifest["pictures"][IMAGE.name]))
    proc = run(["generate", "--image", str(IMAGE), "--prompt", "Describe this image."], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "embedded default model" in proc.stderr
    assert proc.stdout.strip() == expected
    # nothing was built at first use: the only thing written is JAX's cache of compiled programs
    home = tmp_path / "home"
    written = sorted(p.name for p in home.iterdir()) if home.exists() else []
    assert written in ([], ["jax-cache"]), written


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
                        r"ended by (eos|length|stop)\)(, after \d+\.\d\d s preparing \d+ programs? \(.*\))?",
                        captured.err.strip().splitlines()[-1])


def test_cli_reports_bad_input_as_an_error_line(tmp_path):
    proc = run(["generate", "--model", str(tmp_path / "missing"), "--prompt", "hi"], tmp_path)
    assert proc.returncode == 2
    assert "omnijax: error:" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
