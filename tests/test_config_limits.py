"""Absurd or hostile checkpoint folders fail fast with a CheckpointError naming the problem: configs out of bounds,
weight files outside the folder or not regular files, non-float tensors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from omnijax.app.config_limits import check_config_limits
from fixtures.tiny_gemma3 import build_tiny_gemma3
from omnijax.app.pipeline import Pipeline
from omnijax.common.errors import CheckpointError
from fixtures.child_path import child_python_path



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_gemma3(tmp_path_factory.mktemp("limits") / "tiny", seed=5)


def copy_with(src, tmp_path, edit_config=None, name="edited"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    if edit_config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture
def nothing_built(monkeypatch):
    """Config errors must come before the model's shapes are built."""

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the problem was found")

    monkeypatch.setattr("omnijax.app.pipeline.abstract_model", built)


def fails_fast(folder, match):
    with pytest.raises(CheckpointError, match=match):
        Pipeline.from_pretrained(folder)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(mm_tokens_per_image=10**9), r"mm_tokens_per_image = 1000000000"),
    (lambda c: c["text_config"].update(num_hidden_layers=10**6), r"text_config.num_hidden_layers = 1000000"),
    (lambda c: c["text_config"].update(num_hidden_layers=1e6), r"num_hidden_layers = 1000000.0"),
    (lambda c: c["text_config"].update(num_attention_heads=0), r"text_config.num_attention_heads = 0"),
    (lambda c: c["text_config"].update(num_key_value_heads=3), r"not a multiple of text_config.num_key_value_heads"),
    (lambda c: c["text_config"].update(vocab_size=-5), r"vocab_size = -5"),
    (lambda c: c["text_config"].update(vocab_size=None), r"text_config.vocab_size = None is not usable \(it has no"),
    (lambda c: c["text_config"].update(rms_norm_eps=float("nan")), r"rms_norm_eps"),
    (lambda c: c["vision_config"].update(image_size=10**6), r"vision_config.image_size"),
    (lambda c: c.update(image_token_index=2**40), r"image_token_index"),
    (lambda c: c["text_config"].update(layer_types=["full_attention"] * 3), r"layer_types lists 3 layers"),
])
def test_config_out_of_bounds(checkpoint, tmp_path, edit, match, nothing_built):
    fails_fast(copy_with(checkpoint, tmp_path, edit), match)


def test_processor_image_size_out_of_bounds(checkpoint, tmp_path, nothing_built):
    dst = copy_with(checkpoint, tmp_path)
    for name in ("processor_config.json", "preprocessor_config.json"):
        file = dst / name
        if file.exists():
            data = json.loads(file.read_text())
            section = data.get("image_processor", data)
            section["size"] = {"height": 100_000, "width": 100_000}
            file.write_text(json.dumps(data))
    fails_fast(dst, "100000 x 100000 is over the limit")


def test_bounds_accept_published_configs(checkpoint, tiny_qwen_full_dir):
    check_config_limits(json.loads((checkpoint / "config.json").read_text()))
    check_config_limits(json.loads((tiny_qwen_full_dir / "config.json").read_text()))  # thinker, talker, code2wav
    with pytest.raises(CheckpointError, match="JSON object"):
        check_config_limits([1, 2])


def sharded(checkpoint, tmp_path, rename=None):
    """The checkpoint as one shard plus an index, with ``rename(key) -> file name`` for the index entries."""
    dst = copy_with(checkpoint, tmp_path, name="sharded")
    tensors = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").rename(dst / "model-00001-of-00001.safetensors")
    weight_map = {k: (rename(k) if rename else None) or "model-00001-of-00001.safetensors" for k in tensors}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst, tensors


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.safetensors", "sub/../../x.safetensors",
                                  "pytorch_model.bin", "C:\\weights.safetensors"])
def test_index_naming_files_outside_the_folder_or_not_safetensors(checkpoint, tmp_path, name, monkeypatch):
    from omnijax.app.checkpoint import TensorIndex

    def no_reads(self, key):
        raise AssertionError(f"{key} was read before the index was checked")

    monkeypatch.setattr(TensorIndex, "read", no_reads)
    key = "language_model.model.layers.0.mlp.up_proj.weight"
    dst, _ = sharded(checkpoint, tmp_path, lambda k: name if k == key else None)
    fails_fast(dst, "outside the checkpoint folder|not a .safetensors file")


def test_integer_tensor_in_a_fused_projection(checkpoint, tmp_path, monkeypatch):
    dst = copy_with(checkpoint, tmp_path)
    tensors = load_file(str(dst / "model.safetensors"))
    key = "language_model.model.layers.1.self_attn.k_proj.weight"  # fused with q and v, which stay float
    tensors[key] = np.round(tensors[key] * 100).astype(np.int32)
    save_file(tensors, str(dst / "model.safetensors"))
    from omnijax.app.checkpoint import TensorIndex

    def no_reads(self, key):
        raise AssertionError(f"{key} was read before the dtypes were checked")

    monkeypatch.setattr(TensorIndex, "read", no_reads)
    fails_fast(dst, r"layers\.1\.self_attn\.k_proj\.weight.*stored as I32")


def test_a_fifo_in_the_folder_is_refused_without_blocking(checkpoint, tmp_path):
    folders = {}
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        dst = copy_with(checkpoint, tmp_path, name=f"fifo_{name}")
        (dst / name).unlink()
        os.mkfifo(dst / name)
        folders[name] = str(dst)
    code = ("import json, sys\nfrom omnijax.app.pipeline import Pipeline\nfrom omnijax.common.errors import CheckpointError\n"
            "for folder in json.loads(sys.argv[1]):\n"
            "    try:\n        Pipeline.from_pretrained(folder)\n    except CheckpointError as e:\n        print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(list(folders.values()))], capture_output=True,
                          text=True, timeout=120,  # a blocked open
                          env=dict(os.environ, PYTHONPATH=child_python_path()))
    lines = proc.stdout.strip().splitlines()  # would end in the timeout here
    assert len(lines) == 3, proc.stderr[-2000:]
    for line, name in zip(lines, folders):
        assert f"{name} in checkpoint folder" in line and "not a regular file" in line


def test_the_default_model_loads_without_a_path(monkeypatch, tmp_path):
    from omnijax.app import default_model

    built = build_tiny_gemma3(tmp_path / "default", seed=0)
    monkeypatch.setattr(default_model, "default_model_dir", lambda: built)
    pipe = Pipeline.from_pretrained(max_context=128)
    assert pipe.folder == built and pipe.family == "gemma3"
