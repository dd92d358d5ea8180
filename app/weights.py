"""How checkpoint tensors become parameters: a weight map is data, built by pure functions per family.

A weight map is ``dict[param_path, TensorSpec]`` where ``param_path`` is the tuple path of a parameter in the
model's NNX state (e.g. ``("decoder", "layers", 0, "attn", "q_proj", "kernel")``) and ``TensorSpec`` names the
tensor on disk and the layout change from torch's layout to ours.
"""

from __future__ import annotations

import dataclasses

import numpy as np

ParamPath = tuple


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor feeding one parameter.

    key: the tensor's name in the safetensors files.
    transpose: axis permutation applied after reading (``(1, 0)`` turns a torch Linear weight [out, in] into our
        kernel [in, out]); None keeps the layout.
    reshape: shape applied after the transpose; None keeps the shape.
    """

    key: str
    transpose: tuple[int, ...] | None = None
    reshape: tuple[int, ...] | None = None

    def apply(self, array: np.ndarray) -> np.ndarray:
        if self.transpose is not None:
            array = np.transpose(array, self.transpose)
        if self.reshape is not None:
            array = np.reshape(array, self.reshape)
        return array


def linear(key_prefix: str) -> TensorSpec:
    """A torch ``nn.Linear`` weight ``{prefix}.weight`` [out, in] as our kernel [in, out]."""
    return TensorSpec(f"{key_prefix}.weight", transpose=(1, 0))


def plain(key: str) -> TensorSpec:
    """A tensor used as stored (biases, norm weights, embedding tables)."""
    return TensorSpec(key)


def prefixed(weight_map: dict[ParamPath, TensorSpec], path_prefix: ParamPath) -> dict[ParamPath, TensorSpec]:
    """The same map with ``path_prefix`` put in front of every parameter path (to nest a sub-model's map)."""
    return {tuple(path_prefix) + tuple(path): spec for path, spec in weight_map.items()}
