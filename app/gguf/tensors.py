"""A GGUF file's tensors under their Hugging Face names, read one at a time into the requested dtype.

``GGUFTensors`` has the interface of app/checkpoint.py's ``TensorIndex`` (``keys``, ``shape``, ``read``,
``close``), so ``load_params`` streams a GGUF file exactly as it streams safetensors: one tensor is dequantized,
transformed, cast and placed on the mesh before the next is read.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable

import numpy as np

from omnijax.app.gguf.arch import GGUFArch, gguf_tensor_name
from omnijax.app.gguf.dequant import CHUNK_BYTES, dequantize_rows_chunked, dequantize_tensor
from omnijax.app.gguf.file import GGUFFile, TensorInfo
from omnijax.common.errors import CheckpointError
from omnijax.common.quantized import quantize

log = logging.getLogger(__name__)


class GGUFTensors:
    """Tensors of ``file`` keyed by the Hugging Face names in ``wanted`` (the keys a weight map reads).

    A GGUF tensor no wanted key maps to (and that ``arch.ignored`` does not name) stays under its GGUF name, so
    the loader reports it as an unexpected tensor. ``read`` returns arrays of ``dtype`` (a numpy dtype).
    """

    def __init__(self, file: GGUFFile, arch: GGUFArch, hf_config: dict, wanted: Iterable[str], dtype):
        self.file = file
        self.arch = arch
        self.hf_config = hf_config
        self.dtype = np.dtype(dtype)
        layers = int(hf_config["num_hidden_layers"])
        self.gguf_name: dict[str, str] = {}  # Hugging Face key -> GGUF name
        for key in sorted(set(wanted)):
            name = gguf_tensor_name(arch.architecture, layers, key)
            if name is not None and name in file.tensors:
                self.gguf_name[key] = name
        mapped = set(self.gguf_name.values())
        ignored = [re.compile(p) for p in arch.ignored]
        skipped = {n for n in file.tensors if n not in mapped and any(r.fullmatch(n) for r in ignored)}
        if skipped:
            log.info("skipping %d GGUF tensors the model does not use: %s", len(skipped),
                     ", ".join(sorted(skipped)[:5]))
        self.unmapped = [n for n in file.tensors if n not in mapped and n not in skipped]

    def keys(self) -> set[str]:
        return set(self.gguf_name) | set(self.unmapped)

    def info(self, key: str) -> TensorInfo:
        name = self.gguf_name.get(key, key if key in self.unmapped else None)
        if name is None:
            raise CheckpointError(f"tensor {key!r} is missing from GGUF file {str(self.file.path)!r}")
        return self.file.tensors[name]

    def check_float(self, keys) -> None:
        """Every tensor type of the file was checked when it was opened (``check_types``: float and quantized
        types only, which dequantize to floats); kept for the loader's common interface."""
        for key in keys:
            self.info(key)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.info(key).shape

    def holds_more_than_4_bits(self, key: str) -> bool:
        """Whether the file stores ``key`` quantized with more than 4 bits a value (Q5_*, Q6_K, Q8_*): such a
        tensor stays int8 when int4 is asked, as a Q4_K_M file keeps its sensitive tensors above 4 bits."""
        import gguf

        name = gguf.GGMLQuantizationType(self.info(key).ggml_type).name
        return name.startswith(("Q5", "Q6", "Q8"))

    def read(self, key: str) -> np.ndarray:
        """The tensor ``key`` dequantized, with the architecture's transforms for it applied in float32, as
        ``self.dtype``."""
        info = self.info(key)
        transforms = self.arch.transforms_for(key)

        def rows(part: slice) -> np.ndarray:
            return self.file.read(info, part)

        if not transforms:
            return dequantize_tensor(rows, info, self.dtype)
        array = dequantize_tensor(rows, info, np.float32)
        for transform in transforms:
            array = transform(array, self.hf_config)
        return array.astype(self.dtype, copy=False)

    def read_quantized(self, key: str, mode: str, axis: int, shape: tuple[int, ...],
                       chunk_bytes: int = CHUNK_BYTES) -> dict[str, np.ndarray] | None:
        """The tensor ``key`` quantized to ``mode`` along its last axis (``quantize``'s parts), converted a group of
        rows at a time: the stored blocks of a few rows are dequantized to float32 and quantized again, so the
        tensor is never whole in float32. None when this path does not apply (a transform, another axis or shape):
        the loader then reads the tensor whole. A NaN or an infinity in the stored values (a broken block scale)
        raises CheckpointError naming the tensor, as the float path does."""
        from omnijax.app.checkpoint import check_finite
        from omnijax.app.weight_cache import aligned_empty

        info = self.info(key)
        if axis != len(shape) - 1 or tuple(info.shape) != tuple(shape) or self.arch.transforms_for(key):
            return None
        out: dict[str, np.ndarray] = {}
        rows = info.rows
        for part, values in dequantize_rows_chunked(lambda r: self.file.read(info, r), info, chunk_bytes):
            check_finite(values, key)
            chunk = quantize(values, mode, -1)
            for name, a in chunk.items():
                if name not in out:
                    out[name] = aligned_empty((rows,) + a.shape[1:], a.dtype)
                out[name][part] = a
        return {name: a.reshape(tuple(shape[:-1]) + a.shape[1:]) for name, a in out.items()}

    def source_files(self) -> list:
        """The files whose content the tensors come from (the weight cache's key)."""
        return [self.file.path]

    def close(self) -> None:
        self.file.close()
