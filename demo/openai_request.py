"""One OpenAI chat or completions request body, from JSON to the answer's JSON: the steps ``omnijax serve``
(demo/server.py) and ``omnijax batch`` (demo/batch_file.py) share, so both read a body and answer it the same way.

    request = read_request(body, chat=True, model="gemma-3-4b-it", voices=pipe.voices)   # RequestError: a 400
    prompt = prepare_prompt(pipe, request, folder)      # messages -> PreparedPrompt (media written into ``folder``)
    handles = submit(pipe, prompt, request)             # its n choices; SamplingError / PromptError: a 400
    results = read_calls(pipe, request, [h.result() for h in handles])   # tool calls, when tools were offered
    body = answer_body(api.new_id("chatcmpl"), "gemma-3-4b-it", results, request, prompt, TokenText(tokenizer))

Fields and values are checked by demo/openai_protocol.py; spoken answers (``modalities``) by demo/openai_audio.py;
log probabilities are written by demo/openai_logprobs.py.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import secrets

from omnijax.app.tools import ToolError
from omnijax.common.errors import ConstraintError
from omnijax.demo import openai_audio
from omnijax.demo import openai_logprobs as lp
from omnijax.demo import openai_protocol as api

DEFAULT_MAX_TOKENS = 256  # a request that names no max_tokens gets at most this many (within the context)


@dataclasses.dataclass(frozen=True)
class ApiRequest:
    """A checked request body: ``chat`` (/v1/chat/completions, else /v1/completions), its settings, its spoken
    answer settings (None: text only) and the seed it samples with (a random one when the body names none, as
    OpenAI samples)."""

    body: dict
    chat: bool
    settings: api.Settings
    spoken: dict | None
    seed: int
    compiled: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # what ``tool_request``
    # made for this request's model

    @property
    def echo(self) -> str | None:
        """The prompt a completions request with ``echo`` repeats before each answer (None: no echo)."""
        return None if self.chat or not self.settings.echo else api.completion_prompt(self.body)


def check_model(body: dict, model: str) -> None:
    """RequestError (404, ``model_not_found``) when the body names a model other than ``model``."""
    name = body.get("model")
    if name is not None and name != model:
        raise api.RequestError(f"the model {str(name)[:200]!r} does not exist; this server serves {model!r}",
                               param="model", status=404, code="model_not_found")


def read_request(body, *, chat: bool, model: str, voices: tuple[str, ...] = ()) -> ApiRequest:
    """``body`` checked as a chat (``chat``) or completions request for ``model`` (a model with ``voices`` may
    answer aloud); RequestError names the first field refused."""
    if not isinstance(body, dict):
        raise api.RequestError("the request body must be a JSON object")
    settings = api.settings_of(body, chat=chat)
    check_model(body, model)
    spoken = openai_audio.audio_request(body, voices)
    if spoken is not None and not chat:
        raise api.RequestError("/v1/completions answers in text only; ask /v1/chat/completions for audio",
                               param="modalities")
    if spoken is not None and settings.logprobs is not None:
        raise api.RequestError("log probabilities are not given with a spoken answer", param="logprobs")
    if spoken is not None and settings.n > 1:
        raise api.RequestError("a spoken answer is one choice: 'n' must be 1", param="n")
    if spoken is not None and settings.tools is not None and settings.tools["mode"] != "none":
        raise api.RequestError("tool calls are not read from a spoken answer ('tool_choice': 'none' declares the "
                               "tools only)", param="tools")
    seed = secrets.randbelow(2**63) if settings.seed is None else settings.seed
    return ApiRequest(body, chat, settings, spoken, seed)


def prepare_prompt(pipe, request: ApiRequest, folder: pathlib.Path, *, allow_remote: bool = False, fetch=None,
                   media_root: str | os.PathLike | None = None):
    """The request's PreparedPrompt: chat messages with their media (inline payloads written into ``folder``,
    remote URLs through ``fetch`` with ``allow_remote``, local paths inside ``media_root``), or the raw prompt of a
    completions request. Its structured output is compiled for the model first (the server calls this in a worker
    thread: the first one wraps the tokenizer for llguidance); RequestError when it cannot be."""
    check_constraint(pipe, request)
    tools = tool_request(pipe, request)
    if not request.chat:
        return pipe.prepare_raw(api.completion_prompt(request.body))
    messages = api.chat_messages(request.body, allow_remote=allow_remote and fetch is not None,
                                 media_root=media_root)
    if not pipe.has_chat_template:
        raise api.RequestError("this model has no chat template (a base model): use /v1/completions",
                               param="messages")
    return pipe.prepare(api.resolve_media(messages, folder, fetch), tools=tools)


def tool_request(pipe, request: ApiRequest):
    """The request's tools checked and their call grammar compiled for the model (``Pipeline.check_tools``; kept
    compiled for ``submit``), or None; RequestError naming the field."""
    tools = request.settings.tools
    if tools is None:
        return None
    if "tools" not in request.compiled:
        try:
            request.compiled["tools"] = pipe.check_tools(tools["tools"], tools["tool_choice"],
                                                         tools["parallel_tool_calls"])
        except ToolError as e:
            raise api.RequestError(str(e), param=e.param) from None
    return request.compiled["tools"]


def read_calls(pipe, request: ApiRequest, results: list) -> list:
    """``results`` with their tool calls read (``Pipeline.read_tool_calls``) when the request offered tools."""
    tools = tool_request(pipe, request)
    if tools is not None:
        for r in results:
            pipe.read_tool_calls(r, tools)
    return results


def check_constraint(pipe, request: ApiRequest) -> None:
    """RequestError (param ``response_format``) when the request's structured output does not compile for the model
    (``Pipeline.check_response_format``; compiled, it is kept for ``submit``)."""
    if request.settings.constraint is not None:
        try:
            pipe.check_response_format(request.settings.constraint)
        except ConstraintError as e:
            raise api.RequestError(str(e), param="response_format") from None


def submit(pipe, prompt, request: ApiRequest, listener=None) -> list:
    """The request's ``n`` choices on ``pipe``'s engine (their RequestHandles): without max_tokens as much as fits,
    up to DEFAULT_MAX_TOKENS; with max_tokens 0 (``echo``) one token, which is not shown."""
    settings = request.settings
    limit = settings.max_new_tokens
    if limit is None:  # as much as fits, up to the default
        limit = max(1, min(DEFAULT_MAX_TOKENS, pipe.scheduler.context - len(prompt.token_ids)))
    tools = {} if settings.tools is None else {"tools": tool_request(pipe, request)}
    return pipe.submit_choices(prompt, settings.n, **tools, max_new_tokens=max(limit, 1),
                               temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                               seed=request.seed,
                               stop=settings.stop or None, ignore_eos=settings.ignore_eos, logprobs=settings.logprobs,
                               logprobs_mode=settings.logprobs_mode, response_format=settings.constraint,
                               prompt_logprobs=settings.logprobs if settings.echo else None, listener=listener)


def usage(results, settings: api.Settings) -> dict:
    """The prompt counted once, the completion tokens of every choice (none with max_tokens 0)."""
    shown = 0 if settings.max_new_tokens == 0 else sum(len(r.token_ids) for r in results)
    return api.usage(results[0].prompt_tokens, shown, results[0].cached_tokens)


def prompt_logprobs(results, settings: api.Settings, prompt, echo: str | None, token_text) -> dict | None:
    """``echo``'s prompt part of the completions logprobs (from the choice that computed them), or None."""
    if echo is None or settings.logprobs is None:
        return None
    scored = next((r for r in results if r.prompt_logprobs is not None), None)
    if scored is None or len(scored.prompt_logprobs) < len(prompt.token_ids) - 1:  # cancelled before the prompt ran
        return None
    return lp.prompt_part(prompt.token_ids.tolist(), scored.prompt_logprobs, scored.prompt_top, settings.logprobs,
                          token_text)


