"""Pipeline.score: each token's log-probability given the ones before it, against transformers on the tiny Gemma 3
(float32), the windows that cut long texts, and ``omnijax score FILE``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from omnijax.app.scoring import perplexity, windows
from omnijax.common.errors import PromptError

pytestmark = pytest.mark.reference

TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Once upon a time, in a small village by the sea, there lived an old fisherman and his cat. " * 3,
         "ab"]


def reference_logprobs(hf_model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits
    logp = torch.log_softmax(logits[0].double(), dim=-1)
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()


def test_log_probabilities_equal_transformers(gemma3_pipeline, hf_gemma3_model):
    scores = gemma3_pipeline.score(TEXTS)
    assert len(scores) == len(TEXTS)
    for text, got in zip(TEXTS, scores):
        ids = gemma3_pipeline.prepare_raw(text).token_ids.tolist()
        ref = reference_logprobs(hf_gemma3_model, ids)
        assert got.dtype == np.float32 and got.shape == (len(ids) - 1,)
        assert np.all(got <= 0)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)
    assert gemma3_pipeline.score(TEXTS[0]).shape == scores[0].shape  # one text: one array


def test_long_texts_are_scored_in_windows_each_token_once(gemma3_pipeline, hf_gemma3_model):
    from omnijax.app.scoring import Scorer

    text = TEXTS[1]
    ids = gemma3_pipeline.prepare_raw(text).token_ids
    whole = Scorer(gemma3_pipeline).score(ids)
    small = Scorer(gemma3_pipeline, window=16)
    assert len(ids) > 3 * small.window
    cut = small.score(ids)
    assert cut.shape == whole.shape
    np.testing.assert_allclose(cut[:15], whole[:15], rtol=0, atol=1e-5)  # the first window sees the same context
    # each later token saw at least window - stride earlier tokens: the same as transformers with that context
    start, end, first = windows(len(ids), 16, 8)[2]
    ref = reference_logprobs(hf_gemma3_model, ids[start:end].tolist())
    np.testing.assert_allclose(cut[first - 1:end - 1], ref[first - 1 - start:], rtol=0, atol=1e-4)


def test_windows_cover_every_token_once():
    for n, window, stride in [(5, 8, 4), (8, 8, 4), (9, 8, 4), (100, 16, 8), (101, 10, 3), (40, 2, 1)]:
        spans = windows(n, window, stride)
        scored = [t for start, end, first in spans for t in range(first, end)]
        assert scored == list(range(1, n)), (n, window, stride)
        assert all(end - start <= window and start < first for start, end, first in spans)
    with pytest.raises(ValueError):
        windows(10, 8, 8)


def test_perplexity_of_log_probabilities():
    assert perplexity([np.log(np.full(4, 0.5, np.float32))]) == pytest.approx(2.0)
    assert math.isnan(perplexity([np.zeros(0, np.float32)]))


def test_score_takes_text(gemma3_pipeline):
    with pytest.raises(PromptError, match="strings"):
        gemma3_pipeline.score([1, 2, 3])
    for bad, name in ((None, "NoneType"), (b"some bytes", "bytes"), (42, "int")):
        with pytest.raises(PromptError, match=f"a text \\(a string\\) or a list of texts, got {name}"):
            gemma3_pipeline.score(bad)
    assert gemma3_pipeline.score("a").shape[0] == len(gemma3_pipeline.prepare_raw("a").token_ids) - 1
    with pytest.raises(PromptError, match="the texts to score holds more than 16777216 bytes"):
        gemma3_pipeline.score("a" * (16 << 20) + "b")


def test_a_text_longer_than_a_request_is_scored_in_windows(gemma3_pipeline, monkeypatch):
    """A text over a request's text cap (from the context budget; here lowered to 2,000 bytes) is scored whole:
    windows, not one context."""
    from omnijax.preprocess.request_limits import RequestBudget

    monkeypatch.setattr(gemma3_pipeline.processor, "budget", RequestBudget(max_text_bytes=2000))
    text = " ".join(TEXTS) * 20
    assert len(text) > 2000
    with pytest.raises(PromptError, match="bytes of text"):
        gemma3_pipeline.generate(text, max_new_tokens=1)
    logprobs = gemma3_pipeline.score(text)
    ids = gemma3_pipeline.prepare_raw(text, 1 << 20).token_ids
    assert logprobs.shape == (len(ids) - 1,) and np.isfinite(logprobs).all()


def test_score_command_prints_the_perplexity(tiny_gemma3_dir, tmp_path, capsys, gemma3_pipeline):
    from omnijax.demo.cli import main

    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(TEXTS[0])
    second.write_text(TEXTS[1])
    assert main(["score", "--model", str(tiny_gemma3_dir), str(first), str(second)]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = perplexity(gemma3_pipeline.score([TEXTS[0]]))
    assert out[0].startswith(f"{first}: perplexity ") and float(out[0].split()[2]) == pytest.approx(expected, rel=1e-3)
    assert out[-1].startswith("total: perplexity ")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00bad")
    assert main(["score", "--model", str(tiny_gemma3_dir), str(tmp_path / "bad.txt")]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse refuses an unknown --quantize before anything loads
        main(["score", "--model", str(tiny_gemma3_dir), "--quantize", "int3", str(first)])
