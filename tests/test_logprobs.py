"""Log probabilities of generated tokens and ``n`` > 1 choices, on the tiny Gemma 3 (float32).

The engine's log probabilities (the chosen token's and the top 20 at each generated position) equal transformers'
log-softmax of its logits over the prompt plus the generated tokens, for greedy and sampled requests alike (the
distribution before temperature / top-k / top-p); another top count compiles nothing, and a step with no request
asking for them runs the program without them. ``n`` choices share one prefill and sample with seed + i. Through
``omnijax serve`` with the official ``openai`` client: chat log probabilities streamed and not, completions'
``echo`` with the prompt's log probabilities and alternatives, ``n`` = 3 choices (streamed with their index), and
the 400s.
"""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from omnijax.app.requests import Request
from omnijax.app.sampling import SamplingParams, choice_seed
from omnijax.app.token_logprobs import TOP, check_logprobs
from omnijax.common.errors import SamplingError
from test_server import DEADLINE_S

pytestmark = pytest.mark.reference

RAW = "The old lighthouse stands at the end of the harbour road"
CHAT = [{"role": "user", "content": [{"type": "text", "text": "What colour is the sky?"}]}]
TOL = 1e-4


def reference_logprobs(hf_model, ids: list[int]) -> np.ndarray:
    """transformers' float32 log-softmax [len(ids), vocab] at every position of ``ids``."""
    import torch

    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([ids]),
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits
    return torch.log_softmax(logits[0].float(), dim=-1).numpy()


def check_against_reference(result, prompt_ids: list[int], hf_model) -> None:
    """Each generated token's log probability and the top 20 equal transformers' at its position (ids in the same
    order wherever the values are not tied)."""
    answer = list(result.token_ids)
    assert len(result.logprobs) == len(answer) > 0
    ref = reference_logprobs(hf_model, prompt_ids + answer)
    for step, record in enumerate(result.logprobs):
        row = ref[len(prompt_ids) - 1 + step]  # the position predicting token ``step`` of the answer
        assert record.token_id == answer[step]
        assert abs(record.logprob - row[answer[step]]) < TOL, (step, record.logprob, row[answer[step]])
        assert len(record.top) == TOP
        check_top(record.top, row, step)


def check_top(top, row: np.ndarray, where) -> None:
    """``top``'s (id, log probability) pairs are the ``len(top)`` largest of the reference log-softmax ``row``,
    largest first (ids in the same order wherever the values are not tied)."""
    ids = np.array([i for i, _ in top])
    values = np.array([v for _, v in top])
    np.testing.assert_allclose(values, row[ids], rtol=0, atol=TOL)  # each id's own value
    order = np.argsort(-row, kind="stable")[:len(top)]
    np.testing.assert_allclose(values, row[order], rtol=0, atol=TOL)  # the largest, largest first
    untied = np.abs(np.diff(row[order])) > 10 * TOL
    separated = np.concatenate([[True], untied]) & np.concatenate([untied, [True]])
    assert np.array_equal(ids[separated], order[separated]), where


