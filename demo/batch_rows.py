"""OpenAI batch files as plain functions: the input's lines, the rows of the output and error files, and what an
earlier run of the same command has already written.

An input line (OpenAI's batch input format):

    {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [...]}}

An output row, and an error row (the line could not be answered; ``custom_id`` is null when the line has no usable
one of its own: it is not JSON, names none, or repeats an earlier line's; ``error.line`` is the input line's number,
from 1):

    {"id": "batch_req_...", "custom_id": "req-1", "response": {"status_code": 200, "request_id": "req_...",
     "body": {...the server's answer...}}, "error": null}
    {"id": "batch_req_...", "custom_id": "req-2", "response": null, "error": {"code": "...", "message": "...",
     "line": 2}}

Lines are read one at a time with a cap on their length, and the rows of an earlier run are read one at a time too:
what is kept of them is their custom_ids (and the numbers of lines without one), never their answers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import stat
import uuid
from typing import BinaryIO, Iterator

from omnijax.common.errors import OmnijaxError

URLS = {"/v1/chat/completions": True, "/v1/completions": False}  # the endpoints a line may name -> chat or not
MAX_CUSTOM_ID_CHARS = 512
MAX_ROW_BYTES = 256 * 2**20  # the longest row read back from an output or error file
ROW_START = b'{"id": "batch_req_'
SKIP_CHUNK = 2**20


class BatchFileError(OmnijaxError):
    """A batch input, output or error file cannot be used as given (the run stops before writing anything)."""


class BatchLineError(OmnijaxError):
    """One input line that cannot be answered: an error row with ``code``; ``custom_id`` when it has a usable one."""

    def __init__(self, code: str, message: str, custom_id: str | None = None):
        super().__init__(message)
        self.code, self.custom_id = code, custom_id


@dataclasses.dataclass(frozen=True)
class BatchLine:
    """A well-formed input line: its number (from 1), custom_id, endpoint (``chat``: /v1/chat/completions) and the
    request body (checked later, as the server checks it)."""

    number: int
    custom_id: str
    chat: bool
    body: dict


# ---- input -------------------------------------------------------------------------------------------------------

def read_lines(file: BinaryIO, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(number, line without its end) for each line of ``file``, numbered from 1; blank lines are skipped (still
    counted). A line longer than ``max_bytes`` comes as None: it is read past in pieces, never held whole."""
    number = 0
    while True:
        line = file.readline(max_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_bytes and not line.endswith(b"\n"):  # (max_bytes and its newline fit)
            while not line.endswith(b"\n"):
                line = file.readline(SKIP_CHUNK)
                if not line:
                    break
            yield number, None
            continue
        line = line.rstrip(b"\r\n")
        if line.strip():
            yield number, line


def count_lines(path: str | os.PathLike) -> int:
    """The lines of ``path`` (a last line without a newline counts), read in pieces."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while piece := f.read(SKIP_CHUNK):
            count += piece.count(b"\n")
            last = piece[-1:]
    return count + (last != b"\n")


def parse_line(number: int, line: bytes | None, max_bytes: int) -> BatchLine:
    """The input line ``number`` as a BatchLine; BatchLineError names what is wrong with it."""
    where = f"line {number}"
    if line is None:
        raise BatchLineError("line_too_long", f"{where} is longer than {max_bytes / 2**20:g} MB (--max-line-mb)")
    try:
        record = json.loads(line)
    except RecursionError:
        raise BatchLineError("invalid_json", f"{where} nests too deeply to be read as JSON") from None
    except ValueError as e:
        raise BatchLineError("invalid_json", f"{where} is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(record, dict):
        raise BatchLineError("invalid_line", f"{where} must be a JSON object with custom_id, method, url and body")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BatchLineError("missing_custom_id", f"{where} has no custom_id (a non-empty string)")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise BatchLineError("invalid_custom_id", f"{where}: the custom_id is longer than {MAX_CUSTOM_ID_CHARS} "
                                                  f"characters")
    method = record.get("method")
    if method != "POST":
        raise BatchLineError("invalid_method", f"{where}: method must be \"POST\", got {str(method)[:50]!r}",
                             custom_id)
    url = record.get("url")
    if url not in URLS:
        raise BatchLineError("invalid_url", f"{where}: url {str(url)[:100]!r} is not supported (one of "
                                            f"{', '.join(URLS)})", custom_id)
    body = record.get("body")
    if not isinstance(body, dict):
        raise BatchLineError("invalid_body", f"{where}: body must be a JSON object (the request)", custom_id)
    return BatchLine(number, custom_id, URLS[url], body)


# ---- output ------------------------------------------------------------------------------------------------------

def _row_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def ok_row(custom_id: str, body: dict) -> dict:
    """The output row of an answered line; ``body``: the server's JSON answer."""
    return {"id": _row_id(), "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex}", "body": body}, "error": None}


def error_row(custom_id: str | None, number: int, code: str, message: str) -> dict:
    """The error row of input line ``number``."""
    return {"id": _row_id(), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message, "line": number}}


def _is_row(row) -> bool:
    if not (isinstance(row, dict) and isinstance(row.get("id"), str) and "response" in row and "error" in row):
        return False
    custom_id, error = row.get("custom_id"), row["error"]
    if isinstance(error, dict):
        return isinstance(custom_id, str) or (custom_id is None and isinstance(error.get("line"), int))
    return error is None and isinstance(row["response"], dict) and isinstance(custom_id, str)


@dataclasses.dataclass
class Finished:
    """What the output and error files hold: the custom_ids answered or refused, the input line numbers refused
    without a custom_id of their own, and how many rows each file holds."""

    ids: set = dataclasses.field(default_factory=set)
    lines: set = dataclasses.field(default_factory=set)
    ok: int = 0
    failed: int = 0

    @property
    def count(self) -> int:
        return len(self.ids) + len(self.lines)


def read_rows(path: pathlib.Path, finished: Finished, what: str) -> int:
    """Add the rows of the batch output or error file ``path`` (if it exists) to ``finished``; return the length of
    its complete lines (text after the last newline is a row torn by a kill). BatchFileError when ``path`` is not a
    regular file or holds anything but batch rows: such a file is never written to."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise BatchFileError(f"{what} {path} cannot be used: {e.strerror or e}") from e
    if not stat.S_ISREG(info.st_mode):
        raise BatchFileError(f"{what} {path} is not a regular file (a folder, device or FIFO); give a .jsonl file")
    refused = f"{what} {path} exists and is not a batch file written by omnijax"
    complete, number = 0, 0
    try:
        with open(path, "rb") as f:
            while line := f.readline(MAX_ROW_BYTES + 1):
                number += 1
                if not line.endswith(b"\n"):
                    if len(line) > MAX_ROW_BYTES or not (line.startswith(ROW_START) or ROW_START.startswith(line)):
                        raise BatchFileError(f"{refused} (it does not end in a batch row); it is left as it is: "
                                             f"choose another file")
                    break  # a torn last row
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    row = None
                if not _is_row(row):
                    raise BatchFileError(f"{refused} (line {number} is not a batch row); it is left as it is: "
                                         f"choose another file")
                complete += len(line)
                if row["custom_id"] is None:
                    finished.lines.add(row["error"]["line"])
                else:
                    finished.ids.add(row["custom_id"])
                if row["error"] is None:
                    finished.ok += 1
                else:
                    finished.failed += 1
    except OSError as e:
        raise BatchFileError(f"{what} {path} cannot be read: {e.strerror or e}") from e
    return complete
