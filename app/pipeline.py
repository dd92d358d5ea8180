"""The Python API: ``Pipeline.from_pretrained(folder or .gguf file)`` then ``generate`` / ``stream`` on chat messages
or, for base models, on plain text (raw completion); a model with a talker also answers aloud (``speak=True``: the
speech path is app/speech.py, entered through ``_speak`` only).

Every request runs on one serving engine (app/scheduler.py): ``generate`` and ``stream`` may be called from several
threads at once (their requests share the engine's slots), and ``submit`` hands back a ``RequestHandle`` to stream
or cancel a request without blocking."""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Generator, Iterator, Sequence

import jax
import numpy as np

from omnijax.app.checkpoint import abstract_params
from omnijax.app.checkpoint_source import open_checkpoint
from omnijax.app.compilation_cache import enable_compilation_cache
from omnijax.app.config_limits import check_config_limits
from omnijax.common.host_memory import release_free_memory
from omnijax.common.errors import CapabilityError, CheckpointError, ConstraintError, PromptError, SettingError
from omnijax.common.quantized import check_quantize
from omnijax.app.families import family_for_config
from omnijax.app.generation import Engine
from omnijax.app.grammar import Constraint, from_response_format
from omnijax.app.tool_calls import ToolRequest, parse_calls, tool_request
from omnijax.app.tools import ToolError
from omnijax.app.model import abstract_model
from omnijax.app.pipeline_loading import JAX_DTYPES, MAX_BATCH, check_load_settings, load_weights
from omnijax.app.requests import GenerationResult, Request, RequestHandle
from omnijax.app.sampling import (SamplingParams, check_choices, check_max_speech_frames, check_settings,
                                  choice_seed)
from omnijax.app.scheduler import (DEFAULT_MAX_QUEUE, DEFAULT_MEDIA_CACHE_MB, DEFAULT_PREFIX_CACHE_MB, Scheduler)
from omnijax.app.slots import DEFAULT_KV_CACHE_MB, DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_SLOTS
from omnijax.app.speech_events import AudioChunk, TextPiece
from omnijax.app.token_logprobs import check_logprobs, check_logprobs_mode
from omnijax.app.vocabulary import check_vocabulary
from omnijax.common.sharding import make_mesh
from omnijax.preprocess.processor import PreparedPrompt
from omnijax.preprocess.raw_prompt import raw_prompt_ids
from omnijax.preprocess.request_limits import MAX_SCORE_TEXT_BYTES, RequestBudget, check_text_size

DEFAULT_CONTEXT = 8192  # a slot's context when the caller names none (at most the model's own limit)


def _is_batch(messages: Any) -> bool:
    """A list of conversations or of raw prompts (one conversation is a list of message dicts)."""
    return isinstance(messages, (list, tuple)) and bool(messages) and isinstance(messages[0], (list, tuple, str))


MAX_PROMPT_LOGITS_BYTES = 4 << 30  # the logits one prompt_logits call returns