def check_processed(pipe, raw, sampled, greedy) -> None:
    """``logprobs_mode="processed"``: the same tokens, with the log probabilities of what they were drawn from. At
    temperature T with top-k 5 that is log_softmax(logits / T) over the 5 most likely tokens (-inf elsewhere),
    which the raw values give: raw = logits - a constant, so processed_i = raw_i / T - logsumexp_(top 5)(raw / T).
    A greedy answer's are its raw ones."""
    processed = pipe.generate_prepared([raw], max_new_tokens=8, ignore_eos=True, logprobs=20, temperature=1.7,
                                       top_k=5, seed=11, logprobs_mode="processed")[0]
    assert processed.token_ids == sampled.token_ids
    for got, ref in zip(processed.logprobs, sampled.logprobs):
        ids = [i for i, _ in ref.top[:5]]
        scaled = np.array([v for _, v in ref.top[:5]]) / 1.7
        norm = np.log(np.sum(np.exp(scaled - scaled.max()))) + scaled.max()
        assert [i for i, _ in got.top[:5]] == ids
        np.testing.assert_allclose([v for _, v in got.top[:5]], scaled - norm, rtol=0, atol=TOL)
        assert all(v == -np.inf for _, v in got.top[5:]) and len(got.top) == TOP
        assert abs(got.logprob - (ref.logprob / 1.7 - norm)) < TOL
    as_drawn, own = (pipe.generate_prepared([raw], max_new_tokens=8, ignore_eos=True, logprobs=20,
                                            logprobs_mode=mode)[0] for mode in ("processed", "raw"))
    assert own.token_ids == greedy.token_ids
    assert [(r.token_id, r.logprob, r.top) for r in as_drawn.logprobs] == \
        [(r.token_id, r.logprob, r.top) for r in own.logprobs]


def test_greedy_and_sampled_logprobs_equal_transformers(gemma3_pipeline, hf_gemma3_model):
    pipe = gemma3_pipeline
    raw = pipe.prepare_raw(RAW)
    chat = pipe.prepare(CHAT)
    greedy = pipe.generate_prepared([raw, chat], max_new_tokens=8, ignore_eos=True, logprobs=20)
    for prompt, result in zip((raw, chat), greedy):
        check_against_reference(result, prompt.token_ids.tolist(), hf_gemma3_model)
        assert all(r.token_id == r.top[0][0] for r in result.logprobs)  # greedy: the most likely token
    # sampled: the values are the model's distribution's, not the one temperature / top-k reshaped
    sampled = pipe.generate_prepared([raw], max_new_tokens=8, ignore_eos=True, logprobs=20, temperature=1.7,
                                     top_k=5, seed=11)[0]
    check_against_reference(sampled, raw.token_ids.tolist(), hf_gemma3_model)
    assert sampled.token_ids != greedy[0].token_ids  # the premise: it did sample
    check_processed(pipe, raw, sampled, greedy[0])
    # the same tokens without logprobs; a request beside one that asks gets none
    plain = pipe.scheduler.submit(Request(raw, 8, ignore_eos=True))
    asking = pipe.scheduler.submit(Request(chat, 8, ignore_eos=True, logprobs=3))
    plain, asking = plain.result(DEADLINE_S), asking.result(DEADLINE_S)
    assert plain.logprobs is None and plain.token_ids == greedy[0].token_ids
    assert asking.token_ids == greedy[1].token_ids
    assert [(r.token_id, r.logprob, r.top) for r in asking.logprobs] == \
        [(r.token_id, r.logprob, r.top[:3]) for r in greedy[1].logprobs]


def test_prompt_logprobs_and_their_alternatives_equal_transformers(gemma3_pipeline, hf_gemma3_model):
    """Each prompt token's log probability given the ones before it and the 20 most likely tokens there (what
    ``echo`` shows), from the same prefill; asking for 2 alternatives keeps the first 2 of the same values."""
    pipe = gemma3_pipeline
    raw = pipe.prepare_raw(RAW)
    ids = raw.token_ids.tolist()
    ref = reference_logprobs(hf_gemma3_model, ids)
    result = pipe.submit(raw, max_new_tokens=1, prompt_logprobs=20).result(DEADLINE_S)
    assert len(result.prompt_logprobs) == len(result.prompt_top) == len(ids) - 1
    for t, (value, top) in enumerate(zip(result.prompt_logprobs, result.prompt_top)):
        assert abs(value - ref[t, ids[t + 1]]) < TOL, t
        assert len(top) == TOP
        check_top(top, ref[t], t)
    two = pipe.submit(raw, max_new_tokens=1, prompt_logprobs=2).result(DEADLINE_S)
    assert np.array_equal(two.prompt_logprobs, result.prompt_logprobs)
    assert two.prompt_top == [top[:2] for top in result.prompt_top]
    alone = pipe.submit(raw, max_new_tokens=1, prompt_logprobs=True).result(DEADLINE_S)
    assert alone.prompt_top is None and np.array_equal(alone.prompt_logprobs, result.prompt_logprobs)
    with pytest.raises(SamplingError, match="prompt_logprobs"):
        pipe.submit(raw, prompt_logprobs=21)


