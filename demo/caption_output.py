"""The caption output file: only omnijax caption files are opened, one run at a time, and rows survive any name.

* ``check_output(path)`` refuses an output that is not a regular file (``/dev/full``, a FIFO, a folder) and an
  existing file that is not a caption file written by omnijax (an image, a CSV, a manifest): every complete line
  must be a caption row (a JSON object with "path" and "status"), and the text after the last newline (a row torn
  by a kill) must be the start of one. Reading is bounded by the file's size and MAX_OUTPUT_BYTES.
* ``OutputLock(path)`` holds an exclusive lock on ``<path>.lock`` for the whole run: a second run on the same
  output stops at once with a message instead of writing rows twice or losing them.
* ``row_bytes`` writes a path that is not valid UTF-8 (a file name's undecodable bytes, kept by Python as
  surrogate escapes) with JSON ``\\udcXX`` escapes: ``json.loads`` gives the same ``str`` back and
  ``os.fsencode(row["path"])`` the original bytes.
* ``replace_file`` rewrites the file atomically and keeps its permissions; ``remove_stale_temp_files`` removes the
  temporary files of a run that was killed while rewriting (called with the output's lock held).
* ``append_row`` writes a row whole or not at all: a failed write (a full disk) is cut back to the last complete
  row and raises CaptionInputError.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pathlib
import re
import stat
from typing import Sequence

from omnijax.demo.caption_items import STATUSES, CaptionInputError, parse_rows

MAX_OUTPUT_BYTES = 2 * 2**30
ROW_START = b'{"path": '


def row_bytes(row: dict) -> bytes:
    """One JSONL line. Text that is not valid Unicode (surrogate-escaped bytes of a file name) is written with
    JSON escapes, so the line is valid UTF-8 and reads back as the same ``str``."""
    try:
        return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(row, ensure_ascii=True) + "\n").encode("ascii")


def _is_caption_row(row) -> bool:
    return isinstance(row, dict) and isinstance(row.get("path"), str) and row.get("status") in STATUSES


def read_output(path: str | os.PathLike, *, what: str = "--out") -> tuple[list[dict], int, int]:
    """(rows, bytes of complete lines, file size) of an existing caption file; ([], 0, 0) when there is none.

    Raises CaptionInputError when ``path`` is not a regular file, is over MAX_OUTPUT_BYTES, or holds anything but
    caption rows (and possibly a torn last row)."""
    path = pathlib.Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return [], 0, 0
    except OSError as e:
        raise CaptionInputError(f"{what} {path} cannot be used: {e.strerror or e}") from e
    if stat.S_ISDIR(info.st_mode):
        raise CaptionInputError(f"{what} {path} is a folder; give a .jsonl file")
    if not stat.S_ISREG(info.st_mode):
        raise CaptionInputError(f"{what} {path} is not a regular file (a device, FIFO or socket); give a .jsonl file")
    if info.st_size > MAX_OUTPUT_BYTES:
        raise CaptionInputError(f"{what} {path} holds {info.st_size / 2**30:.1f} GB, more than the "
                                f"{MAX_OUTPUT_BYTES // 2**30} GB a caption file may hold; split the input")
    try:
        with open(path, "rb") as f:
            data = f.read(info.st_size)
    except OSError as e:
        raise CaptionInputError(f"{what} {path} cannot be read: {e.strerror or e}") from e
    parsed = parse_rows(data)
    if parsed.bad_lines or not all(_is_caption_row(r) for r in parsed.rows):
        number = next(i for i, line in enumerate(data[:parsed.complete_bytes].split(b"\n"), 1)
                      if line.strip() and not _line_is_row(line))
        raise CaptionInputError(f"{what} {path} exists and is not a caption file written by omnijax (line {number} "
                                f"is not a caption row); it is left as it is: choose another --out")
    torn = data[parsed.complete_bytes:]
    if torn and not (torn.startswith(ROW_START) or ROW_START.startswith(torn)):
        raise CaptionInputError(f"{what} {path} exists and is not a caption file written by omnijax (it does not "
                                f"end in a caption row); it is left as it is: choose another --out")
    return parsed.rows, parsed.complete_bytes, len(data)


def _line_is_row(line: bytes) -> bool:
    try:
        return _is_caption_row(json.loads(line))
    except (ValueError, RecursionError):
        return False


def check_not_an_input(out: str | os.PathLike, items: Sequence[str],
                       inputs: Sequence[str | os.PathLike] = ()) -> None:
    """Refuse an output that is one of the media ``items`` (absolute normalised paths, compared by name: a media
    file never passes as a caption file anyway) or one of the other ``inputs`` (a manifest: by name or by file)."""
    out = pathlib.Path(out)
    names = {os.path.abspath(out), os.path.realpath(out)}
    for item in names.intersection(items):
        raise CaptionInputError(f"--out {out} is one of the inputs ({item}); choose another output file")
    for item in inputs:
        same = os.path.abspath(item) in names or os.path.realpath(item) in names
        if not same and out.exists() and os.path.exists(item):
            same = os.path.samefile(out, item)
        if same:
            raise CaptionInputError(f"--out {out} is one of the inputs ({item}); choose another output file")


def lock_path(out: str | os.PathLike) -> pathlib.Path:
    out = pathlib.Path(out)
    return out.with_name(out.name + ".lock")


class OutputLock:
    """An exclusive lock on ``<out>.lock`` (flock: released by the system if the process dies), removed on
    release. A second holder gets ``error`` (CaptionInputError) at once; ``command`` names the run in messages."""

    def __init__(self, out: str | os.PathLike, *, command: str = "caption", flag: str = "--out",
                 error: type[Exception] = CaptionInputError):
        self.out = pathlib.Path(out)
        self.path = lock_path(out)
        self.command, self.flag, self.error = command, flag, error
        self._fd: int | None = None

    def __enter__(self) -> "OutputLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                raise self.error(f"cannot create the lock file {self.path}: {e.strerror or e}") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise self.error(f"another omnijax {self.command} run is writing {self.out} (it holds "
                                     f"{self.path}); wait for it to finish or choose another {self.flag}") from None
                raise self.error(f"cannot lock {self.path}: {e.strerror or e}") from e
            try:  # the file may have been removed by the run that held it just before: lock the current one
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    self._fd = fd
                    return self
            except FileNotFoundError:
                pass
            os.close(fd)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None


def _temp_name(path: pathlib.Path, attempt: int) -> pathlib.Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{attempt}.tmp")


def remove_stale_temp_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """Remove the temporary files ``replace_file`` left next to ``path`` in a run that was killed before it could
    (``.NAME.PID.N.tmp``); call it holding the output's lock, so that no running rewrite owns one. Returns them."""
    path = pathlib.Path(path)
    pattern = re.compile(re.escape(f".{path.name}.") + r"\d+\.\d+\.tmp")
    removed = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        if pattern.fullmatch(name):
            try:
                os.remove(path.parent / name)
                removed.append(path.parent / name)
            except OSError:
                pass
    return removed


