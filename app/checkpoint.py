"""Reading a Hugging Face checkpoint folder: config, safetensors index, and parameters placed on the mesh.

Tensors are read one at a time (plain file reads into aligned host buffers, or a ``TensorSource`` such as a GGUF
file's), re-laid out per the family's weight map, cast to the requested dtype and placed (``place``: used in place
on a one-device mesh, else handed shard by shard to ``jax.make_array_from_callback``): the host never holds a second
full copy of the model. A conversion worth keeping is written to the weight cache as it goes (app/weight_cache.py).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import stat
from typing import Iterable, Protocol

import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open

from omnijax.common.errors import CheckpointError, SettingError
from omnijax.common.quantized import INT4_GROUP, QuantizedArray, can_quantize, check_quantize, quantize
from omnijax.common.weights import ParamPath, TensorSpec
from omnijax.app.weight_cache import place, read_header, read_tensor

log = logging.getLogger(__name__)

_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def numpy_dtype(name: str):
    try:
        return _NUMPY_DTYPES[str(name)]
    except KeyError:
        raise SettingError(f"unsupported dtype {name!r}; use one of {', '.join(sorted(_NUMPY_DTYPES))}") from None


# The weight dtypes omnijax reads (safetensors header names); anything else (integers, booleans, 8-bit floats
# that need scales) is refused before a tensor is read.
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
MAX_JSON_BYTES = 64 * 2**20  # config, generation config and index files are kilobytes


def check_folder_files(folder: pathlib.Path) -> None:
    """Refuse a checkpoint folder holding something other than files and folders under a name (a FIFO, a socket or
    a device): opening one can block forever where Ctrl-C cannot reach. Links are followed (a Hugging Face cache
    snapshot is made of links); broken links are left for the loader to report if a needed file is missing."""
    try:
        entries = list(os.scandir(folder))
    except OSError as e:
        raise CheckpointError(f"checkpoint folder {str(folder)!r} cannot be listed: {e.strerror or e}") from e
    for entry in entries:
        try:
            mode = entry.stat(follow_symlinks=True).st_mode
        except OSError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise CheckpointError(f"{entry.name} in checkpoint folder {str(folder)!r} is not a regular file "
                                  f"(a FIFO, socket or device); remove it")


def regular_file(file: pathlib.Path, what: str) -> pathlib.Path:
    """``file`` when it is a regular file (links followed), else CheckpointError naming ``what`` it should be."""
    try:
        mode = file.stat().st_mode
    except OSError as e:
        raise CheckpointError(f"{what} {str(file)!r} cannot be read: {e.strerror or e}") from e
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{what} {str(file)!r} is not a regular file")
    return file


def read_json(folder: pathlib.Path, name: str, *, required: bool = True) -> dict | None:
    file = folder / name
    if not file.exists() and not file.is_symlink():
        if required:
            raise CheckpointError(f"{name} is missing from checkpoint folder {str(folder)!r}")
        return None
    regular_file(file, name)
    try:
        with open(file, "rb") as f:  # read(n) would allocate n bytes at once: read what the file holds
            data = f.read(min(os.fstat(f.fileno()).st_size, MAX_JSON_BYTES) + 1)
        if len(data) > MAX_JSON_BYTES:
            raise CheckpointError(f"{file} is over {MAX_JSON_BYTES // 2**20} MB, too large for a {name}")
        return json.loads(data)
    except RecursionError:
        raise CheckpointError(f"{file} nests too deeply to be read as JSON") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file} is not readable JSON: {e}") from e


FINITE_CHECK_BLOCK = 1 << 22  # values checked at a time (a 16 MB block of float32)


def check_finite(array: np.ndarray, name: str) -> None:
    """CheckpointError naming tensor ``name`` when ``array`` (a float array, as it will be used) holds a NaN or an
    infinity: such a weight makes every answer garbage. Checked block by block, without a full-size temporary."""
    if not (np.issubdtype(array.dtype, np.floating) or array.dtype == ml_dtypes.bfloat16):
        return
    flat = array.reshape(-1)
    for start in range(0, flat.size, FINITE_CHECK_BLOCK):
        block = flat[start:start + FINITE_CHECK_BLOCK]
        if not np.isfinite(block).all():
            bad = int(np.count_nonzero(~np.isfinite(block)))
            raise CheckpointError(f"tensor {name!r} holds NaN or infinite values ({bad}+ of {flat.size} as "
                                  f"{array.dtype}); the checkpoint is broken, or its values do not fit {array.dtype}")


def weight_file_name(folder: pathlib.Path, name) -> str:
    """``name`` (a file named by the safetensors index) when it is a ``.safetensors`` file inside ``folder``:
    a relative path with no ``..`` part. Anything else (``/etc/passwd``, ``../x``, a pickle file) raises."""
    where = f"the weight index of {str(folder)!r}"
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{where} names a weight file {name!r} that is not a file name")
    parts = pathlib.PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or pathlib.PureWindowsPath(name).drive or ".." in parts or "\\" in name \
            or "\0" in name:
        raise CheckpointError(f"{where} names weight file {name!r} outside the checkpoint folder")
    if not name.endswith(".safetensors"):
        raise CheckpointError(f"{where} names weight file {name!r}, which is not a .safetensors file "
                              f"(omnijax reads safetensors only)")
    return name


class TensorSource(Protocol):
    """Checkpoint tensors by (canonical Hugging Face) key, read one at a time: ``TensorIndex`` for safetensors
    folders, ``app.gguf.tensors.GGUFTensors`` for GGUF files."""

    def keys(self) -> set[str]: ...

    def check_float(self, keys: Iterable[str]) -> None: ...

    def read(self, key: str) -> np.ndarray: ...

    def close(self) -> None: ...


class TensorIndex:
    """Which safetensors file holds each tensor, with on-disk key spellings normalised by ``aliases``.

    aliases: ordered (regex, replacement) rewrites from other published spellings of a key to the canonical one.
    """

    def __init__(self, folder: pathlib.Path, aliases: Iterable[tuple[str, str]] = ()):
        self.folder = folder
        self._aliases = [(re.compile(p), r) for p, r in aliases]
        index = read_json(folder, "model.safetensors.index.json", required=False)
        if index is not None:
            try:
                files_by_key = dict(index["weight_map"])
            except (KeyError, TypeError, ValueError) as e:
                raise CheckpointError(f"{folder / 'model.safetensors.index.json'} has no weight_map") from e
            checked: set[str] = set()
            for name in files_by_key.values():
                if not isinstance(name, str) or name not in checked:
                    checked.add(weight_file_name(folder, name))
        else:
            single = folder / "model.safetensors"
            if not single.exists():
                raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {str(folder)!r}")
            regular_file(single, "weight file")
            files_by_key = {k: "model.safetensors" for k in self._keys_of(single)}
        for name in set(files_by_key.values()):
            if not (folder / name).exists():
                raise CheckpointError(f"weight file {name} named in the index is missing from {str(folder)!r}")
            regular_file(folder / name, "weight file")
        self.disk_key = {}  # canonical key -> (file name, on-disk key)
        for key, file in files_by_key.items():
            canonical = self.canonical(key)
            if canonical in self.disk_key:
                raise CheckpointError(f"tensor {key!r} appears twice in {str(folder)!r} (as {canonical!r})")
            self.disk_key[canonical] = (file, key)
        self._open: dict[str, object] = {}
        self._layouts: dict[str, tuple | None] = {}

    @staticmethod
    def _keys_of(file: pathlib.Path) -> list[str]:
        try:
            with safe_open(str(file), framework="numpy") as f:
                return list(f.keys())
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{file} is not a readable safetensors file: {e}") from e

    def canonical(self, key: str) -> str:
        for pattern, replacement in self._aliases:
            key = pattern.sub(replacement, key)
        return key

    def keys(self) -> set[str]:
        return set(self.disk_key)

    def shape(self, key: str) -> tuple[int, ...]:
        handle, disk = self._handle(key)
        return tuple(handle.get_slice(disk).get_shape())

    def dtype(self, key: str) -> str:
        """The tensor's dtype as the safetensors header names it ("F32", "BF16", "I64", ...), without reading it."""
        handle, disk = self._handle(key)
        try:
            return str(handle.get_slice(disk).get_dtype())
        except Exception as e:
            raise CheckpointError(f"tensor {key!r} in {str(self.folder)!r} has an unreadable header: {e}") from e

    def check_float(self, keys: Iterable[str]) -> None:
        """Raise CheckpointError naming the first of ``keys`` whose stored dtype is not a float type."""
        for key in keys:
            dtype = self.dtype(key)
            if dtype not in FLOAT_DTYPES:
                raise CheckpointError(f"tensor {key!r} in {str(self.folder)!r} is stored as {dtype}; weights must "
                                      f"be float ({', '.join(sorted(FLOAT_DTYPES))})")

    def read(self, key: str) -> np.ndarray:
        """The tensor ``key`` as stored, in a fresh host array: read with plain file reads into an aligned buffer
        (``read_tensor``: a one-device mesh uses it in place), not through safetensors' memory map, whose pages
        would count as resident while the file is open (the whole model once more by the last tensor). A tensor
        of a dtype that reader does not know is read by safetensors."""
        handle, disk = self._handle(key)
        file = self.disk_key[key][0]
        layout = self._layout(file)
        if layout is not None and disk in layout[0]:
            header, data_start, f = layout
            try:
                return read_tensor(f, header[disk], data_start, disk)
            except (CheckpointError, OSError) as e:
                raise CheckpointError(f"tensor {key!r} could not be read from {str(self.folder)!r}: {e}") from e
        try:
            return handle.get_tensor(disk)
        except Exception as e:
            raise CheckpointError(f"tensor {key!r} could not be read from {str(self.folder)!r}: {e}") from e

    def _layout(self, file: str):
        """(checked header of the tensors whose dtype ``read_tensor`` knows, data start, open file) of weight file
        ``file``, or None when its header does not read that way (safetensors reads it then)."""
        if file not in self._layouts:
            layout = None
            try:
                f = open(self.folder / file, "rb", buffering=0)
                header, data_start = read_header(f, os.fstat(f.fileno()).st_size, self.folder / file,
                                                 known_dtypes_only=False)
                layout = (header, data_start, f)
            except (CheckpointError, OSError):
                pass
            self._layouts[file] = layout
        return self._layouts[file]

    def _handle(self, key: str):
        if key not in self.disk_key:
            raise CheckpointError(f"tensor {key!r} is missing from checkpoint {str(self.folder)!r}")
        file, disk = self.disk_key[key]
        if file not in self._open:
            try:
                self._open[file] = safe_open(str(self.folder / file), framework="numpy")
            except Exception as e:
                raise CheckpointError(f"{self.folder / file} is not a readable safetensors file: {e}") from e
        return self._open[file], disk

    def source_files(self) -> list[pathlib.Path]:
        """The files whose content the tensors come from: the weight files and config.json (the weight cache's
        key)."""
        return [self.folder / "config.json"] + sorted(self.folder / f for f in {f for f, _ in self.disk_key.values()})

    def close(self):
        self._open.clear()
        for layout in self._layouts.values():
            if layout is not None:
                layout[2].close()
        self._layouts.clear()


