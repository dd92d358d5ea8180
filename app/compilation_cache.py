"""JAX's persistent compilation cache, on by default, so a second run on the same model does not compile again.

It lives in ``$OMNIJAX_HOME/jax-cache/<jaxlib version>-<CPU signature>`` (one file per compiled program; the folder
can be deleted at any time). JAX's own cache key holds the jaxlib version, the platform, the XLA flags and the
compile options but not the host CPU's features, and XLA loads a program compiled for instructions the host lacks
with no more than a log line: a home folder shared by an AVX2 and an AVX-512 machine (a network home, a copied
cache) would run the other machine's code. Keyed by the CPU's architecture and feature flags
(``common.cpu.cpu_signature``), each kind of machine keeps its own programs.

The folder holds at most ``MAX_CACHE_BYTES`` (least recently used programs go first; with a bound JAX also locks
the folder while it reads or writes, so several processes may share it). JAX writes a program file, then its
access-time file, in place: a process killed between the two (Ctrl-C during the first compile) leaves a program
file that is truncated or has no access time, and with a size bound every later write then fails. ``mend``
removes such files under JAX's lock before the cache is used.

``OMNIJAX_COMPILATION_CACHE=0`` (or the CLI's ``--no-compilation-cache``) turns it off; a cache folder the user
configured for JAX (``JAX_COMPILATION_CACHE_DIR``) is left as it is.
"""

from __future__ import annotations

import logging
import os
import pathlib

import jax
import jaxlib

from omnijax.common.cpu import cpu_signature
from omnijax.common.paths import omnijax_home

log = logging.getLogger(__name__)
ENV = "OMNIJAX_COMPILATION_CACHE"
MAX_CACHE_BYTES = 4 << 30
_PROGRAM, _ACCESS_TIME = "-cache", "-atime"  # the suffixes of JAX's files for one program (jax/_src/lru_cache.py)


def cache_folder(home: pathlib.Path | None = None) -> pathlib.Path:
    """The cache folder of this jaxlib on this kind of CPU."""
    return (home or omnijax_home()) / "jax-cache" / f"jaxlib-{jaxlib.__version__}-{cpu_signature()}"


def mend(folder: pathlib.Path, timeout: float = 10.0) -> int:
    """Remove the program files of ``folder`` (a size-bounded JAX cache) that have no access-time file: each was
    left by a process killed while writing it. Holds JAX's lock on the folder meanwhile (a write in progress in
    another process is left alone); skipped when the lock is not had within ``timeout`` seconds. Returns how many
    files were removed."""
    import filelock

    removed = 0
    try:
        with filelock.FileLock(folder / ".lockfile", timeout=timeout):
            for program in folder.glob(f"*{_PROGRAM}"):
                if not program.with_name(program.name[:-len(_PROGRAM)] + _ACCESS_TIME).exists():
                    program.unlink(missing_ok=True)
                    removed += 1
    except (filelock.Timeout, OSError) as e:
        log.warning("compilation cache %s not checked: %s", folder, e)
    if removed:
        log.warning("compilation cache %s: removed %d program(s) left half-written", folder, removed)
    return removed


def enable_compilation_cache() -> pathlib.Path | None:
    """Turn the cache on (once per process) unless disabled; returns its folder, or None when off. A folder the user
    configured for JAX is used as it is (mended when JAX bounds its size)."""
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        if jax.config.jax_compilation_cache_max_size != -1:
            mend(pathlib.Path(configured))
        return pathlib.Path(configured)
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    folder = cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a read-only home: run without the cache
        log.warning("compilation cache disabled: cannot create %s (%s)", folder, e)
        return None
    mend(folder)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
