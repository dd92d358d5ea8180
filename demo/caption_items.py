"""Batch captioning inputs and outputs as pure functions: finding the items, sharding them, reading rows back.

An input is a folder (searched recursively), a glob, a JSONL / CSV manifest (a path column and an optional
per-item prompt column) or one media file. Every item is keyed by its absolute, normalised path: the same key
whatever the working directory, which is what resuming and merging compare.

Output rows are JSON lines. A row is "ok", "error" or "skipped"; resuming reads the rows already written
(ignoring a torn last line), and merging part files keeps one row per path.
"""

from __future__ import annotations

import csv
import dataclasses
import glob as globlib
import io
import json
import os
import pathlib
import re
from typing import Iterable, Sequence

from omnijax.common.errors import OmnijaxError
from omnijax.preprocess.video_source import VIDEO_EXTENSIONS

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jfif", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm",
                              ".pgm", ".pbm", ".pnm", ".ico", ".tga"})
AUDIO_EXTENSIONS = frozenset({".wav", ".mp3", ".flac", ".ogg", ".oga", ".opus", ".m4a", ".aac", ".aif", ".aiff",
                              ".wma"})
MANIFEST_EXTENSIONS = frozenset({".jsonl", ".ndjson", ".csv"})
MAX_MANIFEST_BYTES = 256 * 2**20  # a manifest of millions of items
DEFAULT_PROMPTS = {"image": "Describe this image.", "audio": "Describe this audio.",
                   "video": "Describe this video."}
_GLOB_CHARS = re.compile(r"[*?\[]")
STATUSES = ("ok", "skipped", "error")


class CaptionInputError(OmnijaxError):
    """The captioning input (folder, glob, manifest) or output file cannot be used as given."""


@dataclasses.dataclass(frozen=True)
class CaptionItem:
    """One thing to caption. path: absolute normalised path (the item's key); kind: "image", "audio" or "video";
    prompt: a per-item prompt from a manifest, or None for the run's default."""

    path: str
    kind: str
    prompt: str | None = None


# ---- discovery ---------------------------------------------------------------------------------------------------

def media_kind(path: str) -> str | None:
    """"image", "audio", "video" or None (not a media file), from the file extension."""
    ext = os.path.splitext(path)[1].lower()
    if ext in IMAGE_EXTENSIONS:
        return "image"
    if ext in AUDIO_EXTENSIONS:
        return "audio"
    if ext in VIDEO_EXTENSIONS:
        return "video"
    return None


def item_key(path: str | os.PathLike, base: str | os.PathLike | None = None) -> str:
    """The absolute, normalised form of ``path`` (relative paths taken from ``base``, default the working dir)."""
    path = os.fspath(path)
    if base is not None and not os.path.isabs(path):
        path = os.path.join(os.fspath(base), path)
    return os.path.normpath(os.path.abspath(path))


def _hidden(name: str) -> bool:
    return name.startswith(".")


