"""Converted weights kept on disk, so a second load of a checkpoint reads its stored tensors instead of converting
them again.

A GGUF file's tensors are dequantized (and, with ``quantize``, quantized again) at every load, and a safetensors
checkpoint loaded with ``quantize`` is quantized at every load: seconds for a 270M model, minutes for a large one.
The first load writes what it placed on the devices (every parameter as the host array it was placed from: float
tensors in their dtype, quantized ones as their ``values`` / ``scales`` / ``offsets``) into one safetensors file;
a later load of the same content with the same setting reads those tensors back, one at a time, straight into the
buffers the devices use (``place``: no second copy on a one-device mesh).

Where: ``$OMNIJAX_HOME/weights`` (``OMNIJAX_WEIGHT_CACHE_DIR`` names another folder; ``OMNIJAX_WEIGHT_CACHE=0``
turns the cache off). One entry is ``<key>.safetensors``; the key is a hash of the cache format, the content of
the checkpoint's files (sha256 of every weight file and its config: ``source_digest``), the family, the dtype, the
quantize mode and every parameter's path and shape. The content hash is remembered per file by its size, times and
inode (``sources/``), so an unchanged file is not hashed again; a changed file (any write changes its ctime) is,
and then misses. An entry is checked before it is used: its header (bounded, every offset inside the file), its
key and setting, every parameter present with its shape and dtype, and a crc32 of every tensor; anything wrong
(a truncated or corrupted file, a file of another setting) is logged, removed and built again, never used.

The folder holds at most ``max_cache_bytes()`` (``OMNIJAX_WEIGHT_CACHE_GB``, default 8): the least recently used
entries go first, an entry larger than the bound is not written, nor one the disk has no room for. Entries are
written under a temporary name and renamed when complete, so a process killed while writing leaves no entry
(stale temporary files are removed later).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import mmap
import os
import pathlib
import shutil
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import jax
import ml_dtypes
import numpy as np

from omnijax.common.errors import CheckpointError
from omnijax.common.paths import omnijax_home
from omnijax.common.quantized import INT4_GROUP, QuantizedArray
from omnijax.common.sharding import named_sharding

log = logging.getLogger(__name__)

FORMAT_VERSION = "1"  # bump when what an entry holds, or how a checkpoint converts, changes
ENV, ENV_DIR, ENV_SIZE = "OMNIJAX_WEIGHT_CACHE", "OMNIJAX_WEIGHT_CACHE_DIR", "OMNIJAX_WEIGHT_CACHE_GB"
DEFAULT_MAX_GB = 8.0
MAX_HEADER_BYTES = 64 << 20  # an entry's JSON header (a few hundred bytes a tensor)
MAX_SOURCE_MEMOS = 512  # files whose content hash is remembered
STALE_TEMP_SECONDS = 3600  # a temporary file this old was left by a process that died while writing
HASH_BLOCK = READ_BLOCK = 16 << 20
MAP_BYTES = 64 << 20  # host buffers from this size are memory maps of their own (``aligned_empty``)
ALIGN = 64  # host buffers a device may use in place (XLA's CPU client aliases 64-byte aligned buffers)
_QUANT_PARTS = ("values", "scales", "offsets")

_SAFETENSORS_DTYPES = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
                       "F64": np.dtype(np.float64), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
                       "I32": np.dtype(np.int32), "I64": np.dtype(np.int64)}
_DTYPE_NAMES = {v: k for k, v in _SAFETENSORS_DTYPES.items()}


def safetensors_dtype(name: str) -> str:
    """The safetensors name ("F32", "BF16", ...) of a dtype name ("float32", "bfloat16", ...)."""
    from omnijax.app.checkpoint import numpy_dtype

    return _DTYPE_NAMES[np.dtype(numpy_dtype(name))]


# ---- host buffers and placing them ---------------------------------------------------------------------------

def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``ALIGN``-byte boundary. A large one is an
    anonymous memory map of its own (page-aligned; returned to the system when the array goes): numpy asks for
    transparent huge pages on its large arrays, and where the kernel then compacts memory at the first touch
    (``defrag`` set to ``madvise``) a few hundred MB cost seconds instead of a fraction of one."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= MAP_BYTES:
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def place(array: np.ndarray, axes: tuple, mesh) -> jax.Array:
    """A host array as a device array laid out by its logical ``axes`` (each device gets its own piece). On a
    one-device mesh an aligned contiguous array is used in place (no copy: the caller must not change it
    afterwards); otherwise each device gets a copy of its piece."""
    sharding = named_sharding(axes, array.shape, mesh)
    if len(sharding.device_set) == 1 and array.flags.c_contiguous and array.ctypes.data % ALIGN == 0 \
            and array.size > 0:
        return jax.device_put(array, sharding, may_alias=True)
    return jax.make_array_from_callback(array.shape, sharding, lambda idx, a=array: a[idx])


# ---- where, whether, how much --------------------------------------------------------------------------------

def enabled(environ=os.environ) -> bool:
    return environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def cache_folder(environ=os.environ) -> pathlib.Path:
    configured = environ.get(ENV_DIR)
    return pathlib.Path(configured).expanduser() if configured else omnijax_home() / "weights"


def max_cache_bytes(environ=os.environ) -> int:
    raw = environ.get(ENV_SIZE)
    try:
        gb = float(raw) if raw else DEFAULT_MAX_GB
    except ValueError:
        log.warning("%s=%r is not a number of GB; using %g", ENV_SIZE, raw, DEFAULT_MAX_GB)
        gb = DEFAULT_MAX_GB
    if not math.isfinite(gb) or gb < 0:
        gb = DEFAULT_MAX_GB
    return int(min(gb, 1 << 20) * 2**30)


# the code a conversion runs: the loader, the GGUF reader and dequantizer, the families' weight maps and transforms,
# the quantizer (relative to the package); with the gguf and numpy versions, part of every key
_CONVERSION_CODE = ("app/checkpoint.py", "app/weight_cache.py", "app/gguf", "app/families", "common/quantized.py",
                    "common/weights.py")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the source of the code that converts a checkpoint (``_CONVERSION_CODE``) and of the versions of
    the packages it calls: an entry converted by other code is never read back."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        gguf_version = version("gguf")
    except PackageNotFoundError:
        gguf_version = "none"
    root = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"gguf {gguf_version} numpy {np.__version__}".encode())
    for part in _CONVERSION_CODE:
        target = root / part
        for file in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            digest.update(f"{file.relative_to(root)}\0".encode())
            try:
                digest.update(file.read_bytes())
            except OSError:
                digest.update(b"(unreadable)")
    return digest.hexdigest()[:32]


# ---- content hashes of the source files ----------------------------------------------------------------------

def _stat_signature(file: pathlib.Path) -> list:
    st = file.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def file_digest(file: pathlib.Path, memo_folder: pathlib.Path | None) -> str:
    """sha256 of ``file``'s content, remembered in ``memo_folder`` under its real path with its size, times and
    inode: hashed again whenever any of those changed (or the memo is unreadable)."""
    file = pathlib.Path(file).resolve()
    signature = _stat_signature(file)
    memo = None
    if memo_folder is not None:
        memo = memo_folder / (hashlib.sha256(str(file).encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json")
        try:
            with open(memo, "rb") as f:
                known = json.loads(f.read(4096))
            if isinstance(known, dict) and known.get("path") == str(file) and known.get("stat") == signature \
                    and isinstance(known.get("sha256"), str) and len(known["sha256"]) == 64:
                return known["sha256"]
        except (OSError, ValueError):
            pass
    digest = hashlib.sha256()
    with open(file, "rb", buffering=0) as f:
        block = bytearray(HASH_BLOCK)
        view = memoryview(block)
        while n := f.readinto(block):
            digest.update(view[:n])
    value = digest.hexdigest()
    if memo is not None and _stat_signature(file) == signature:  # not changed while it was read
        try:
            memo_folder.mkdir(parents=True, exist_ok=True)
            _write_atomic(memo, json.dumps({"path": str(file), "stat": signature, "sha256": value}).encode())
            _prune_memos(memo_folder)
        except OSError:
            pass
    return value


def source_digest(files, memo_folder: pathlib.Path | None) -> str:
    """One hash of the content of ``files`` (in the order given, each named by its file name)."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{pathlib.Path(file).name}\0{file_digest(file, memo_folder)}\n".encode())
    return digest.hexdigest()


