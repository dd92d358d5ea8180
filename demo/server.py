"""``omnijax serve``: an OpenAI-compatible HTTP API (FastAPI on uvicorn) over one pipeline's serving engine.

    GET  /health                 {"status": "ok"}
    GET  /v1/models              the served model
    POST /v1/chat/completions    chat (text, image_url / video_url data: URLs, input_audio), stream or not; a model
                                 with a talker answers aloud with "modalities": ["text", "audio"]
    POST /v1/completions         raw prompts (base models)
    GET  /metrics                Prometheus text (demo/metrics.py)

Requests are checked field by field (demo/openai_protocol.py) and prepared in worker threads; generation runs on
the engine, whose scheduler thread serves every request at once. A handler waits on its request without holding a
thread: the engine wakes it through the event loop. ``n`` > 1 submits the choices together (one prefill: see
``Pipeline.submit_choices``; choice i samples with seed + i) and streams their chunks as they come, each with its
``index``; log probabilities (demo/openai_logprobs.py) come with the tokens from the engine. Streams are
server-sent events as OpenAI sends them. A client that goes away (a closed stream, a dropped connection) cancels
its request, which frees its slot at the engine's next step. Every refusal is OpenAI's error JSON with its status: 400 bad request, 401 missing key, 404 unknown model
or path, 413 body too large, 503 queue full; nothing a request holds can stop the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pathlib
import shutil
import tempfile
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from omnijax.app.scheduler import ClosedError, QueueFullError
from omnijax.common.errors import OmnijaxError
from omnijax.app.token_text import TokenText
from omnijax.demo import openai_audio
from omnijax.demo import openai_logprobs as lp
from omnijax.demo import openai_protocol as api
from omnijax.demo import openai_request
from omnijax.demo.api_key import ApiKeyCheck
from omnijax.demo.body_limit import BodyLimit
from omnijax.demo.host_check import HostCheck
from omnijax.demo.metrics import CONTENT_TYPE, metrics_text
from omnijax.demo.openai_tool_stream import ToolDeltas

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_MB = 64
DEFAULT_MAX_TOKENS = openai_request.DEFAULT_MAX_TOKENS  # without max_tokens at most this many (within the context)


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse(api.error_body(message, type_=type_, param=param, code=code), status_code=status)


def _refusal(e: BaseException) -> JSONResponse:
    """The HTTP answer for an error of a request: its own status for a RequestError, 503 for a full queue or a closed
    engine, 400 for any other OmnijaxError (bad media, prompt over the context, bad setting)."""
    if isinstance(e, api.RequestError):
        return error_response(e.status, str(e), e.type, e.param, e.code)
    if isinstance(e, QueueFullError):
        return error_response(503, str(e), "server_overloaded", code="queue_full")
    if isinstance(e, ClosedError):  # the server is shutting down
        return error_response(503, str(e), "server_unavailable", code="shutting_down")
    return error_response(400, str(e), code=type(e).__name__)


class Server:
    """The API over ``pipe`` (a Pipeline), served as ``model`` (its name unless given)."""

    def __init__(self, pipe, *, model: str | None = None, allow_remote_media: bool = False, fetch=None,
                 upload_dir: str | None = None, max_speech_frames: int | None = None):
        """fetch: MediaRef -> bytes for remote URLs (demo/remote_media.py), with ``allow_remote_media``;
        max_speech_frames: the cap on one spoken answer's codec frames (a model with a talker; default 4096)."""
        self.pipe = pipe
        self.max_speech_frames = max_speech_frames
        self.model = model or pipe.name
        self.allow_remote_media = allow_remote_media and fetch is not None
        self.fetch = fetch
        self.upload_root = pathlib.Path(upload_dir or tempfile.mkdtemp(prefix="omnijax-serve-"))
        self.created = int(time.time())
        self._token_text: TokenText | None = None

    @property
    def token_text(self) -> TokenText:
        if self._token_text is None:
            self._token_text = TokenText(self.pipe.processor.tokenizer)
        return self._token_text

    # ---- request -> engine (demo/openai_request.py) ---------------------------------------------------------
    def _speech(self, prompt, result, settings: api.Settings, seed: int, spoken: dict):
        """The spoken answer's chunks, made one at a time by the caller (a blocking iterator)."""
        return self.pipe.speak_answer(prompt, result, voice=spoken["voice"], temperature=settings.temperature,
                                      top_k=settings.top_k, top_p=settings.top_p, seed=seed,
                                      max_speech_frames=self.max_speech_frames)

    def _prepare(self, request: openai_request.ApiRequest, folder: pathlib.Path):
        return openai_request.prepare_prompt(self.pipe, request, folder, allow_remote=self.allow_remote_media,
                                             fetch=self.fetch)

    # ---- handlers ------------------------------------------------------------------------------------------
    async def chat(self, request: Request):
        return await self._complete(request, chat=True)

    async def completions(self, request: Request):
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, *, chat: bool):
        try:
            body = await _json_body(request)
            parsed = openai_request.read_request(body, chat=chat, model=self.model, voices=self.pipe.voices)
        except OmnijaxError as e:
            return _refusal(e)
        settings, seed, spoken = parsed.settings, parsed.seed, parsed.spoken
        folder = pathlib.Path(tempfile.mkdtemp(prefix="request-", dir=self.upload_root))
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        try:
            prompt = await run_in_threadpool(self._prepare, parsed, folder)
            handles = openai_request.submit(self.pipe, prompt, parsed, lambda: loop.call_soon_threadsafe(wake.set))
        except OmnijaxError as e:
            shutil.rmtree(folder, ignore_errors=True)
            return _refusal(e)
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        shutil.rmtree(folder, ignore_errors=True)  # prepared: the media files are no longer needed
        request_id = api.new_id("chatcmpl" if chat else "cmpl")
        speech = None if spoken is None else (prompt, settings, seed, spoken)
        echo = parsed.echo
        tools = openai_request.tool_request(self.pipe, parsed) if chat else None
        if settings.stream and tools is not None and tools.parses:
            return _event_stream(self._stream_calls(handles, wake, request_id, settings, tools), handles)
        if settings.stream:
            return _event_stream(self._stream(handles, wake, request_id, chat, settings, speech, prompt, echo),
                                 handles)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, handles))
        try:
            async for _ in _events(handles, wake):
                pass
            results = [h.result() for h in handles]
            result = results[0]
            if speech is not None and result.finish_reason != "cancelled":
                chunks = await run_in_threadpool(lambda: list(self._speech(prompt, result, settings, seed, spoken)))
                self.pipe.attach_audio(result, chunks)
        except OmnijaxError as e:
            return _refusal(e)
        finally:
            watcher.cancel()
            for h in handles:
                h.cancel()
        results = openai_request.read_calls(self.pipe, parsed, results)
        return JSONResponse(openai_request.answer_body(request_id, self.model, results, parsed, prompt,
                                                       self.token_text))

    @staticmethod
    def _usage(results, settings: api.Settings) -> dict:
        return openai_request.usage(results, settings)

    def _prompt_logprobs(self, results, settings: api.Settings, prompt, echo: str | None) -> dict | None:
        return openai_request.prompt_logprobs(results, settings, prompt, echo, self.token_text)

    async def _stream(self, handles: list, wake: asyncio.Event, request_id: str, chat: bool, settings: api.Settings,
                      speech: tuple | None = None, prompt=None, echo: str | None = None):
        """Server-sent events of the answer's choices as their tokens come (each chunk names its choice's
        ``index``); with ``speech`` (prompt, settings, seed, spoken settings; one choice) the text goes as
        ``delta.audio.transcript`` pieces, then the audio as ``delta.audio.data`` pieces (demo/openai_audio.py).
        Completions with ``echo`` start each choice with the prompt; with ``echo`` and ``logprobs`` the prompt's
        log probabilities are known only once the answers end, so the chunks wait for them."""
        created = int(time.time())
        deltas = None if speech is None else openai_audio.AudioDeltas(speech[3]["format"], self.pipe.speech.sample_rate)
        model, top = self.model, settings.logprobs
        held = [lp.StreamedRecords() for _ in handles]
        offsets = [lp.CompletionLogprobs(self.token_text, top or 0, 0 if echo is None else len(echo))
                   for _ in handles]
        hidden = settings.max_new_tokens == 0  # echo only: the drawn token is not shown
        waiting = echo is not None and top is not None  # the echo's logprobs come at the end

        def piece(i: int, text: str, records: list, finish_reason: str | None = None) -> bytes:
            if chat:
                logprobs = None if top is None else {"content": lp.chat_content(records, top, self.token_text),
                                                     "refusal": None}
                return api.sse(api.chat_chunk(request_id, model, created, {"content": text}, index=i,
                                              logprobs=logprobs))
            logprobs = None if top is None else offsets[i].part(records)
            return api.sse(api.completion(request_id, model, text, finish_reason, None, created, chunk=True,
                                          index=i, logprobs=logprobs))

        later: list[tuple] = []  # (choice, text, records) waiting for the echo's log probabilities
        for i in range(len(handles)):
            if chat:
                first = {"role": "assistant", "content": ""} if deltas is None else \
                    {"role": "assistant", "content": None, **deltas.start()}
                yield api.sse(api.chat_chunk(request_id, model, created, first, index=i))
            elif echo is not None and not waiting:
                yield api.sse(api.completion(request_id, model, echo, None, None, created, chunk=True, index=i))
        async for i, event in _events(handles, wake, indexed=True):
            records = held[i].take(event) if top is not None else []
            if not event.text or hidden:
                continue
            if deltas is not None:
                yield api.sse(api.chat_chunk(request_id, model, created, deltas.transcript(event.text)))
            elif waiting:
                later.append((i, event.text, records))
            else:
                yield piece(i, event.text, records)
        results = [h.result() for h in handles]
        if waiting:
            shared = self._prompt_logprobs(results, settings, prompt, echo)
            for i in range(len(handles)):
                yield api.sse(api.completion(request_id, model, echo, None, None, created, chunk=True, index=i,
                                             logprobs=shared if shared is not None else lp.empty()))
            for i, text, records in later:
                yield piece(i, text, records)
        for i, result in enumerate(results):
            if deltas is not None and result.finish_reason != "cancelled":
                prompt_, settings_, seed, spoken = speech
                chunks = iter(await run_in_threadpool(self._speech, prompt_, result, settings_, seed, spoken))
                while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
                    yield api.sse(api.chat_chunk(request_id, model, created, deltas.data(chunk)))
                yield api.sse(api.chat_chunk(request_id, model, created, deltas.end()))
            rest = held[i].rest(result.finish_reason) if top is not None and not hidden else []
            if rest:
                yield piece(i, "", rest)
            if chat:
                yield api.sse(api.chat_chunk(request_id, model, created, {}, result.finish_reason, index=i))
            else:
                yield api.sse(api.completion(request_id, model, "", "length" if hidden else result.finish_reason,
                                             None, created, chunk=True, index=i,
                                             logprobs=None if top is None else lp.empty()))
        if settings.include_usage:
            use = self._usage(results, settings)
            if chat:
                yield api.sse(api.chat_chunk(request_id, model, created, None, use=use))
            else:
                yield api.sse(api.completion(request_id, model, "", None, use, created, chunk=True,
                                             choices=[]))
        yield api.sse("[DONE]")

    async def _stream_calls(self, handles: list, wake: asyncio.Event, request_id: str, settings: api.Settings,
                            tools):
        """Server-sent events of a chat answer that may call tools (demo/openai_tool_stream.py): its content as it
        becomes certain not to start a call, then each call in one ``tool_calls`` delta (``index``, ``id``, ``type``,
        ``function.name`` and its whole ``arguments``) as soon as it is complete; the last chunk's finish_reason is
        "tool_calls" when the answer holds calls. Log probabilities come with the chunks of their tokens."""
        created = int(time.time())
        model, top = self.model, settings.logprobs
        held = [lp.StreamedRecords() for _ in handles]
        streams = [ToolDeltas(self.pipe, tools) for _ in handles]

        def chunk(i: int, delta: dict, records: list, finish_reason: str | None = None) -> bytes:
            logprobs = None if top is None or not records else {
                "content": lp.chat_content(records, top, self.token_text), "refusal": None}
            return api.sse(api.chat_chunk(request_id, model, created, delta, finish_reason, index=i,
                                          logprobs=logprobs))

        for i in range(len(handles)):
            yield api.sse(api.chat_chunk(request_id, model, created, {"role": "assistant", "content": ""},
                                         index=i))
        async for i, event in _events(handles, wake, indexed=True):
            records = held[i].take(event) if top is not None else []
            for delta in streams[i].update(event.token_id) or ([{"content": ""}] if records else []):
                yield chunk(i, delta, records)
                records = []
        results = [h.result() for h in handles]
        for i, result in enumerate(results):
            for delta in streams[i].finish(result):
                yield chunk(i, delta, [])
            rest = held[i].rest(result.finish_reason) if top is not None else []
            if rest:
                yield chunk(i, {"content": ""}, rest)
            yield chunk(i, {}, [], "tool_calls" if streams[i].calls_sent else result.finish_reason)
        if settings.include_usage:
            yield api.sse(api.chat_chunk(request_id, model, created, None, use=self._usage(results, settings)))
        yield api.sse("[DONE]")

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "created": self.created,
                                            "owned_by": "omnijax"}]}

    def metrics(self) -> Response:
        return Response(metrics_text(self.pipe.scheduler, self.model), media_type=CONTENT_TYPE)

    def close(self) -> None:
        shutil.rmtree(self.upload_root, ignore_errors=True)


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise api.RequestError("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise api.RequestError("the request body must be a JSON object")
    return body


def _event_stream(events, handles: list) -> StreamingResponse:
    """The server-sent ``events`` of a started answer (an async generator of encoded events) as a response: an
    OmnijaxError raised once the stream has started goes as an error event, and the ``handles`` are cancelled when
    the stream ends, fails or the client goes away (the generator is closed or cancelled)."""

    async def guarded():
        try:
            async for event in events:
                yield event
        except OmnijaxError as e:
            yield api.sse(api.error_body(str(e), code=type(e).__name__))
            yield api.sse("[DONE]")
        finally:
            await events.aclose()
            for h in handles:
                h.cancel()

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(handles: list, wake: asyncio.Event, *, indexed: bool = False):
    """The token events of the requests ``handles`` (a request's choices) as they come, without holding a thread
    (the engine sets ``wake``); ``indexed``: (choice index, event) pairs."""
    open_ = set(range(len(handles)))
    while open_:
        wake.clear()
        any_events = False
        for i in sorted(open_):
            events, ended = handles[i].take()
            any_events |= bool(events)
            for event in events:
                yield (i, event) if indexed else event
            if ended:
                open_.discard(i)
        if open_ and not any_events:
            await wake.wait()


async def _cancel_on_disconnect(request: Request, handles: list) -> None:
    """Cancel ``handles`` when the client closes the connection before the answer is sent."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for handle in handles:
                handle.cancel()
            return


def build_app(server: Server, *, names: frozenset[str] = frozenset(), max_body_mb: float = DEFAULT_MAX_BODY_MB,
              api_key: str | None = None, ui=None) -> Any:
    """The ASGI app: the API routes and error handlers behind the Host check (``names``: see
    demo/host_check.py), the body cap and the API key; with ``ui`` (a gradio Blocks), the web demo at ``/ui``."""
    app = FastAPI(title="omnijax", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/health", lambda: {"status": "ok"}, methods=["GET"])
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", server.chat, methods=["POST"])
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])
    app.add_api_route("/metrics", server.metrics, methods=["GET"])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        code = "not_found" if exc.status_code == 404 else None
        return error_response(exc.status_code, str(exc.detail), code=code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):
        return error_response(400, "the request is malformed")

    @app.exception_handler(Exception)
    async def failed(request, exc):
        log.exception("request failed")
        return error_response(500, f"internal error: {type(exc).__name__}", "server_error")

    if ui is not None:
        import gradio as gr

        app = gr.mount_gradio_app(app, ui, path="/ui")
    return HostCheck(BodyLimit(ApiKeyCheck(app, api_key), int(max_body_mb * 2**20)), names)


@contextlib.contextmanager
def serving(pipe, **kwargs):
    """A Server over ``pipe`` whose uploads folder is removed at the end."""
    server = Server(pipe, **kwargs)
    try:
        yield server
    finally:
        server.close()
