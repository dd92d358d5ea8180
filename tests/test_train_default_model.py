"""The default model's training script (training/train_default_model.py, the `train` extra): a short run of both
phases is reproducible and writes a checkpoint folder that omnijax loads."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from safetensors.numpy import load_file

from training.model import CONFIG, write_folder_files
from training.gemma3_weights import gemma3_weight_shapes
from fixtures.child_path import child_python_path

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "training" / "train_default_model.py")


def test_a_short_run_is_reproducible_and_writes_a_loadable_checkpoint(tmp_path):
    """Two runs one after the other (2 vision steps, then 4 conversation steps: three short ones and a long one)
    give byte-identical weights; every other file is the shipped folder's; the pipeline answers with them. (The
    second run reads the first's compiled programs from the run's compilation cache, as a user's second run does.)"""
    env = dict(os.environ, PYTHONPATH=child_python_path(), JAX_PLATFORMS="cpu")
    cmd = [sys.executable, SCRIPT, "--vision-steps", "2", "--steps", "4", "--log-every", "1"]
    runs = [subprocess.run(cmd + ["--out", str(tmp_path / name)], cwd=tmp_path, env=env, text=True, timeout=900,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for name in ("a", "b")]
    for run in runs:
        log = run.stdout
        assert run.returncode == 0, log
        assert "[vision] step 2/2" in log and "short_loss" in log and "long_loss" in log, log
        summary = json.loads(log.strip().splitlines()[-1])
        assert (summary["vision_steps"], summary["steps"], summary["seed"]) == (2, 4, 0)
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()

    built = write_folder_files(tmp_path / "built")
    assert sorted(p.name for p in a.iterdir()) == sorted([p.name for p in built.iterdir()] + ["model.safetensors"])
    for f in built.iterdir():
        assert (a / f.name).read_bytes() == f.read_bytes(), f.name
    weights = load_file(str(a / "model.safetensors"))
    assert {k: v.shape for k, v in weights.items()} == gemma3_weight_shapes(CONFIG)
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in weights.values())

    from omnijax.app.pipeline import Pipeline
    from training.scenes import render, sample_scene

    image = render(sample_scene(np.random.default_rng(3)))
    out = Pipeline.from_pretrained(a).generate(
        [{"role": "user", "content": [{"type": "image", "image": image},
                                      {"type": "text", "text": "Describe this image."}]}], max_new_tokens=4)
    assert len(out.token_ids) >= 1 and out.finish_reason in ("eos", "length")