def answer_body(request_id: str, model: str, results: list, request: ApiRequest, prompt, token_text) -> dict:
    """The JSON answer to a request that is not streamed, from its choices' results: a ``chat.completion`` (the
    first choice's message spoken when its result holds audio) or a ``text_completion``; log probabilities as
    asked (``token_text``: app/token_text.py's TokenText of the tokenizer)."""
    settings = request.settings
    use = usage(results, settings)
    if request.chat:
        choices = [api.chat_choice(r.text if r.tool_calls is None else r.content, r.finish_reason, i,
                                   None if settings.logprobs is None else
                                   lp.chat_logprobs(lp.answer_records(r.logprobs, r.finish_reason),
                                                    settings.logprobs, token_text), tool_calls=r.tool_calls)
                   for i, r in enumerate(results)]
        if getattr(results[0], "audio", None) is not None:
            choices[0]["message"] = openai_audio.audio_message(results[0], request.spoken["format"])
        return api.chat_completion(request_id, model, "", "", use, choices=choices)
    echo = request.echo
    shared = prompt_logprobs(results, settings, prompt, echo, token_text)
    choices = []
    for i, r in enumerate(results):
        text = "" if settings.max_new_tokens == 0 else r.text
        logprobs = None
        if settings.logprobs is not None:
            records = [] if settings.max_new_tokens == 0 else lp.answer_records(r.logprobs, r.finish_reason)
            logprobs = lp.CompletionLogprobs(token_text, settings.logprobs,
                                             0 if echo is None else len(echo)).part(records)
            if shared is not None:
                logprobs = lp.join(shared, logprobs)
        reason = "length" if settings.max_new_tokens == 0 else r.finish_reason
        choices.append(api.completion_choice(text if echo is None else echo + text, reason, i, logprobs))
    return api.completion(request_id, model, "", None, use, choices=choices)
