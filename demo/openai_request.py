"""One OpenAI chat or completions request body, from JSON to the answer's JSON: the steps ``omnijax serve``
(demo/server.py) and ``omnijax batch`` (demo/batch_file.py) share, so both read a body and answer it the same way.

    request = read_request(body, chat=True, model="gemma-3-4b-it", voices=pipe.voices)   # RequestError: a 400
    prompt = prepare_prompt(pipe, request, folder)      # messages -> PreparedPrompt (media written into ``folder``)
    handle = submit(pipe, prompt, request)              # on the engine; SamplingError / PromptError: a 400
    body = answer_body(api.new_id("chatcmpl"), "gemma-3-4b-it", handle.result(), request)

Fields and values are checked by demo/openai_protocol.py; spoken answers (``modalities``) by demo/openai_audio.py.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import secrets

from omnijax.demo import openai_audio
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
    seed = secrets.randbelow(2**63) if settings.seed is None else settings.seed
    return ApiRequest(body, chat, settings, spoken, seed)


def prepare_prompt(pipe, request: ApiRequest, folder: pathlib.Path, *, allow_remote: bool = False, fetch=None,
                   media_root: str | os.PathLike | None = None):
    """The request's PreparedPrompt: chat messages with their media (inline payloads written into ``folder``,
    remote URLs through ``fetch`` with ``allow_remote``, local paths inside ``media_root``), or the raw prompt of a
    completions request."""
    if not request.chat:
        return pipe.prepare_raw(api.completion_prompt(request.body))
    messages = api.chat_messages(request.body, allow_remote=allow_remote and fetch is not None,
                                 media_root=media_root)
    if not pipe.has_chat_template:
        raise api.RequestError("this model has no chat template (a base model): use /v1/completions",
                               param="messages")
    return pipe.prepare(api.resolve_media(messages, folder, fetch))


def submit(pipe, prompt, request: ApiRequest, listener=None):
    """The request on ``pipe``'s engine (a RequestHandle): without max_tokens as much as fits, up to
    DEFAULT_MAX_TOKENS."""
    settings = request.settings
    limit = settings.max_new_tokens
    if limit is None:
        limit = max(1, min(DEFAULT_MAX_TOKENS, pipe.scheduler.context - len(prompt.token_ids)))
    return pipe.submit(prompt, max_new_tokens=limit, temperature=settings.temperature, top_k=settings.top_k,
                       top_p=settings.top_p, seed=request.seed, stop=settings.stop or None,
                       ignore_eos=settings.ignore_eos, listener=listener)


def answer_body(request_id: str, model: str, result, request: ApiRequest) -> dict:
    """The JSON answer to a request that is not streamed: a ``chat.completion`` (its message spoken when the
    result holds audio) or a ``text_completion``."""
    use = api.usage(result.prompt_tokens, len(result.token_ids), result.cached_tokens)
    if not request.chat:
        return api.completion(request_id, model, result.text, result.finish_reason, use)
    out = api.chat_completion(request_id, model, result.text, result.finish_reason, use)
    if getattr(result, "audio", None) is not None:
        out["choices"][0]["message"] = openai_audio.audio_message(result, request.spoken["format"])
    return out
