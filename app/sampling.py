"""Next-token choice from logits: greedy, or temperature + top-k + top-p sampling (all on device)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def mode(self) -> tuple[bool, bool, bool]:
        """The static part (compiled variants): (sample, use top-k, use top-p)."""
        return (not self.greedy, not self.greedy and self.top_k > 0, not self.greedy and self.top_p < 1.0)

    def values(self) -> dict:
        """The traced part: changing these never recompiles."""
        return {"temperature": jnp.float32(max(self.temperature, 1e-6)), "top_k": jnp.int32(self.top_k),
                "top_p": jnp.float32(self.top_p)}


def choose(logits_BV: jax.Array, key: jax.Array, values: dict, mode: tuple[bool, bool, bool]) -> jax.Array:
    """Token ids [batch] from float32 logits [batch, vocab]."""
    sample, use_top_k, use_top_p = mode
    if not sample:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    logits = logits_BV / values["temperature"]
    if use_top_k or use_top_p:
        sorted_desc = -jnp.sort(-logits, axis=-1)
        if use_top_k:
            k = jnp.clip(values["top_k"], 1, logits.shape[-1])
            kth = jnp.take_along_axis(sorted_desc, jnp.full((logits.shape[0], 1), k - 1), axis=-1)
            logits = jnp.where(logits < kth, -jnp.inf, logits)
            sorted_desc = jnp.where(jnp.arange(logits.shape[-1])[None] < k, sorted_desc, -jnp.inf)
        if use_top_p:
            probs = jax.nn.softmax(sorted_desc, axis=-1)
            cum = jnp.cumsum(probs, axis=-1)
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            keep = (cum - probs) < values["top_p"]
            threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
            logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