def folder_items(folder: str | os.PathLike) -> list[CaptionItem]:
    """Media files under ``folder`` (recursive, sorted, hidden files and folders skipped); other files ignored."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for name in sorted(files):
            kind = media_kind(name)
            if kind is not None and not _hidden(name):
                found.append(CaptionItem(item_key(os.path.join(root, name)), kind))
    return sorted(found, key=lambda item: item.path)


def glob_items(pattern: str) -> list[CaptionItem]:
    """Media files matching ``pattern`` (``**`` recurses), sorted; folders and non-media matches ignored."""
    found = []
    for match in globlib.glob(pattern, recursive=True):
        kind = media_kind(match)
        if kind is not None and not os.path.isdir(match):
            found.append(CaptionItem(item_key(match), kind))
    return sorted(found, key=lambda item: item.path)


def inside(path: str, folder: str) -> bool:
    """Whether the absolute normalised ``path`` lies in ``folder`` (compared by name, links not followed)."""
    folder = item_key(folder)
    return os.path.commonpath([path, folder]) == folder


def _manifest_item(record: dict, where: str, base: str, path_column: str, prompt_column: str,
                   allow_outside: bool = False) -> CaptionItem:
    """A manifest row as an item; a path without a known audio, video or image extension is taken as an image. A
    path outside the manifest's folder ``base`` (``../x``, an absolute path elsewhere) is refused unless
    ``allow_outside``: a manifest names files of its own dataset."""
    value = record.get(path_column)
    if not isinstance(value, str) or not value.strip():
        raise CaptionInputError(f"{where}: no {path_column!r} value (columns: {sorted(map(str, record))[:20]})")
    prompt = record.get(prompt_column)
    if prompt is not None and not isinstance(prompt, str):
        raise CaptionInputError(f"{where}: the {prompt_column!r} value must be a string, got {str(prompt)[:80]!r}")
    path = item_key(value.strip(), base)
    if not allow_outside and not inside(path, base):
        raise CaptionInputError(f"{where}: {value.strip()!r} is outside the manifest's folder {base}; pass "
                                f"--allow-outside-paths to caption files elsewhere")
    return CaptionItem(path, media_kind(path) or "image", prompt if prompt and prompt.strip() else None)


def parse_jsonl_manifest(text: str, name: str, base: str, *, path_column: str = "path",
                         prompt_column: str = "prompt", allow_outside: bool = False) -> list[CaptionItem]:
    """Items of a JSONL manifest (one JSON object per line; blank lines skipped), in file order.

    Relative paths are taken from ``base`` (the manifest's folder). A line that is not a JSON object, or has no
    path, raises CaptionInputError naming the file and line.
    """
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            record = json.loads(line)
        except RecursionError:
            raise CaptionInputError(f"{where} nests too deeply to be read as JSON") from None
        except ValueError as e:
            raise CaptionInputError(f"{where} is not valid JSON: {e}") from e
        if not isinstance(record, dict):
            raise CaptionInputError(f"{where}: expected a JSON object with a {path_column!r} key")
        items.append(_manifest_item(record, where, base, path_column, prompt_column, allow_outside))
    return items


def parse_csv_manifest(text: str, name: str, base: str, *, path_column: str = "path",
                       prompt_column: str = "prompt", allow_outside: bool = False) -> list[CaptionItem]:
    """Items of a CSV manifest with a header row naming ``path_column`` (and optionally ``prompt_column``). A
    field is at most csv's field limit (128 KB)."""
    reader = csv.DictReader(io.StringIO(text))
    items = []
    try:
        if reader.fieldnames is None or path_column not in reader.fieldnames:
            raise CaptionInputError(f"{name}: the CSV header has no {path_column!r} column "
                                    f"(header: {(reader.fieldnames or [])[:20]})")
        for record in reader:
            if not any((v or "").strip() for v in record.values() if isinstance(v, str)):
                continue  # a blank row
            items.append(_manifest_item(record, f"{name} line {reader.line_num}", base, path_column, prompt_column,
                                        allow_outside))
    except csv.Error as e:
        raise CaptionInputError(f"{name} line {reader.line_num}: not readable CSV ({e}; a field may hold at most "
                                f"{csv.field_size_limit() // 1024} KB)") from None
    return items


def manifest_items(path: str | os.PathLike, *, path_column: str = "path", prompt_column: str = "prompt",
                   allow_outside: bool = False) -> list[CaptionItem]:
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_MANIFEST_BYTES:
                raise CaptionInputError(f"the manifest {path} is over {MAX_MANIFEST_BYTES // 2**20} MB; split it")
            data = f.read(size + 1)
        if len(data) > MAX_MANIFEST_BYTES:  # it grew while read
            raise CaptionInputError(f"the manifest {path} is over {MAX_MANIFEST_BYTES // 2**20} MB; split it")
        text = data.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise CaptionInputError(f"cannot read the manifest {path}: {e}") from e
    parse = parse_csv_manifest if path.suffix.lower() == ".csv" else parse_jsonl_manifest
    return parse(text, str(path), str(path.parent.absolute()), path_column=path_column, prompt_column=prompt_column,
                 allow_outside=allow_outside)


def discover(source: str, *, path_column: str = "path", prompt_column: str = "prompt",
             allow_outside: bool = False) -> list[CaptionItem]:
    """The items of ``source``: a folder, a manifest (.jsonl / .ndjson / .csv), one media file or a glob.

    Duplicate paths keep their first occurrence. Raises CaptionInputError when nothing usable is found, or when a
    manifest names a file outside its folder and ``allow_outside`` is not set.
    """
    if os.path.isdir(source):
        items = folder_items(source)
        what = f"no media files (by extension) in the folder {source}"
    elif os.path.isfile(source):
        ext = os.path.splitext(source)[1].lower()
        if ext in MANIFEST_EXTENSIONS:
            items = manifest_items(source, path_column=path_column, prompt_column=prompt_column,
                                   allow_outside=allow_outside)
            what = f"the manifest {source} lists no items"
        elif media_kind(source) is not None:
            items = [CaptionItem(item_key(source), media_kind(source))]
            what = ""
        else:
            raise CaptionInputError(f"{source} is neither a folder, a manifest (.jsonl, .ndjson, .csv), a media "
                                    f"file nor a glob")
    elif _GLOB_CHARS.search(source):
        items = glob_items(source)
        what = f"the glob {source!r} matches no media files"
    else:
        raise CaptionInputError(f"input not found: {source}")
    if not items:
        raise CaptionInputError(what)
    return unique_items(items)


def unique_items(items: Iterable[CaptionItem]) -> list[CaptionItem]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item.path not in seen:
            seen.add(item.path)
            out.append(item)
    return out


# ---- sharding ----------------------------------------------------------------------------------------------------

def shard_items(items: Sequence[CaptionItem], shard_index: int, shard_count: int) -> list[CaptionItem]:
    """Process ``shard_index`` of ``shard_count``'s share: every shard_count-th item from shard_index.

    Shard the full, deterministically ordered item list (before removing finished items), so that a process
    keeps the same share across reruns and its part file stays complete. Shards are disjoint, cover every item
    and differ in size by at most one.
    """
    from grain.sharding import ShardOptions

    options = ShardOptions(shard_index=shard_index, shard_count=shard_count)  # validates index and count
    return list(items[options.shard_index::options.shard_count])


def part_path(out: str | os.PathLike, shard_index: int, shard_count: int) -> pathlib.Path:
    """The file one process writes: ``out`` itself for one process, else ``<stem>.part-00001-of-00004<suffix>``
    (the process index counts from 0: process 1 of 4 is the second)."""
    out = pathlib.Path(out)
    if shard_count == 1:
        return out
    suffix = out.suffix or ".jsonl"
    return out.with_name(f"{out.stem}.part-{shard_index:05d}-of-{shard_count:05d}{suffix}")


def part_pattern(out: str | os.PathLike) -> re.Pattern:
    """A regex matching the names of ``out``'s part files; groups: index, count."""
    out = pathlib.Path(out)
    suffix = out.suffix or ".jsonl"
    return re.compile(re.escape(out.stem) + r"\.part-(\d{5,})-of-(\d{5,})" + re.escape(suffix) + "$")


# ---- rows --------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ParsedRows:
    """rows: the complete, valid rows in file order; complete_bytes: length of the prefix ending at the last
    newline (a torn last line lies past it); bad_lines: complete lines that were not JSON rows with a path."""

    rows: list[dict]
    complete_bytes: int
    bad_lines: int


def parse_rows(data: bytes) -> ParsedRows:
    """Rows of a JSONL output file. Text after the last newline is a torn write and is not a row."""
    end = data.rfind(b"\n") + 1
    rows, bad = [], 0
    for line in data[:end].split(b"\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            bad += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("path"), str):
            rows.append(row)
        else:
            bad += 1
    return ParsedRows(rows, end, bad)


def row_status(row: dict) -> str:
    status = row.get("status")
    if status in STATUSES:
        return status
    return "error" if row.get("error") else "ok"


def finished_paths(rows: Iterable[dict], *, retry_errors: bool = False) -> set[str]:
    """Paths that need no more work: every row's path, or with ``retry_errors`` only those with a non-error row."""
    return {row["path"] for row in rows if not (retry_errors and row_status(row) == "error")}


def remaining(items: Sequence[CaptionItem], finished: set[str]) -> list[CaptionItem]:
    return [item for item in items if item.path not in finished]


def dedup_rows(rows: Iterable[dict]) -> list[dict]:
    """One row per path, in order of first appearance: the last "ok" row, else the last "skipped", else the last
    "error" row."""
    rank = {"ok": 2, "skipped": 1, "error": 0}
    best: dict[str, dict] = {}
    for row in rows:
        path = row["path"]
        if path not in best or rank[row_status(row)] >= rank[row_status(best[path])]:
            best[path] = row  # dict keeps the first insertion position
    return list(best.values())


def check_parts(parts: Sequence[tuple[int, int, str]]) -> None:
    """``parts``: (process index, process count, file name) of each part file found. Raises CaptionInputError if
    the counts disagree or a process's part is missing."""
    counts = sorted({count for _, count, _ in parts})
    if len(counts) > 1:
        raise CaptionInputError(f"part files from runs with different process counts {counts}: "
                                f"{sorted(name for _, _, name in parts)}; remove the stale ones")
    count = counts[0]
    stray = sorted(name for index, _, name in parts if index >= count)
    if stray:
        raise CaptionInputError(f"part files with a process index past the count: {stray}")
    missing = sorted(set(range(count)) - {index for index, _, _ in parts})
    if missing:
        raise CaptionInputError(f"missing part files for processes {missing} of {count}")
