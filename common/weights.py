"""How checkpoint tensors become parameters: a weight map is data, built by pure functions per family.

A weight map is ``dict[param_path, TensorSpec]`` where ``param_path`` is the tuple path of a parameter in the
model's NNX state (e.g. ``("decoder", "layers", 0, "attn", "qkv_proj", "kernel")``) and ``TensorSpec`` names the
tensor on disk and the layout change from torch's layout to ours.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

ParamPath = tuple


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor feeding one parameter.

    key: the tensor's name in the safetensors files, or several names whose tensors are stacked along a new
        first axis (per-expert tensors -> one [experts, ...] parameter) or, with ``concat_axis``, concatenated
        (q/k/v projections -> one fused projection).
    transpose: axis permutation applied to each tensor after reading (``(1, 0)`` turns a torch Linear weight
        [out, in] into an [in, out] matrix); None keeps the layout.
    reshape: shape applied after the transpose (and stacking); None keeps the shape.
    fn: a last layout change (a pure numpy function of the array so far), for layouts the fields above do not
        express (e.g. q/k/v rows regrouped per kv head); ``inverse`` undoes it (for ``unapply``).
    """

    key: str | tuple[str, ...]
    transpose: tuple[int, ...] | None = None
    reshape: tuple[int, ...] | None = None
    concat_axis: int | None = None
    fn: Callable[[np.ndarray], np.ndarray] | None = None
    inverse: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)

    def apply(self, arrays: np.ndarray | list[np.ndarray]) -> np.ndarray:
        """The parameter value from the tensor(s) read for ``keys`` (in that order)."""
        arrays = [arrays] if isinstance(arrays, np.ndarray) else list(arrays)
        if self.transpose is not None:
            arrays = [np.transpose(a, self.transpose) for a in arrays]
        if isinstance(self.key, str):
            array = arrays[0]
        elif self.concat_axis is not None:
            array = np.concatenate(arrays, axis=self.concat_axis)
        else:
            array = np.stack(arrays)
        if self.reshape is not None:
            array = np.reshape(array, self.reshape)
        if self.fn is not None:
            array = self.fn(array)
        return array

    def unapply(self, value: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        """The inverse of :meth:`apply`: the checkpoint tensors (one per key, in order, of the given on-disk
        ``shapes``) that ``apply`` turns into the parameter ``value``."""
        keys = self.keys
        if len(shapes) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(shapes)} shapes")
        if self.fn is not None:
            if self.inverse is None:
                raise ValueError(f"the layout change of {keys[0]!r} has no inverse")
            value = self.inverse(np.asarray(value))
        # the shape of each tensor after its transpose, i.e. as apply sees it before joining
        inverse = None if self.transpose is None else tuple(np.argsort(self.transpose))
        moved = [tuple(s) if self.transpose is None else tuple(s[i] for i in self.transpose) for s in shapes]
        value = np.asarray(value)
        if isinstance(self.key, str):
            parts = [np.reshape(value, moved[0])]
        elif self.concat_axis is not None:
            joined = list(moved[0])
            joined[self.concat_axis] = sum(s[self.concat_axis] for s in moved)
            value = np.reshape(value, joined)
            cuts = np.cumsum([s[self.concat_axis] for s in moved])[:-1]
            parts = np.split(value, cuts, axis=self.concat_axis)
        else:
            value = np.reshape(value, (len(keys),) + moved[0])
            parts = [value[i] for i in range(len(keys))]
        if inverse is not None:
            parts = [np.transpose(p, inverse) for p in parts]
        return [np.ascontiguousarray(p) for p in parts]


def linear(key_prefix: str) -> TensorSpec:
    """A torch ``nn.Linear`` weight ``{prefix}.weight`` [out, in] as our kernel (the same layout)."""
    return TensorSpec(f"{key_prefix}.weight")


def fused_linear(key_prefixes: list[str], suffix: str = "weight") -> TensorSpec:
    """Several torch Linear weights [out_i, in] (or biases [out_i] with suffix "bias") as one kernel
    [sum out_i, in] (bias [sum out_i]): one matmul instead of several."""
    return TensorSpec(tuple(f"{p}.{suffix}" for p in key_prefixes), concat_axis=0)


def stacked_linear(key_prefixes: list[str]) -> TensorSpec:
    """Several torch Linear weights ``{prefix}.weight`` [out, in] stacked as one [n, in, out] parameter."""
    return TensorSpec(tuple(f"{p}.weight" for p in key_prefixes), transpose=(1, 0))


def plain(key: str) -> TensorSpec:
    """A tensor used as stored (biases, norm weights, embedding tables)."""
    return TensorSpec(key)


def prefixed(weight_map: dict[ParamPath, TensorSpec], path_prefix: ParamPath) -> dict[ParamPath, TensorSpec]:
    """The same map with ``path_prefix`` put in front of every parameter path (to nest a sub-model's map)."""
    return {tuple(path_prefix) + tuple(path): spec for path, spec in weight_map.items()}