def abstract_params(abstract_model: nnx.Module) -> tuple[nnx.GraphDef, dict[ParamPath, tuple[tuple, tuple]]]:
    """(graphdef, {param path: (shape, logical axes)}) of a model built under ``nnx.eval_shape``."""
    graphdef, state = nnx.split(abstract_model)
    flat = {}
    for path, var in nnx.to_flat_state(state):
        value = var.get_value()
        axes = var.get_metadata().get("axes") or (None,) * len(value.shape)
        flat[tuple(path)] = (tuple(value.shape), tuple(axes))
    return graphdef, flat


QUANTIZED_SUBTREE = ("decoder",)  # the weights ``quantize`` applies to: the decoder's (encoders keep their dtype)


def quantizable_params(abstract_model: nnx.Module) -> dict[ParamPath, int]:
    """{param path: the axis its products contract} of the decoder's weight matrices that may be stored quantized
    (parameters built with ``param(..., quant_axis=...)``: projections, experts, embedding / output tables)."""
    _, state = nnx.split(abstract_model)
    out = {}
    for path, var in nnx.to_flat_state(state):
        meta = var.get_metadata()
        axis = meta.get("quant_axis")
        if axis is not None and tuple(path[:len(QUANTIZED_SUBTREE)]) == QUANTIZED_SUBTREE:
            out[tuple(path)] = int(axis) if meta.get("quant_int4", True) else Int8Only(int(axis))
    return out


