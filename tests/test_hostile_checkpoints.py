"""What a hostile or broken checkpoint can do: refused with the right OmnijaxError, quickly, in bounded memory, and the
process keeps loading and answering good checkpoints afterwards.

Every case of the reliability report's checkpoint classes runs in one child process under a 5 GB address-space cap
(tests/fixtures/bounded.py; a JAX process with a tiny model maps about 2 GB), each measured: the error type and
message, its time (a generous bound: a hang would run into minutes) and how much the peak resident memory grew
(each case stays far below what the report saw: a 2**31-layer config, a 4M-token vocabulary, a 3 GB string).
"""

from __future__ import annotations

import pytest

from fixtures import hostile_checkpoints
from fixtures.bounded import check_case, run_cases

# case -> (error type, a part of its message)
EXPECTED = {
    "gguf_block_count_2_31": ("CheckpointError", "block_count = 2147483648 is not usable"),
    "gguf_head_count_0": ("CheckpointError", "head_count = 0 is not usable"),
    "gguf_sliding_window_pattern_0": ("CheckpointError", "sliding_window_pattern = 0 is not usable"),
    "gguf_alignment_string": ("CheckpointError", "general.alignment 'abc'"),
    "gguf_vocabulary_4m_tokens": ("CheckpointError", "metadata array of 4000000 values"),
    "gguf_tokenizer_larger_than_embedding": ("CheckpointError", r"tokenizer has 495 tokens \(added tokens included\) "
                                                                r"but the embedding and output layer have 490 rows"),
    "gguf_chat_template_nested_loops": ("PromptError", "steps"),
    "tokenizer_json_120mb": ("CheckpointError", "tokenizer.json in .* is 120 MB"),
    "tokenizer_json_added_token_beyond_embedding": ("CheckpointError", "tokenizer has 491 tokens .* have 489 rows"),
    "weight_full_of_nan": ("CheckpointError", "layers.1.mlp.down_proj.weight' holds NaN"),
    "config_json_nested_10000_deep": ("CheckpointError", "config.json nests too deeply"),
    "config_text_config_list": ("CheckpointError", r"text_config = \[\] is not usable"),
    "generation_config_eos_text": ("CheckpointError", "generation_config.json: eos_token_id = 'abc'"),
    "generation_config_eos_10_30": ("CheckpointError", "generation_config.json: eos_token_id = 10000000"),
    "dtype_int8": ("SettingError", "unsupported dtype 'int8'"),
    "chat_template_nested_loops": ("PromptError", "chat template was stopped: it took more than"),
    "chat_template_huge_string": ("PromptError", "'\\*' would make a value of more than"),
}
MAX_SECONDS = 60  # each case; all are refused in well under a second of work (loading JAX aside)
MAX_GROWTH_MB = 400  # peak resident memory growth of each case (loading a tiny model included)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = hostile_checkpoints.write_all(tmp_path_factory.mktemp("hostile_checkpoints"))
    return run_cases("hostile_checkpoints", list(EXPECTED), memory_gb=5, timeout=900, args=[str(folder)])


@pytest.mark.parametrize("case", list(EXPECTED))
def test_hostile_checkpoint_is_refused_quickly_in_bounded_memory(results, case):
    check_case(results[case], *EXPECTED[case], max_seconds=MAX_SECONDS, max_growth_mb=MAX_GROWTH_MB)


def test_the_process_keeps_working_after_every_case(results):
    works = results["still_works"]
    assert set(works) == {"good", "good.gguf"} and all(1 <= n <= 3 for n in works.values()), works
    assert results["peak_mb"] < 1500, results["peak_mb"]  # the whole child, a tiny model loaded (~520 MB)


class _Tokenizer:
    def __init__(self, size, added=(), image_token=None):
        self.size, self.added_tokens_decoder = size, {i: None for i in added}
        self.special_tokens_map = {"image_token": "<img>"} if image_token is not None else {}
        self.image_token = image_token

    def __len__(self):
        return self.size

    def convert_tokens_to_ids(self, token):
        return self.image_token


def test_vocabulary_rule_keeps_legitimate_layouts():
    from omnijax.app.vocabulary import check_vocabulary
    from omnijax.common.errors import CheckpointError

    check_vocabulary(_Tokenizer(262145, added=[262144]), 262208, (262144,), (1, 106), "gemma-3-4b")  # padding rows
    check_vocabulary(_Tokenizer(490, added=[489]), 489, (489,), (1,), "tiny gemma3")  # soft token == vocab_size
    check_vocabulary(_Tokenizer(262144), 262144, (), (1,), "gemma-3-270m")
    # a text-only model whose tokenizer declares the image soft token of its multimodal sibling at vocab_size
    check_vocabulary(_Tokenizer(262145, added=[262144], image_token=262144), 262144, (), (1, 106), "gemma-3-1b")
    with pytest.raises(CheckpointError, match="tokenizer has 262145 tokens"):
        check_vocabulary(_Tokenizer(262145, added=[262144]), 262144, (), (1, 106), "x")  # an undeclared extra
    with pytest.raises(CheckpointError, match="tokenizer has 491 tokens .* have 489 rows: 1 token id"):
        check_vocabulary(_Tokenizer(491, added=[489, 490]), 489, (489,), (1,), "x")
    with pytest.raises(CheckpointError, match="tokenizer has 601 tokens"):
        check_vocabulary(_Tokenizer(480, added=[600]), 600, (), (1,), "x")  # an added id past len(tokenizer)
    with pytest.raises(CheckpointError, match=r"end-of-generation id\(s\) \[700\]"):
        check_vocabulary(_Tokenizer(480), 600, (), (1, 700), "x")


def test_load_settings_are_checked_before_anything_is_read(tmp_path):
    from omnijax.app.pipeline import Pipeline
    from omnijax.common.errors import SettingError

    for kwargs, message in [({"dtype": "int8"}, "unsupported dtype"), ({"max_context": 0}, "max_context must be"),
                            ({"max_context": True}, "max_context must be"), ({"model_axis": 0}, "model_axis must be"),
                            ({"max_audio_seconds": float("nan")}, "max_audio_seconds must be"),
                            ({"max_audio_seconds": 1e12}, "max_audio_seconds must be")]:
        with pytest.raises(SettingError, match=message):
            Pipeline.from_pretrained(tmp_path / "not even read", **kwargs)
        with pytest.raises(ValueError):  # also a ValueError, as before
            Pipeline.from_pretrained(tmp_path / "not even read", **kwargs)