def test_another_top_count_compiles_nothing_and_plain_steps_run_without(gemma3_pipeline):
    pipe = gemma3_pipeline
    slots = pipe.scheduler.slots
    pipe.generate(RAW, max_new_tokens=4, logprobs=2)  # the logprob variants of this row count: compiled once
    pipe.generate(RAW, max_new_tokens=4)
    calls = []
    step, insert = slots.step, slots.insert

    def recording_step(rows, chunks=None, logprobs=False, mask=None):
        if chunks is None:  # a decode step (a step with the prompt's chunk decodes no row of this request yet)
            calls.append(("decode", logprobs))
        return step(rows, chunks, logprobs=logprobs, mask=mask)

    def recording_insert(*args, **kwargs):
        calls.append(("insert", args[-1]))
        return insert(*args, **kwargs)

    slots.step, slots.insert = recording_step, recording_insert
    try:
        before = pipe.compilations()
        events = list(pipe.submit(RAW, max_new_tokens=5, logprobs=17).events())
        assert pipe.compilations() == before
        assert [len(e.logprob.top) for e in events if e.token_id is not None] == [17] * 5
        asked = list(calls)
        calls.clear()
        assert pipe.generate(RAW, max_new_tokens=5).logprobs is None
        assert pipe.compilations() == before
    finally:
        slots.step, slots.insert = step, insert
    assert asked and all(flag for _, flag in asked)
    assert calls and not any(flag for _, flag in calls)  # no request asked: the steps ran without logprobs


def test_logprobs_setting_is_checked(gemma3_pipeline):
    assert [check_logprobs(v) for v in (None, False, True, 0, 20)] == [None, None, 0, 0, 20]
    for bad in (21, -1, 2.0, "3"):
        with pytest.raises(SamplingError, match="logprobs"):
            gemma3_pipeline.generate(RAW, max_new_tokens=2, logprobs=bad)
    for bad in ("logits", None, 1):
        with pytest.raises(SamplingError, match="logprobs_mode"):
            gemma3_pipeline.generate(RAW, max_new_tokens=2, logprobs=2, logprobs_mode=bad)
    for bad in (0, 9, 1.5):
        with pytest.raises(SamplingError, match="n must be"):
            gemma3_pipeline.generate(RAW, max_new_tokens=2, n=bad)
    assert choice_seed(2**63 - 1, 1) == -(2**63) and choice_seed(5, 2) == 7


def test_n_choices_share_one_prefill_and_sample_with_seed_plus_index(gemma3_pipeline):
    pipe = gemma3_pipeline
    prompt = pipe.prepare_raw("Notes for the day: the train leaves at 9:30 and returns at 18:45, bring water")
    assert len(prompt.token_ids) >= 16
    choices = pipe.generate_prepared([prompt], max_new_tokens=6, temperature=1.0, seed=41, n=2, ignore_eos=True,
                                     logprobs=0)[0]  # (logprobs: the program of two rows the first test compiled)
    assert len({tuple(c.token_ids) for c in choices}) == 2
    assert choices[0].cached_tokens == 0  # the one prefill
    assert choices[1].cached_tokens == len(prompt.token_ids)  # taken from it
    alone = pipe.generate_prepared([prompt], max_new_tokens=6, temperature=1.0, seed=42, ignore_eos=True,
                                   logprobs=0)[0]
    assert alone.token_ids == choices[1].token_ids  # choice i samples with seed + i


