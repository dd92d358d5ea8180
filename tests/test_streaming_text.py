"""Streamed text is the final text, for every token sequence, with O(1) decoding work per token.

Random token sequences go through the answer builder ``Pipeline.generate`` and ``Pipeline.stream`` share, with the
tokenizers of both families: Gemma 3's SentencePiece-style vocabulary (byte-fallback tokens decoded a run at a time)
and Qwen3-Omni's byte-level one (partial UTF-8 sequences in single tokens), special tokens and end ids mixed in.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from fixtures import tiny_gemma3 as dm
from omnijax.app.answer_text import AnswerText
from omnijax.app.detokenize import IncrementalDetokenizer
from omnijax.preprocess.tokenizer import byte_fallback_ids, load_tokenizer, special_tokens


@pytest.fixture(scope="module", params=["gemma3", "qwen3_omni"])
def tokenizer(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"tok_{request.param}")
    if request.param == "gemma3":
        cfg = dm.TINY_GEMMA3_CONFIG
        dm.write_tokenizer_and_processor(folder, image_size=cfg["vision_config"]["image_size"],
                                         mm_tokens_per_image=cfg["mm_tokens_per_image"])
    else:
        import fixtures.qwen3_omni_checkpoint as qc

        qc.build_tokenizer_and_processor_files(folder)
    return load_tokenizer(pathlib.Path(folder))


def decoder_of(tokenizer):
    calls = {"tokens": 0}

    def decode(ids):
        calls["tokens"] += len(ids)
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    return decode, calls


def random_sequence(rng, tokenizer, length: int) -> list[int]:
    """Token ids drawn to stress decoding: long runs of byte tokens (or of single-byte byte-level tokens), special
    tokens in the middle of runs, ordinary tokens."""
    vocab = tokenizer.get_vocab()
    specials = sorted(set(special_tokens(tokenizer).values()))
    byte_ids = sorted(byte_fallback_ids(tokenizer)) or sorted(i for t, i in vocab.items() if len(t) == 1)
    ordinary = sorted(set(vocab.values()) - set(specials) - set(byte_ids))
    out: list[int] = []
    while len(out) < length:
        kind = rng.choice(["bytes", "ordinary", "special"], p=[0.5, 0.4, 0.1])
        if kind == "bytes":
            out += [int(rng.choice(byte_ids)) for _ in range(int(rng.integers(1, 7)))]
        elif kind == "ordinary":
            out += [int(rng.choice(ordinary)) for _ in range(int(rng.integers(1, 4)))]
        else:
            out.append(int(rng.choice(specials)))
    return out[:length]


def run_answer(tokenizer, ids, stops=None, eos_ids=()):
    decode, calls = decoder_of(tokenizer)
    answer = AnswerText(decode, IncrementalDetokenizer.for_tokenizer(tokenizer, decode), stops, eos_ids)
    pieces, shown = [], ""
    for t in ids:
        piece = answer.push(t)
        pieces.append(piece)
        shown += piece
        if answer.done:
            break
    pieces.append(answer.finish())
    return answer, pieces, calls


def test_streamed_text_equals_the_final_text_for_random_tokens(tokenizer):
    rng = np.random.default_rng(0)
    eos = special_tokens(tokenizer)[tokenizer.eos_token] if tokenizer.eos_token else None
    replaced = 0
    for trial in range(300):
        ids = random_sequence(rng, tokenizer, int(rng.integers(1, 50)))
        answer, pieces, _ = run_answer(tokenizer, ids, eos_ids=[eos] if trial % 3 == 0 and eos is not None else [])
        answer_ids = answer.token_ids[:-1] if answer.finish_reason == "eos" else answer.token_ids
        final = tokenizer.decode(answer_ids, skip_special_tokens=True)
        assert "".join(pieces) == answer.text == final, (ids, pieces)
        joined = ""
        for piece in pieces:  # every prefix shown was a prefix of the final text
            joined += piece
            assert final.startswith(joined)
        replaced += "\ufffd" in final
    assert replaced > 50  # the sequences do hit invalid bytes


def test_stop_strings_cut_the_streamed_and_the_final_text_alike(tokenizer):
    rng = np.random.default_rng(1)
    stopped = 0
    for _ in range(200):
        ids = random_sequence(rng, tokenizer, int(rng.integers(2, 40)))
        full = tokenizer.decode(ids, skip_special_tokens=True)
        if len(full) < 3:
            continue
        start = int(rng.integers(0, len(full) - 1))
        stops = [full[start:start + int(rng.integers(1, 4))], "never appears \u2603"]
        answer, pieces, _ = run_answer(tokenizer, ids, stops)
        assert "".join(pieces) == answer.text
        assert not any(s in answer.text for s in stops)
        if answer.finish_reason == "stop":
            stopped += 1
            rest = tokenizer.decode(answer.token_ids, skip_special_tokens=True)
            assert rest.startswith(answer.text) and any(rest[len(answer.text):].startswith(s) for s in stops)
        else:
            assert answer.text == full and answer.finish_reason == "length"
    assert stopped > 100


def test_decoding_work_per_token_is_bounded(tokenizer):
    rng = np.random.default_rng(2)
    byte_ids = sorted(byte_fallback_ids(tokenizer)) or sorted(i for t, i in tokenizer.get_vocab().items()
                                                               if len(t) == 1)
    ids = random_sequence(rng, tokenizer, 3000)
    ids[1000:1400] = [int(rng.choice(byte_ids)) for _ in range(400)]  # one very long run of bytes
    _, _, calls = run_answer(tokenizer, ids, stops=["\n\n\n", "zzz"])
    # the final decode of the whole answer is one pass; per token a few short windows
    assert calls["tokens"] <= 12 * len(ids), calls["tokens"] / len(ids)


def test_held_text_is_released_by_the_next_token():
    """A lossy byte-level decode: an unfinished character waits, a finished or invalid one is shown."""
    table = {1: b"ab", 2: b"\xe2", 3: b"\x82", 4: b"\xac", 5: b" c", 6: b"\xff"}
    decode = lambda ids: b"".join(table[i] for i in ids).decode("utf-8", errors="replace")
    d = IncrementalDetokenizer(decode)
    assert [d.push(t) for t in (1, 2, 3, 4, 5)] == ["ab", "", "", "\u20ac", " c"]
    d = IncrementalDetokenizer(decode)
    assert [d.push(t) for t in (1, 2, 6, 5)] == ["ab", "", "\ufffd", "\ufffd c"]


@pytest.mark.parametrize("family", ["gemma3", "qwen3_omni"])
def test_stream_equals_generate_on_the_tiny_models(family, request):
    pipe = request.getfixturevalue("gemma3_pipeline" if family == "gemma3" else "qwen_pipeline")
    texts = []
    prompts = ("Hello", "Wie geht's? ☃") if family == "gemma3" else ("Wie geht's? ☃",)
    for prompt in prompts:  # the token budget of the parity tests: their programs are reused
        messages = [{"role": "user", "content": prompt}]
        full = pipe.generate(messages, max_new_tokens=16)
        pieces = []
        stream = pipe.stream(messages, max_new_tokens=16)
        while True:
            try:
                pieces.append(next(stream))
            except StopIteration as stop:
                result = stop.value
                break
        assert "".join(pieces) == result.text == full.text
        assert (result.token_ids, result.finish_reason) == (full.token_ids, full.finish_reason)
        texts.append(full.text)
    if family == "gemma3":
        assert any("\ufffd" in t for t in texts)  # the byte-fallback case that used to freeze the stream
