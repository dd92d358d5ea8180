"""The Python API: ``Pipeline.from_pretrained(folder or .gguf file)`` then ``generate`` / ``stream`` on chat messages
or, for base models, on plain text (raw completion)."""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import pathlib
import time
from typing import Any, Generator, Sequence

import jax.numpy as jnp
import numpy as np

from omnijax.app.answer_text import answer_for
from omnijax.app.checkpoint import abstract_params, load_params
from omnijax.app.checkpoint_source import open_checkpoint
from omnijax.app.compilation_cache import enable_compilation_cache
from omnijax.app.config_limits import check_config_limits
from omnijax.common.errors import CheckpointError, PromptError, SettingError
from omnijax.app.families import family_for_config
from omnijax.app.generation import Engine
from omnijax.app.model import abstract_model
from omnijax.app.sampling import check_settings
from omnijax.app.vocabulary import check_vocabulary
from omnijax.common.sharding import make_mesh
from omnijax.preprocess.processor import PreparedPrompt
from omnijax.preprocess.raw_prompt import raw_prompt_ids
from omnijax.preprocess.request_limits import RequestBudget, check_text_size

log = logging.getLogger(__name__)

_JAX_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass
class GenerationResult:
    """text: the answer (special tokens removed, cut before a stop string); token_ids: generated ids (an EOS that
    ended the answer included, as transformers' generate returns it); finish_reason: "eos", "stop" or "length"."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    seconds: float = 0.0


def _is_batch(messages: Any) -> bool:
    """A list of conversations or of raw prompts (one conversation is a list of message dicts)."""
    return isinstance(messages, (list, tuple)) and bool(messages) and isinstance(messages[0], (list, tuple, str))


MAX_AUDIO_SECONDS_SETTING = 86400.0  # max_audio_seconds: a day
MAX_BATCH = 1024  # prompts generated together (each row holds its own KV cache)


def check_load_settings(dtype, model_axis, max_context, max_audio_seconds) -> None:
    """SettingError naming the first ``from_pretrained`` argument of the wrong type or out of range."""
    if dtype not in _JAX_DTYPES:
        raise SettingError(f"unsupported dtype {dtype!r}; use one of {sorted(_JAX_DTYPES)}")
    for name, value, low in (("model_axis", model_axis, 1), ("max_context", max_context, 2)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low):
            raise SettingError(f"{name} must be None or an integer >= {low}, got {value!r}")
    if max_audio_seconds is not None and (
            isinstance(max_audio_seconds, bool) or not isinstance(max_audio_seconds, numbers.Real)
            or not math.isfinite(max_audio_seconds) or not 0 < max_audio_seconds <= MAX_AUDIO_SECONDS_SETTING):
        raise SettingError(f"max_audio_seconds must be None or a number in (0, {MAX_AUDIO_SECONDS_SETTING:g}], got "
                           f"{max_audio_seconds!r}")


class Pipeline:
    def __init__(self, folder: pathlib.Path, spec, cfg, engine: Engine, processor, hf_config: dict):
        self.folder = folder
        self.spec = spec
        self.config = cfg
        self.engine = engine
        self.processor = processor
        self.hf_config = hf_config

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
    def from_pretrained(cls, path=None, *, dtype: str = "float32", mesh=None, model_axis: int | None = None,
                        max_context: int | None = None, max_audio_seconds: float | None = None) -> "Pipeline":
        """Load a local Hugging Face checkpoint folder, a GGUF file, or a folder holding one GGUF file (``path=None``:
        the embedded default model).

        dtype: parameter dtype ("float32", "bfloat16", "float16"); GGUF tensors are dequantized into it.
        mesh: a ("data", "model") jax Mesh; default: all devices with ``model_axis`` of them (default all)
        sharding the weights. max_context: context budget in tokens (prompt + new tokens), at most the model's own
        limit. max_audio_seconds: longest audio clip accepted (families with audio input).
        """
        check_load_settings(dtype, model_axis, max_context, max_audio_seconds)
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
        processor = spec.make_processor(ckpt.folder, cfg, max_audio_seconds=max_audio_seconds,
                                        **ckpt.processor_kwargs)
        check_vocabulary(processor.tokenizer, cfg.decoder.vocab_size, tuple(t for _, t in cfg.media_token_ids),
                         cfg.eos_ids, str(ckpt.path))
        if mesh is None:
            try:
                mesh = make_mesh(model_axis)
            except ValueError as e:
                raise SettingError(f"model_axis: {e}") from None
        cfg = dataclasses.replace(cfg, decoder=cfg.decoder.with_kv_repeat(mesh.shape["model"]))
        graphdef, shapes = abstract_params(abstract_model(cfg, spec))
        weight_map = spec.weight_map(cfg)
        start = time.perf_counter()
        tensors = ckpt.open_tensors(spec, weight_map, dtype)
        params = load_params(tensors, shapes, weight_map, dtype=dtype, mesh=mesh,
                             unused_patterns=spec.unused_keys(cfg, ckpt.hf_config))
        log.info("loaded %s (%s, %s) in %.1fs", ckpt.path, spec.name, ckpt.format, time.perf_counter() - start)
        engine = Engine(cfg, graphdef, params, mesh, collate=processor.collate, dtype=_JAX_DTYPES[dtype],
                        max_context=max_context)
        processor.budget = RequestBudget.for_context(engine.max_context)
        return cls(ckpt.path, spec, cfg, engine, processor, ckpt.hf_config)

    def prepare(self, messages) -> PreparedPrompt:
        """Chat messages -> PreparedPrompt through the family's processor; a plain string is a raw prompt."""
        if isinstance(messages, str):
            return self.prepare_raw(messages)
        return self.processor.prepare(messages)

    def prepare_raw(self, text: str) -> PreparedPrompt:
        """A raw-completion prompt: ``text`` tokenized as the tokenizer does by default (BOS as it is configured to
        add), with no chat template. Media placeholder tokens are refused (a raw prompt carries no media)."""
        if isinstance(text, str):
            check_text_size([text], self.processor.budget.max_text_bytes, "the raw prompt")
        ids = raw_prompt_ids(self.processor.tokenizer, text)
        for modality, token_id in self.config.media_token_ids:
            if np.any(ids == token_id):
                raise PromptError(f"the raw prompt holds {int(np.sum(ids == token_id))} {modality} placeholder "
                                  f"token(s); raw prompts are text only")
        return PreparedPrompt(token_ids=ids, media={}, bidirectional=np.zeros(len(ids), bool))

    def generate(self, messages, *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None):
        """One conversation (or raw prompt string) -> GenerationResult; a list of them -> list of GenerationResult."""
        check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        batch = _is_batch(messages)
        conversations = list(messages) if batch else [messages]
        if len(conversations) > MAX_BATCH:  # before any of them is prepared
            raise SettingError(f"a batch holds at most {MAX_BATCH} conversations, got {len(conversations)}")
        prompts = [self.prepare(c) for c in conversations]
        results = self.generate_prepared(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                         top_k=top_k, top_p=top_p, seed=seed, stop=stop)
        return results if batch else results[0]

    def generate_prepared(self, prompts: list[PreparedPrompt], *, max_new_tokens: int = 64, temperature: float = 0.0,
                          top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None,
                          pad_to: int | None = None) -> list[GenerationResult]:
        """``generate`` for prompts already prepared (``prepare``), one result per prompt.

        pad_to: fill the batch up to this size with copies of its first prompt (their answers are dropped) so a
        short last batch reuses the compiled program of full ones. ``seconds`` is the batch's generation time.
        """
        sampling, max_new_tokens, stop = check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        if not 1 <= len(prompts) <= MAX_BATCH or (pad_to is not None and not 0 <= pad_to <= MAX_BATCH):
            raise SettingError(f"a batch holds 1 to {MAX_BATCH} prompts (padded to at most {MAX_BATCH}); got "
                               f"{len(prompts)} prompts, pad_to {pad_to}")
        batch = list(prompts) + [prompts[0]] * max(0, (pad_to or 0) - len(prompts))
        start = time.perf_counter()
        tokens = self.engine.generate(batch, max_new_tokens, sampling)
        seconds = time.perf_counter() - start
        return [self._result(row, len(p.token_ids), stop, seconds) for row, p in zip(tokens[:len(prompts)], prompts)]

    def _result(self, row: np.ndarray, prompt_tokens: int, stop: tuple[str, ...], seconds: float) -> GenerationResult:
        ids = row.tolist()
        if not stop:  # no stop strings: the answer ends at the first end id
            end = next((i for i, t in enumerate(ids) if t in self.config.eos_ids), None)
            answer = ids if end is None else ids[:end]
            return GenerationResult(text=self.processor.decode(answer), token_ids=ids[:len(answer) + 1],
                                    prompt_tokens=prompt_tokens, finish_reason="length" if end is None else "eos",
                                    seconds=seconds)
        answer = answer_for(self.processor, stop, self.config.eos_ids)
        for t in ids:
            answer.push(t)
            if answer.done:
                break
        answer.finish()
        return GenerationResult(text=answer.text, token_ids=answer.token_ids, prompt_tokens=prompt_tokens,
                                finish_reason=answer.finish_reason, seconds=seconds)

    def stream(self, messages, *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0,
               stop: Sequence[str] | None = None) -> Generator[str, None, GenerationResult]:
        """Text pieces of one conversation's answer as they are generated (one piece per token, "" while a token
        adds no visible text yet, so a consumer can stop between any two tokens), then possibly one last piece.

        The generator's return value (``result = yield from pipe.stream(...)``) is the answer's GenerationResult as
        ``generate`` gives it, and the pieces joined are exactly ``result.text``: text is shown once no later
        token can change it (an unfinished UTF-8 character or byte run waits), and text that could be the start
        of a stop string waits until it is known not to be one.
        """
        sampling, max_new_tokens, stop = check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        if _is_batch(messages):
            raise PromptError("stream takes one conversation; use generate for a batch")
        start = time.perf_counter()
        prompt = self.prepare(messages)
        answer = answer_for(self.processor, stop, self.config.eos_ids)
        for tok in self.engine.stream([prompt], max_new_tokens, sampling):
            piece = answer.push(int(tok[0]))
            if answer.done:
                if piece:
                    yield piece
                break
            yield piece
        rest = answer.finish()
        if rest:
            yield rest
        return GenerationResult(text=answer.text, token_ids=answer.token_ids, prompt_tokens=len(prompt.token_ids),
                                finish_reason=answer.finish_reason, seconds=time.perf_counter() - start)
