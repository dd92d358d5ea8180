"""The Python API: ``Pipeline.from_pretrained(folder or .gguf file)`` then ``generate`` / ``stream`` on chat messages
or, for base models, on plain text (raw completion); a model with a talker also answers aloud (``speak=True``: the
speech path is app/speech.py, entered through ``_speak`` only)."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time
from typing import Any, Generator, Iterator, Sequence

import jax.numpy as jnp
import numpy as np

from omnijax.app.answer_text import answer_for
from omnijax.app.checkpoint import abstract_params, load_params
from omnijax.app.checkpoint_source import open_checkpoint
from omnijax.app.compilation_cache import enable_compilation_cache
from omnijax.app.config_limits import check_config_limits
from omnijax.common.errors import CapabilityError, PromptError
from omnijax.app.families import family_for_config
from omnijax.app.generation import Engine
from omnijax.app.model import abstract_model
from omnijax.app.sampling import SamplingParams, check_settings
from omnijax.app.speech_events import AudioChunk, TextPiece
from omnijax.common.sharding import make_mesh
from omnijax.preprocess.processor import PreparedPrompt
from omnijax.preprocess.raw_prompt import raw_prompt_ids

log = logging.getLogger(__name__)

_JAX_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass
class GenerationResult:
    """text: the answer (special tokens removed, cut before a stop string); token_ids: generated ids (an EOS that
    ended the answer included, as transformers' generate returns it); finish_reason: "eos", "stop" or "length".
    With ``speak=True``: audio (float32 mono samples in [-1, 1]), sample_rate (Hz) and audio_codes (int32
    [frames, code groups], the codec codes the audio was made from); None otherwise."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    seconds: float = 0.0
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    audio_codes: np.ndarray | None = None


def _is_batch(messages: Any) -> bool:
    """A list of conversations or of raw prompts (one conversation is a list of message dicts)."""
    return isinstance(messages, (list, tuple)) and bool(messages) and isinstance(messages[0], (list, tuple, str))


class Pipeline:
    def __init__(self, folder: pathlib.Path, spec, cfg, engine: Engine, processor, hf_config: dict):
        self.folder = folder
        self.spec = spec
        self.config = cfg
        self.engine = engine
        self.processor = processor
        self.hf_config = hf_config
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
    def from_pretrained(cls, path=None, *, dtype: str = "float32", mesh=None, model_axis: int | None = None,
                        max_context: int | None = None, max_audio_seconds: float | None = None) -> "Pipeline":
        """Load a local Hugging Face checkpoint folder, a GGUF file, or a folder holding one GGUF file (``path=None``:
        the embedded default model).

        dtype: parameter dtype ("float32", "bfloat16", "float16"); GGUF tensors are dequantized into it.
        mesh: a ("data", "model") jax Mesh; default: all devices with ``model_axis`` of them (default all)
        sharding the weights. max_context: context budget in tokens (prompt + new tokens), at most the model's own
        limit. max_audio_seconds: longest audio clip accepted (families with audio input).
        """
        if dtype not in _JAX_DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(_JAX_DTYPES)}")
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
        graphdef, shapes = abstract_params(abstract_model(cfg, spec))
        weight_map = spec.weight_map(cfg)
        start = time.perf_counter()
        tensors = ckpt.open_tensors(spec, weight_map, dtype)
        params = load_params(tensors, shapes, weight_map, dtype=dtype, mesh=mesh,
                             unused_patterns=spec.unused_keys(cfg, ckpt.hf_config))
        log.info("loaded %s (%s, %s) in %.1fs", ckpt.path, spec.name, ckpt.format, time.perf_counter() - start)
        engine = Engine(cfg, graphdef, params, mesh, collate=processor.collate, dtype=_JAX_DTYPES[dtype],
                        max_context=max_context)
        return cls(ckpt.path, spec, cfg, engine, processor, ckpt.hf_config)

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
                 top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None, speak: bool = False,
                 voice: str | None = None, max_speech_frames: int | None = None):
        """One conversation (or raw prompt string) -> GenerationResult; a list of them -> list of GenerationResult.

        speak: also answer aloud (one conversation, a model with a talker): the result carries ``audio``,
        ``sample_rate`` and ``audio_codes``. voice: one of ``voices`` (default: the first). max_speech_frames: a
        cap on the codec frames spoken (default 4096)."""
        sampling, _, _ = check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        batch = _is_batch(messages)
        if speak:
            self._check_speak(messages, voice, max_speech_frames)
        conversations = list(messages) if batch else [messages]
        prompts = [self.prepare(c) for c in conversations]
        results = self.generate_prepared(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                         top_k=top_k, top_p=top_p, seed=seed, stop=stop)
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
        if max_speech_frames is not None and (isinstance(max_speech_frames, bool) or
                                              not isinstance(max_speech_frames, int) or max_speech_frames < 1):
            raise PromptError(f"max_speech_frames must be an integer >= 1, got {max_speech_frames!r}")

    def _speak(self, prompt: PreparedPrompt, result: GenerationResult, voice, sampling: SamplingParams,
               max_speech_frames) -> Iterator[AudioChunk]:
        """The answer of ``result`` spoken, chunk by chunk."""
        kwargs = {} if max_speech_frames is None else {"max_frames": max_speech_frames}
        return self.speech.speak(prompt, spoken_tokens(result, self.processor.decode, self.config.eos_ids),
                                 voice=voice, sampling=sampling, **kwargs)

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
               top_p: float = 1.0, seed: int = 0, stop: Sequence[str] | None = None, speak: bool = False,
               voice: str | None = None,
               max_speech_frames: int | None = None) -> Generator[Any, None, GenerationResult]:
        """Text pieces of one conversation's answer as they are generated (one piece per token, "" while a token
        adds no visible text yet, so a consumer can stop between any two tokens), then possibly one last piece.

        The generator's return value (``result = yield from pipe.stream(...)``) is the answer's GenerationResult as
        ``generate`` gives it, and the pieces joined are exactly ``result.text``: text is shown once no later
        token can change it (an unfinished UTF-8 character or byte run waits), and text that could be the start
        of a stop string waits until it is known not to be one.

        speak: the events are ``TextPiece`` (the text pieces) and then ``AudioChunk`` (the spoken answer, chunk by
        chunk as it is made; app/speech_events.py); the chunks joined are exactly ``result.audio``.
        """
        sampling, max_new_tokens, stop = check_settings(max_new_tokens, temperature, top_k, top_p, seed, stop)
        if _is_batch(messages):
            raise PromptError("stream takes one conversation; use generate for a batch")
        if speak:
            self._check_speak(messages, voice, max_speech_frames)
        start = time.perf_counter()
        prompt = self.prepare(messages)
        answer = answer_for(self.processor, stop, self.config.eos_ids)
        wrap = TextPiece if speak else str
        for tok in self.engine.stream([prompt], max_new_tokens, sampling):
            piece = answer.push(int(tok[0]))
            if answer.done:
                if piece:
                    yield wrap(piece)
                break
            yield wrap(piece)
        rest = answer.finish()
        if rest:
            yield wrap(rest)
        result = GenerationResult(text=answer.text, token_ids=answer.token_ids, prompt_tokens=len(prompt.token_ids),
                                  finish_reason=answer.finish_reason, seconds=time.perf_counter() - start)
        if speak:
            chunks = []
            for chunk in self._speak(prompt, result, voice, sampling, max_speech_frames):
                chunks.append(chunk)
                yield chunk
            _attach_audio(result, chunks, self.speech)
            result.seconds = time.perf_counter() - start
        return result


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