class Int8Only(int):
    """A quantizable parameter's axis, for a weight that stays int8 when int4 is asked (``param(..., int4=False)``)."""


def check_weight_map(params: dict[ParamPath, tuple[tuple, tuple]], weight_map: dict[ParamPath, TensorSpec],
                     disk_keys: set[str], unused_patterns: Iterable[str] = ()) -> list[str]:
    """Validate that parameters, weight map and checkpoint agree; returns the on-disk keys skipped as unused.

    Raises CheckpointError naming every missing tensor or unexpected tensor.
    """
    unmapped = sorted(set(params) - set(weight_map))
    if unmapped:
        raise CheckpointError(f"no checkpoint tensor is mapped to parameters {['/'.join(map(str, p)) for p in unmapped][:5]}")
    needed = {key for path, spec in weight_map.items() if path in params for key in spec.keys}
    missing = sorted(needed - disk_keys)
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:5]}")
    unused_re = [re.compile(p) for p in unused_patterns]
    extra = sorted(disk_keys - needed)
    skipped = [k for k in extra if any(r.fullmatch(k) for r in unused_re)]
    unexpected = [k for k in extra if k not in set(skipped)]
    if unexpected:
        raise CheckpointError(f"checkpoint has {len(unexpected)} unexpected tensor(s) that this model does not use, "
                              f"e.g. {unexpected[:5]}")
    return skipped