class Pipeline:
    def __init__(self, folder: pathlib.Path, spec, cfg, engine: Engine, processor, hf_config: dict,
                 scheduler: Scheduler, *, dtype: str = "float32", quantize: str | None = None):
        self.folder = folder
        self.spec = spec
        self.config = cfg
        self.engine = engine
        self.processor = processor
        self.hf_config = hf_config
        self.scheduler = scheduler
        self.dtype = dtype
        self.quantize = quantize
        self._scorer = None
        self.speech = None
        if cfg.speech is not None:
            from omnijax.app.speech import SpeechEngine

            self.speech = SpeechEngine(engine, cfg.speech)

    @property
    def has_talker(self) -> bool:
        """Whether the model can answer aloud (``speak=True``)."""
        return self.speech is not None

    @property
    def voices(self) -> tuple[str, ...]:
        """The voices ``voice=`` takes (the checkpoint's speakers; the first is the default); () without a talker."""
        return self.speech.voices if self.speech is not None else ()

    @property
    def family(self) -> str:
        return self.spec.name

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def has_chat_template(self) -> bool:
        """Whether chat messages can be rendered (base models often have no chat template: use raw text)."""
        return bool(getattr(getattr(self.processor, "tokenizer", None), "chat_template", None))

    @classmethod
    def from_pretrained(cls, path=None, *, dtype: str = "float32", quantize: str | None = None, mesh=None,
                        model_axis: int | None = None, max_context: int | None = None,
                        max_audio_seconds: float | None = None, max_batch: int = DEFAULT_SLOTS,
                        max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB, media_cache_mb: float = DEFAULT_MEDIA_CACHE_MB,
                        max_queue: int = DEFAULT_MAX_QUEUE, video_size: str = "processor",
                        kv_cache_mb: float = DEFAULT_KV_CACHE_MB) -> "Pipeline":
        """Load a local Hugging Face checkpoint folder, a GGUF file, or a folder holding one GGUF file (``path=None``:
        the embedded default model).

        dtype: parameter dtype ("float32", "bfloat16", "float16"); GGUF tensors are dequantized into it.
        quantize: None, "int8" or "int4": the decoder's weight matrices (projections, experts, embedding / output
        matrix) are stored quantized (int8 per output channel; int4 in groups of 32, two per byte) and widened
        next to their products (common/matmul_policy.py); the rest stays in ``dtype``. A GGUF file's tensors are
        converted one at a time. A conversion (a GGUF file, or ``quantize``) is kept in the weight cache
        (app/weight_cache.py), which the next load of the same content and setting reads back instead.
        mesh: a ("data", "model") jax Mesh; default: all devices with ``model_axis`` of them (default all)
        sharding the weights. max_context: context budget in tokens (prompt + new tokens) of each request, at most
        the model's own limit (default: that limit up to 8192). max_audio_seconds: longest audio clip accepted
        (families with audio input). The serving engine: ``max_batch`` requests decode together (slots), the keys
        and values of the layers that keep the whole context share a pool of ``kv_cache_mb`` (each request holds
        the pages of its prompt and max_new_tokens; one that does not fit waits), each step runs up to
        ``max_batched_tokens`` prompt tokens (of up to four requests) beside the decode rows, the prefix and media
        caches keep up to ``prefix_cache_mb`` / ``media_cache_mb`` (0: off), and at most
        ``max_queue`` requests wait for a slot. video_size: the frame size bounds of videos where the family's
        processor overrides its saved video processor's (Qwen3-Omni): "processor" (default: as transformers'
        processor resizes them when no size is passed) or "checkpoint" (the saved ``size``).
        """
        check_load_settings(dtype, model_axis, max_context, max_audio_seconds, max_batch, max_batched_tokens,
                            max_queue, prefix_cache_mb, media_cache_mb, video_size, kv_cache_mb)
        quantize = check_quantize(quantize)
        enable_compilation_cache()
        if path is None:
            from omnijax.app.default_model import default_model_dir

            path = default_model_dir()
        ckpt = open_checkpoint(path)
        check_config_limits(ckpt.hf_config)
        spec = family_for_config(ckpt.hf_config)
        try:
            cfg = spec.parse_config(ckpt.hf_config)
        except (ArithmeticError, AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"config.json is not a valid {spec.name} config: {e!r}") from e
        if ckpt.eos_ids is not None:
            cfg = dataclasses.replace(cfg, eos_ids=ckpt.eos_ids)
        processor = spec.make_processor(ckpt.folder, cfg, max_audio_seconds=max_audio_seconds, video_size=video_size,
                                        **ckpt.processor_kwargs)
        check_vocabulary(processor.tokenizer, cfg.decoder.vocab_size, tuple(t for _, t in cfg.media_token_ids),
                         cfg.eos_ids, str(ckpt.path))
        release_free_memory()  # the tokenizer's scratch: the weights come next
        if mesh is None:
            try:
                mesh = make_mesh(model_axis)
            except ValueError as e:
                raise SettingError(f"model_axis: {e}") from None
        cfg = dataclasses.replace(cfg, decoder=cfg.decoder.with_kv_repeat(mesh.shape["model"]))
        skeleton = abstract_model(cfg, spec)
        graphdef, shapes = abstract_params(skeleton)
        params = load_weights(ckpt, spec, cfg, skeleton, shapes, dtype=dtype, quantize=quantize, mesh=mesh)
        release_free_memory()
        engine = Engine(cfg, graphdef, params, mesh, collate=processor.collate, dtype=JAX_DTYPES[dtype],
                        max_context=max_context)
        scheduler = Scheduler(engine, processor, slots=max_batch,
                              context=max_context or min(engine.max_context, DEFAULT_CONTEXT),
                              max_batched_tokens=max_batched_tokens,
                              prefix_cache_mb=prefix_cache_mb, media_cache_mb=media_cache_mb, max_queue=max_queue,
                              kv_cache_mb=kv_cache_mb, threaded=jax.process_count() == 1)
        processor.budget = RequestBudget.for_context(scheduler.context)
        return cls(ckpt.path, spec, cfg, engine, processor, ckpt.hf_config, scheduler, dtype=dtype,
                   quantize=quantize)

    def score(self, texts) -> list[np.ndarray] | np.ndarray:
        """For each raw text (a string, or a list of them), the natural-log probability of each of its tokens after
        the first given the ones before it: a float32 numpy array of length (tokens - 1) per text. The text is
        tokenized as a raw prompt (``prepare_raw``: BOS as the tokenizer adds it); a text longer than the scoring
        window (1024 tokens, at most the context budget) is scored in overlapping windows, each token once.
        ``app.scoring.perplexity`` of the result is the perplexity."""
        from omnijax.app.scoring import Scorer

        single = isinstance(texts, str)
        if not single and not isinstance(texts, (list, tuple)):
            raise PromptError(f"score takes a text (a string) or a list of texts, got {type(texts).__name__}")
        items = [texts] if single else list(texts)
        bad = [type(t).__name__ for t in items if not isinstance(t, str)]
        if bad:
            raise PromptError(f"score takes texts (strings), got {bad[0]}")
        check_text_size(items, MAX_SCORE_TEXT_BYTES, "the texts to score")  # windows: not the context's cap
        if self._scorer is None:
            self._scorer = Scorer(self)
        out = [self._scorer.score(self.prepare_raw(t, MAX_SCORE_TEXT_BYTES).token_ids) for t in items]
        return out[0] if single else out

    def prompt_logits(self, messages) -> np.ndarray | list[np.ndarray]:
        """float32 [prompt tokens, vocab]: the logits at every position of a conversation's prompt with its media (a
        raw prompt string or a PreparedPrompt too; a list of them -> a list of arrays). Row t is the model's
        prediction of token t + 1 (the last row: of the answer's first token). They come from the serving engine's
        own programs: the prompt is prefilled in chunks into a slot exactly as before an answer (none of it from the
        prefix cache). At most ``MAX_PROMPT_LOGITS_BYTES`` of logits per call."""
        batch = _is_batch(messages) or (isinstance(messages, (list, tuple)) and bool(messages)
                                        and all(isinstance(m, PreparedPrompt) for m in messages))
        items = list(messages) if batch else [messages]
        if len(items) > MAX_BATCH:
            raise SettingError(f"a batch holds at most {MAX_BATCH} conversations, got {len(items)}")
        prompts = [m if isinstance(m, PreparedPrompt) else self.prepare(m) for m in items]
        size = sum(len(p.token_ids) for p in prompts) * self.config.decoder.vocab_size * 4
        if size > MAX_PROMPT_LOGITS_BYTES:
            raise PromptError(f"the logits of {sum(len(p.token_ids) for p in prompts)} prompt tokens take "
                              f"{size / 2**30:.1f} GiB, over the {MAX_PROMPT_LOGITS_BYTES / 2**30:.0f} GiB one call "
                              f"returns; ask for fewer or shorter prompts (score gives log-probabilities of any length)")
        for p in prompts:
            self.scheduler.check_fits(len(p.token_ids), 1)
        handles: list[RequestHandle] = []
        try:
            for p in prompts:
                handles.append(self.scheduler.submit(Request(p, 1, prompt_logits=True)))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        out = [r.prompt_logits for r in self._wait(handles)]
        return out if batch else out[0]

    def prepare(self, messages, tools: list[dict] | ToolRequest | None = None) -> PreparedPrompt:
        """Chat messages -> PreparedPrompt through the family's processor; a plain string is a raw prompt.
        ``tools``: the functions the model is offered (OpenAI's tool dicts or ``check_tools``' ToolRequest), written
        into the prompt as the checkpoint's chat template (or, without tool support there, the prompt format of
        preprocess/tool_prompt.py) writes them."""
        if isinstance(messages, str):
            if tools:
                raise PromptError("tools need chat messages, not a raw prompt")
            return self.prepare_raw(messages)
        if isinstance(tools, ToolRequest):
            tools = tools.template_tools()
        return self.processor.prepare(messages, tools=tools or None)

    # ---- tool calls ------------------------------------------------------------------------------------------
    @property
    def tool_format(self) -> str:
        """How this checkpoint's model writes tool calls (app/tools.py's formats; its family's choice)."""
        return self.processor.tool_format

    def check_tools(self, tools, tool_choice=None, parallel_tool_calls: bool = True) -> ToolRequest | None:
        """OpenAI's ``tools`` (a list of ``{"type": "function", "function": {"name", "description", "parameters"}}``),
        ``tool_choice`` ("auto", the default with tools; "none"; "required"; ``{"type": "function", "function":
        {"name": ...}}``) and ``parallel_tool_calls`` checked and their call grammar compiled for this model: a
        ToolRequest (None without tools). ToolError (a ConstraintError; ``param`` names the field) when one is
        malformed, names an unknown function, or has a schema llguidance cannot compile."""
        request = tool_request(tools, tool_choice, parallel_tool_calls, self.tool_format,
                               self.processor.tokenizer.get_added_vocab())
        constraint = self.tool_constraint(request)
        if constraint is not None:
            try:
                self.scheduler.grammars.check(constraint, where="tools")
            except ToolError:
                raise
            except ConstraintError as e:
                raise ToolError(str(e).split(": ", 1)[-1], "tools") from None
        return request

    @staticmethod
    def tool_constraint(request: ToolRequest | None) -> Constraint | None:
        """The constraint an answer with tools follows (None: free text)."""
        if request is None or request.grammar is None:
            return None
        return Constraint(request.grammar, f"tool calls ({request.fmt}, {request.choice.mode})")

    def raw_answer(self, token_ids: Sequence[int]) -> str:
        """An answer's text with its special tokens (tool-call markers are some), its end ids left out."""
        eos = set(self.config.eos_ids)
        return self.processor.tokenizer.decode([t for t in token_ids if t not in eos], skip_special_tokens=False)

    def read_tool_calls(self, result: GenerationResult, request: ToolRequest | None) -> GenerationResult:
        """``result`` with its ``tool_calls`` and ``content`` (the text before the first call; without calls, the
        answer's text) read from its tokens (``request`` offered tools and did not say "none"); it is returned as it
        is otherwise."""
        if request is None or not request.parses:
            return result
        from omnijax.preprocess.tokenizer import special_tokens

        content, calls = parse_calls(request.fmt, self.raw_answer(result.token_ids),
                                     special_tokens(self.processor.tokenizer))
        result.tool_calls, result.content = calls, content if calls else result.text  # no calls: the answer
        return result

    def _with_tools(self, settings: dict) -> ToolRequest | None:
        """Pop ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` from ``settings``, the checked ToolRequest, its
        constraint put in as the response format (both at once: SamplingError)."""
        request = self.check_tools(settings.pop("tools", None), settings.pop("tool_choice", None),
                                   settings.pop("parallel_tool_calls", True))
        constraint = self.tool_constraint(request)
        if constraint is not None:
            if settings.get("response_format") not in (None, {"type": "text"}):
                raise ConstraintError("response_format and tool calls cannot both constrain an answer; use "
                                      "tool_choice 'none' with a response_format")
            settings["response_format"] = constraint
        return request

    def prepare_raw(self, text: str, max_text_bytes: int | None = None) -> PreparedPrompt:
        """A raw-completion prompt: ``text`` tokenized as the tokenizer does by default (BOS as it is configured to
        add), with no chat template. Media placeholder tokens are refused (a raw prompt carries no media).
        max_text_bytes: the text cap (default: a request's, from the context budget)."""
        if isinstance(text, str):
            check_text_size([text], max_text_bytes or self.processor.budget.max_text_bytes, "the raw prompt")
        ids = raw_prompt_ids(self.processor.tokenizer, text)
        for modality, token_id in self.config.media_token_ids:
            if np.any(ids == token_id):
                raise PromptError(f"the raw prompt holds {int(np.sum(ids == token_id))} {modality} placeholder "
                                  f"token(s); raw prompts are text only")
        return PreparedPrompt(token_ids=ids, media={}, bidirectional=np.zeros(len(ids), bool))

    # ---- requests --------------------------------------------------------------------------------------------
    def submit(self, prompt, *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None,
               ignore_eos: bool = False, logprobs: int | bool | None = None, logprobs_mode: str = "raw",
               prompt_logprobs: int | bool | None = False, response_format: dict | Constraint | None = None,
               listener=None, group=None, tools=None, tool_choice=None, parallel_tool_calls: bool = True
               ) -> RequestHandle:
        """Queue one conversation, raw prompt string or PreparedPrompt on the engine without waiting: the handle's
        ``events()`` stream its tokens, ``result()`` waits for the GenerationResult, ``cancel()`` stops it.
        Settings are checked first (SamplingError, PromptError); ``ignore_eos``: generate exactly
        ``max_new_tokens`` tokens; ``logprobs``: None (off), or the alternatives (0..20; True: 0) each token's
        ``TokenLogprob`` carries, in every event and in ``GenerationResult.logprobs``, under the model's own
        distribution (``logprobs_mode="raw"``) or the one each token is drawn from, after temperature, top-k and
        top-p (``"processed"``; the tokens they drop at -inf); ``prompt_logprobs``: also each prompt token's log
        probability (``GenerationResult.prompt_logprobs``), and as ``logprobs`` the alternatives there under the
        model's distribution (``GenerationResult.prompt_top``); ``response_format``: a structured output, what the
        answer must be (see ``check_response_format``; ConstraintError when it is malformed or does not compile);
        ``listener``: called from the engine's thread at each new event (it must not block; e.g. to wake an event
        loop); ``group``: see ``Request.group`` (``submit_choices`` sets it); ``tools``, ``tool_choice``,
        ``parallel_tool_calls``: see ``check_tools`` (the prompt, when not prepared yet, offers the tools;
        ``read_tool_calls`` reads the calls of the handle's result)."""
        sampling, max_new_tokens, stop = check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        logprobs = check_logprobs(logprobs)
        prompt_logprobs = check_logprobs(prompt_logprobs, "prompt_logprobs")
        check_logprobs_mode(logprobs_mode)
        with_tools = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls,
                      "response_format": response_format}
        request = self._with_tools(with_tools)
        constraint = self.check_response_format(with_tools["response_format"])
        prepared = prompt if isinstance(prompt, PreparedPrompt) else self.prepare(prompt, tools=request)
        return self.scheduler.submit(Request(prepared, max_new_tokens, sampling, stop, bool(ignore_eos),
                                             prompt_logprobs=prompt_logprobs, logprobs=logprobs,
                                             logprobs_mode=logprobs_mode, group=group, constraint=constraint),
                                     listener)

    def check_response_format(self, response_format: dict | Constraint | None) -> Constraint | None:
        """The constraint of a structured output, compiled for this model (ConstraintError naming llguidance's message
        when it cannot be; the first call wraps the tokenizer for llguidance, about a second for a large
        vocabulary): None or ``{"type": "text"}`` (none), OpenAI's ``{"type": "json_object"}`` and ``{"type":
        "json_schema", "json_schema": {"name": ..., "schema": {...}}}``, the extensions ``{"type": "regex", "regex":
        ...}``, ``{"type": "choice", "choice": [...]}`` and ``{"type": "grammar", "grammar": <Lark or GBNF>}``, or a
        ``Constraint`` (app/grammar.py's builders)."""
        constraint = from_response_format(response_format)
        return None if constraint is None else self.scheduler.grammars.check(constraint)

    def submit_choices(self, prompt, n: int, *, seed: int = 0, prompt_logprobs: int | bool | None = False,
                       **settings) -> list[RequestHandle]:
        """``n`` answers (1..8) to one prompt, queued together: a handle per answer (``submit``'s settings apply to
        each). Answer i draws with seed ``seed + i`` (``choice_seed``), so it is what a lone request with that seed
        gives. The prompt is prepared once and prefilled once: the other answers wait for the first one's prefill
        and take the prompt from the prefix cache (when it is on and the prompt has 16 tokens or more).
        ``prompt_logprobs`` is asked of one answer only (the last: it prefills the whole prompt beside the first)."""
        n = check_choices(n)
        check_settings(settings.get("max_new_tokens", 64), settings.get("temperature", 0.0), settings.get("top_k", 0),
                       settings.get("top_p", 1.0), seed, settings.get("stop"))
        request = self._with_tools(settings)
        settings["response_format"] = self.check_response_format(settings.get("response_format"))
        prepared = prompt if isinstance(prompt, PreparedPrompt) else self.prepare(prompt, tools=request)
        group = object() if n > 1 else None
        handles: list[RequestHandle] = []
        try:
            for i in range(n):
                handles.append(self.submit(prepared, seed=choice_seed(seed, i), group=group,
                                           prompt_logprobs=prompt_logprobs if i == n - 1 else None,
                                           **settings))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return handles

    def wait(self, handle: RequestHandle) -> GenerationResult:
        """``handle.result()``, driving the engine from this thread where it has no thread of its own (several JAX
        processes)."""
        return self._wait([handle])[0]

    def _wait(self, handles: list[RequestHandle]) -> list[GenerationResult]:
        if not self.scheduler.threaded:
            self.scheduler.run(handles)
        try:
            return [h.result() for h in handles]
        except BaseException:
            for h in handles:
                h.cancel()
            raise

    def generate(self, messages, *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None, speak: bool = False,
                 voice: str | None = None, max_speech_frames: int | None = None,
                 logprobs: int | bool | None = None, logprobs_mode: str = "raw", n: int = 1,
                 response_format: dict | Constraint | None = None, tools=None, tool_choice=None,
                 parallel_tool_calls: bool = True):
        """One conversation (or raw prompt string) -> GenerationResult; a list of them -> list of GenerationResult
        (the requests run side by side on the engine; every one with these settings).

        speak: also answer aloud (one conversation, a model with a talker): the result carries ``audio``,
        ``sample_rate`` and ``audio_codes``. voice: one of ``voices`` (default: the first). max_speech_frames: a
        cap on the codec frames spoken (default 4096). logprobs: None (off), or how many alternatives (0..20) each
        token's ``TokenLogprob`` in ``GenerationResult.logprobs`` carries; logprobs_mode: their distribution ("raw"
        or "processed", as ``submit``). n: answers per conversation (1..8; see
        ``submit_choices``): with n > 1 each conversation gives a list of n results. response_format: a structured
        output (``check_response_format``). tools, tool_choice, parallel_tool_calls: functions the model may call
        (``check_tools``): each result's ``tool_calls`` (ToolCall: ``name``, ``arguments`` as JSON text, ``id``)
        and ``content`` (its text before them) are read from the answer."""
        sampling, _, _ = check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        check_logprobs(logprobs)
        check_logprobs_mode(logprobs_mode)
        n = check_choices(n)
        with_tools = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls,
                      "response_format": response_format}
        request = self._with_tools(with_tools)
        constraint = self.check_response_format(with_tools["response_format"])
        batch = _is_batch(messages)
        if speak:
            if n > 1:
                raise SettingError("speak=True answers once: n must be 1")
            self._check_speak(messages, voice, max_speech_frames)
        conversations = list(messages) if batch else [messages]
        if len(conversations) > MAX_BATCH:  # before any of them is prepared
            raise SettingError(f"a batch holds at most {MAX_BATCH} conversations, got {len(conversations)}")
        prompts = [self.prepare(c, tools=request) for c in conversations]
        results = self.generate_prepared(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                         top_k=top_k, top_p=top_p, seed=seed, stop=stop, logprobs=logprobs,
                                         logprobs_mode=logprobs_mode, n=n, response_format=constraint)
        for r in results:
            for one in (r if isinstance(r, list) else [r]):
                self.read_tool_calls(one, request)
        if speak:
            chunks = list(self._speak(prompts[0], results[0], voice, sampling, max_speech_frames))
            _attach_audio(results[0], chunks, self.speech)
        return results if batch else results[0]

    def _check_speak(self, messages, voice, max_speech_frames) -> None:
        """Refuse a request to speak that cannot be served, before any work."""
        if self.speech is None:
            raise CapabilityError(f"{self.name} ({self.family}) has no talker: it cannot answer aloud (speak=True); "
                                  f"it answers in text only")
        if _is_batch(messages):
            raise PromptError("speak=True takes one conversation, not a batch")
        if isinstance(messages, str):
            raise PromptError("speak=True needs chat messages (the talker speaks the assistant's turn), not a raw "
                              "prompt")
        self.speech.voice_id(voice)
        check_max_speech_frames(max_speech_frames)

    def speak_answer(self, prompt: PreparedPrompt, result: GenerationResult, *, voice: str | None = None,
                     temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                     max_speech_frames: int | None = None) -> Iterator[AudioChunk]:
        """The answer ``result`` to ``prompt`` (from ``submit`` / ``generate_prepared``) spoken, chunk by chunk, with
        the sampling settings the answer was made with; ``attach_audio`` joins the chunks into the result. For a
        server that streams the text first (a model with a talker; CapabilityError otherwise)."""
        sampling, _, _ = check_settings(1, temperature, top_k, top_p, seed, None)
        if self.speech is None:
            raise CapabilityError(f"{self.name} ({self.family}) has no talker: it cannot answer aloud")
        self.speech.voice_id(voice)
        check_max_speech_frames(max_speech_frames)
        return self._speak(prompt, result, voice, sampling, max_speech_frames)

    def attach_audio(self, result: GenerationResult, chunks: list[AudioChunk]) -> None:
        """``result`` with the spoken answer's ``chunks`` joined into its audio, sample_rate and audio_codes."""
        _attach_audio(result, chunks, self.speech)

    def _speak(self, prompt: PreparedPrompt, result: GenerationResult, voice, sampling: SamplingParams,
               max_speech_frames) -> Iterator[AudioChunk]:
        """The answer of ``result`` spoken, chunk by chunk."""
        kwargs = {} if max_speech_frames is None else {"max_frames": max_speech_frames}
        return self.speech.speak(prompt, spoken_tokens(result, self.processor.decode, self.config.eos_ids),
                                 voice=voice, sampling=sampling, **kwargs)

    def generate_prepared(self, prompts: list[PreparedPrompt], *, max_new_tokens: int = 64, temperature: float = 0.0,
                          top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None,
                          ignore_eos: bool = False, logprobs: int | bool | None = None, logprobs_mode: str = "raw",
                          n: int = 1, response_format: dict | Constraint | None = None) -> list:
        """``generate`` for prompts already prepared (``prepare``), one result per prompt (1 to 1024 of them; with
        ``n`` > 1, a list of n results per prompt)."""
        check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        check_logprobs(logprobs)
        check_logprobs_mode(logprobs_mode)
        n = check_choices(n)
        constraint = self.check_response_format(response_format)
        if not 1 <= len(prompts) <= MAX_BATCH:
            raise SettingError(f"generate takes 1 to {MAX_BATCH} prompts at once, got {len(prompts)}")
        for p in prompts:
            self.scheduler.check_fits(len(p.token_ids), max_new_tokens)
        settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                        stop=stop, ignore_eos=ignore_eos, logprobs=logprobs, logprobs_mode=logprobs_mode,
                        response_format=constraint)
        handles: list[RequestHandle] = []
        try:
            for p in prompts:
                handles.extend(self.submit_choices(p, n, **settings))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        results = self._wait(handles)
        return results if n == 1 else [results[i:i + n] for i in range(0, len(results), n)]

    def stream(self, messages, *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None, speak: bool = False,
               voice: str | None = None, max_speech_frames: int | None = None,
               logprobs: int | bool | None = None, logprobs_mode: str = "raw",
               response_format: dict | Constraint | None = None) -> Generator[Any, None, GenerationResult]:
        """Text pieces of one conversation's answer as they are generated (one piece per token, "" while a token
        adds no visible text yet, so a consumer can stop between any two tokens), then possibly one last piece.

        The generator's return value (``result = yield from pipe.stream(...)``) is the answer's GenerationResult as
        ``generate`` gives it, and the pieces joined are exactly ``result.text``: text is shown once no later
        token can change it (an unfinished UTF-8 character or byte run waits), and text that could be the start
        of a stop string waits until it is known not to be one. Closing the generator early (a consumer that
        stops reading) cancels the request and frees its slot.

        speak: the events are ``TextPiece`` (the text pieces) and then ``AudioChunk`` (the spoken answer, chunk by
        chunk as it is made; app/speech_events.py); the chunks joined are exactly ``result.audio``. logprobs,
        logprobs_mode: as ``generate`` (in the returned result; ``submit`` gives them token by token in its events).
        response_format: a structured output (``check_response_format``).
        """
        sampling, _, _ = check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        check_logprobs(logprobs)
        check_logprobs_mode(logprobs_mode)
        constraint = self.check_response_format(response_format)
        if _is_batch(messages):
            raise PromptError("stream takes one conversation; use generate for a batch")
        if speak:
            self._check_speak(messages, voice, max_speech_frames)
        start = time.perf_counter()
        prompt = self.prepare(messages)
        handle = self.submit(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                             top_p=top_p, seed=seed, stop=stop, logprobs=logprobs, logprobs_mode=logprobs_mode,
                             response_format=constraint)
        wrap = TextPiece if speak else str
        try:
            for event in self._events(handle):
                yield wrap(event.text)
            result = handle.result()
        finally:
            handle.cancel()  # no-op once it has ended
        if speak:
            chunks = []
            for chunk in self._speak(prompt, result, voice, sampling, max_speech_frames):
                chunks.append(chunk)
                yield chunk
            _attach_audio(result, chunks, self.speech)
            result.seconds = time.perf_counter() - start
        return result

    def _events(self, handle: RequestHandle):
        if self.scheduler.threaded:
            yield from handle.events()
            return
        import queue

        while True:  # several processes: this thread drives the engine
            try:
                yield from handle.events(timeout=0)
                return
            except queue.Empty:
                self.scheduler.step()

    def compilations(self) -> int:
        """How many programs the engine has compiled so far (a new input inside its buckets adds none)."""
        return self.scheduler.compilations()

    def close(self) -> None:
        """Stop the engine's thread (requests still running end as cancelled)."""
        self.scheduler.close()


def spoken_tokens(result: GenerationResult, decode, eos_ids) -> list[int]:
    """The answer tokens the talker speaks: without the end token, and without the tokens of a stop string that cut
    the answer (the shortest run of tokens whose text still covers ``result.text``)."""
    ids = list(result.token_ids)
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    if result.finish_reason == "stop":
        while ids and decode(ids[:-1]).startswith(result.text):
            ids = ids[:-1]
    return ids


def _attach_audio(result: GenerationResult, chunks: list[AudioChunk], speech) -> None:
    """The spoken answer's chunks joined into ``result`` (an empty waveform when there was nothing to speak)."""
    groups = speech.cfg.talker.num_code_groups
    result.audio = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)
    result.audio_codes = np.concatenate([c.codes for c in chunks]) if chunks else np.zeros((0, groups), np.int32)
    result.sample_rate = speech.sample_rate
