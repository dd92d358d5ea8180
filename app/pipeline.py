"""The Python API: ``Pipeline.from_pretrained(folder or .gguf file)`` then ``generate`` / ``stream`` on chat messages
or, for base models, on plain text (raw completion)."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time
from typing import Any, Generator, Sequence

import jax.numpy as jnp
import numpy as np

from omnijax.app.answer_text import answer_for
from omnijax.app.checkpoint import abstract_params, load_params, quantizable_params
from omnijax.app.checkpoint_source import open_checkpoint
from omnijax.app.compilation_cache import enable_compilation_cache
from omnijax.app.config_limits import check_config_limits
from omnijax.common.errors import PromptError, SettingError
from omnijax.common.quantized import check_quantize
from omnijax.app.families import family_for_config
from omnijax.app.generation import Engine
from omnijax.app.model import abstract_model
from omnijax.app.sampling import check_settings
from omnijax.common.sharding import make_mesh
from omnijax.preprocess.processor import PreparedPrompt
from omnijax.preprocess.raw_prompt import raw_prompt_ids

log = logging.getLogger(__name__)

_JAX_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def check_dtype(dtype) -> str:
    """``dtype`` when it names a weight dtype omnijax loads, else SettingError naming the valid ones."""
    if dtype not in _JAX_DTYPES:
        raise SettingError(f"unsupported dtype {dtype!r}; use one of {', '.join(sorted(_JAX_DTYPES))}")
    return dtype


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


class Pipeline:
    def __init__(self, folder: pathlib.Path, spec, cfg, engine: Engine, processor, hf_config: dict, *,
                 dtype: str = "float32", quantize: str | None = None):
        self.folder = folder
        self.spec = spec
        self.config = cfg
        self.engine = engine
        self.processor = processor
        self.hf_config = hf_config
        self.dtype = dtype
        self.quantize = quantize
        self._scorer = None

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
                        max_audio_seconds: float | None = None) -> "Pipeline":
        """Load a local Hugging Face checkpoint folder, a GGUF file, or a folder holding one GGUF file (``path=None``:
        the embedded default model).

        dtype: parameter dtype ("float32", "bfloat16", "float16"); GGUF tensors are dequantized into it.
        quantize: None, "int8" or "int4": the decoder's weight matrices (projections, experts, embedding / output
        matrix) are stored quantized (int8 per output channel; int4 in groups of 32, two per byte) and widened
        next to their products (common/matmul_policy.py); the rest stays in ``dtype``. A GGUF file's tensors are
        converted one at a time.
        mesh: a ("data", "model") jax Mesh; default: all devices with ``model_axis`` of them (default all)
        sharding the weights. max_context: context budget in tokens (prompt + new tokens), at most the model's own
        limit. max_audio_seconds: longest audio clip accepted (families with audio input).
        """
        dtype = check_dtype(dtype)
        quantize = check_quantize(quantize)
        enable_compilation_cache()
        if path is None:
            from omnijax.app.default_model import default_model_dir

            path = default_model_dir()
        ckpt = open_checkpoint(path)
        check_config_limits(ckpt.hf_config)
        spec = family_for_config(ckpt.hf_config)
        cfg = spec.parse_config(ckpt.hf_config)
        if ckpt.eos_ids is not None:
            cfg = dataclasses.replace(cfg, eos_ids=ckpt.eos_ids)
        processor = spec.make_processor(ckpt.folder, cfg, max_audio_seconds=max_audio_seconds,
                                        **ckpt.processor_kwargs)
        mesh = mesh if mesh is not None else make_mesh(model_axis)
        cfg = dataclasses.replace(cfg, decoder=cfg.decoder.with_kv_repeat(mesh.shape["model"]))
        skeleton = abstract_model(cfg, spec)
        graphdef, shapes = abstract_params(skeleton)
        weight_map = spec.weight_map(cfg)
        start = time.perf_counter()
        # quantized weights are made from float32 tensors (one at a time), the others cast to dtype as they come
        tensors = ckpt.open_tensors(spec, weight_map, "float32" if quantize else dtype)
        params = load_params(tensors, shapes, weight_map, dtype=dtype, mesh=mesh,
                             unused_patterns=spec.unused_keys(cfg, ckpt.hf_config), quantize_mode=quantize,
                             quant_axes=quantizable_params(skeleton) if quantize else None)
        log.info("loaded %s (%s, %s) in %.1fs", ckpt.path, spec.name, ckpt.format, time.perf_counter() - start)
        engine = Engine(cfg, graphdef, params, mesh, collate=processor.collate, dtype=_JAX_DTYPES[dtype],
                        max_context=max_context)
        return cls(ckpt.path, spec, cfg, engine, processor, ckpt.hf_config, dtype=dtype, quantize=quantize)

    def score(self, texts) -> list[np.ndarray] | np.ndarray:
        """For each raw text (a string, or a list of them), the natural-log probability of each of its tokens after
        the first given the ones before it: a float32 numpy array of length (tokens - 1) per text. The text is
        tokenized as a raw prompt (``prepare_raw``: BOS as the tokenizer adds it); a text longer than the scoring
        window (1024 tokens, at most the context budget) is scored in overlapping windows, each token once.
        ``app.scoring.perplexity`` of the result is the perplexity."""
        from omnijax.app.scoring import Scorer

        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        bad = [type(t).__name__ for t in items if not isinstance(t, str)]
        if bad:
            raise PromptError(f"score takes texts (strings), got {bad[0]}")
        if self._scorer is None:
            self._scorer = Scorer(self.engine)
        out = [self._scorer.score(self.prepare_raw(t).token_ids) for t in items]
        return out[0] if single else out

    def prepare(self, messages) -> PreparedPrompt:
        """Chat messages -> PreparedPrompt through the family's processor; a plain string is a raw prompt."""
        if isinstance(messages, str):
            return self.prepare_raw(messages)
        return self.processor.prepare(messages)

    def prepare_raw(self, text: str) -> PreparedPrompt:
        """A raw-completion prompt: ``text`` tokenized as the tokenizer does by default (BOS as it is configured to
        add), with no chat template. Media placeholder tokens are refused (a raw prompt carries no media)."""
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
