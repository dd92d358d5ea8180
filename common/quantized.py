"""Weight-only quantized parameters as plain pytrees: int8 per output channel, int4 in groups (two per byte).

A ``QuantizedArray`` stands for a float weight ``w`` of ``shape`` whose values along one axis (``axis``, the axis
a product contracts) are stored narrow:

- int8: ``values`` int8 [shape]; ``scales`` float32 [shape with axis -> 1]; w = values * scales (symmetric, one
  scale per output channel, i.e. per position of every other axis).
- int4: ``values`` uint8 [shape with axis -> n / 2]; within each group of ``group`` values along the axis, byte j
  holds value j in its low nibble and value j + group / 2 in its high nibble (q in 0..15); ``scales`` and
  ``offsets`` float16 [shape with axis -> n / group]; w = q * scale + offset (asymmetric: a Q4_0 / Q4_K block of a
  GGUF file is one group, exactly).

It is registered as a pytree (values, scales, offsets are leaves; bits, axis, group static), so it travels through
``jax.jit`` and ``nnx.merge`` as a parameter's value, and every leaf carries the parameter's logical axis names
(common/sharding.py places them like the float weight). Quantizing happens on the host with numpy at load
(``quantize``); devices only dequantize (``dequantize``), inside the product that reads the weight
(common/matmul_policy.py).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from omnijax.common.errors import SettingError

QUANTIZE_MODES = ("int8", "int4")
INT4_GROUP = 32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedArray:
    values: jax.Array
    scales: jax.Array
    offsets: jax.Array | None = None
    bits: int = dataclasses.field(default=8, metadata=dict(static=True))
    axis: int = dataclasses.field(default=0, metadata=dict(static=True))
    group: int = dataclasses.field(default=0, metadata=dict(static=True))

    # ---- array-like views ----------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.values.shape)
        shape[self.axis] *= 2 if self.bits == 4 else 1
        return tuple(shape)

    @property
    def ndim(self) -> int:
        return len(self.values.shape)

    @property
    def dtype(self):
        """The dtype a product computes in when it reads this weight (float32: scales are exact there)."""
        return jnp.float32

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in (self.values, self.scales, self.offsets) if x is not None)

    def _leaves(self):
        return [x for x in (self.values, self.scales, self.offsets) if x is not None]

    def __getitem__(self, index):
        """``w[...]`` is ``w`` (an ``nnx.Param``'s value); ``w[i]`` / ``w[ids]`` index the first axis (an expert,
        a table row), which must not be the quantized axis."""
        if index is Ellipsis:
            return self
        if self.axis == 0:
            raise ValueError("cannot index the quantized axis of a QuantizedArray")
        index = jnp.asarray(index)
        pick = lambda x: None if x is None else x[index]
        return dataclasses.replace(self, values=self.values[index], scales=self.scales[index],
                                   offsets=pick(self.offsets), axis=self.axis - 1 + index.ndim)

    def reshape(self, *shape) -> "QuantizedArray":
        """The same weight with its axes before ``axis`` reshaped (the quantized axis and those after it keep
        their sizes): ``[K, R, D] -> [K * R, D]``."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        tail = self.shape[self.axis:]
        lead = math.prod(self.shape[:self.axis])
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(s if s != -1 else math.prod(self.shape) // known for s in shape)
        if shape[len(shape) - len(tail):] != tail or math.prod(shape[:len(shape) - len(tail)]) != lead:
            raise ValueError(f"a QuantizedArray of shape {self.shape} (axis {self.axis}) cannot be reshaped to "
                             f"{shape}: only the axes before the quantized one may change")
        new_lead = shape[:len(shape) - len(tail)]
        re = lambda x: None if x is None else x.reshape(new_lead + x.shape[self.axis:])
        return dataclasses.replace(self, values=re(self.values), scales=re(self.scales), offsets=re(self.offsets),
                                   axis=len(new_lead))

    # ---- device side ---------------------------------------------------------------------------------------
    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The float weight [shape] in ``dtype`` (elementwise ops only, so a product can fuse them)."""
        if self.bits == 8:
            return self.values.astype(dtype) * self.scales.astype(dtype)
        a = self.axis
        n = self.shape[a]
        groups = n // self.group
        v = self.values.reshape(self.values.shape[:a] + (groups, self.group // 2) + self.values.shape[a + 1:])
        p = v.astype(dtype)
        high = jnp.floor(p * jnp.asarray(1 / 16, dtype))
        low = p - high * jnp.asarray(16, dtype)
        q = jnp.concatenate([low, high], axis=a + 1)  # [..., groups, group, ...]
        expand = lambda x: jnp.expand_dims(x.astype(dtype), a + 1)
        w = q * expand(self.scales) + expand(self.offsets)
        return w.reshape(self.shape)


def is_quantized(x) -> bool:
    return isinstance(x, QuantizedArray)


def check_quantize(mode) -> str | None:
    """``mode`` when it is None or one of QUANTIZE_MODES, else ValueError naming the valid ones."""
    if mode is None or mode in QUANTIZE_MODES:
        return mode
    raise SettingError(f"unknown quantize mode {mode!r}; use one of {', '.join(QUANTIZE_MODES)} (or None: "
                       f"weights in their dtype)")


# ---- host side: numpy quantizers ---------------------------------------------------------------------------

def quantize_int8(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, float32 scales [shape with axis -> 1]): symmetric, one scale per position of the other axes."""
    w = np.asarray(w, np.float32)
    peak = np.max(np.abs(w), axis=axis, keepdims=True)
    scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    values = np.clip(np.rint(w / scales), -127, 127).astype(np.int8)
    return values, scales


def quantize_int4(w: np.ndarray, axis: int, group: int = INT4_GROUP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 packed values [shape with axis -> n / 2], float16 scales and offsets [shape with axis -> n / group]):
    asymmetric per group along ``axis`` (min to max in 16 levels)."""
    w = np.asarray(w, np.float32)
    n = w.shape[axis]
    if n % group or group % 2:
        raise ValueError(f"int4 groups of {group} do not divide an axis of {n}")
    g = np.moveaxis(w, axis, -1).reshape(*[s for i, s in enumerate(w.shape) if i != axis], n // group, group)
    low = g.min(axis=-1, keepdims=True)
    high = g.max(axis=-1, keepdims=True)
    scales = ((high - low) / 15.0).astype(np.float16)
    offsets = low.astype(np.float16)
    s32, o32 = scales.astype(np.float32), offsets.astype(np.float32)
    safe = np.where(s32 > 0, s32, 1.0)
    q = np.clip(np.rint((g - o32) / safe), 0, 15).astype(np.uint8)
    half = group // 2
    packed = q[..., :half] | (q[..., half:] << 4)  # [..., groups, group / 2]
    lead = packed.shape[:-2]
    values = np.moveaxis(packed.reshape(*lead, n // 2), -1, axis)
    scales = np.moveaxis(scales.reshape(*lead, n // group), -1, axis)
    offsets = np.moveaxis(offsets.reshape(*lead, n // group), -1, axis)
    return np.ascontiguousarray(values), np.ascontiguousarray(scales), np.ascontiguousarray(offsets)


def quantize(w: np.ndarray, mode: str, axis: int, group: int = INT4_GROUP) -> dict[str, np.ndarray]:
    """{"values", "scales"[, "offsets"]} of ``w`` quantized to ``mode`` along ``axis`` (numpy arrays)."""
    axis = axis % w.ndim
    if mode == "int8":
        values, scales = quantize_int8(w, axis)
        return {"values": values, "scales": scales}
    if mode == "int4":
        values, scales, offsets = quantize_int4(w, axis, group)
        return {"values": values, "scales": scales, "offsets": offsets}
    raise ValueError(f"unknown quantize mode {mode!r}")


def can_quantize(shape: tuple[int, ...], mode: str, axis: int, group: int = INT4_GROUP) -> bool:
    """Whether a weight of ``shape`` quantizes to ``mode`` along ``axis`` (int4 needs whole groups)."""
    if not shape:
        return False
    n = shape[axis % len(shape)]
    return mode == "int8" or (mode == "int4" and n % group == 0)


def dequantize_numpy(parts: dict[str, np.ndarray], mode: str, axis: int, group: int = INT4_GROUP) -> np.ndarray:
    """The float32 weight of ``quantize``'s output (host side, for tests and for reading a quantized weight)."""
    if mode == "int8":
        return parts["values"].astype(np.float32) * parts["scales"]
    v = np.moveaxis(parts["values"], axis, -1)
    lead = v.shape[:-1]
    half = group // 2
    v = v.reshape(*lead, -1, half)
    q = np.concatenate([v & 15, v >> 4], axis=-1).astype(np.float32)  # [..., groups, group]
    s = np.moveaxis(parts["scales"], axis, -1).astype(np.float32)[..., None]
    o = np.moveaxis(parts["offsets"], axis, -1).astype(np.float32)[..., None]
    return np.moveaxis((q * s + o).reshape(*lead, -1), -1, axis)
