"""Tool calls end to end on tiny random checkpoints, whose weights make the grammar the only reason an answer is a
valid call: through ``omnijax serve`` (the shared tiny Gemma 3 server, its prompt format) with the official
``openai`` client (``required``, a named function, one call only, streamed deltas joining into the same calls,
``none``, tool results sent back, the 400s naming the field), and through the Python API on Qwen3-Omni, Gemma 4 and
Llama 4 (each family's native format)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from omnijax.demo.openai_tool_stream import ToolDeltas
from test_server import DEADLINE_S

pytestmark = pytest.mark.slow  # a server, and four families' pipelines answering up to 200 tokens

PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8},
    "days": {"type": "integer", "minimum": 1, "maximum": 9},
    "tags": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2,
                                                        "items": {"type": "string", "maxLength": 3}}}},
    "required": ["city", "tags"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city.",
                                            "parameters": PARAMS}}
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {},
                                                         "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
SCHEMAS = {"get_weather": PARAMS, "clock": CLOCK["function"]["parameters"]}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 200  # a call of these bounded schemas takes fewer tokens


def valid(value, schema: dict) -> bool:
    """Whether ``value`` follows ``schema`` (the keywords these tests use)."""
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", []))
                and (schema.get("additionalProperties", True) is not False or set(value) <= set(props))
                and all(valid(v, props[k]) for k, v in value.items() if k in props))
    if kind == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", len(value))
                and all(valid(v, schema["items"]) for v in value))
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema.get("minimum", value) <= value <= schema.get("maximum", value))
    raise AssertionError(f"untested schema {schema}")


def check_call(name: str, arguments: str, names=tuple(SCHEMAS)) -> dict:
    """The call's arguments, parsed and checked against its function's schema."""
    assert name in names, name
    args = json.loads(arguments)
    assert valid(args, SCHEMAS[name]), (name, args)
    return args


# ---- through the server -----------------------------------------------------------------------------------------

def ask(client, **kwargs):
    settings = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0.0, **kwargs}
    return client.chat.completions.create(model="tiny", **settings)


def test_required_gives_calls_that_follow_their_schemas(gemma3_client):
    reply = ask(gemma3_client, tools=TOOLS, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None  # required: the answer is calls only
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        check_call(call.function.name, call.function.arguments)
    assert len({c.id for c in calls}) == len(calls)


def test_named_function_and_one_call_only(gemma3_client):
    named = ask(gemma3_client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [call] = named.choices[0].message.tool_calls
    args = check_call(call.function.name, call.function.arguments, names=("get_weather",))
    assert "city" in args and "tags" in args
    single = ask(gemma3_client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                 seed=3, n=2)
    for choice in single.choices:
        [call] = choice.message.tool_calls
        check_call(call.function.name, call.function.arguments)


def test_streamed_deltas_join_into_the_same_calls(gemma3_client):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        whole = ask(gemma3_client, tools=TOOLS, tool_choice=choice).choices[0].message.tool_calls
        joined: dict[int, dict] = {}
        reasons, content = [], ""
        for chunk in ask(gemma3_client, tools=TOOLS, tool_choice=choice, stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                reasons.append(c.finish_reason)
                for delta in c.delta.tool_calls or []:
                    # every delta names its call (strict clients need id, type and name on each)
                    assert delta.id and delta.type == "function" and delta.function.name
                    entry = joined.setdefault(delta.index, {"id": delta.id, "name": delta.function.name,
                                                            "arguments": ""})
                    assert (entry["id"], entry["name"]) == (delta.id, delta.function.name)
                    entry["arguments"] += delta.function.arguments or ""
        assert content == "" and reasons[-1] == "tool_calls"
        assert sorted(joined) == list(range(len(whole)))
        assert [(joined[i]["name"], json.loads(joined[i]["arguments"])) for i in sorted(joined)] == \
            [(c.function.name, json.loads(c.function.arguments)) for c in whole]


def test_none_gives_text(gemma3_client):
    reply = ask(gemma3_client, tools=TOOLS, tool_choice="none", max_tokens=12)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    plain = ask(gemma3_client, max_tokens=12, messages=[{"role": "system", "content": "x"}, *MESSAGES])
    assert isinstance(choice.message.content, str) and plain.choices[0].message.content is not None


def test_auto_answers_text_or_valid_calls(gemma3_client):
    for seed in range(3):
        choice = ask(gemma3_client, tools=TOOLS, temperature=1.0, seed=seed).choices[0]
        for call in choice.message.tool_calls or []:
            check_call(call.function.name, call.function.arguments)
        assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
        assert "<tool_call>" not in (choice.message.content or "")  # a started call is always a whole call


def test_tool_results_go_back_through_the_prompt(gemma3_client, gemma3_pipeline):
    """An assistant turn with calls and the tool results: the server's prompt is the one the Python API makes."""
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": json.dumps({"city": "Paris"})}}]
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear", "note": "a } and \\""}'}]
    reply = ask(gemma3_client, tools=TOOLS, messages=messages, tool_choice="none", max_tokens=4)
    expected = gemma3_pipeline.prepare(messages, tools=TOOLS)
    without = gemma3_pipeline.prepare(MESSAGES, tools=TOOLS)
    assert reply.usage.prompt_tokens == len(expected.token_ids) > len(without.token_ids)
    text = gemma3_pipeline.processor.tokenizer.decode(expected.token_ids)
    assert '<tool_response>\n{"sky": "clear", "note": "a } and \\""}\n</tool_response>' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text


