"""Speaking an answer: the thinker's states -> talker -> code predictor -> code2wav, streamed in chunks.

After the thinker has written its answer, ``SpeechEngine.speak`` runs, on the same engine design as the text loop:

1. ``prepare`` (one jitted call): one prefill of prompt + spoken answer through the thinker returning its input
   embeddings and its hidden states at the talker's ``accept_hidden_layer`` (``DecoderModel.prefill(hidden_at=)``),
   the talker's input rows gathered and projected from them (the layout: app/families/qwen3_omni/talker_input.py),
   the talker's prefill and its first code.
2. ``frames`` (one jitted call per chunk): an on-device while loop over frames; each frame runs the code predictor's
   inner loop (G - 1 steps, on device) and one talker step, with the repetition penalty and the suppressed ids of
   transformers' ``generate``, until the end code or the chunk is full.
3. ``vocode`` (one jitted call per chunk): code2wav on the chunk's frames with the left context it needs
   (decoder/qwen3_omni/code2wav.py); the chunks joined are exactly the answer's audio.

Shapes are bucketed: the thinker sequence and the talker's cache take the engine's length buckets (the cache grows
to the next bucket when the frames need it), chunks have two fixed sizes; new lengths inside a bucket do not
compile again. Host work is O(1) per chunk.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.app.families.qwen3_omni.speech import PREDICTOR_SAMPLING, TALKER_SAMPLING
from omnijax.app.families.qwen3_omni.talker_input import HIDDEN, TEXT, TTS_BOS, TTS_EOS, TTS_PAD, talker_input
from omnijax.app.generation import Engine, bucket_for, make_batch
from omnijax.app.sampling import SamplingParams, choose
from omnijax.app.speech_events import AudioChunk
from omnijax.common.errors import OmnijaxError, SamplingError
from omnijax.common.sharding import host_array, named_sharding, put, use_mesh
from omnijax.decoder.kv_cache import extend_cache
from omnijax.decoder.model import Media, Prompt
from omnijax.decoder.qwen3_omni.code2wav import chunk_samples, start_stream
from omnijax.preprocess.processor import PreparedPrompt

FIRST_CHUNK_FRAMES = 8  # a short first chunk: the first audio comes early
CHUNK_FRAMES = 25  # then two seconds at Qwen3-Omni's 12.5 frames per second
DEFAULT_MAX_FRAMES = 4096  # transformers' talker_max_new_tokens


class TalkerState(NamedTuple):
    """The talker between frames: ``code0`` [B] the next frame's first code (its other groups not yet predicted),
    ``hidden`` [B, D] the talker's final-normed state that chose it, ``frame`` frames completed, ``done`` [B] the end
    code was chosen, ``seen`` [B, V] codes chosen so far (repetition penalty), ``trailing`` [B, T, D] / its length
    [B]: the text still to speak, one entry per frame, then ``pad`` [B, D]; ``delta`` [B] the RoPE delta."""

    cache: dict
    code0: jax.Array
    hidden: jax.Array
    frame: jax.Array
    done: jax.Array
    seen: jax.Array
    trailing: jax.Array
    trailing_len: jax.Array
    pad: jax.Array
    delta: jax.Array


class SpeechSettings(NamedTuple):
    """The talker's and the code predictor's sampling (greedy when the request is greedy, else transformers'
    talker defaults with the request's seed)."""

    talker: SamplingParams
    predictor: SamplingParams

    @classmethod
    def of(cls, sampling: SamplingParams) -> "SpeechSettings":
        if sampling.greedy:
            return cls(SamplingParams(), SamplingParams())
        return cls(SamplingParams(**TALKER_SAMPLING, seed=sampling.seed),
                   SamplingParams(**PREDICTOR_SAMPLING, seed=sampling.seed))

    def mode(self):
        return self.talker.mode(), self.predictor.mode()

    def values(self):
        return self.talker.values(), self.predictor.values()


class SpeechEngine:
    """Compiled speech output for one loaded model (its ``Engine`` and the family's ``SpeechConfig``)."""

    def __init__(self, engine: Engine, cfg, *, first_chunk: int = FIRST_CHUNK_FRAMES, chunk: int = CHUNK_FRAMES):
        self.engine = engine
        self.cfg = cfg
        self.first_chunk, self.chunk = first_chunk, chunk
        vocab = cfg.talker.decoder.vocab_size
        first, end = cfg.suppressed
        ids = np.arange(vocab)
        self._suppressed = (ids >= first) & (ids < end) & (ids != cfg.codec["eos"])
        self._prepare = jax.jit(self._prepare_impl, static_argnames=("talker_cache_len", "mode"))
        self._frames = jax.jit(self._frames_impl, static_argnames=("chunk", "mode"), donate_argnames=("state",))
        self._vocode = jax.jit(self._vocode_impl, donate_argnames=("stream",))
        self._grow = jax.jit(self._grow_impl, static_argnames=("cache_len",))
        self._decode = jax.jit(lambda params, codes: self._speech(params).code2wav.decode(codes))

    @property
    def voices(self) -> tuple[str, ...]:
        return self.cfg.voices

    @property
    def sample_rate(self) -> int:
        return self.cfg.sample_rate

    def voice_id(self, voice: str | None) -> int:
        """The codec id of ``voice`` (case-insensitive; None: the checkpoint's first voice)."""
        speakers = dict(self.cfg.speakers)
        if voice is None:
            return self.cfg.speakers[0][1]
        if not isinstance(voice, str) or voice.lower() not in speakers:
            raise SamplingError(f"unknown voice {voice!r}; this model's voices are {', '.join(self.voices)}")
        return speakers[voice.lower()]

    # ---- jitted bodies -------------------------------------------------------------------------------------
    def _model(self, params):
        return nnx.merge(self.engine.graphdef, params)

    def _speech(self, params):
        return self._model(params).speech

    def _talker_logits(self, talker, h_BD, seen_BV):
        """The codec logits as transformers' generate hands them to the sampler: repetition penalty on the codes
        chosen so far, suppressed ids at -inf."""
        logits = talker.codec_logits(h_BD)
        p = jnp.float32(self.cfg.repetition_penalty)
        logits = jnp.where(seen_BV, jnp.where(logits < 0, logits * p, logits / p), logits)
        return jnp.where(jnp.asarray(self._suppressed), -jnp.inf, logits)

    def _prepare_impl(self, params, thinker: dict, layout: dict, key, values, *, talker_cache_len, mode):
        model = self._model(params)
        dec, talker = model.decoder, model.speech.talker
        cfg = self.engine.cfg
        media = {cfg.media_token_id(m): Media(*out) for m, out in thinker["media"].items()}
        prompt = Prompt(thinker["tokens"], thinker["lengths"], thinker["rope_pos"], thinker["bidirectional"], media,
                        cfg.deepstack_ids(thinker["media"]))
        accept = self.cfg.accept_hidden_layer
        _, _, hidden = dec.prefill(prompt, cache_len=thinker["tokens"].shape[1], cache_dtype=self.engine.dtype,
                                   attention=self.engine.attention, hidden_at=tuple(sorted({0, accept})),
                                   output="hidden")
        embeds, states = hidden[0][0], hidden[accept][0]  # [L, thinker width]
        tts = self.cfg.tts
        special = talker.text_projection(dec.embedder.encode(jnp.asarray([[tts["pad"], tts["bos"], tts["eos"]]])))[0]

        def rows(src, kinds):
            src = jnp.clip(src, 0, embeds.shape[0] - 1)
            text = talker.text_projection(jnp.take(embeds, src, axis=0))
            out = jnp.where((kinds == HIDDEN)[:, None], talker.hidden_projection(jnp.take(states, src, axis=0)), text)
            for kind, row in ((TTS_PAD, special[0]), (TTS_BOS, special[1]), (TTS_EOS, special[2])):
                out = jnp.where((kinds == kind)[:, None], row, out)
            return jnp.where(((kinds >= TEXT) & (kinds <= TTS_EOS))[:, None], out, 0)

        codec = layout["codec"]
        x = rows(layout["rows"], layout["kinds"])
        x = x + jnp.where((codec >= 0)[:, None], talker.codec_embed(jnp.maximum(codec, 0)), 0)
        n = x.shape[0]
        t_prompt = Prompt(jnp.zeros((1, n), jnp.int32), layout["length"][None], layout["rope_pos"],
                          jnp.zeros((1, n), bool), {})
        h, cache = talker.decoder.prefill(t_prompt, cache_len=talker_cache_len, cache_dtype=self.engine.dtype,
                                          attention=self.engine.attention, embeds=x[None].astype(self.engine.dtype),
                                          output="hidden")
        seen = jnp.zeros((1, talker.cfg.decoder.vocab_size), bool)
        code0 = choose(self._talker_logits(talker, h, seen), jax.random.fold_in(key, 0), values[0], mode[0])
        trailing = rows(layout["trailing_rows"], layout["trailing_kinds"])[None]
        return TalkerState(cache, code0, h, jnp.int32(0), code0 == self.cfg.codec["eos"],
                           seen.at[0, code0[0]].set(True), trailing, layout["trailing_length"][None],
                           special[None, 0], layout["delta"][None])

    def _frames_impl(self, params, state: TalkerState, limit, key, values, *, chunk, mode):
        """Up to ``min(chunk, limit)`` frames -> (codes [B, chunk, G] (the first ``count`` are real), count, state).
        ``speak`` passes one ``chunk`` (the longest) and the frames it wants as ``limit``: one program for all."""
        talker = self._speech(params).talker
        b = state.code0.shape[0]
        groups = talker.cfg.num_code_groups
        eos = self.cfg.codec["eos"]

        def cond(carry):
            i, st, _ = carry
            return (i < jnp.minimum(limit, chunk)) & ~jnp.all(st.done)

        def body(carry):
            i, st, codes = carry
            frame_key = jax.random.fold_in(key, 2 * st.frame + 1)
            rest, total = talker.predict_codes(
                st.hidden, st.code0, lambda logits, g: choose(logits, jax.random.fold_in(frame_key, g), values[1],
                                                              mode[1]))
            codes = codes.at[:, i].set(jnp.concatenate([st.code0[:, None], rest], axis=1))
            text = jnp.where((st.frame < st.trailing_len)[:, None],
                             jax.lax.dynamic_index_in_dim(st.trailing, jnp.minimum(st.frame, st.trailing.shape[1] - 1),
                                                          1, keepdims=False), st.pad)
            pos = st.cache["length"] + st.delta
            h, cache = talker.decoder.embeds_step((total + text).astype(st.hidden.dtype),
                                                  jnp.broadcast_to(pos[None], (3, b)), st.cache)
            code0 = choose(self._talker_logits(talker, h, st.seen), jax.random.fold_in(key, 2 * (st.frame + 1)),
                           values[0], mode[0])
            seen = st.seen | jax.nn.one_hot(code0, st.seen.shape[1], dtype=bool)
            return i + 1, st._replace(cache=cache, code0=code0, hidden=h, frame=st.frame + 1, done=code0 == eos,
                                      seen=seen), codes

        codes = jnp.zeros((b, chunk, groups), jnp.int32)
        count, state, codes = jax.lax.while_loop(cond, body, (jnp.int32(0), state, codes))
        return codes, count, state

    def _vocode_impl(self, params, stream, codes, count):
        return self._speech(params).code2wav.stream_chunk(stream, codes, count)

    def _grow_impl(self, state: TalkerState, *, cache_len):
        return state._replace(cache=extend_cache(self.cfg.talker.decoder, state.cache, cache_len))

    # ---- host side -----------------------------------------------------------------------------------------
    def _put(self, array) -> jax.Array:
        array = np.asarray(array)
        return put(array, named_sharding((None,) * array.ndim, array.shape, self.engine.mesh))

    def _thinker_inputs(self, prompt: PreparedPrompt, answer: np.ndarray) -> dict:
        """Prompt + spoken answer as one bucketed thinker prefill (answer positions continue the prompt's)."""
        n = len(answer)
        rope = None if prompt.rope_positions is None else np.concatenate(
            [prompt.rope_positions, np.broadcast_to(len(prompt.token_ids) + prompt.rope_delta + np.arange(n),
                                                    (prompt.rope_positions.shape[0], n))], axis=1)
        whole = PreparedPrompt(np.concatenate([prompt.token_ids, answer]).astype(np.int32), prompt.media,
                               np.concatenate([prompt.bidirectional, np.zeros(n, bool)]), rope, prompt.rope_delta)
        length = bucket_for(len(whole.token_ids), self.engine.buckets)
        batch = make_batch([whole], length, self.engine.cfg.pad_id, self.engine.cfg.decoder.rope_axes)
        return {"tokens": self._put(batch.tokens), "lengths": self._put(batch.lengths),
                "bidirectional": self._put(batch.bidirectional), "rope_pos": self._put(batch.rope_pos),
                "media": self.engine.encode(batch.media)}

    def _layout(self, layout, length: int, trailing: int) -> dict:
        def pad(a, n, value):
            return np.concatenate([a, np.full((n - a.shape[-1],) if a.ndim == 1 else (a.shape[0], n - a.shape[-1]),
                                              value, a.dtype)], axis=-1)

        rope = pad(layout.rope_positions, length, 0)[:, None]
        return {k: self._put(v) for k, v in {
            "rows": pad(layout.rows, length, -1), "kinds": pad(layout.kinds, length, -1),
            "codec": pad(layout.codec, length, -1), "length": np.int32(layout.length), "rope_pos": rope,
            "delta": np.float32(layout.rope_delta), "trailing_rows": pad(layout.trailing_rows, trailing, -1),
            "trailing_kinds": pad(layout.trailing_kinds, trailing, -1),
            "trailing_length": np.int32(len(layout.trailing_rows))}.items()}

    def speak(self, prompt: PreparedPrompt, answer_ids, *, voice: str | None, sampling: SamplingParams,
              max_frames: int = DEFAULT_MAX_FRAMES) -> Iterator[AudioChunk]:
        """The spoken answer as chunks (none when the answer has nothing to speak). ``answer_ids``: the answer's
        tokens without its end token."""
        speaker = self.voice_id(voice)
        answer = np.asarray(answer_ids, np.int32)
        layout = talker_input(prompt.token_ids, answer, self.cfg, speaker, prompt.rope_media)
        if layout is None:
            return
        buckets = self.engine.buckets
        settings = SpeechSettings.of(sampling)
        mode, values = settings.mode(), settings.values()
        key = settings.talker.key()
        cache_len = bucket_for(layout.length + 4 * len(layout.trailing_rows) + self.first_chunk, buckets)
        mesh = self.engine.mesh
        with use_mesh(mesh):
            state = self._prepare(
                self.engine.params, self._thinker_inputs(prompt, answer),
                self._layout(layout, bucket_for(layout.length, buckets),
                             bucket_for(len(layout.trailing_rows), buckets)),
                key, values, talker_cache_len=cache_len, mode=mode)
            stream = start_stream(self.cfg.code2wav, 1, self.engine.dtype)
        frames = 0
        while frames < max_frames:
            size = self.first_chunk if frames == 0 else self.chunk
            need = layout.length + frames + size
            if need > cache_len:
                cache_len = bucket_for(need, buckets)
                with use_mesh(mesh):
                    state = self._grow(state, cache_len=cache_len)
            with use_mesh(mesh):  # one program for every chunk: its frame count is data (a short first one too)
                codes, count, state = self._frames(self.engine.params, state, jnp.int32(min(size, max_frames - frames)),
                                                   key, values, chunk=self.chunk, mode=mode)
            count = int(host_array(count))
            if count:
                samples, stream = self._vocode_chunk(stream, codes, frames, count)
                yield AudioChunk(samples, self.sample_rate, host_array(codes)[0, :count])
            frames += count
            if count < size or bool(host_array(state.done).all()):
                return

    def _vocode_chunk(self, stream, codes, frames_before: int, count: int) -> tuple[np.ndarray, tuple]:
        """code2wav on a chunk's frames (the first ``count`` of ``codes`` [1, chunk, G]) -> (the samples they
        complete, float32; the stream state after them)."""
        with use_mesh(self.engine.mesh):
            wav, stream = self._vocode(self.engine.params, stream, codes, jnp.int32(count))
        first, end = chunk_samples(frames_before, count, self.cfg.code2wav)
        return host_array(wav)[0, first:end].astype(np.float32), stream

    def decode_stream(self, codes: np.ndarray) -> Iterator[np.ndarray]:
        """code2wav alone on codes int [frames, groups], streamed in the chunks ``speak`` uses: each chunk's
        samples (joined: the whole decode's)."""
        codes = np.asarray(codes, np.int32)
        stream = start_stream(self.cfg.code2wav, 1, self.engine.dtype)
        frames = 0
        while frames < len(codes):
            size = self.first_chunk if frames == 0 else self.chunk
            part = codes[frames:frames + size]
            padded = np.zeros((1, self.chunk, codes.shape[1]), np.int32)  # one width: one program
            padded[0, :len(part)] = part
            samples, stream = self._vocode_chunk(stream, self._put(padded), frames, len(part))
            yield samples
            frames += len(part)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """code2wav alone: codes int [frames, groups] -> the whole decode's waveform (float32)."""
        with use_mesh(self.engine.mesh):
            wav = self._decode(self.engine.params, self._put(np.asarray(codes, np.int32)[None]))
        return host_array(wav)[0].astype(np.float32)

    def compilations(self) -> int:
        return sum(f._cache_size() for f in (self._prepare, self._frames, self._vocode, self._grow))


def require_speech(engine: "SpeechEngine | None", family: str) -> "SpeechEngine":
    if engine is None:
        raise OmnijaxError(f"this {family} checkpoint has no talker (no speech output): it answers in text only")
    return engine
