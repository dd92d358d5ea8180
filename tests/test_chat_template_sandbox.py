"""Chat templates render exactly as transformers renders them, and a hostile one is stopped: each case of
fixtures/hostile_templates.py (nested loops, a 3 GB string, exponential concatenation or recursion, widths passed
to filters and string methods, ...) raises a PromptError naming its limit, in bounded time and memory (one child
process under a 1.5 GB address-space cap), and a good template renders afterwards."""

from __future__ import annotations

import json

import pytest

from fixtures.bounded import check_case, run_cases
from fixtures.hostile_templates import TEMPLATES
from omnijax.preprocess.chat_template import MAX_SECONDS

MAX_GROWTH_MB = 300  # a value is at most 8M characters (32 MB as UCS-4); the work of a rendering at most 64M


@pytest.fixture(scope="module")
def results():
    return run_cases("hostile_templates", list(TEMPLATES), memory_gb=1.5, timeout=600)


@pytest.mark.parametrize("case", list(TEMPLATES))
def test_a_hostile_template_is_stopped(results, case):
    check_case(results[case], "PromptError", TEMPLATES[case][1], max_seconds=MAX_SECONDS + 10,
               max_growth_mb=MAX_GROWTH_MB)


def test_a_good_template_renders_after_them(results):
    assert results["still_works"] == "<user>Hello>"


CONVERSATIONS = [
    [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}],
    [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
     {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
     {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
     {"role": "user", "content": [{"type": "text", "text": "  And now? <b>&</b> "}]}],
]


@pytest.mark.parametrize("folder", ["tiny_gemma3_dir", "tiny_qwen_dir", "tiny_gemma4_small_dir", "tiny_llama4_dir"])
def test_every_family_template_renders_as_transformers_renders_it(request, folder):
    from omnijax.app.families import family_for_config
    from omnijax.preprocess.prompts import _render

    path = request.getfixturevalue(folder)
    hf = json.loads((path / "config.json").read_text())
    spec = family_for_config(hf)
    tokenizer = spec.make_processor(path, spec.parse_config(hf)).tokenizer
    for messages in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert _render(tokenizer, messages, None) == expected
