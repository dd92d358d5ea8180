"""The time spent preparing compiled programs (tracing, lowering, then compiling them or loading them from the
compilation cache), read from JAX's monitoring events, so that a front end reports it apart from generation: the
first answer of a fresh install spends most of its time compiling, and a reader of "tokens/s" should not take that
for the model's speed.

JAX reports these durations on the thread that prepares the program (the engine's); the clock sums them over the
process, so ``since()`` covers whatever ran between ``start()`` and the call.
"""

from __future__ import annotations

import dataclasses
import threading

# the steps of preparing one program; backend_compile covers a compilation-cache read when the program is there
_DURATIONS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")
_HITS, _MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"

_lock = threading.Lock()
_totals = {"seconds": 0.0, "programs": 0, "hits": 0, "misses": 0}
_registered = False


def _on_duration(name: str, seconds: float, **_) -> None:
    if name in _DURATIONS:
        with _lock:
            _totals["seconds"] += seconds
            _totals["programs"] += name == _DURATIONS[-1]


def _on_event(name: str, **_) -> None:
    if name in (_HITS, _MISSES):
        with _lock:
            _totals["hits" if name == _HITS else "misses"] += 1


@dataclasses.dataclass(frozen=True)
class Preparation:
    """What preparing programs cost over an interval: ``seconds`` in all, ``programs`` prepared, of which
    ``loaded`` came from the compilation cache and ``compiled`` were compiled and written to it (both 0 when the
    cache is off: every program was compiled)."""

    seconds: float
    programs: int
    loaded: int
    compiled: int

    def describe(self) -> str:
        """``0.93 s preparing 5 programs (loaded from the compilation cache)`` and the like."""
        what = f"{self.seconds:.2f} s preparing {self.programs} program{'s' * (self.programs != 1)}"
        if self.loaded and not self.compiled:
            return f"{what} (loaded from the compilation cache)"
        if self.compiled and not self.loaded:
            return f"{what} (compiled: a first run; later runs load them from the compilation cache)"
        if self.compiled and self.loaded:
            return f"{what} ({self.compiled} compiled, {self.loaded} loaded from the compilation cache)"
        return f"{what} (compiled; the compilation cache is off)"


class ProgramClock:
    """Started by :func:`start`; ``since()`` is the :class:`Preparation` of what ran after."""

    def __init__(self):
        with _lock:
            self._start = dict(_totals)

    def since(self) -> Preparation:
        with _lock:
            now = dict(_totals)
        d = {k: now[k] - self._start[k] for k in now}
        return Preparation(d["seconds"], d["programs"], d["hits"], d["misses"])


def start() -> ProgramClock:
    """A clock from now (JAX's listeners are registered on the first call)."""
    global _registered
    import jax.monitoring

    with _lock:
        if not _registered:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _registered = True
    return ProgramClock()
