"""What every media encoder returns for one batch of items of its modality."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class EncoderOutput(NamedTuple):
    """Feature rows of a batch of media items, bucket padding included.

    features: [rows, text_hidden] soft tokens. The j-th row with ``valid`` True is what the j-th placeholder token of
        the modality (over the whole batch, in order) receives.
    valid: [rows] bool, False for padding rows (their values are unspecified).
    extras: extra [rows, text_hidden] feature maps aligned row for row with ``features`` (Qwen3-Omni's deepstack
        features, one per deepstack layer); () when the encoder has none.
    """

    features: jax.Array
    valid: jax.Array
    extras: tuple[jax.Array, ...] = ()

    def valid_rows_first(self) -> "EncoderOutput":
        """The same rows reordered so that the valid ones come first, in order (jit-friendly, shapes unchanged):
        row j of ``features`` / each extra is then what the j-th placeholder receives."""
        order = jnp.argsort(~self.valid, stable=True)
        return EncoderOutput(self.features[order], self.valid[order], tuple(e[order] for e in self.extras))
