"""Joining several JAX processes into one runtime (``jax.distributed``), on accelerators or on CPUs."""

from __future__ import annotations

import jax


def init_distributed(coordinator: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None) -> None:
    """``jax.distributed.initialize`` (None values: detected from the cluster environment). CPU processes talk
    through gloo collectives, so one mesh can span processes on machines without accelerators."""
    if (jax.config.jax_platforms or "").split(",")[0] in ("", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def broadcast_from_first(values: list[int], size: int) -> list[int]:
    """Process 0's ``values`` (ints >= 0, at most ``size`` of them) on every process."""
    import numpy as np
    from jax.experimental import multihost_utils

    mine = np.full(size + 1, -1, np.int64)
    mine[0] = len(values)
    mine[1:1 + len(values)] = values
    got = np.asarray(multihost_utils.broadcast_one_to_all(mine))
    return [int(v) for v in got[1:1 + int(got[0])]]
