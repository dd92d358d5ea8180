"""The package's native part: the CPU kernels of common/kernels/cpu, built as one shared library into
omnijax.common.kernels (loaded with ctypes by common/kernels/native_library.py; it has no Python bindings).
pyproject.toml holds the rest.

The build needs a C++17 compiler and nothing from JAX: the XLA FFI headers are in common/kernels/cpu/third_party.
Without a compiler the install still succeeds (the extension is optional) and the kernels' pure-JAX references run."""

from setuptools import Extension, setup

CPU = "common/kernels/cpu"

setup(ext_modules=[Extension(
    "omnijax.common.kernels._cpu_kernels",
    sources=[f"{CPU}/narrow_matmul.cc"],
    depends=[f"{CPU}/narrow_matmul_kernel.h", f"{CPU}/third_party/xla/ffi/api/ffi.h",
             f"{CPU}/third_party/xla/ffi/api/api.h", f"{CPU}/third_party/xla/ffi/api/c_api.h"],
    include_dirs=[f"{CPU}/third_party"],
    language="c++",
    # one build for every x86-64 CPU: the AVX2 and AVX-512 variants carry their own target options and are chosen
    # at run time, so no -march; the FFI headers' own warnings are not ours to fix
    extra_compile_args=["-std=c++17", "-O3", "-g0", "-fvisibility=hidden", "-w"],
    extra_link_args=["-pthread"],
    optional=True,
)])
