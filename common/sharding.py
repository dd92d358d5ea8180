"""Logical axis names -> mesh axes. One place decides how parameters, caches and activations are laid out.

Parameters carry logical ``axes`` metadata (see common/linear.py). ``partition_spec`` turns a logical tuple into a
``PartitionSpec`` for the active mesh, dropping a mesh axis where it does not divide the dimension (e.g. one KV head
on a 4-way model axis stays replicated). ``constrain`` pins an activation's layout inside jitted code when a mesh is
active (``with use_mesh(mesh): ...``) and does nothing otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DEFAULT_RULES: dict[str, str | None] = {
    "batch": "data",
    "vocab": "model",
    "heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "expert": "model",
    "vision_heads": "model",
    "vision_mlp": "model",
    "audio_heads": "model",
    "audio_mlp": "model",
    "embed": None,
    "vision_embed": None,
    "length": None,
    "cache_len": None,
    "kv_pages": None,
    "head_dim": None,
}

_ACTIVE: contextvars.ContextVar[tuple[Mesh, dict] | None] = contextvars.ContextVar("omnijax_mesh", default=None)


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None, rules: dict[str, str | None] | None = None):
    """Make ``mesh`` the one ``constrain`` and ``partition_spec`` use while tracing inside this block."""
    token = _ACTIVE.set(None if mesh is None else (mesh, dict(rules or DEFAULT_RULES)))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_mesh() -> Mesh | None:
    state = _ACTIVE.get()
    return None if state is None else state[0]


def partition_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh,
                   rules: dict[str, str | None] | None = None) -> PartitionSpec:
    """The PartitionSpec of an array of ``shape`` whose dimensions have logical names ``axes``."""
    rules = DEFAULT_RULES if rules is None else rules
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        mesh_axis = rules.get(name) if name is not None else None
        if mesh_axis is None or mesh_axis in used or mesh.shape[mesh_axis] == 1 or dim % mesh.shape[mesh_axis]:
            spec.append(None)
        else:
            spec.append(mesh_axis)
            used.add(mesh_axis)
    return PartitionSpec(*spec)


def named_sharding(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh,
                   rules: dict[str, str | None] | None = None) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(axes, shape, mesh, rules))


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
    """``with_sharding_constraint`` by logical names under the active mesh; identity without one."""
    state = _ACTIVE.get()
    if state is None:
        return x
    mesh, rules = state
    return jax.lax.with_sharding_constraint(x, named_sharding(axes, x.shape, mesh, rules))


def make_mesh(model_axis: int | None = None, devices=None) -> Mesh:
    """A ("data", "model") mesh over ``devices`` (default: every device of every process), laid out by
    ``jax.make_mesh`` from the topology. ``model_axis`` devices shard the weights; the rest split the batch.
    Default: every device of this process on the model axis (processes split the batch)."""
    devices = list(jax.devices() if devices is None else devices)
    local = sum(d.process_index == jax.process_index() for d in devices)
    model = (local or len(devices)) if model_axis is None else int(model_axis)
    if model < 1 or len(devices) % model:
        raise ValueError(f"model axis {model} does not divide the {len(devices)} available devices")
    axis_types = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((len(devices) // model, model), ("data", "model"), axis_types, devices=devices)


def put(array, sharding: NamedSharding) -> jax.Array:
    """A host array (the same on every process) as a global array laid out by ``sharding``; each process places
    only its own devices' pieces, so this works when the mesh spans processes."""
    import numpy as np

    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def host_array(x: jax.Array):
    """A global array as one numpy array on this host, also when its shards live on other processes."""
    import numpy as np

    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
