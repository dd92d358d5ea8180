"""JAX's persistent compilation cache, on by default, so a second run on the same model does not compile again.

It lives in ``$OMNIJAX_HOME/jax-cache`` (one file per compiled program; the folder can be deleted at any time). ``OMNIJAX_COMPILATION_CACHE=0`` (or the CLI's ``--no-compilation-cache``)
turns it off; a cache folder the user configured for JAX (``JAX_COMPILATION_CACHE_DIR``) is left as it is.
"""

from __future__ import annotations

import logging
import os
import pathlib

import jax

from omnijax.common.paths import omnijax_home

log = logging.getLogger(__name__)
ENV = "OMNIJAX_COMPILATION_CACHE"


def enable_compilation_cache() -> pathlib.Path | None:
    """Turn the cache on (once per process) unless disabled; returns its folder, or None when off."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return pathlib.Path(configured)
    folder = omnijax_home() / "jax-cache"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a read-only home: run without the cache
        log.warning("compilation cache disabled: cannot create %s (%s)", folder, e)
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