def append_row(file, row: dict, out: pathlib.Path, error: type[Exception] = CaptionInputError) -> None:
    """Append ``row`` to ``file`` (an unbuffered binary file opened for appending) in full, or cut the file back to
    where it was and raise ``error`` (a full disk, a quota, a file size limit): the file always ends with a
    complete row."""
    data = row_bytes(row)
    start = os.fstat(file.fileno()).st_size
    try:
        view = memoryview(data)
        while view:
            written = file.write(view)
            if not written:
                raise OSError(errno.EIO, "nothing was written")
            view = view[written:]
    except OSError as e:
        try:
            os.ftruncate(file.fileno(), start)
        except OSError:
            pass
        raise error(f"cannot write to {out}: {e.strerror or e}; the rows written before are kept") from None


def replace_file(path: pathlib.Path, rows: Sequence[dict]) -> None:
    """Write ``rows`` to a temporary file next to ``path``, fsync it and rename it onto ``path``. The new file has
    the old one's permissions (or the default ones, from the umask, for a new file). A failure (a full disk)
    leaves the old file as it was and raises CaptionInputError."""
    path = pathlib.Path(path)
    mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else None
    for attempt in range(100):
        tmp = _temp_name(path, attempt)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
            break
        except FileExistsError:
            continue
    else:
        raise CaptionInputError(f"cannot create a temporary file next to {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            for row in rows:
                f.write(row_bytes(row))
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise CaptionInputError(f"cannot rewrite {path}: {e.strerror or e}; it is left as it was") from None
        raise
