"""A GGUF file's header (metadata and tensor table) and the raw bytes of one tensor at a time.

The header is parsed with ``struct`` over a memory map of the file's first bytes only: ``gguf.GGUFReader`` builds
a Python object per element of every metadata array (a 262k-token vocabulary: ~12 s and ~700 MB), and the
loader needs none of the vocabulary. Long string arrays are therefore skipped and kept as their length
(``StringArray``), unless asked for by key (``string_arrays``: the vocabulary and merges, when the tokenizer is
built from them). Tensor bytes are read with ``os.pread`` into
a fresh buffer, so reading tensor after tensor never keeps the file's pages mapped in this process.

Layout (little-endian, GGUF v2 and v3): magic ``GGUF``, version u32, tensor count u64, metadata count u64;
metadata entries (key string, value type u32, value); tensor entries (name, dimension count u32, dimensions
u64 each, fastest-moving first, ggml type u32, offset u64 into the data section); the data section starts at
the next multiple of ``general.alignment`` (default 32).
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import pathlib
import struct

import numpy as np

from omnijax.common.errors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
KEEP_STRINGS_UP_TO = 4096  # longer string arrays (vocabularies, merges) are kept as their length only
# Bounds on what the header may declare, checked before it is used (real files: ~40 keys, ~1000 tensors, 262k-token
# vocabularies, strings of kilobytes)
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 20
MAX_DIMS = 8
MAX_ARRAY = 1 << 21  # elements of a metadata array
MAX_STRING_BYTES = 16 * 2**20  # a metadata string (a chat template: kilobytes)
MAX_ARRAY_STRING_BYTES = 1 << 16  # one string of a string array (a token, a merge)
MAX_ALIGNMENT = 1 << 20

# metadata value type -> struct format of one value (8: string and 9: array are variable-sized)
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                   12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclasses.dataclass(frozen=True)
class StringArray:
    """A long string array of the metadata, not read: only its length."""

    count: int

    def __len__(self) -> int:
        return self.count


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. shape: in numpy / torch order (slowest-moving first); offset: from the start of
    the file; nbytes: its stored size."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1]) if self.shape else 1


class _Cursor:
    """Sequential little-endian reads over a buffer; running past its end is a CheckpointError."""

    def __init__(self, buf, path: pathlib.Path):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise CheckpointError(f"{self.path} is truncated: its GGUF header ends early")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return values if len(values) > 1 else values[0]

    def string(self, limit: int = MAX_STRING_BYTES) -> str:
        length = self.unpack("<Q")
        if length > limit:
            raise CheckpointError(f"{self.path} holds a metadata string of {length} bytes; at most {limit} are read")
        if self.pos + length > len(self.buf):
            raise CheckpointError(f"{self.path} is truncated: its GGUF header ends early")
        raw = bytes(self.buf[self.pos:self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{self.path} holds a metadata string that is not UTF-8: {e}") from e

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            length = self.unpack("<Q")
            if length > MAX_ARRAY_STRING_BYTES:
                raise CheckpointError(f"{self.path} holds a string of {length} bytes in a metadata array; at most "
                                      f"{MAX_ARRAY_STRING_BYTES} are read")
            self.pos += length
        if self.pos > len(self.buf):
            raise CheckpointError(f"{self.path} is truncated: its GGUF header ends early")

    def value(self, value_type: int, keep_strings: bool = False):
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            element_type, count = self.unpack("<IQ")
            if count > MAX_ARRAY:
                raise CheckpointError(f"{self.path} holds a metadata array of {count} values; at most {MAX_ARRAY} "
                                      f"are read")
            if element_type in _SCALAR_FORMATS:
                dtype = np.dtype(_SCALAR_FORMATS[element_type].replace("?", "b1"))
                end = self.pos + count * dtype.itemsize
                if end > len(self.buf):
                    raise CheckpointError(f"{self.path} is truncated: its GGUF header ends early")
                values = np.frombuffer(self.buf, dtype, count, self.pos).copy()
                self.pos = end
                return values
            if element_type == _STRING:
                if count > KEEP_STRINGS_UP_TO and not keep_strings:
                    self.skip_strings(count)
                    return StringArray(count)
                return [self.string(MAX_ARRAY_STRING_BYTES) for _ in range(count)]
            raise CheckpointError(f"{self.path} holds a metadata array of value type {element_type}, "
                                  f"which GGUF does not define")
        raise CheckpointError(f"{self.path} holds a metadata value of type {value_type}, which GGUF does not define")


class GGUFFile:
    """The header of one GGUF file, and its tensors' bytes on request (``read``).

    metadata: key -> value (numbers, strings, numpy arrays for numeric arrays, lists of strings, ``StringArray``
    for long string arrays but those of the keys in ``string_arrays``). tensors: name -> TensorInfo, in file order.
    """

    def __init__(self, path, *, header_bytes: int | None = None, string_arrays: tuple[str, ...] = ()):
        self.path = pathlib.Path(path)
        self._string_arrays = frozenset(string_arrays)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise CheckpointError(f"GGUF file {str(self.path)!r} cannot be opened: {e.strerror or e}") from e
        try:
            self.size = os.fstat(self._fd).st_size
            if self.size < 24:
                raise CheckpointError(f"{self.path} is not a GGUF file (only {self.size} bytes)")
            with mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ) as view:
                self.metadata, self.tensors, self.data_start = self._parse(view)
        except BaseException:
            os.close(self._fd)
            raise

    def _parse(self, view) -> tuple[dict, dict[str, TensorInfo], int]:
        cur = _Cursor(view, self.path)
        if bytes(view[:4]) != MAGIC:
            raise CheckpointError(f"{self.path} is not a GGUF file (it does not start with the GGUF magic bytes)")
        cur.pos = 4
        version = cur.unpack("<I")
        if version not in VERSIONS:
            hint = " (a big-endian file?)" if version > 0xFFFF else ""
            raise CheckpointError(f"{self.path} is GGUF version {version}{hint}; supported versions: {VERSIONS}")
        tensor_count, kv_count = cur.unpack("<QQ")
        if kv_count > MAX_KEYS or tensor_count > MAX_TENSORS:
            raise CheckpointError(f"{self.path} declares {kv_count} metadata keys and {tensor_count} tensors; at "
                                  f"most {MAX_KEYS} keys and {MAX_TENSORS} tensors are read")
        metadata = {}
        for _ in range(kv_count):
            key = cur.string()
            metadata[key] = cur.value(cur.unpack("<I"), key in self._string_arrays)
        entries = []
        for _ in range(tensor_count):
            name = cur.string()
            ndim = cur.unpack("<I")
            if ndim > MAX_DIMS:
                raise CheckpointError(f"{self.path}: tensor {name!r} has {ndim} dimensions; at most {MAX_DIMS}")
            dims = cur.unpack(f"<{ndim}Q") if ndim else ()
            dims = (dims,) if isinstance(dims, int) else tuple(dims)
            ggml_type, offset = cur.unpack("<IQ")
            entries.append((name, tuple(reversed(dims)), ggml_type, offset))
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(alignment, (bool, np.bool_)) or not isinstance(alignment, (int, np.integer)) \
                or not 1 <= alignment <= MAX_ALIGNMENT:
            shown = repr(alignment)[:40]
            raise CheckpointError(f"{self.path} has general.alignment {shown}; it must be an integer in "
                                  f"[1, {MAX_ALIGNMENT}]")
        alignment = int(alignment)
        data_start = -(-cur.pos // alignment) * alignment
        tensors: dict[str, TensorInfo] = {}
        for name, shape, ggml_type, offset in entries:
            if name in tensors:
                raise CheckpointError(f"{self.path} holds tensor {name!r} twice")
            nbytes = stored_nbytes(shape, ggml_type, name, self.path)
            start = data_start + offset
            if start + nbytes > self.size:
                raise CheckpointError(f"{self.path} is truncated: tensor {name!r} ends past the end of the file")
            tensors[name] = TensorInfo(name, shape, ggml_type, start, nbytes)
        return metadata, tensors, data_start

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(f"{self.path} has no general.architecture in its metadata")
        return arch

    def read(self, info: TensorInfo, rows: slice | None = None) -> np.ndarray:
        """The stored bytes of ``info`` (or of a range of its rows) as uint8 [rows, bytes per row]."""
        per_row = info.nbytes // max(info.rows, 1)
        start, stop, _ = (rows or slice(None)).indices(info.rows)
        count = (stop - start) * per_row
        try:
            raw = os.pread(self._fd, count, info.offset + start * per_row)
        except OSError as e:
            raise CheckpointError(f"tensor {info.name!r} could not be read from {self.path}: {e.strerror or e}") from e
        if len(raw) != count:
            raise CheckpointError(f"{self.path} is truncated: tensor {info.name!r} ends past the end of the file")
        return np.frombuffer(raw, np.uint8).reshape(stop - start, per_row)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def stored_nbytes(shape: tuple[int, ...], ggml_type: int, name: str, path) -> int:
    """Bytes a tensor of ``shape`` (numpy order) and ``ggml_type`` occupies in the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(ggml_type)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise CheckpointError(f"tensor {name!r} in {path} has ggml type {ggml_type}, which the gguf package "
                              f"does not know") from None
    row = shape[-1] if shape else 1
    if row % block:
        raise CheckpointError(f"tensor {name!r} in {path}: a row of {row} values is not a whole number of "
                              f"{qtype.name} blocks of {block}")
    return math.prod(shape[:-1]) * (row // block) * block_bytes
