"""Structured outputs (``response_format``) on the tiny Gemma 3, whose random weights make the constraint the only
thing that makes its answers valid.

The pieces alone: the device's bitmask equals llguidance's own, a step's masks hold each matcher's row, the
builders and their refusals. Through the engine: a constrained request beside an unconstrained one (whose answer is
the one it gets alone), greedy constrained tokens whose raw log probabilities are the model's own, a new constraint
compiling nothing, a grammar llguidance refuses raising before any work. Through ``omnijax serve`` with the official
``openai`` client: JSON schemas on chat (streamed and not, sampled choices too) and completions, the regex and
choice extensions and vLLM's ``guided_*`` fields, and the 400s naming the field.
"""

from __future__ import annotations

import json

import httpx
import jax.numpy as jnp
import llguidance
import numpy as np
import openai
import pytest
from llguidance.numpy import apply_token_bitmask_inplace

from omnijax.app import grammar
from omnijax.app.sampling import apply_bitmask
from omnijax.common.errors import ConstraintError
from omnijax.preprocess.processor import PreparedPrompt
from test_server import DEADLINE_S, metric

SCHEMA = {"type": "object",
          "properties": {"answer": {"enum": ["yes", "no", "maybe"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 99},
                         "sure": {"type": "boolean"}},
          "required": ["answer", "count", "sure"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True}}
RAW = "The weather report for tomorrow says"
TOL = 1e-4


def check_reply(text: str) -> dict:
    """``text`` parsed, holding exactly SCHEMA's keys with values of their types and ranges."""
    reply = json.loads(text)
    assert set(reply) == {"answer", "count", "sure"}, reply
    assert reply["answer"] in ("yes", "no", "maybe")
    assert isinstance(reply["count"], int) and not isinstance(reply["count"], bool) and 0 <= reply["count"] <= 99
    assert isinstance(reply["sure"], bool)
    return reply


# ---- the pieces ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab,words", [(70, 3), (70, 2), (64, 2)])
def test_apply_bitmask_equals_llguidance(vocab, words):
    """Bits past the vocabulary are not read; ids past the mask's bits are not allowed."""
    rng = np.random.default_rng(vocab + words)
    logits = rng.standard_normal((3, vocab)).astype(np.float32)
    mask = rng.integers(-2**31, 2**31, (3, words), dtype=np.int64).astype(np.int32)
    mask[1] = -1  # a row without a constraint
    expected = logits.copy()
    apply_token_bitmask_inplace(expected, mask)
    got = np.asarray(apply_bitmask(jnp.asarray(logits), jnp.asarray(mask)))
    np.testing.assert_array_equal(got, expected)
    if words * 32 >= vocab:
        np.testing.assert_array_equal(got[1], logits[1])


def test_fill_masks_hold_each_matchers_row(gemma3_pipeline):
    grammars = gemma3_pipeline.scheduler.grammars
    tokenizer = grammars.tokenizer
    assert tokenizer.vocab_size >= gemma3_pipeline.config.decoder.vocab_size  # the image soft token lies past it
    digits = llguidance.LLMatcher(tokenizer, grammar.regex("[0-9]{2}").grammar)
    obj = grammars.matcher(grammar.json_object())
    masks = grammar.fill_masks([None, digits, obj], grammars.words)
    assert masks.shape == (3, grammars.words) and masks.dtype == np.int32
    assert np.all(masks[0] == -1)
    for row, m in ((1, digits), (2, obj)):
        np.testing.assert_array_equal(masks[row], np.frombuffer(m.compute_bitmask(), np.int32))
    assert obj.consume_tokens(tokenizer.tokenize_str('{"a": [1, 2]}')) and obj.is_stopped()
    assert not grammars.matcher(grammar.json_object()).consume_tokens(tokenizer.tokenize_str("[1]"))


def test_response_formats_and_their_refusals():
    assert grammar.from_response_format(None) is None
    assert grammar.from_response_format({"type": "text"}) is None
    assert grammar.from_response_format(JSON_SCHEMA).description == "json_schema 'reply'"
    assert grammar.from_response_format({"type": "json_object"}).description == "json_object"
    for kind, value in (("regex", "[a-z]+"), ("choice", ["yes", "no"]), ("grammar", 'start: "a" | "b"'),
                        ("grammar", 'root ::= "a" | "b"')):
        assert isinstance(grammar.from_response_format({"type": kind, kind: value}), grammar.Constraint)
    refused = {
        "type unknown": ({"type": "xml"}, "not supported"),
        "schema missing": ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs"),
        "schema refused": ({"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}, "Invalid type"),
        "regex refused": ({"type": "regex", "regex": "(ab"}, "unclosed group"),
        "choice empty": ({"type": "choice", "choice": []}, "non-empty list"),
        "grammar refused": ({"type": "grammar", "grammar": "start: foo"}, "unknown name"),
        "not an object": ("json", "must be an object"),
    }
    for value, message in refused.values():
        with pytest.raises(ConstraintError, match=message) as e:
            grammar.from_response_format(value)
        assert str(e.value).startswith("response_format: ")


# ---- through the engine ----------------------------------------------------------------------------------------

def test_constrained_beside_unconstrained(gemma3_pipeline):
    """The two decode side by side (the steps holding both draw with masks; the unconstrained row's is all ones, so
    its answer is the one it gets alone); sampled and streamed constrained answers parse too."""
    pipe = gemma3_pipeline
    prompt = pipe.prepare_raw(RAW)
    alone = pipe.generate_prepared([prompt], max_new_tokens=12, ignore_eos=True)[0]
    constrained = pipe.submit(prompt, max_new_tokens=60, response_format=JSON_SCHEMA)
    free = pipe.submit(prompt, max_new_tokens=12, ignore_eos=True)
    constrained, free = constrained.result(DEADLINE_S), free.result(DEADLINE_S)
    assert free.token_ids == alone.token_ids and free.text == alone.text
    assert constrained.finish_reason == "stop"  # complete: the request ended there
    check_reply(constrained.text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(alone.text)  # the premise: unconstrained, the random model writes no JSON
    sampled = pipe.generate(RAW, max_new_tokens=60, response_format=JSON_SCHEMA, temperature=1.0, seed=5, n=3)
    assert all(check_reply(r.text) for r in sampled)
    streamed = []
    result = collect(pipe.stream(RAW, max_new_tokens=60, response_format=JSON_SCHEMA), streamed)
    assert "".join(streamed) == result.text == constrained.text


def collect(generator, pieces: list):
    """Collect a ``Pipeline.stream``'s pieces into ``pieces``; its result."""
    while True:
        try:
            pieces.append(next(generator))
        except StopIteration as stop:
            return stop.value


def test_greedy_constrained_logprobs_are_the_models(gemma3_pipeline):
    """Raw: the model's log-softmax of each constrained token (its prompt logits over prompt + answer); processed:
    within the mask, so never below the raw value, and the greedy token is the most likely allowed one."""
    pipe = gemma3_pipeline
    prompt = pipe.prepare_raw(RAW)
    raw, processed = (pipe.generate_prepared([prompt], max_new_tokens=60, response_format=JSON_SCHEMA, logprobs=5,
                                             logprobs_mode=mode)[0] for mode in ("raw", "processed"))
    assert raw.token_ids == processed.token_ids
    answer = raw.token_ids
    ids = np.concatenate([prompt.token_ids, np.asarray(answer[:-1], prompt.token_ids.dtype)])
    logits = pipe.prompt_logits(PreparedPrompt(token_ids=ids, media={}, bidirectional=np.zeros(len(ids), bool)))
    top = logits.max(-1, keepdims=True)
    model = logits - top - np.log(np.sum(np.exp(logits - top), -1, keepdims=True))  # log-softmax
    n = len(prompt.token_ids)
    for step, (r, p) in enumerate(zip(raw.logprobs, processed.logprobs)):
        assert r.token_id == p.token_id == answer[step]
        assert abs(r.logprob - model[n - 1 + step, answer[step]]) < TOL, step
        assert p.logprob >= r.logprob - TOL and p.top[0][0] == answer[step]
    assert any(r.top[0][0] != r.token_id for r in raw.logprobs)  # the mask changed some greedy choices


def test_a_new_constraint_compiles_nothing_and_a_refused_one_does_no_work(gemma3_pipeline):
    """Decode steps take a mask only while a constrained request decodes: the others run the unmasked programs."""
    pipe = gemma3_pipeline
    slots = pipe.scheduler.slots
    step, masked = slots.step, []

    def recording_step(rows, chunks=None, logprobs=False, mask=None):
        if rows and chunks is None:  # a decode step (beside a prompt chunk the request does not decode yet)
            masked.append(mask is not None)
        return step(rows, chunks, logprobs=logprobs, mask=mask)

    slots.step = recording_step
    try:
        pipe.generate("Pick one:", max_new_tokens=4)  # (the unmasked programs of one row: compiled here if not yet)
        assert masked and not any(masked)
        masked.clear()
        first = pipe.generate("Pick one:", max_new_tokens=8, response_format={"type": "regex", "regex": "[0-9]{3}"})
        assert len(first.text) == 3 and first.text.isdigit() and first.finish_reason == "stop"
        assert masked and all(masked)
        before = pipe.compilations()
        second = pipe.generate("Say it now:", max_new_tokens=8, response_format={"type": "choice",
                                                                               "choice": ["left", "right"]})
        assert second.text in ("left", "right") and pipe.compilations() == before
    finally:
        slots.step = step
    steps = pipe.scheduler.stats.steps
    for bad in ({"type": "regex", "regex": "(ab"}, {"type": "json_schema", "json_schema": {"schema": []}}):
        with pytest.raises(ConstraintError, match="response_format"):
            pipe.generate(RAW, max_new_tokens=4, response_format=bad)
    assert pipe.scheduler.stats.steps == steps


def test_the_generate_command_takes_a_response_format(gemma3_pipeline, capsys, monkeypatch):
    from omnijax.demo.cli import main

    monkeypatch.setattr("omnijax.app.cli.load_pipeline", lambda args, **kwargs: gemma3_pipeline)
    choice = json.dumps({"type": "choice", "choice": ["sunny", "rainy"]})
    assert main(["generate", "--raw", "--prompt", RAW, "--no-stream", "--response-format", choice]) == 0
    assert capsys.readouterr().out.strip() in ("sunny", "rainy")

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the response format was checked")

    monkeypatch.setattr("omnijax.app.cli.load_pipeline", no_model)
    for value, message in (('{"type": "regex", "regex": "(ab"}', "unclosed group"), ("{json", "not valid JSON")):
        assert main(["generate", "--prompt", "hi", "--response-format", value]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("omnijax: error: --response-format") and message in err[0], err


# ---- through the server ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(gemma3_server):
    return gemma3_server


@pytest.fixture(scope="module")
def client(gemma3_client):
    return gemma3_client


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat_json_schema_streamed_and_not(client, gemma3_pipeline):
    messages = chat("Is it going to rain?")
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=60, temperature=0,
                                           response_format=JSON_SCHEMA)
    choice = reply.choices[0]
    check_reply(choice.message.content)
    assert choice.finish_reason == "stop"
    expected = gemma3_pipeline.generate([{"role": "user", "content": [{"type": "text", "text": "Is it going to rain?"}]}],
                                        max_new_tokens=60, response_format=JSON_SCHEMA)
    assert choice.message.content == expected.text
    chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=60, temperature=0,
                                            response_format=JSON_SCHEMA, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    sampled = client.chat.completions.create(model="tiny", messages=messages, max_tokens=60, temperature=1.0, seed=3,
                                             n=3, response_format=JSON_SCHEMA)
    assert all(check_reply(c.message.content) for c in sampled.choices)
    assert len({c.message.content for c in sampled.choices}) > 1


def test_completions_json_schema_and_guided_json(client):
    for extra in ({"response_format": JSON_SCHEMA}, {"guided_json": json.dumps(SCHEMA)}):
        reply = client.completions.create(model="tiny", prompt=RAW, max_tokens=60, temperature=0, extra_body=extra)
        check_reply(reply.choices[0].text)
        assert reply.choices[0].finish_reason == "stop"


def test_regex_choice_and_grammar_extensions(client):
    date = client.chat.completions.create(model="tiny", messages=chat("When?"), max_tokens=20, temperature=0,
                                          response_format={"type": "regex", "regex": r"20[0-9]{2}-[01][0-9]"})
    text = date.choices[0].message.content
    assert len(text) == 7 and text[:2] == "20" and text[4] == "-" and text.replace("-", "").isdigit()
    for extra in ({"response_format": {"type": "choice", "choice": ["sunny", "rainy"]}},
                  {"guided_choice": ["sunny", "rainy"]}):
        reply = client.completions.create(model="tiny", prompt=RAW, max_tokens=10, temperature=0, extra_body=extra)
        assert reply.choices[0].text in ("sunny", "rainy")
    lark = 'start: "It is " ("warm" | "cold") "."'
    for extra in ({"response_format": {"type": "grammar", "grammar": lark}}, {"guided_grammar": lark}):
        reply = client.completions.create(model="tiny", prompt=RAW, max_tokens=10, temperature=0, extra_body=extra)
        assert reply.choices[0].text in ("It is warm.", "It is cold.")


BAD = {
    "schema refused": ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "strin"}}}}, "response_format", "Invalid type"),
    "schema missing": ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                       "response_format", "needs"),
    "type unknown": ({"response_format": {"type": "yaml"}}, "response_format", "not supported"),
    "regex refused": ({"response_format": {"type": "regex", "regex": "[a-"}}, "response_format", "regex"),
    "guided_regex not a string": ({"guided_regex": 5}, "guided_regex", "must be a string"),
    "guided_choice empty": ({"guided_choice": []}, "guided_choice", "non-empty"),
    "two at once": ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "one"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_refused_response_format_is_a_400_before_any_work(server, case):
    extra, param, message = BAD[case]
    steps = metric(server, "omnijax_decode_steps_total")
    for path, body in (("chat/completions", {"messages": chat("hi")}), ("completions", {"prompt": RAW})):
        r = httpx.post(f"{server}/v1/{path}", json={"model": "tiny", "max_tokens": 4, **body, **extra},
                       timeout=DEADLINE_S)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and message in error["message"] and param in error["message"], error
    assert metric(server, "omnijax_decode_steps_total") == steps
