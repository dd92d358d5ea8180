"""Stored GGUF tensors -> float arrays, with the ``gguf`` package's ``gguf.quants.dequantize``.

A tensor is dequantized a group of rows at a time into an array of the requested dtype, so converting one
tensor holds that tensor once in the requested dtype plus one group of rows in float32 and in stored form.
"""

from __future__ import annotations

import functools

import numpy as np

from omnijax.common.errors import CheckpointError

CHUNK_BYTES = 16 << 20  # stored bytes dequantized per step


@functools.lru_cache(maxsize=None)
def can_dequantize(ggml_type: int) -> bool:
    """Whether ``gguf.quants.dequantize`` turns this ggml type into float values (floats and quantized blocks:
    yes; integer tensors, or block types the installed gguf package lacks: no)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        qtype = GGMLQuantizationType(ggml_type)
        _, block_bytes = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        return False
    try:
        out = dequantize(np.zeros((1, block_bytes), np.uint8), qtype)
    except NotImplementedError:
        return False
    return np.issubdtype(np.asarray(out).dtype, np.floating)


def type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"ggml type {ggml_type}"


def check_types(path, types_by_tensor: dict[str, int]) -> None:
    """CheckpointError naming every ggml type of the file that cannot be dequantized, with a tensor of each."""
    bad: dict[int, str] = {}
    for name, ggml_type in types_by_tensor.items():
        if not can_dequantize(ggml_type):
            bad.setdefault(ggml_type, name)
    if bad:
        listed = ", ".join(f"{type_name(t)} (e.g. {name!r})" for t, name in sorted(bad.items()))
        raise CheckpointError(f"{path} holds tensors of unsupported ggml types: {listed}; omnijax reads the "
                              f"float types (F32, F16, BF16) and the block types gguf.quants dequantizes "
                              f"(Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ*)")


def dequantize_rows(raw_RB: np.ndarray, ggml_type: int) -> np.ndarray:
    """Stored rows uint8 [rows, bytes per row] -> float32 [rows, values per row]."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out = dequantize(raw_RB, GGMLQuantizationType(ggml_type))
    return np.asarray(out, dtype=np.float32)


def dequantize_rows_chunked(read_rows, info, chunk_bytes: int = CHUNK_BYTES):
    """(row slice, float32 [rows in it, values per row]) of the tensor ``info`` (a ``TensorInfo``), a group of
    rows at a time. read_rows: ``slice -> uint8 [rows, bytes per row]`` (``GGUFFile.read`` bound to ``info``)."""
    rows = info.rows
    per_row = info.nbytes // max(rows, 1)
    step = max(1, chunk_bytes // max(per_row, 1))
    row_len = info.shape[-1] if info.shape else 1
    for start in range(0, rows, step):
        part = slice(start, min(rows, start + step))
        values = dequantize_rows(read_rows(part), info.ggml_type)
        if values.shape != (part.stop - part.start, row_len):
            raise CheckpointError(f"tensor {info.name!r}: {type_name(info.ggml_type)} rows dequantized to shape "
                                  f"{list(values.shape)}, expected {[part.stop - part.start, row_len]}")
        yield part, values


def dequantize_tensor(read_rows, info, dtype, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    """The tensor ``info`` (a ``TensorInfo``) as ``dtype``, in its shape (``dequantize_rows_chunked`` written into
    one array of ``dtype``)."""
    from omnijax.app.weight_cache import aligned_empty

    row_len = info.shape[-1] if info.shape else 1
    out = aligned_empty((info.rows, row_len), dtype)  # aligned: a one-device mesh uses it in place
    for part, values in dequantize_rows_chunked(read_rows, info, chunk_bytes):
        out[part] = values
    return out.reshape(info.shape)
