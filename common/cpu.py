"""What the host CPU is: its feature flags, and a short name for them (programs compiled for one set of flags may not
run correctly on a CPU without them)."""

from __future__ import annotations

import functools
import hashlib
import pathlib
import platform


@functools.cache
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo is not readable)."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):  # x86 / Arm
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_signature(flags: frozenset[str] | None = None, machine: str | None = None) -> str:
    """The machine type and a digest of its CPU flags, e.g. ``x86_64-3f2a9c01d4e7``: equal on two hosts exactly when
    they report the same architecture and the same feature flags."""
    flags = cpu_flags() if flags is None else flags
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return f"{machine or platform.machine() or 'unknown'}-{digest}"
