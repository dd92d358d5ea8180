"""Parameters back to checkpoint tensors: the family weight map run in reverse (for models trained here)."""

from __future__ import annotations

import numpy as np

from omnijax.common.weights import ParamPath, TensorSpec


def checkpoint_tensors(params: dict[ParamPath, np.ndarray], weight_map: dict[ParamPath, TensorSpec],
                       disk_shapes: dict[str, tuple[int, ...]], dtype=np.float32) -> dict[str, np.ndarray]:
    """{checkpoint key: tensor} for flat ``params`` (parameter path -> value), the inverse of loading them with
    ``weight_map``: fused projections are split, reshaped tensors get their on-disk shape (``disk_shapes``).

    Raises ValueError when a parameter has no entry in the map, a key is produced twice, or a key of
    ``disk_shapes`` gets no tensor."""
    out: dict[str, np.ndarray] = {}
    for path, value in params.items():
        spec = weight_map.get(tuple(path))
        if spec is None:
            raise ValueError(f"parameter {'/'.join(map(str, path))} has no checkpoint tensor in the weight map")
        for key, tensor in zip(spec.keys, spec.unapply(np.asarray(value), [disk_shapes[k] for k in spec.keys])):
            if key in out:
                raise ValueError(f"checkpoint tensor {key!r} is produced twice")
            out[key] = tensor.astype(dtype)
    missing = sorted(set(disk_shapes) - set(out))
    if missing:
        raise ValueError(f"no parameter gives checkpoint tensors {missing[:5]}")
    return dict(sorted(out.items()))
