"""The one generation loop: jitted media encoding, bucketed prefill, and a decode loop that stays on device.

Shapes are fixed by budgets so new prompts rarely compile: prompts are left-padded to a bucket length, the KV cache
length is a bucket too, and the number of media items is rounded up to a power of two.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.errors import PromptError
from app.families.spec import ModelConfig, PreparedPrompt
from app.sampling import SamplingParams, choose
from decoder.embed import merge_media
from decoder.kv_cache import init_cache
from decoder.masks import block_ids
from decoder.rope import rope_tables
from common.sharding import named_sharding, use_mesh

# Prompt and cache lengths: powers of two and the halfway points between them (at most a third is padding).
DEFAULT_BUCKETS = tuple(sorted({b for k in range(6, 18) for b in (1 << k, 3 << (k - 1))}))


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= n (n itself past the largest bucket)."""
    for b in buckets:
        if n <= b:
            return b
    return n


def pow2_at_least(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclasses.dataclass
class Batch:
    """Prompts left-padded to one bucket length. Arrays are numpy [batch, length] unless said."""

    tokens: np.ndarray
    seq_pos: np.ndarray
    bidirectional: np.ndarray
    rope_pos: np.ndarray  # [axes, batch, length]
    rope_delta: np.ndarray  # [batch]
    lengths: np.ndarray  # [batch]
    media: dict[str, list]  # modality -> media items of every row, row-major

    @property
    def media_ahead(self) -> int:
        """The longest run of bidirectional (media block) tokens in any row, rounded up to a power of two (0 if
        none): how far ahead of itself a prompt token may attend."""
        longest = 0
        for row in self.bidirectional:
            edges = np.flatnonzero(np.diff(np.r_[0, row.astype(np.int8), 0]))
            if len(edges):
                longest = max(longest, int(np.max(edges[1::2] - edges[::2])))
        return 0 if longest == 0 else pow2_at_least(longest)


def make_batch(prompts: list[PreparedPrompt], length: int, pad_id: int, rope_axes: int = 1) -> Batch:
    b = len(prompts)
    tokens = np.full((b, length), pad_id, np.int32)
    seq_pos = np.full((b, length), -1, np.int32)
    bidir = np.zeros((b, length), bool)
    rope_pos = np.zeros((rope_axes, b, length), np.int32)
    lengths = np.array([len(p.token_ids) for p in prompts], np.int32)
    for i, p in enumerate(prompts):
        n = len(p.token_ids)
        tokens[i, length - n:] = p.token_ids
        seq_pos[i, length - n:] = np.arange(n)
        bidir[i, length - n:] = p.bidirectional
        rope_pos[:, i, length - n:] = np.arange(n) if p.rope_positions is None else p.rope_positions
    deltas = np.array([p.rope_delta for p in prompts], np.int32)
    media = {}
    for modality in sorted({m for p in prompts for m in p.media}):
        items = [x for p in prompts for x in p.media.get(modality, [])]
        if items:
            media[modality] = items
    return Batch(tokens, seq_pos, bidir, rope_pos, deltas, lengths, media)


def pad_rows(x_MD: jax.Array) -> jax.Array:
    """Feature rows padded to a power of two (fewer distinct shapes reach the prefill program)."""
    m = x_MD.shape[0]
    return x_MD if pow2_at_least(m) == m else jnp.pad(x_MD, ((0, pow2_at_least(m) - m), (0, 0)))


class Engine:
    """Compiled prefill/decode for one loaded model. ``params`` is the plain pytree of (sharded) arrays."""

    def __init__(self, cfg: ModelConfig, graphdef: nnx.GraphDef, params: dict, mesh, *, dtype,
                 max_context: int | None = None, buckets: tuple[int, ...] = DEFAULT_BUCKETS):
        self.cfg = cfg
        self.graphdef = graphdef
        self.params = params
        self.mesh = mesh
        self.dtype = dtype
        self.max_context = min(max_context or cfg.max_context, cfg.max_context)
        self.buckets = tuple(b for b in buckets if b < self.max_context) + (self.max_context,)
        self.eos_ids = jnp.asarray(cfg.eos_ids or (-1,), jnp.int32)
        encoders = nnx.merge(graphdef, params).encoders
        self._collate = {m: type(encoders[m]).collate for m in cfg.modalities}
        self._encode = jax.jit(self._encode_impl, static_argnames=("modality", "static"))
        self._prefill = jax.jit(self._prefill_impl, static_argnames=("cache_len", "media_ahead", "all_logits"))
        self._rope = jax.jit(lambda pos_ABL: rope_tables(pos_ABL, cfg.decoder.rope_by_type, cfg.decoder.head_dim))
        self._decode = jax.jit(self._decode_impl, static_argnames=("mode", "steps_cap"), donate_argnames=("cache",))
        self._step = jax.jit(self._step_impl, static_argnames=("mode",), donate_argnames=("cache",))

    # ---- jitted bodies -------------------------------------------------------------------------------------
    def _model(self, params):
        return nnx.merge(self.graphdef, params)

    def _encode_impl(self, params, inputs, *, modality, static):
        return self._model(params).encoders[modality](inputs, static)

    def _prefill_impl(self, params, tokens_BL, seq_pos_BL, bidir_BL, rope, media, deepstack, *, cache_len,
                      media_ahead, all_logits=False):
        dec = self._model(params).decoder
        x = dec.embedder.encode(tokens_BL)
        for modality, feats in media.items():
            x = merge_media(x, tokens_BL == self.cfg.media_token_id(modality), feats)
        if deepstack:
            deepstack = (tokens_BL == self.cfg.media_token_id(self.cfg.deepstack_modality), deepstack)
        cache = init_cache(self.cfg.decoder, tokens_BL.shape[0], cache_len, self.dtype)
        h, cache = dec(x, seq_pos_BL=seq_pos_BL, block_BL=block_ids(bidir_BL), cache=cache,
                       write_index=jnp.int32(0), attend_cache=False, rope=rope,
                       deepstack=deepstack or None, last_only=not all_logits, media_ahead=media_ahead)
        if all_logits:
            return dec.logits(h), cache
        return dec.logits(h)[:, 0], cache

    def _forward_token(self, dec, cache, tok_B, pos_B, delta_B, index):
        x = dec.embedder.encode(tok_B[:, None])
        rope_pos = jnp.broadcast_to((pos_B + delta_B)[None, :, None], (self.cfg.decoder.rope_axes, pos_B.shape[0], 1))
        h, cache = dec(x, seq_pos_BL=pos_B[:, None], block_BL=jnp.full_like(pos_B[:, None], -1), cache=cache,
                       write_index=index, attend_cache=True, rope_pos_ABL=rope_pos)
        return dec.logits(h)[:, 0], cache

    def _decode_impl(self, params, cache, logits_BV, lengths_B, delta_B, start, max_new, key, values, eos_ids, *,
                     mode, steps_cap):
        """Generate up to ``max_new`` tokens (<= steps_cap) -> (tokens [B, steps_cap] padded, steps run, cache)."""
        dec = self._model(params).decoder
        b = logits_BV.shape[0]
        pad = jnp.int32(self.cfg.pad_id)

        def cond(state):
            i, _, done, _, _ = state
            return (i < max_new) & ~jnp.all(done)

        def body(state):
            # token i from token i - 1 (which sits at sequence position length + i - 1)
            i, tok, done, buf, cache = state
            logits, cache = self._forward_token(dec, cache, tok, lengths_B + i - 1, delta_B, start + i - 1)
            nxt = choose(logits, jax.random.fold_in(key, i), values, mode)
            buf = buf.at[:, i].set(jnp.where(done, pad, nxt))
            return i + 1, nxt, done | jnp.isin(nxt, eos_ids), buf, cache

        tok0 = choose(logits_BV, jax.random.fold_in(key, 0), values, mode)
        buf = jnp.full((b, steps_cap), pad, jnp.int32).at[:, 0].set(tok0)
        state = (jnp.int32(1), tok0, jnp.isin(tok0, eos_ids), buf, cache)
        i, _, _, buf, cache = jax.lax.while_loop(cond, body, state)
        return buf, i, cache  # the cache is returned so that the donated input buffers hold it (no copy)

    def _step_impl(self, params, cache, tok_B, pos_B, delta_B, index, key, values, *, mode):
        dec = self._model(params).decoder
        logits, cache = self._forward_token(dec, cache, tok_B, pos_B, delta_B, index)
        return choose(logits, key, values, mode), cache

    # ---- host side -----------------------------------------------------------------------------------------
    def _put(self, array: np.ndarray, axes: tuple) -> jax.Array:
        return jax.device_put(array, named_sharding(axes, array.shape, self.mesh))

    def plan(self, prompts: list[PreparedPrompt], max_new_tokens: int) -> tuple[int, int, int]:
        """(bucketed prompt length, cache length, new tokens) for these prompts; raises PromptError if too long."""
        longest = max(len(p.token_ids) for p in prompts)
        if longest == 0:
            raise PromptError("the prompt is empty")
        if longest >= self.max_context:
            raise PromptError(f"the prompt has {longest} tokens; the context budget is {self.max_context} tokens "
                              f"(prompt plus at least one new token)")
        if max_new_tokens < 1:
            raise PromptError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        length = bucket_for(longest, self.buckets)
        if longest + max_new_tokens > self.max_context:
            raise PromptError(f"the prompt has {longest} tokens and max_new_tokens is {max_new_tokens}: "
                              f"{longest + max_new_tokens} exceeds the context budget of {self.max_context} tokens")
        cache_len = bucket_for(length + max_new_tokens, self.buckets)
        return length, cache_len, max_new_tokens

    def prefill(self, prompts: list[PreparedPrompt], max_new_tokens: int, *, all_logits: bool = False):
        length, cache_len, max_new = self.plan(prompts, max_new_tokens)
        batch = make_batch(prompts, length, self.cfg.pad_id, self.cfg.decoder.rope_axes)
        media, deepstack = {}, ()
        with use_mesh(self.mesh):
            for modality, items in batch.media.items():
                arrays, static = self._collate[modality](items)
                feats, extra = self._encode(self.params, arrays, modality=modality, static=static)
                media[modality] = pad_rows(feats)
                if modality == self.cfg.deepstack_modality:
                    deepstack = tuple(pad_rows(f) for f in extra)
            logits, cache = self._prefill(self.params, self._put(batch.tokens, ("batch", "length")),
                                          self._put(batch.seq_pos, ("batch", "length")),
                                          self._put(batch.bidirectional, ("batch", "length")),
                                          self._rope(self._put(batch.rope_pos, (None, "batch", "length"))),
                                          media, deepstack,
                                          cache_len=cache_len, media_ahead=batch.media_ahead,
                                          all_logits=all_logits)
        return batch, length, cache_len, max_new, logits, cache

    def score(self, prompts: list[PreparedPrompt]) -> list[np.ndarray]:
        """Logits [prompt length, vocab] (float32) at every position of each prompt."""
        batch, length, _, _, logits, _ = self.prefill(prompts, 1, all_logits=True)
        logits = np.asarray(logits)
        return [logits[i, length - n:] for i, n in enumerate(batch.lengths)]

    def generate(self, prompts: list[PreparedPrompt], max_new_tokens: int, sampling: SamplingParams, *,
                 ignore_eos: bool = False) -> np.ndarray:
        """Token ids [batch, n] (n <= max_new_tokens), pad after EOS (``ignore_eos``: always max_new_tokens)."""
        batch, length, cache_len, max_new, logits, cache = self.prefill(prompts, max_new_tokens)
        with use_mesh(self.mesh):
            buf, steps, _ = self._decode(self.params, cache, logits, self._put(batch.lengths, ("batch",)),
                                      self._put(batch.rope_delta, ("batch",)), jnp.int32(length), jnp.int32(max_new), jax.random.key(sampling.seed),
                                      sampling.values(), jnp.full_like(self.eos_ids, -1) if ignore_eos else self.eos_ids,
                                      mode=sampling.mode(), steps_cap=cache_len - length)
        return np.asarray(buf)[:, :int(steps)]

    def stream(self, prompts: list[PreparedPrompt], max_new_tokens: int,
               sampling: SamplingParams) -> Iterator[np.ndarray]:
        """Yields the next token of every row [batch] until max_new_tokens or every row hit EOS."""
        batch, length, cache_len, max_new, logits, cache = self.prefill(prompts, max_new_tokens)
        key = jax.random.key(sampling.seed)
        values, mode = sampling.values(), sampling.mode()
        lengths = self._put(batch.lengths, ("batch",))
        deltas = self._put(batch.rope_delta, ("batch",))
        eos = set(self.cfg.eos_ids)
        with use_mesh(self.mesh):
            tok = choose(logits, jax.random.fold_in(key, 0), values, mode)
        done = np.zeros(len(prompts), bool)
        for i in range(max_new):
            host = np.asarray(tok)
            yield np.where(done, self.cfg.pad_id, host)
            done |= np.isin(host, list(eos))
            if done.all() or i + 1 == max_new:
                return
            with use_mesh(self.mesh):
                tok, cache = self._step(self.params, cache, tok, lengths + i, deltas, jnp.int32(length + i),
                                        jax.random.fold_in(key, i + 1), values, mode=mode)

    def compilations(self) -> int:
        """How many programs the jitted entry points have compiled so far."""
        return sum(f._cache_size() for f in (self._encode, self._prefill, self._decode, self._step))
