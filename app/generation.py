"""One loaded model on its mesh: parameters, shape buckets and jitted media encoding.

The model's forward lives in decoder/model.py. Generation, the logits at every prompt position
(``Pipeline.prompt_logits``) and scoring run on the slots of app/slots.py, driven by app/scheduler.py; media inputs
are bucketed on the host (the processor's ``collate``, one function per modality) and encoded here. ``make_batch``
right-pads whole prompts to a bucket length for the speech path (app/speech.py).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from omnijax.app.families.spec import ModelConfig
from omnijax.common.sharding import named_sharding, put, use_mesh
from omnijax.decoder.attention_op import BACKENDS
from omnijax.preprocess.processor import PreparedPrompt

# Prompt and cache lengths: powers of two and the halfway points between them (at most a third is padding).
DEFAULT_BUCKETS = tuple(sorted({b for k in range(6, 18) for b in (1 << k, 3 << (k - 1))}))


ATTENTION_ENV = "OMNIJAX_ATTENTION"


def attention_backend(environ=os.environ) -> str:
    """The prompt attention backend ``OMNIJAX_ATTENTION`` forces (dense / blocked / fused), else "auto"; read once,
    when an engine is built."""
    chosen = environ.get(ATTENTION_ENV, "auto") or "auto"
    if chosen not in BACKENDS:
        raise ValueError(f"{ATTENTION_ENV}={chosen!r} is not an attention backend; use one of {BACKENDS}")
    return chosen


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= n (n itself past the largest bucket)."""
    for b in buckets:
        if n <= b:
            return b
    return n


@dataclasses.dataclass
class Batch:
    """Prompts right-padded to one bucket length. Arrays are numpy [batch, length] unless said."""

    tokens: np.ndarray
    bidirectional: np.ndarray
    rope_pos: np.ndarray  # [axes, batch, length]
    rope_delta: np.ndarray  # [batch]
    lengths: np.ndarray  # [batch]
    media: dict[str, list]  # modality -> media items of every row, row-major


def make_batch(prompts: list[PreparedPrompt], length: int, pad_id: int, rope_axes: int = 1) -> Batch:
    b = len(prompts)
    tokens = np.full((b, length), pad_id, np.int32)
    bidir = np.zeros((b, length), bool)
    rope_pos = np.zeros((rope_axes, b, length), np.float32)  # time-aware positions may be fractional
    lengths = np.array([len(p.token_ids) for p in prompts], np.int32)
    for i, p in enumerate(prompts):
        n = len(p.token_ids)
        tokens[i, :n] = p.token_ids
        bidir[i, :n] = p.bidirectional
        rope_pos[:, i, :n] = np.arange(n) if p.rope_positions is None else p.rope_positions
    deltas = np.array([p.rope_delta for p in prompts], np.float32)
    media = {}
    for modality in sorted({m for p in prompts for m in p.media}):
        items = [x for p in prompts for x in p.media.get(modality, [])]
        if items:
            media[modality] = items
    return Batch(tokens, bidir, rope_pos, deltas, lengths, media)


class Engine:
    """One loaded model: its config, parameters (the plain pytree of (sharded) arrays), mesh, context budget and
    shape buckets, and its media encoders compiled per modality."""

    def __init__(self, cfg: ModelConfig, graphdef: nnx.GraphDef, params: dict, mesh, *, collate: dict, dtype,
                 max_context: int | None = None, buckets: tuple[int, ...] = DEFAULT_BUCKETS,
                 attention: str | None = None):
        """collate: {modality: the processor's host-side batching of its media items}. attention: the prompt
        attention backend (``decoder.attention_op.BACKENDS``); default: what ``OMNIJAX_ATTENTION`` forces, else
        "auto"."""
        self.cfg = cfg
        self.attention = attention_backend() if attention is None else attention
        if self.attention not in BACKENDS:
            raise ValueError(f"unknown attention backend {self.attention!r}; known: {BACKENDS}")
        self.graphdef = graphdef
        self.params = params
        self.mesh = mesh
        self.dtype = dtype
        self.max_context = min(max_context or cfg.max_context, cfg.max_context)
        self.buckets = tuple(b for b in buckets if b < self.max_context) + (self.max_context,)
        self.eos_ids = jnp.asarray(cfg.eos_ids or (-1,), jnp.int32)
        self._collate = dict(collate)  # host-side batching per modality: media items -> bucketed arrays
        self._encode = jax.jit(self._encode_impl, static_argnames=("modality",))

    # ---- jitted bodies -------------------------------------------------------------------------------------
    def model(self, params):
        """The model (encoders and decoder) on ``params``: inside jitted code only (merging is traced once)."""
        return nnx.merge(self.graphdef, params)

    def _encode_impl(self, params, inputs, *, modality):
        return tuple(self.model(params).encoders[self.cfg.encoder_of(modality)](inputs))

    # ---- host side -----------------------------------------------------------------------------------------
    def put(self, array: np.ndarray, axes: tuple) -> jax.Array:
        return put(array, named_sharding(axes, array.shape, self.mesh))

    def encode(self, media: dict[str, list]) -> dict:
        """{modality: encoder output tuple (features [R, D], valid [R], extras)} for {modality: media items}."""
        out = {}
        for modality, items in media.items():
            inputs = {k: self.put(np.asarray(v), (None,) * np.ndim(v))
                      for k, v in self._collate[modality](items).items()}
            out[modality] = self._encode(self.params, inputs, modality=modality)
        return out

    def compilations(self) -> int:
        """How many programs the jitted entry points have compiled so far."""
        return self._encode._cache_size()