BAD = {
    "a tool without a name": ({"tools": [{"type": "function", "function": {"parameters": PARAMS}}]},
                              "tools[0].function.name"),
    "a schema llguidance refuses": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "strin"}}}}}]}, "tools[0].function.parameters"),
    "an unknown function": ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                            "tool_choice.function.name"),
    "tools not a list": ({"tools": {"type": "function"}}, "tools"),
    "parallel_tool_calls not a boolean": ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    "required without tools": ({"tool_choice": "required"}, "tool_choice"),
    "a tool choice of another kind": ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    "tools and a response format": ({"tools": TOOLS, "tool_choice": "required",
                                     "response_format": {"type": "json_object"}}, "response_format"),
    "arguments that are not JSON": ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "clock", "arguments": "{oops"}}]}]},
        "messages[1].tool_calls[0].function.arguments"),
    "deprecated functions": ({"functions": [{"name": "f"}]}, "functions"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_tools_get_a_400_naming_the_field(gemma3_server, case):
    body, param = BAD[case]
    r = httpx.post(gemma3_server + "/v1/chat/completions", timeout=DEADLINE_S,
                   json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_tools_on_completions_and_with_the_client(gemma3_server, gemma3_client):
    r = httpx.post(gemma3_server + "/v1/completions", timeout=DEADLINE_S,
                   json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        ask(gemma3_client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "nope" in str(e.value)


# ---- through the Python API, each family's own format -----------------------------------------------------------

@pytest.mark.parametrize("family", ["gemma3", "qwen3_omni", "gemma4", "llama4"])
def test_required_calls_in_each_familys_format(request, family):
    fixture = {"gemma3": "gemma3_pipeline", "qwen3_omni": "qwen_pipeline", "gemma4": "gemma4_text_pipeline",
               "llama4": "llama4_text_pipeline"}[family]
    pipe = request.getfixturevalue(fixture)
    assert pipe.tool_format == {"gemma3": "prompt", "qwen3_omni": "hermes", "gemma4": "gemma4",
                                "llama4": "llama4"}[family]
    out = pipe.generate(MESSAGES, tools=TOOLS, tool_choice="required", max_new_tokens=MAX_TOKENS)
    assert out.tool_calls and out.content == ""
    for call in out.tool_calls:
        check_call(call.name, call.arguments)
    # the server's stream of the same tokens, one at a time (the raw text holds the family's special markers)
    deltas = ToolDeltas(pipe, pipe.check_tools(TOOLS, "required"))
    sent = [d for t in out.token_ids for d in deltas.update(t)] + deltas.finish(out)
    assert [d["tool_calls"][0]["index"] for d in sent] == list(range(len(out.tool_calls)))
    assert [(d["tool_calls"][0]["function"]["name"], d["tool_calls"][0]["function"]["arguments"]) for d in sent] \
        == [(c.name, c.arguments) for c in out.tool_calls]
    [named] = pipe.generate(MESSAGES, tools=TOOLS, max_new_tokens=MAX_TOKENS,
                            tool_choice={"type": "function", "function": {"name": "get_weather"}}).tool_calls
    check_call(named.name, named.arguments, names=("get_weather",))
    plain = pipe.generate(MESSAGES, tools=TOOLS, tool_choice="none", max_new_tokens=4)
    assert plain.tool_calls is None and plain.content is None


def test_cli_prints_the_calls(tiny_gemma3_dir, gemma3_pipeline, capsys):
    from omnijax.app.cli import main

    named = {"type": "function", "function": {"name": "get_weather"}}
    expected = gemma3_pipeline.generate(MESSAGES, tools=TOOLS, tool_choice=named, max_new_tokens=MAX_TOKENS)
    code = main(["generate", "--model", str(tiny_gemma3_dir), "--prompt", MESSAGES[0]["content"], "--tools",
                 json.dumps(TOOLS), "--tool-choice", "get_weather", "--max-new-tokens", str(MAX_TOKENS)])
    assert code == 0
    [line] = capsys.readouterr().out.splitlines()
    call = json.loads(line)
    assert call == {"name": "get_weather", "arguments": json.loads(expected.tool_calls[0].arguments)}
    check_call(call["name"], json.dumps(call["arguments"]), names=("get_weather",))
    code = main(["generate", "--model", str(tiny_gemma3_dir), "--prompt", "hi", "--tools", json.dumps(TOOLS),
                 "--tool-choice", "nope"])
    assert code == 2 and "--tool-choice.function.name" in capsys.readouterr().err
