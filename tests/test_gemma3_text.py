"""Text-only Gemma 3 (Gemma3ForCausalLM, model_type gemma3_text) against transformers in float32: a tiny random
folder written by ``save_pretrained``; logits and greedy tokens for chat and raw prompts, published key spellings,
a folder without a chat template, and the demo page for a text-only model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from fixtures import tiny_gemma3 as dm
from fixtures.step_shapes import few_step_shapes
from omnijax.app.pipeline import Pipeline
from omnijax.common.errors import PromptError
from conftest import _randomise_

pytestmark = pytest.mark.reference

MAX_NEW = 16
LONG = ("The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill "
        "and the rain keeps falling on the quiet town. ") * 2
CHATS = {
    "short": [{"role": "user", "content": "Write a short poem about the sea."}],
    "system_and_turns": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": LONG}]},
                         {"role": "assistant", "content": "Noted."},
                         {"role": "user", "content": "And then?"}],
}
RAWS = {"short": "The sea is", "long": LONG + "In the end"}


def text_config() -> dict:
    config = dict(dm.TINY_GEMMA3_CONFIG["text_config"], architectures=["Gemma3ForCausalLM"])
    config.pop("model_type")
    return config


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """A tiny Gemma3ForCausalLM folder: every weight random, the default tokenizer and chat template, the
    instruction-tuned generation config."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    folder = tmp_path_factory.mktemp("tiny_gemma3_text")
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**text_config())).to(torch.float32).eval()
    _randomise_(model)
    model.save_pretrained(folder)
    dm.write_generation_config(folder)
    dm.write_tokenizer_and_processor(folder, image_size=dm.TINY_GEMMA3_CONFIG["vision_config"]["image_size"],
                                     mm_tokens_per_image=dm.TINY_GEMMA3_CONFIG["mm_tokens_per_image"])
    return folder


@pytest.fixture(scope="module")
def text_pipe(text_dir):
    return few_step_shapes(Pipeline.from_pretrained(text_dir))


@pytest.fixture(scope="module")
def hf_text(text_dir):
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    model = Gemma3ForCausalLM.from_pretrained(text_dir, dtype=torch.float32, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(str(text_dir))


def reference_ids(tokenizer, case: str, kind: str) -> list[int]:
    if kind == "raw":
        return tokenizer(RAWS[case])["input_ids"]
    return tokenizer.apply_chat_template(CHATS[case], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]


def test_the_folder_is_read_as_the_text_only_class(text_dir, text_pipe):
    assert json.loads((text_dir / "config.json").read_text())["model_type"] == "gemma3_text"
    assert text_pipe.family == "gemma3" and text_pipe.config.modalities == ()
    assert set(text_pipe.engine.params) == {"decoder"}
    assert text_pipe.config.eos_ids == (1, 6)  # generation_config.json: <eos>, <end_of_turn>


@pytest.mark.parametrize("kind,case", [("chat", "short"), ("chat", "system_and_turns"), ("raw", "short"),
                                       ("raw", "long")])
def test_prompt_ids_and_logits_equal_transformers(text_pipe, hf_text, kind, case):
    model, tokenizer = hf_text
    prompt = text_pipe.prepare(RAWS[case] if kind == "raw" else CHATS[case])
    assert prompt.token_ids.tolist() == reference_ids(tokenizer, case, kind)
    assert prompt.token_ids[0] == tokenizer.bos_token_id
    with torch.no_grad():
        ref = model(torch.tensor(prompt.token_ids[None], dtype=torch.long)).logits[0].numpy()
    ours = text_pipe.prompt_logits(prompt)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


def test_long_raw_prompt_exercises_the_sliding_window(text_pipe):
    assert len(text_pipe.prepare(RAWS["long"]).token_ids) > 3 * text_pipe.config.decoder.sliding_window


def test_greedy_tokens_equal_transformers(text_pipe, hf_text):
    model, tokenizer = hf_text
    prompts = [CHATS["short"], RAWS["short"], RAWS["long"]]
    cases = [("chat", "short"), ("raw", "short"), ("raw", "long")]
    ours = text_pipe.generate(prompts, max_new_tokens=MAX_NEW)
    for (kind, case), result in zip(cases, ours):
        ids = torch.tensor([reference_ids(tokenizer, case, kind)], dtype=torch.long)
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1]:].tolist()
        assert len(ref) >= 8 and result.token_ids == ref


def test_media_parts_are_refused(text_pipe):
    with pytest.raises(PromptError, match="text only.*1 image"):
        text_pipe.prepare([{"role": "user", "content": [{"type": "image", "image": "cat.png"},
                                                        {"type": "text", "text": "What is it?"}]}])


def test_published_key_spellings_load_the_same_weights(text_dir, text_pipe, tmp_path):
    import jax

    other = tmp_path / "spelled"
    shutil.copytree(text_dir, other)
    tensors = load_file(str(other / "model.safetensors"))
    assert any(k.startswith("model.layers.") for k in tensors)
    save_file({k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()},
              str(other / "model.safetensors"))
    pipe = Pipeline.from_pretrained(other)  # (nothing is generated: no compilation)
    a, b = jax.tree.leaves(text_pipe.engine.params), jax.tree.leaves(pipe.engine.params)
    assert len(a) == len(b) > 0 and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


def test_a_folder_without_a_chat_template_takes_raw_text(text_dir, text_pipe, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(text_dir, base)
    for name in ("chat_template.jinja", "chat_template.json"):
        (base / name).unlink(missing_ok=True)
    for name in ("tokenizer_config.json", "processor_config.json"):
        if (base / name).exists():
            config = json.loads((base / name).read_text())
            config.pop("chat_template", None)
            (base / name).write_text(json.dumps(config))
    pipe = Pipeline.from_pretrained(base)
    assert not pipe.has_chat_template and text_pipe.has_chat_template
    with pytest.raises(PromptError, match="no chat template.*plain text"):
        pipe.prepare(CHATS["short"])
    assert pipe.prepare(RAWS["short"]).token_ids.tolist() == text_pipe.prepare(RAWS["short"]).token_ids.tolist()


def test_the_demo_offers_no_attachments_and_names_the_inputs(text_pipe):
    from omnijax.demo.web import build_demo, make_responder

    demo = build_demo(text_pipe)
    config = demo.get_config_file()
    textbox = next(c["props"] for c in config["components"] if c["props"].get("elem_id") == "chat-input")
    header = next(c["props"]["value"] for c in config["components"] if c["props"].get("elem_id") == "model-info")
    assert textbox["sources"] == [] and not textbox.get("file_types")
    assert "**inputs:** text" in header and "image" not in header
    # (the batch of test_greedy_tokens_equal_transformers: its compiled programs are reused)
    expected = text_pipe.generate([CHATS["short"], RAWS["short"], RAWS["long"]], max_new_tokens=MAX_NEW)[0]
    outputs = list(make_responder(text_pipe)({"text": CHATS["short"][0]["content"], "files": []}, [], MAX_NEW,
                                             0.0, 1.0, 0, 0))
    assert outputs[-1][0]["content"][0]["text"] == expected.text