@pytest.mark.parametrize("family", ["gemma", "byte-level"])
def test_token_bytes_join_to_the_text(gemma3_pipeline, family):
    """Each token's bytes (byte-fallback tokens, ``▁`` pieces, byte-level pieces) joined give the text's UTF-8, and
    each token's offset is where its text starts."""
    from transformers import PreTrainedTokenizerFast

    from omnijax.app.token_text import TextOffsets, TokenText

    if family == "gemma":
        tokenizer = gemma3_pipeline.processor.tokenizer
    else:
        from fixtures.qwen3_omni_tokenizer import build_tokenizer

        tokenizer = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer())
    text = TokenText(tokenizer)
    assert text.byte_level == (family == "byte-level")
    sentence = "The café's naïve owner said: «ça va?» ✓ 9:30"
    ids = [i for i in tokenizer(sentence, add_special_tokens=False)["input_ids"]]
    assert len(ids) > 10
    assert b"".join(text.bytes_of(i) for i in ids) == sentence.encode()
    offsets = TextOffsets(text, 5)
    starts = [offsets.push(i) for i in ids]
    assert starts[0] == 5 and offsets.offset == 5 + len(sentence)
    pieces = [text.text_of(i) for i in ids]
    assert any(p.startswith("bytes:") for p in pieces)  # a character split over tokens: its parts as bytes
    whole = [(s - 5, p) for s, p in zip(starts, pieces) if not p.startswith("bytes:")]
    assert all(sentence[s:s + len(p)] == p for s, p in whole)


# ---- through the server ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(gemma3_server):
    return gemma3_server


@pytest.fixture(scope="module")
def client(gemma3_client):
    return gemma3_client


def chat_messages():
    return [{"role": "user", "content": "What colour is the sky?"}]


def test_chat_logprobs_streamed_and_not(client, gemma3_pipeline):
    reply = client.chat.completions.create(model="tiny", messages=chat_messages(), max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=5)
    choice = reply.choices[0]
    expected = gemma3_pipeline.generate(CHAT, max_new_tokens=8, logprobs=5)
    records = expected.logprobs[:-1] if expected.finish_reason == "eos" else expected.logprobs
    content = choice.logprobs.content
    assert len(content) == len(records) > 0
    for entry, record in zip(content, records):
        assert abs(entry.logprob - record.logprob) < TOL
        assert len(entry.top_logprobs) == 5
        assert [abs(t.logprob - v) < TOL for t, (_, v) in zip(entry.top_logprobs, record.top)] == [True] * 5
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token or entry.token.startswith("bytes:")
    assert choice.message.content == expected.text

    stream = client.chat.completions.create(model="tiny", messages=chat_messages(), max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=5, stream=True)
    streamed, text = [], ""
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.logprobs is not None and c.logprobs.content:
                streamed.extend(c.logprobs.content)
    assert text == choice.message.content
    assert [(e.token, e.logprob, e.bytes, [t.token for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, e.bytes, [t.token for t in e.top_logprobs]) for e in content]

    # the extension logprobs_mode "processed": what top-k 2 leaves, the third alternative impossible (-inf, written
    # -9999.0); each chosen token one of the two
    drawn = client.chat.completions.create(model="tiny", messages=chat_messages(), max_tokens=6, temperature=1.5,
                                           top_p=1.0, seed=4, logprobs=True, top_logprobs=3,
                                           extra_body={"top_k": 2, "logprobs_mode": "processed"})
    entries = drawn.choices[0].logprobs.content
    assert entries
    for e in entries:
        assert e.top_logprobs[2].logprob == -9999.0 and e.logprob > -9999.0
        assert e.token in (e.top_logprobs[0].token, e.top_logprobs[1].token)
        assert abs(np.logaddexp(e.top_logprobs[0].logprob, e.top_logprobs[1].logprob)) < TOL  # they hold all of it


def test_completions_echo_gives_the_prompt_logprobs(client, gemma3_pipeline, hf_gemma3_model):
    prompt = gemma3_pipeline.prepare_raw(RAW).token_ids.tolist()
    ref = reference_logprobs(hf_gemma3_model, prompt)
    reply = client.completions.create(model="tiny", prompt=RAW, max_tokens=4, temperature=0, echo=True, logprobs=3)
    choice = reply.choices[0]
    assert choice.text.startswith(RAW)
    logprobs = choice.logprobs
    n = len(prompt)
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) >= n + 1
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    np.testing.assert_allclose(logprobs.token_logprobs[1:n], [ref[t, prompt[t + 1]] for t in range(n - 1)], rtol=0,
                               atol=TOL)
    for t in range(1, n):  # the 3 most likely tokens there and the prompt's own (4 entries, or 3 when it is one)
        top = logprobs.top_logprobs[t]
        assert len(top) in (3, 4) and top[logprobs.tokens[t]] == logprobs.token_logprobs[t]
        largest = np.sort(ref[t - 1])[::-1][:3]
        np.testing.assert_allclose(sorted(top.values(), reverse=True)[:3], largest, rtol=0, atol=TOL)
    assert "".join(logprobs.tokens[1:n]) == RAW  # the prompt's own tokens after <bos>
    assert logprobs.text_offset[n] == len(RAW)  # the answer starts after the echoed prompt
    assert all(len(top) in (3, 4) for top in logprobs.top_logprobs[n:])
    # max_tokens 0: the prompt alone (what evaluation harnesses ask)
    only = client.completions.create(model="tiny", prompt=RAW, max_tokens=0, echo=True, logprobs=0).choices[0]
    assert only.text == RAW and only.logprobs.token_logprobs[1:] == logprobs.token_logprobs[1:n]


