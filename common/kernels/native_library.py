"""The CPU kernels' shared library (built from common/kernels/cpu by the package's build): found beside this module,
loaded once, its XLA FFI handlers registered with JAX for the CPU platform.

Where the library is missing or cannot be loaded (a build without a C++ compiler, another OS), ``library()`` is
None and one ``CpuKernelsMissing`` warning says so; the ops then take their pure-JAX reference path, which gives the
same answer, slower.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
import pathlib
import threading
import warnings

import jax

from omnijax.common.errors import SettingError

LIBRARY_NAME = "_cpu_kernels"
# FFI target name -> the handler's symbol in the library
HANDLERS = {"omnijax_matmul_int8": "OmnijaxMatmulInt8", "omnijax_matmul_int4": "OmnijaxMatmulInt4",
            "omnijax_matmul_bf16": "OmnijaxMatmulBf16"}
ISA_ENV = "OMNIJAX_CPU_ISA"
ISAS = ("auto", "avx512", "avx2", "scalar")
LEVELS = ("scalar", "avx2", "avx512")  # what the library's OmnijaxCpuLevel() numbers
_lock = threading.Lock()


class CpuKernelsMissing(UserWarning):
    """The CPU kernels' library is not there: narrow-weight products on CPU run their (slower) pure-JAX reference."""


def library_path(folder: pathlib.Path = pathlib.Path(__file__).parent) -> pathlib.Path | None:
    """The built library in ``folder`` (named like a Python extension module of this interpreter), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"{LIBRARY_NAME}{suffix}"
        if path.is_file():
            return path
    return None


@functools.cache
def _load(path: pathlib.Path | None) -> ctypes.CDLL | None:
    """The library at ``path`` with its handlers registered, or None after one warning naming why not."""
    reason = None
    lib = None
    if path is None:
        reason = f"no {LIBRARY_NAME} library beside {pathlib.Path(__file__).parent} (the package was built without it)"
    else:
        try:
            lib = ctypes.CDLL(str(path))
            for name, symbol in HANDLERS.items():
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
        except (OSError, AttributeError) as error:
            reason, lib = f"{path} cannot be loaded: {error}", None
    if lib is None:
        warnings.warn(f"omnijax's CPU kernels are missing ({reason}): products with int8, int4 and bfloat16 weights "
                      f"on CPU take the pure-JAX path, which is slower. Reinstall omnijax with a C++ compiler "
                      f"(bash scripts/setup.sh) to build them.", CpuKernelsMissing, stacklevel=3)
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded library (its FFI targets registered), or None (warned once) where it is missing."""
    with _lock:
        return _load(library_path())


def best_isa() -> str | None:
    """The best instruction set of this CPU the kernels use (avx512, avx2 or scalar); None without the library."""
    lib = library()
    return None if lib is None else LEVELS[lib.OmnijaxCpuLevel()]


def isa_setting(environ=os.environ) -> str:
    """The instruction set ``OMNIJAX_CPU_ISA`` asks the kernels for: auto (the best the CPU has, the default),
    avx512, avx2 or scalar (each used where the CPU has it, else the best below it). Read when a program is traced."""
    isa = environ.get(ISA_ENV, "") or "auto"
    if isa not in ISAS:
        raise SettingError(f"{ISA_ENV}={isa!r}: use one of {', '.join(ISAS)}")
    return isa


def chosen_isa(isa: str | None = None) -> str | None:
    """The instruction set the kernels take for the setting ``isa`` (default ``OMNIJAX_CPU_ISA``): the one it names
    where the CPU has it, else the best below it; None without the library."""
    best = best_isa()
    isa = isa_setting() if isa is None else isa
    if best is None or isa == "auto":
        return best
    return LEVELS[min(LEVELS.index(isa), LEVELS.index(best))]
