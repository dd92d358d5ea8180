"""Several groups of new tokens in one forward: how they lie in its one flat row of tokens.

A forward (decoder/model.py) may run several groups at once, e.g. a decode step's rows of one token beside prompt
chunks of a few requests: group g is S_g sequences of T_g tokens. Everything that works token by token (embedding,
projections, norms, feed-forward, RoPE) runs once over all the tokens laid end to end, [1, N, ...] with
N = sum of S_g * T_g, so the weights are read once for all of them; attention and the cache writes take each group
in its own shape. A single group keeps its own shape [S, T, ...] (nothing is moved).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Packing(NamedTuple):
    """The (S, T) shape of each group, in order (static)."""

    shapes: tuple[tuple[int, int], ...]

    @property
    def single(self) -> bool:
        return len(self.shapes) == 1

    def join(self, parts: list[jax.Array], axis: int = 0) -> jax.Array:
        """Per-group arrays [..., S_g, T_g, ...] (S at ``axis``) -> the flat layout [..., 1, N, ...]."""
        if self.single:
            return parts[0]
        flat = [p.reshape(*p.shape[:axis], 1, p.shape[axis] * p.shape[axis + 1], *p.shape[axis + 2:])
                for p in parts]
        return jnp.concatenate(flat, axis=axis + 1)

    def split(self, a: jax.Array, axis: int = 0) -> list[jax.Array]:
        """The inverse of ``join``: the flat layout -> per-group arrays."""
        if self.single:
            return [a]
        out, at = [], 0
        for s, t in self.shapes:
            part = jax.lax.slice_in_dim(a, at, at + s * t, axis=axis + 1)
            out.append(part.reshape(*a.shape[:axis], s, t, *a.shape[axis + 2:]))
            at += s * t
        return out