def test_n_choices_with_a_seed(client, server):
    ask = dict(model="tiny", messages=chat_messages(), max_tokens=8, temperature=1.0, seed=1234, n=3)
    first = client.chat.completions.create(**ask)
    assert [c.index for c in first.choices] == [0, 1, 2]
    answers = [c.message.content for c in first.choices]
    assert len(set(answers)) == 3
    assert [c.message.content for c in client.chat.completions.create(**ask).choices] == answers
    streamed = {i: "" for i in range(3)}
    for chunk in client.chat.completions.create(**ask, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert [streamed[i] for i in range(3)] == answers
    single = client.chat.completions.create(**{**ask, "n": 1, "seed": 1235}, logprobs=True).choices[0]
    assert single.message.content == answers[1]  # choice i samples with seed + i
    completions = client.completions.create(model="tiny", prompt=RAW, max_tokens=6, temperature=1.0, seed=7, n=3)
    assert [c.index for c in completions.choices] == [0, 1, 2]
    assert len({c.text for c in completions.choices}) == 3


BAD = {
    "top_logprobs over 20": ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    "top_logprobs without logprobs": ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    "logprobs not a boolean on chat": ("chat/completions", {"logprobs": 3}, "logprobs"),
    "echo on chat": ("chat/completions", {"echo": True}, "echo"),
    "n 0": ("chat/completions", {"n": 0}, "n"),
    "n 9": ("completions", {"n": 9}, "n"),
    "logprobs over 5 on completions": ("completions", {"logprobs": 6}, "logprobs"),
    "max_tokens 0 without echo": ("completions", {"max_tokens": 0}, "max_tokens"),
    "logprobs_mode unknown": ("chat/completions", {"logprobs": True, "logprobs_mode": "logits"}, "logprobs_mode"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_values_are_400_naming_the_param(server, case):
    path, extra, param = BAD[case]
    body = {"model": "tiny", **({"messages": chat_messages()} if path.startswith("chat") else {"prompt": RAW}),
            "max_tokens": 2, **extra}
    r = httpx.post(f"{server}/v1/{path}", json=body, timeout=DEADLINE_S)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