def quantized_value(parts: dict[str, np.ndarray], mode: str, axis: int, axes: tuple, mesh) -> QuantizedArray:
    """``quantize``'s numpy output placed on the mesh: every leaf carries the weight's logical axes."""
    leaves = {name: place(a, axes, mesh) for name, a in parts.items()}
    return QuantizedArray(leaves["values"], leaves["scales"], leaves.get("offsets"), bits=8 if mode == "int8" else 4,
                          axis=axis, group=INT4_GROUP if mode == "int4" else 0)


def quantize_mode_for(shape: tuple, mode: str | None, axis: int | None) -> str | None:
    """The mode a parameter is stored in: ``mode`` where it quantizes (int4 needs whole groups along the axis,
    else int8), None for a parameter that stays float."""
    if mode is None or axis is None:
        return None
    return mode if can_quantize(shape, mode, axis) else "int8"


def load_params(index: TensorSource, params: dict[ParamPath, tuple[tuple, tuple]],
                weight_map: dict[ParamPath, TensorSpec], *, dtype: str, mesh,
                unused_patterns: Iterable[str] = (), quantize_mode: str | None = None,
                quant_axes: dict[ParamPath, int] | None = None, cache_writer=None) -> dict:
    """Read every parameter into a sharded device array; returns the nested pure-dict params pytree.

    quantize_mode: None, "int8" or "int4": the parameters of ``quant_axes`` ({path: contracted axis}) are stored
    as ``QuantizedArray``s, quantized one tensor at a time on the host (a source that reads a tensor straight
    into its quantized form, ``read_quantized``, is asked first).
    cache_writer: an ``app.weight_cache.EntryWriter`` given every parameter's host arrays as they are placed (and
    committed at the end), or None."""
    quantize_mode = check_quantize(quantize_mode)
    quant_axes = quant_axes or {}
    skipped = check_weight_map(params, weight_map, index.keys(), unused_patterns)
    if skipped:
        groups: dict[str, int] = {}
        for key in skipped:
            groups[key.split(".")[0]] = groups.get(key.split(".")[0], 0) + 1
        log.info("skipping %d checkpoint tensors this model does not use: %s", len(skipped),
                 ", ".join(f"{g}.* ({n})" for g, n in sorted(groups.items())))
    target = numpy_dtype(dtype)
    index.check_float(sorted({key for path in params for key in weight_map[path].keys}))
    tree: dict = {}
    for path, (shape, axes) in params.items():
        spec = weight_map[path]
        mode = quantize_mode_for(shape, quantize_mode, quant_axes.get(path))
        wider = getattr(index, "holds_more_than_4_bits", None)
        if mode == "int4" and (isinstance(quant_axes.get(path), Int8Only)
                               or wider is not None and any(wider(key) for key in spec.keys)):
            mode = "int8"
        direct = getattr(index, "read_quantized", None) if mode is not None and _plain(spec) else None
        if direct is not None:
            parts = direct(spec.keys[0], mode, int(quant_axes[path]), shape)
            if parts is not None:
                _set(tree, path, quantized_value(parts, mode, int(quant_axes[path]), axes, mesh))
                if cache_writer is not None:
                    cache_writer.add_quantized(path, parts, 8 if mode == "int8" else 4, int(quant_axes[path]))
                continue
        parts = [index.read(key) for key in spec.keys]
        name = spec.keys[0] if len(spec.keys) == 1 else f"{spec.keys[0]} (+{len(spec.keys) - 1} joined)"
        if spec.concat_axis is None and len({p.shape for p in parts}) > 1:
            raise CheckpointError(f"tensors stacked into parameter {'/'.join(map(str, path))} differ in shape: "
                                  f"{sorted({tuple(p.shape) for p in parts})}")
        try:
            array = spec.apply(parts)
        except ValueError as e:
            raise CheckpointError(f"tensor {name!r} of shape {list(parts[0].shape)} does not fit parameter "
                                  f"{'/'.join(map(str, path))} of shape {list(shape)}: {e}") from e
        del parts
        if tuple(array.shape) != tuple(shape):
            raise CheckpointError(f"tensor {name!r} has shape {list(array.shape)} after layout change, "
                                  f"expected {list(shape)} for parameter {'/'.join(map(str, path))}")
        if not np.issubdtype(array.dtype, np.floating) and array.dtype != ml_dtypes.bfloat16:
            raise CheckpointError(f"tensor {name!r} has non-float dtype {array.dtype}")
        if mode is not None:
            check_finite(array, name)
            axis = int(quant_axes[path])
            parts = quantize(array, mode, axis)
            value = quantized_value(parts, mode, axis, axes, mesh)
            if cache_writer is not None:
                cache_writer.add_quantized(path, parts, 8 if mode == "int8" else 4, axis)
            del parts
        else:
            array = np.ascontiguousarray(array.astype(target, copy=False)).reshape(shape)  # (0-d stays 0-d)
            check_finite(array, name)  # in the dtype it is used in
            value = place(array, axes, mesh)
            if cache_writer is not None:
                cache_writer.add_float(path, array)
        del array
        _set(tree, path, value)
    index.close()
    if cache_writer is not None:
        cache_writer.commit()
    return tree


def _plain(spec: TensorSpec) -> bool:
    """Whether the parameter is one checkpoint tensor used as stored (no layout change)."""
    return isinstance(spec.key, str) and spec.transpose is None and spec.reshape is None and spec.fn is None


def _set(tree: dict, path: ParamPath, value) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
