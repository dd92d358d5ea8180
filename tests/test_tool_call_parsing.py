"""Tool calls without a model (app/tools.py, app/tool_grammar.py, app/tool_calls.py): each family format's parser
on answers that broke other servers (text before a call, two calls, nested arrays, strings holding ``}``, quotes or
brackets, Llama 4's JSON form), the streamed reading joining into the same calls, the checks of ``tools`` /
``tool_choice``, and each format's grammar compiled for the family's tiny vocabulary: it takes the answers the
parser reads and refuses what the tool choice forbids."""

from __future__ import annotations

import json

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from omnijax.app import tool_calls as tc
from omnijax.app import tool_grammar
from omnijax.app import tools as tool_specs
from omnijax.preprocess.tokenizer import special_tokens

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}},
        "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}
TOOLS = [WEATHER, CLOCK]
CITY = 'Pa}r"is [x]'  # a string holding a brace, a quote and brackets
ARGS = {"city": CITY, "days": 3, "tags": [["a", "]"], []]}
FORMAT_OF = {"gemma3": "prompt", "qwen3_omni": "hermes", "gemma4": "gemma4", "llama4": "llama4"}

# Answers in each format: text before the calls, the weather call with nested arrays and a tricky string, then a
# call with no arguments.
ANSWERS = {
    "hermes": ("Let me check.\n<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": ARGS})
               + "\n</tool_call>\n<tool_call>\n" + json.dumps({"name": "clock", "arguments": {}}) + "\n</tool_call>"),
    "gemma4": ('Let me check.<|tool_call>call:get_weather{city:<|"|>' + CITY + '<|"|>,days:3,tags:[[<|"|>a<|"|>,'
               '<|"|>]<|"|>],[]]}<tool_call|><|tool_call>call:clock{}<tool_call|>'),
    "llama4": ("Let me check. <|python_start|>[get_weather(city=" + json.dumps(CITY) + ', days=3, tags=[["a", "]"], '
               "[]]), clock()]<|python_end|>"),
}
ANSWERS["prompt"] = ANSWERS["hermes"]


def check_calls(calls: list, expected: list[tuple[str, dict]]) -> None:
    assert [(c.name, json.loads(c.arguments)) for c in calls] == expected
    assert len({c.id for c in calls}) == len(calls) and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize("fmt", tool_specs.FORMATS)
def test_text_before_two_calls_nested_arrays_and_tricky_strings(fmt):
    content, calls = tc.parse_calls(fmt, ANSWERS[fmt], ["<|python_start|>", "<|python_end|>", '<|"|>'])
    assert content == "Let me check."
    check_calls(calls, [("get_weather", ARGS), ("clock", {})])
    assert calls[0].as_openai() == {"id": calls[0].id, "type": "function",
                                    "function": {"name": "get_weather", "arguments": calls[0].arguments}}


def test_llama4_json_calls_and_bare_lists():
    """Without ``<|python_start|>`` Llama 4's calls are the whole answer (JSON calls, or a pythonic list); a list or
    an object inside other text is text."""
    text = ' {"name": "get_weather", "parameters": ' + json.dumps(ARGS) + '}; {"name": "clock", "parameters": {}}'
    content, calls = tc.parse_calls("llama4", text)
    assert content == ""
    check_calls(calls, [("get_weather", ARGS), ("clock", {})])
    content, calls = tc.parse_calls("llama4", '[clock(), get_weather(city="x", days=true)]\n')
    check_calls(calls, [("clock", {}), ("get_weather", {"city": "x", "days": True})])
    for text in ['First I look. {"name": "get_weather", "parameters": {"city": "x"}}',
                 'Sure. The user is {"name": "Alice", "age": 30}. Anything else?',
                 '{"name": "Alice", "age": 30}',  # an object with a name but no parameters is not a call
                 'See [1]. [clock(), get_weather(city="x")] Done.', "Use a list like [print(x=1)] here.",
                 "In Python, [f(a={1, 2})] builds a set", "[f(a={1, 2})]", "[f(a=b'x')]", "[f(a=1j)]",
                 "[f(a=1e999)]"]:
        assert tc.parse_calls("llama4", text) == (text, []), text


def test_pythonic_values_read_as_the_json_the_grammar_writes():
    """The grammar writes JSON values into pythonic calls: JSON's escapes (a surrogate pair, an escaped slash) mean
    what JSON says; Python's True / None are read too."""
    _, calls = tc.parse_calls("llama4", '[f(a="smile \\ud83d\\ude00", b="x\\/y", c=True, d=None)]')
    check_calls(calls, [("f", {"a": "smile \U0001F600", "b": "x/y", "c": True, "d": None})])
    calls[0].arguments.encode("utf-8")


