"""Qwen3-Omni's code2wav: codec codes [B, T, G] -> 24 kHz waveform, as one decode or streamed chunk by chunk.

The codes of each frame are embedded (one table of G x codebook rows, code g of a frame reading row g * codebook +
code) and averaged, run through a sliding-window transformer (a ``DecoderModel`` of ``layer_scale`` blocks, its
final-normed states taken), then through the convolutional vocoder (decoder/qwen3_omni/vocoder.py).

Streaming (``stream_chunk``): the transformer is causal, so it steps through each chunk's new frames on its own
KV cache (a ring of its window) and gives the states a whole decode gives; the vocoder then decodes a window of
``context_frames`` earlier states plus the new ones, and the caller keeps the samples the new frames complete
(``chunk_samples``). Sample t of a decode depends only on frames before (t + lost) / total_upsample and on at most
``context_frames`` frames before that, so the chunks joined are the whole decode's samples.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from omnijax.decoder.kv_cache import init_cache
from omnijax.decoder.model import DecoderModel, Prompt
from omnijax.decoder.parts import BUILTIN_PARTS
from omnijax.decoder.qwen3_omni.blocks import LayerScaleBlock
from omnijax.decoder.qwen3_omni.vocoder import Vocoder, context_frames, lost_samples, total_upsample
from omnijax.decoder.spec import DecoderSpec

CODE2WAV_PARTS = BUILTIN_PARTS.extended(blocks={"layer_scale": LayerScaleBlock})


@dataclasses.dataclass(frozen=True)
class Code2WavConfig:
    """codebook_size codes in each of num_quantizers groups; transformer: its layers (vocab_size =
    num_quantizers * codebook_size: the code embedding table); the vocoder's decoder_dim, upsampling_ratios and
    upsample_rates."""

    codebook_size: int
    num_quantizers: int
    transformer: DecoderSpec
    decoder_dim: int
    upsampling_ratios: tuple[int, ...]
    upsample_rates: tuple[int, ...]

    @property
    def total_upsample(self) -> int:
        return total_upsample(self.upsampling_ratios, self.upsample_rates)

    @property
    def lost_samples(self) -> int:
        return lost_samples(self.upsample_rates)

    @property
    def context_frames(self) -> int:
        return context_frames(self.upsampling_ratios, self.upsample_rates)

    @property
    def window(self) -> int:
        """The transformer's attention window (its KV ring while streaming)."""
        return max(l.attention.mask.size or 1 for l in self.transformer.layers)


class StreamState(NamedTuple):
    """A streamed decode so far: the transformer's ``cache``, ``tail`` [B, context_frames, D] its states of the
    last frames (zeros before the first), and ``frames`` (int32 scalar) decoded."""

    cache: dict
    tail: jax.Array
    frames: jax.Array


def chunk_samples(frames_before: int, new_frames: int, cfg: Code2WavConfig) -> tuple[int, int]:
    """(first, end) of the samples ``stream_chunk``'s window output holds for the new frames: those the new frames
    complete, which a whole decode has at [frames_before * up - lost, (frames_before + new) * up - lost) (from 0
    for the first chunk)."""
    up, lost, ctx = cfg.total_upsample, cfg.lost_samples, cfg.context_frames
    first = ctx * up - (lost if frames_before > 0 else 0)
    return first, (ctx + new_frames) * up - lost


def start_stream(cfg: Code2WavConfig, batch: int, dtype=jnp.float32) -> StreamState:
    """The state before the first chunk."""
    return StreamState(init_cache(cfg.transformer, batch, cfg.window, dtype),
                       jnp.zeros((batch, cfg.context_frames, cfg.transformer.hidden_size), dtype),
                       jnp.zeros((), jnp.int32))


class Code2Wav(nnx.Module):
    def __init__(self, cfg: Code2WavConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.transformer = DecoderModel(cfg.transformer, parts=CODE2WAV_PARTS, rngs=rngs)
        self.vocoder = Vocoder(cfg.transformer.hidden_size, cfg.decoder_dim, cfg.upsampling_ratios,
                               cfg.upsample_rates, rngs=rngs)

    def embed(self, codes_BTG: jax.Array) -> jax.Array:
        """The mean over groups of each code's embedding [B, T, D]."""
        offsets = jnp.arange(self.cfg.num_quantizers, dtype=jnp.int32) * self.cfg.codebook_size
        return jnp.mean(self.transformer.embedder.encode(codes_BTG + offsets), axis=2)

    def decode(self, codes_BTG: jax.Array) -> jax.Array:
        """The whole decode: waveform [B, T * total_upsample - lost_samples]."""
        b, t, _ = codes_BTG.shape
        x = self.embed(codes_BTG)
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (1, b, t))
        prompt = Prompt(jnp.zeros((b, t), jnp.int32), jnp.full((b,), t, jnp.int32), positions,
                        jnp.zeros((b, t), bool), {})
        h, _ = self.transformer.prefill(prompt, cache_len=t, cache_dtype=x.dtype, all_logits=True, embeds=x,
                                        output="hidden")
        return self.vocoder(h)

    def stream_chunk(self, state: StreamState, codes_BNG: jax.Array, count: jax.Array
                     ) -> tuple[jax.Array, StreamState]:
        """The first ``count`` frames of ``codes_BNG`` (the rest is padding) after ``state`` -> (the window's
        waveform [B, (context_frames + N) * up - lost], whose samples ``chunk_samples`` are the new ones; the
        state after them)."""
        x = self.embed(codes_BNG)  # [B, N, D]
        b, n, d = x.shape

        def one(i, carry):
            cache, states = carry
            pos = cache["length"]
            h, cache = self.transformer.embeds_step(jax.lax.dynamic_index_in_dim(x, i, 1, keepdims=False), pos[None],
                                                    cache)
            return cache, jax.lax.dynamic_update_index_in_dim(states, h.astype(states.dtype), i, 1)

        cache, new = jax.lax.fori_loop(0, count, one, (state.cache, jnp.zeros((b, n, d), state.tail.dtype)))
        window = jnp.concatenate([state.tail, new], axis=1)
        ctx = self.cfg.context_frames
        wav = self.vocoder(window, jnp.maximum(ctx - state.frames, 0))
        tail = jax.lax.dynamic_slice_in_dim(window, count, ctx, axis=1)
        return wav, StreamState(cache, tail, state.frames + count)