def _prune_memos(folder: pathlib.Path) -> None:
    memos = sorted(folder.glob("*.json"), key=lambda p: _mtime(p))
    for old in memos[:max(0, len(memos) - MAX_SOURCE_MEMOS)]:
        old.unlink(missing_ok=True)


def _mtime(path: pathlib.Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _write_atomic(target: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".building-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ---- the entry of one load -----------------------------------------------------------------------------------

def _name(path) -> str:
    return "/".join(map(str, path))


class WeightCache:
    """The cache entry of one checkpoint loaded with one setting: ``read`` (the placed params, or None: build
    them) and ``writer`` (receives the host arrays as ``load_params`` places them)."""

    def __init__(self, folder: pathlib.Path, key: str, setting: dict, shapes: dict, max_bytes: int):
        self.folder = folder
        self.key = key
        self.setting = setting
        self.shapes = shapes  # {param path: (shape, axes)}
        self.max_bytes = max_bytes
        self.file = folder / f"{key}.safetensors"

    @classmethod
    def open(cls, source_files, setting: dict, shapes: dict, environ=os.environ) -> "WeightCache | None":
        """The entry for the content of ``source_files`` loaded with ``setting`` (family, dtype, quantize mode)
        into parameters of ``shapes``; None when the cache is off or its folder cannot be made."""
        if not enabled(environ):
            return None
        folder = cache_folder(environ)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            digest = source_digest(source_files, folder / "sources")
        except OSError as e:
            log.warning("weight cache not used: %s", e)
            return None
        plan = hashlib.sha256(json.dumps(sorted((_name(p), list(s)) for p, (s, _) in shapes.items())).encode())
        setting = dict(setting, format=FORMAT_VERSION, source=digest, params=plan.hexdigest(), code=code_fingerprint())
        key = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:40]
        return cls(folder, key, setting, shapes, max_cache_bytes(environ))

    # ---- reading --------------------------------------------------------------------------------------------
    def read(self, mesh) -> dict | None:
        """The params pytree read from the entry and placed on ``mesh``; None on a miss. A damaged or mismatched
        entry is removed (and the caller builds it again)."""
        if not self.file.is_file():
            return None
        try:
            tree = self._read(mesh)
        except (CheckpointError, OSError, ValueError, KeyError, TypeError, AttributeError, IndexError,
                OverflowError, RecursionError) as e:
            log.warning("weight cache entry %s is not usable (%s); converting the checkpoint again", self.file, e)
            self.file.unlink(missing_ok=True)
            return None
        try:
            os.utime(self.file)  # recently used: pruned last
        except OSError:
            pass
        return tree

    def _read(self, mesh) -> dict:
        # each tensor's crc32 is computed on a second thread (zlib lets go of the GIL) while the next one is read;
        # all are checked before the params are handed out
        with open(self.file, "rb", buffering=0) as f, ThreadPoolExecutor(1) as pool:
            checks = []
            size = os.fstat(f.fileno()).st_size
            header, data_start = read_header(f, size, self.file)
            meta = header.pop("__metadata__", None)
            if not isinstance(meta, dict):
                raise CheckpointError("no metadata")
            if json.loads(meta.get("setting", "null")) != self.setting:
                raise CheckpointError("it was written for another checkpoint or setting")
            plan = json.loads(meta.get("params", "null"))
            crcs = json.loads(meta.get("crc32", "null"))
            if not isinstance(plan, dict) or not isinstance(crcs, dict):
                raise CheckpointError("its metadata is incomplete")
            expected = {_name(p): p for p in self.shapes}
            if set(plan) != set(expected):
                raise CheckpointError("it holds other parameters than the model's")
            tree: dict = {}
            for name, path in expected.items():
                shape, axes = self.shapes[path]
                how = plan[name]

                def tensor(tname: str) -> np.ndarray:
                    info = header.get(tname)
                    if info is None:
                        raise CheckpointError(f"tensor {tname!r} is missing")
                    if not isinstance(crcs.get(tname), int):
                        raise CheckpointError(f"tensor {tname!r} has no checksum")
                    array = read_tensor(f, info, data_start, tname)
                    checks.append((tname, crcs[tname], pool.submit(zlib.crc32, array.reshape(-1).view(np.uint8))))
                    return array

                if how.get("kind") == "float":
                    array = tensor(name)
                    if tuple(array.shape) != tuple(shape) or _DTYPE_NAMES.get(array.dtype) != self.setting["dtype"]:
                        raise CheckpointError(f"parameter {name} is {array.dtype}{list(array.shape)}, expected "
                                              f"{self.setting['dtype']}{list(shape)}")
                    value = place(array, axes, mesh)
                elif how.get("kind") == "quantized":
                    value = self._quantized(name, how, shape, axes, mesh, tensor)
                else:
                    raise CheckpointError(f"parameter {name} has no kind")
                node = tree
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = value
            for tname, crc, got in checks:
                if got.result() != crc:
                    raise CheckpointError(f"tensor {tname!r} does not match its checksum")
        return tree

    def _quantized(self, name, how, shape, axes, mesh, tensor) -> QuantizedArray:
        bits, axis = how.get("bits"), how.get("axis")
        if bits not in (4, 8) or not isinstance(axis, int) or not 0 <= axis < len(shape):
            raise CheckpointError(f"parameter {name} has a bad quantization record {how}")
        parts = {"values": tensor(f"{name}#values"), "scales": tensor(f"{name}#scales")}
        if bits == 4:
            parts["offsets"] = tensor(f"{name}#offsets")
        want = {"values": np.int8 if bits == 8 else np.uint8, "scales": np.float32 if bits == 8 else np.float16,
                "offsets": np.float16}
        groups = 1 if bits == 8 else shape[axis] // INT4_GROUP
        for part, array in parts.items():
            expect = list(shape)
            expect[axis] = {"values": shape[axis] if bits == 8 else shape[axis] // 2}.get(part, groups)
            if array.dtype != np.dtype(want[part]) or list(array.shape) != expect:
                raise CheckpointError(f"parameter {name}: its {part} are {array.dtype}{list(array.shape)}")
        if bits == 4 and shape[axis] % INT4_GROUP:
            raise CheckpointError(f"parameter {name}: int4 groups do not divide {shape[axis]}")
        leaves = {part: place(a, axes, mesh) for part, a in parts.items()}
        return QuantizedArray(leaves["values"], leaves["scales"], leaves.get("offsets"), bits=bits, axis=axis,
                              group=INT4_GROUP if bits == 4 else 0)

    # ---- writing --------------------------------------------------------------------------------------------
    def writer(self) -> "EntryWriter | None":
        try:
            return EntryWriter(self)
        except OSError as e:
            log.warning("weight cache entry not written: %s", e)
            return None


class EntryWriter:
    """Writes one entry as its parameters come (``add_float`` / ``add_quantized``), in a temporary file renamed
    into place by ``commit``. Gives up (quietly, the load goes on) when the entry outgrows the cache's bound or
    the disk. The header's room is reserved from the parameter names; the data follow it in the order added."""

    def __init__(self, cache: WeightCache):
        self.cache = cache
        names = [json.dumps(_name(p)) for p in cache.shapes]
        self.budget = 8 * (-(-(sum(4 * len(n) + 1200 for n in names) + len(json.dumps(cache.setting)) + 4096) // 8))
        self.data_start = 8 + self.budget
        self.header: dict = {}
        self.plan: dict = {}
        self.crcs: dict = {}
        self.offset = 0
        self.failed = False
        self.free = shutil.disk_usage(cache.folder).free
        fd, self.tmp = tempfile.mkstemp(prefix=".building-", suffix=".safetensors", dir=cache.folder)
        self.f = os.fdopen(fd, "wb")

    def _add(self, name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        dtype = _DTYPE_NAMES.get(array.dtype)
        if dtype is None:
            raise ValueError(f"no safetensors dtype for {array.dtype}")
        raw = array.reshape(-1).view(np.uint8)
        if self.data_start + self.offset + raw.size > min(self.cache.max_bytes, self.free - (256 << 20)):
            self.abandon("it would be larger than the cache's bound or the free disk space")
            return
        self.f.seek(self.data_start + self.offset)
        self.f.write(memoryview(raw))
        self.header[name] = {"dtype": dtype, "shape": list(array.shape),
                             "data_offsets": [self.offset, self.offset + raw.size]}
        self.crcs[name] = zlib.crc32(raw)
        self.offset += raw.size

    def add_float(self, path, array: np.ndarray) -> None:
        if self.failed:
            return
        try:
            self._add(_name(path), array)
            self.plan[_name(path)] = {"kind": "float"}
        except (OSError, ValueError) as e:
            self.abandon(str(e))

    def add_quantized(self, path, parts: dict[str, np.ndarray], bits: int, axis: int) -> None:
        if self.failed:
            return
        try:
            for part in _QUANT_PARTS:
                if part in parts:
                    self._add(f"{_name(path)}#{part}", parts[part])
            self.plan[_name(path)] = {"kind": "quantized", "bits": int(bits), "axis": int(axis)}
        except (OSError, ValueError) as e:
            self.abandon(str(e))

    def abandon(self, why: str = "") -> None:
        if not self.failed and why:
            log.info("weight cache entry not written: %s", why)
        self.failed = True
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)

    def commit(self) -> None:
        """Finish the entry (header, rename into place) and keep the folder within its bound."""
        if self.failed:
            return
        meta = {"setting": json.dumps(self.cache.setting, sort_keys=True), "params": json.dumps(self.plan),
                "crc32": json.dumps(self.crcs)}
        text = json.dumps(dict(self.header, __metadata__=meta), separators=(",", ":")).encode()
        if len(text) > self.budget:
            self.abandon(f"its header ({len(text)} bytes) outgrew its reserved room")
            return
        try:
            self.f.seek(0)
            self.f.write(self.budget.to_bytes(8, "little"))
            self.f.write(text + b" " * (self.budget - len(text)))
            self.f.close()
            os.replace(self.tmp, self.cache.file)
        except OSError as e:
            self.abandon(str(e))
            return
        prune(self.cache.folder, self.cache.max_bytes, keep=self.cache.file)


def prune(folder: pathlib.Path, max_bytes: int, keep: pathlib.Path | None = None) -> int:
    """Remove the least recently used entries until the folder's entries total at most ``max_bytes`` (``keep`` is
    never removed), and temporary files left by processes that died while writing. Returns the bytes removed."""
    removed = 0
    now = time.time()
    for tmp in folder.glob(".building-*"):
        if now - _mtime(tmp) > STALE_TEMP_SECONDS:
            tmp.unlink(missing_ok=True)
    entries = []
    for file in folder.glob("*.safetensors"):
        try:
            st = file.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, file))
    total = sum(size for _, size, _ in entries)
    for _, size, file in sorted(entries, key=lambda e: e[0]):
        if total <= max_bytes:
            break
        if keep is not None and file == keep:
            continue
        file.unlink(missing_ok=True)
        total -= size
        removed += size
    return removed


# ---- safetensors, read without a memory map ------------------------------------------------------------------

def read_header(f, size: int, where, known_dtypes_only: bool = True) -> tuple[dict, int]:
    """(header dict, where the data start) of the safetensors file open as ``f`` (``size`` bytes), checked: the
    header is bounded JSON, every tensor's dtype is known, its offsets are inside the file and match its shape.
    known_dtypes_only=False: tensors of other dtypes are left out of the result instead of refused."""
    head = os.pread(f.fileno(), 8, 0)
    if len(head) != 8:
        raise CheckpointError(f"{where} is truncated")
    n = int.from_bytes(head, "little")
    if n > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"{where} declares a header of {n} bytes")
    raw = os.pread(f.fileno(), n, 8)
    if len(raw) != n:
        raise CheckpointError(f"{where} is truncated")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{where} has an unreadable header: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where} has a header that is not a JSON object")
    data_start, data_size = 8 + n, size - 8 - n
    for name, info in list(header.items()):
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise CheckpointError(f"{where}: its metadata is not a table of strings")
            continue
        if not known_dtypes_only and not (isinstance(info, dict) and info.get("dtype") in _SAFETENSORS_DTYPES):
            del header[name]
            continue
        try:
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{where}: tensor {name!r} has a bad header entry") from None
        if any(s < 0 for s in shape) or not 0 <= begin <= end <= data_size \
                or end - begin != math.prod(shape) * dtype.itemsize:
            raise CheckpointError(f"{where}: tensor {name!r} does not fit the file")
    return header, data_start


def read_tensor(f, info: dict, data_start: int, name: str) -> np.ndarray:
    """One tensor of a checked header (``read_header``), read into a fresh aligned array."""
    dtype = _SAFETENSORS_DTYPES[info["dtype"]]
    begin, end = (int(x) for x in info["data_offsets"])
    out = aligned_empty(tuple(int(s) for s in info["shape"]), dtype)
    raw = out.reshape(-1).view(np.uint8)
    view = memoryview(raw)
    done = 0
    while done < raw.size:  # in blocks: one read of hundreds of MB into untouched memory is ~15x slower here
        got = os.preadv(f.fileno(), [view[done:done + READ_BLOCK]], data_start + begin + done)
        if got <= 0:
            raise CheckpointError(f"tensor {name!r} is truncated")
        done += got
    return out