def test_a_call_whose_string_holds_the_end_marker():
    text = 'hi <tool_call>\n{"name": "f", "arguments": {"s": "a</tool_call>b"}}\n</tool_call>'
    content, calls = tc.parse_calls("hermes", text)
    assert content == "hi"
    check_calls(calls, [("f", {"s": "a</tool_call>b"})])


def test_arguments_that_are_not_json_text_are_no_call():
    """A lone surrogate cannot be sent as UTF-8: the call stays text, never a failing response."""
    text = '<tool_call>\n{"name": "f", "arguments": {"s": "\\ud83d"}}\n</tool_call>'
    assert tc.parse_calls("hermes", text) == (text, [])


@pytest.mark.parametrize("fmt", ["gemma4", "llama4", "hermes"])
def test_a_schema_too_large_for_the_grammar_is_a_tool_error(fmt):
    """2,000 properties: the request's grammar compiles, or the request is refused naming ``tools`` (a
    RecursionError, a failure of the server, fails the test)."""
    wide = {"type": "function", "function": {"name": "wide", "parameters": {
        "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}}}}
    try:
        tc.tool_request([wide], "required", True, fmt)
    except tool_specs.ToolError as e:
        assert e.param.startswith("tools")


def test_gemma4_enum_of_arrays_is_refused():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"k": {"enum": [["a"], {"b": "c"}]}}}}}
    with pytest.raises(tool_specs.ToolError, match="enum"):
        tc.tool_request([tool], "required", True, "gemma4")


@pytest.mark.parametrize("fmt,text", [
    ("hermes", "No call here, just <tool_call> without its end"),
    ("hermes", "<tool_call>\nnot json\n</tool_call>"),
    ("gemma4", "<|tool_call>call:get_weather{city:<|\"|>unterminated"),
    ("llama4", "A list [1, 2] and f(x)"),
    ("llama4", "<|python_start|>[f(a=1)"),
])
def test_text_without_a_whole_call_stays_content(fmt, text):
    assert tc.parse_calls(fmt, text) == (text, [])


@pytest.mark.parametrize("fmt", tool_specs.FORMATS)
def test_streamed_reading_joins_into_the_same_answer(fmt):
    """Every prefix of the answer read in turn: the content deltas join into the content, each call comes once,
    whole, and no content is sent after the first call."""
    specials = ["<|python_start|>", "<|python_end|>", '<|"|>', "<|tool_call>", "<tool_call|>"]
    text = ANSWERS[fmt]
    stream = tc.CallStream(fmt, specials)
    sent, calls = "", []
    for end in range(1, len(text) + 1):
        delta, new = stream.update(text[:end])
        assert not (delta and calls)
        sent += delta
        calls += new
    delta, new = stream.finish(text)
    sent, calls = sent + delta, calls + new
    content, expected = tc.parse_calls(fmt, text, specials)
    assert sent == content == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in expected]


def test_streamed_text_without_calls_is_all_content():
    stream = tc.CallStream("hermes")
    text = "Plain <b>answer</b> with a < sign. "
    sent = "".join(stream.update(text[:end])[0] for end in range(1, len(text) + 1))
    assert text.startswith(sent) and sent + stream.finish(text)[0] == text


# ---- the request -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tools,choice,parallel,param", [
    ([{"type": "function", "function": {"description": "no name"}}], None, True, "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "has space"}}], None, True, "tools[0].function.name"),
    ([{"type": "retrieval"}], None, True, "tools[0].type"),
    ("get_weather", None, True, "tools"),
    ([WEATHER, WEATHER], None, True, "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], None, True,
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "strin"}}}}}], None, True, "tools[0].function.parameters"),
    (TOOLS, "sometimes", True, "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "unknown"}}, True, "tool_choice.function.name"),
    (TOOLS, {"type": "function"}, True, "tool_choice"),
    (TOOLS, None, "yes", "parallel_tool_calls"),
    (None, "required", True, "tool_choice"),
])
def test_bad_tools_are_refused_naming_the_field(tools, choice, parallel, param):
    with pytest.raises(tool_specs.ToolError) as e:
        tc.tool_request(tools, choice, parallel, "hermes")
    assert e.value.param == param and str(e.value).startswith(param + ": ")


def test_tool_choices():
    assert tc.tool_request(None) is None
    auto = tc.tool_request(TOOLS, None, True, "hermes")
    assert auto.choice == tool_specs.ToolChoice("auto") and auto.parses and auto.grammar.startswith("start: FREE")
    assert auto.template_tools()[0]["function"]["name"] == "get_weather"
    none = tc.tool_request(TOOLS, "none", True, "hermes")
    assert none.grammar is None and not none.parses
    named = tc.tool_request(TOOLS, {"type": "function", "function": {"name": "clock"}}, True, "hermes")
    assert named.choice == tool_specs.ToolChoice("function", "clock") and "get_weather" not in named.grammar


