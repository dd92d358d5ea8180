"""The embedded default model (app/checkpoints/shapes-gemma3): shipped as built, right on held-out scenes, and
answering exactly as transformers does."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import PIL.Image
import pytest
from safetensors import safe_open

from training import dialogues as sd
from omnijax.app.default_model import DEFAULT_MODEL_NAME, default_model_dir
from training.model import CONFIG, write_folder_files
from training.scenes import render, sample_scene, scene_from_dict
from training.gemma3_weights import gemma3_weight_shapes
from bench.default_model_eval import eval_items, evaluate
from fixtures.step_shapes import few_step_shapes
from fixtures.child_path import child_python_path

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def pipe():
    from omnijax.app.pipeline import Pipeline

    return few_step_shapes(Pipeline.from_pretrained(default_model_dir()))


def _user(images, text):
    return [{"role": "user", "content": [{"type": "image", "image": im} for im in images]
             + [{"type": "text", "text": text}]}]


# ------------------------------------------------------------------------------------------------ the folder


def test_default_model_dir_is_the_shipped_folder_and_builds_nothing(tmp_path):
    code = ("import os, sys; from omnijax.app.default_model import default_model_dir; d = default_model_dir(); "
            "print(d); assert 'torch' not in sys.modules, 'torch imported'")
    env = dict(os.environ, HOME=str(tmp_path / "home"), OMNIJAX_HOME=str(tmp_path / "omnijax"),
               PYTHONPATH=child_python_path(), OMNIJAX_TEST_TORCH="1")  # torch importable: the check means something
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=env, capture_output=True,
                         text=True).stdout.strip()
    assert pathlib.Path(out) == ROOT / "app" / "checkpoints" / DEFAULT_MODEL_NAME == default_model_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written anywhere at first use


def test_shipped_files_are_the_deterministic_build(tmp_path):
    """Every file but the weights is exactly what training/model.py writes today."""
    shipped = default_model_dir()
    built = write_folder_files(tmp_path / "built")
    names = sorted(p.name for p in built.iterdir())
    assert sorted(p.name for p in shipped.iterdir()) == sorted(names + ["model.safetensors"])
    for name in names:
        assert (shipped / name).read_bytes() == (built / name).read_bytes(), name


def test_shipped_weights_fit_the_config_and_the_size_budget():
    path = default_model_dir() / "model.safetensors"
    assert path.stat().st_size <= 30 * 2**20
    with safe_open(str(path), "np") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    assert shapes == gemma3_weight_shapes(CONFIG)
    assert json.loads((default_model_dir() / "config.json").read_text()) == CONFIG


# ------------------------------------------------------------------------------------------------ answers


@pytest.fixture(scope="module")
def held_out_report(pipe):
    """Greedy answers to "Describe this image." and "How many shapes are there?" on 200 new scenes."""
    report = evaluate(pipe, eval_items(200), extended=False)
    assert report["scores"]["scenes"] == 200
    return report


def test_counts_200_held_out_scenes(held_out_report):
    """The bar: "How many shapes are there?" is right in >= 95% of 200 new scenes."""
    assert held_out_report["scores"]["count"] >= 0.95, held_out_report


def test_describes_200_held_out_scenes(held_out_report):
    """The bar: on 200 new scenes "Describe this image." names exactly the right set of (colour, shape) pairs in
    >= 95% of the answers."""
    assert held_out_report["scores"]["describe_pairs"] >= 0.95, held_out_report


def test_readme_and_demo_examples(pipe):
    manifest = json.loads((EXAMPLES / "examples.json").read_text())
    for name, data in manifest["pictures"].items():
        if name.endswith(".png"):  # the files are the scenes they say they are
            pixels = np.asarray(PIL.Image.open(EXAMPLES / name).convert("RGB"))
            assert np.array_equal(pixels, np.asarray(render(scene_from_dict(data)))), name
    for example in manifest["examples"]:
        scenes = [scene_from_dict(manifest["pictures"][f]) for f in example["files"]]
        expected = {"Describe this image.": lambda: sd.describe(scenes[0]),
                    "How many shapes are there?": lambda: sd.count_answer(scenes[0]),
                    "What colour is the triangle?": lambda: sd.colour_answer(scenes[0], "triangle"),
                    "Is there a circle?": lambda: sd.presence_answer(scenes[0], "circle"),
                    "Which image has more shapes?": lambda: sd.compare_answer(scenes)}[example["prompt"]]()
        assert example["answer"] == expected
        out = pipe.generate(_user([str(EXAMPLES / f) for f in example["files"]], example["prompt"]),
                            max_new_tokens=48)
        assert out.text == expected and out.finish_reason == "eos", example


def test_other_questions_several_images_and_text_only(pipe):
    rng = np.random.default_rng(99)
    scenes = [sample_scene(rng, num_shapes=n) for n in (1, 3, 2)]
    images = [render(s) for s in scenes]
    conversations = [_user([images[1]], "How many shapes are in this picture?"),
                     _user([images[0]], "What color is the background?"),
                     _user(images[:2], "Describe these images."),
                     _user(images[1:], "Which image has more shapes?"),
                     _user([], "Hello, what can you do?"),
                     _user([], "Describe this image.")]
    expected = [sd.count_answer(scenes[1]), sd.background_answer(scenes[0]), sd.describe_many(scenes[:2]),
                sd.compare_answer(scenes[1:]), sd.TEXT_ONLY_ANSWER, sd.TEXT_ONLY_ANSWER]
    answers = [r.text for r in pipe.generate(conversations, max_new_tokens=64)]
    assert answers == expected


def test_sampling_stays_sensible(pipe):
    """With temperature 0.7 (top-k 64, top-p 0.95) descriptions still read as descriptions and name the right
    shapes nearly always."""
    items = eval_items(40, seed=5)
    report = evaluate(pipe, items, extended=False, temperature=0.7, seed=1)
    assert report["scores"]["describe_pairs"] >= 0.85, report
    assert report["scores"]["count"] >= 0.85, report


# ------------------------------------------------------------------------------------------------ transformers


def test_transformers_gives_the_same_greedy_answers(pipe):
    import torch
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    folder = default_model_dir()
    model = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    processor = AutoProcessor.from_pretrained(folder)
    rng = np.random.default_rng(123)
    scenes = [sample_scene(rng) for _ in range(4)]
    images = [render(s) for s in scenes]
    conversations = [_user([images[0]], "Describe this image."),
                     _user([images[1]], "How many shapes are there?"),
                     _user([images[2]], "What colour is the " + scenes[2].shapes[0].kind + "?"),
                     _user([images[3]], "Is there a triangle?"),
                     _user(images[:2], "Describe these images."),
                     _user([], "Hi!")]
    for messages in conversations:
        ours = pipe.generate(messages, max_new_tokens=48)
        inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=48, do_sample=False)
        theirs = out[0, inputs["input_ids"].shape[1]:].tolist()
        assert ours.token_ids == theirs, (messages[0]["content"][-1]["text"], ours.text)
        assert ours.finish_reason == "eos"
