"""Helpers for the encoder parity tests: load one module's parameters through its weight map, compare outputs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx


def flat_paths(tree, prefix=()) -> dict[tuple, object]:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(flat_paths(v, prefix + (k,)))
        return out
    return {prefix: tree}


def _set_path(tree: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        tree = tree[k]
    tree[path[-1]] = value


def load_module(make_module, weight_map, tensors: dict[str, np.ndarray]):
    """(graphdef, params): an abstract build of ``make_module()`` with every parameter filled from ``tensors``
    (name -> array) through ``weight_map``. Fails when the map and the module's parameters differ or a shape does
    not match."""
    graphdef, state = nnx.split(nnx.eval_shape(make_module))
    params = nnx.to_pure_dict(state)
    abstract = flat_paths(params)
    assert set(abstract) == set(weight_map), set(abstract) ^ set(weight_map)
    for path, spec in weight_map.items():
        value = spec.apply(tensors[spec.key])
        assert value.shape == tuple(abstract[path].shape), (path, value.shape, abstract[path].shape)
        _set_path(params, path, jnp.asarray(value, jnp.float32))
    return graphdef, params


def assert_close(ours, ref) -> float:
    """Asserts max |ours - ref| <= 1e-5 x max(1, max |ref|) and returns that error relative to the scale."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    err = float(np.abs(ours - ref).max())
    scale = max(1.0, float(np.abs(ref).max()))
    assert err <= 1e-5 * scale, f"max abs diff {err} vs output scale {scale}"
    return err / scale