def test_gemma4_grammar_refuses_keywords_it_cannot_enforce():
    pattern = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "[0-9]+"}}}}}
    with pytest.raises(tool_specs.ToolError, match="'pattern' is not supported") as e:
        tc.tool_request([pattern], "required", True, "gemma4")
    assert e.value.param == "tools[0].function.parameters.properties.code"
    assert tc.tool_request([pattern], "required", True, "hermes").grammar  # JSON formats: llguidance's schema


def test_gemma4_text_is_the_templates_argument_syntax():
    assert tool_grammar.gemma4_text({"b": [1, "x"], "a": {"k": None, "t": True}}) == \
        '{a:{k:null,t:true},b:[1,<|"|>x<|"|>]}'


# ---- grammars on each family's vocabulary ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from fixtures.tool_tokenizers import write_tokenizer_folders

    folders = write_tokenizer_folders(tmp_path_factory.mktemp("tool_tokenizers"))
    return {family: AutoTokenizer.from_pretrained(folder) for family, folder in folders.items()}


def matcher(tokenizer, fmt: str, choice, parallel: bool = True) -> llguidance.LLMatcher:
    request = tc.tool_request(TOOLS, choice, parallel, fmt, tokenizer.get_added_vocab())
    ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    m = llguidance.LLMatcher(ll, request.grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def takes(tokenizer, fmt: str, choice, text: str, parallel: bool = True) -> bool:
    """Whether the grammar of ``choice`` takes ``text`` whole (every token, and may end there)."""
    m = matcher(tokenizer, fmt, choice, parallel)
    return m.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and m.is_accepting()


@pytest.mark.parametrize("family", list(FORMAT_OF))
def test_grammar_takes_the_calls_the_parser_reads(tokenizers, family):
    tokenizer, fmt = tokenizers[family], FORMAT_OF[family]
    text = ANSWERS[fmt]
    calls_only = text.split("Let me check.", 1)[1].lstrip()
    required = calls_only.replace("<|python_start|>", "").replace("<|python_end|>", "")
    assert takes(tokenizer, fmt, "required", required)
    assert takes(tokenizer, fmt, "auto", text)
    assert takes(tokenizer, fmt, "auto", "Only text, with [brackets] and <b>tags</b>.")
    assert not takes(tokenizer, fmt, "required", text)  # text before the calls: refused
    assert not takes(tokenizer, fmt, "required", required, parallel=False)  # two calls
    named = {"type": "function", "function": {"name": "clock"}}
    assert not takes(tokenizer, fmt, named, required)  # another function
    content, calls = tc.parse_calls(fmt, required, special_tokens(tokenizer))
    assert content == "" and [c.name for c in calls] == ["get_weather", "clock"]


@pytest.mark.parametrize("family", list(FORMAT_OF))
def test_grammar_refuses_arguments_off_the_schema(tokenizers, family):
    tokenizer, fmt = tokenizers[family], FORMAT_OF[family]
    wrong = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>',
             "gemma4": "<|tool_call>call:get_weather{days:3}<tool_call|>",
             "llama4": "[get_weather(days=3)]"}
    wrong["prompt"] = wrong["hermes"]
    assert not takes(tokenizer, fmt, "required", wrong[fmt])  # the required city is missing
    m = matcher(tokenizer, fmt, "required")
    assert not m.is_accepting()  # a call is required: the answer cannot end before it


def test_gemma4_grammar_bounds_strings_items_and_numbers(tokenizers):
    tokenizer = tokenizers["gemma4"]
    bounded = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 3}, "n": {"type": "integer", "minimum": 1, "maximum": 5},
        "xs": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "boolean"}},
        "e": {"enum": ["a", 2, None]}}, "required": ["s", "n", "xs"]}}}]
    request = tc.tool_request(bounded, "required", False, "gemma4", tokenizer.get_added_vocab())
    ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))

    def takes_args(args: str) -> bool:
        m = llguidance.LLMatcher(ll, request.grammar, log_level=0)
        ids = tokenizer.encode(f"<|tool_call>call:f{{{args}}}<tool_call|>", add_special_tokens=False)
        return m.consume_tokens(ids) and m.is_accepting()

    good = 'n:5,s:<|"|>a}"<|"|>,xs:[true,false]'
    assert takes_args(good) and takes_args('e:<|"|>a<|"|>,' + good) and takes_args("e:null," + good)
    for bad in ('n:5,s:<|"|>abcd<|"|>,xs:[true]', 'n:6,s:<|"|>a<|"|>,xs:[true]', 'n:5,s:<|"|>a<|"|>,xs:[]',
                'n:5,s:<|"|>a<|"|>,xs:[true,true,true]', 'e:3,' + good, 's:<|"|>a<|"|>,n:5,xs:[true]'):
        assert not takes_args(bad), bad  # too long, too large, too few, too many, not in the enum, not sorted
