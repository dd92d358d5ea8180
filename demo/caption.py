"""Batch captioning: a grain pipeline prepares items in worker threads, the serving engine generates them side by
side, rows go to JSONL.

    items = discover("photos/")                                   # demo.caption_items
    summary = run_captions(pipe, items, "captions.jsonl", CaptionOptions(batch_size=8))

Every item gets one row, written and flushed as soon as it and every item before it have finished (items are
generated side by side on the pipeline's serving engine, so a short caption never waits for a long one to free
its slot): ``{"path", "kind", "prompt", "status",
"caption", "prompt_tokens", "new_tokens", "finish_reason", "seconds", "error"}`` with status "ok", "error" (the
item could not be read or generated; ``error`` says why) or "skipped" (a modality the model does not take).
Running again on the same output skips the items it already holds, so an interrupted run resumes where it
stopped; a torn last line (a crash in mid-write) is cut off and its item redone. With several processes each
one captions its shard of the items into its own part file; ``merge_parts`` joins them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pathlib
import sys
import time
from typing import Sequence, TextIO

import grain
import jax

from omnijax.common.distributed import broadcast_from_first
from omnijax.common.errors import OmnijaxError
from omnijax.app.pipeline import MAX_BATCH
from omnijax.app.sampling import SamplingParams
from omnijax.demo.caption_items import (DEFAULT_PROMPTS, CaptionInputError, CaptionItem, check_parts, dedup_rows,
                                finished_paths, part_path, part_pattern, remaining, row_status, shard_items)
from omnijax.common.errors import printable
from omnijax.demo.caption_output import (OutputLock, append_row, check_not_an_input, read_output,
                                         remove_stale_temp_files, replace_file)
from omnijax.demo.interrupts import CtrlC
from omnijax.demo.progress_bar import ProgressBar


MAX_BATCH_SIZE = MAX_BATCH  # prompts generated together (each holds a KV cache)
MAX_WORKERS = 256  # threads preparing items


@dataclasses.dataclass(frozen=True)
class CaptionOptions:
    """prompt: the default prompt (None: "Describe this image." / "... audio." / "... video."); a manifest's
    per-item prompt wins. system: an optional system message. workers: grain threads preparing items (0: in the
    main thread). retry_errors: redo items whose row is an error row (that row is removed first)."""

    prompt: str | None = None
    system: str | None = None
    max_new_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] | None = None
    batch_size: int = 8
    workers: int = 4
    retry_errors: bool = False
    progress: bool = True

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be an integer in [1, {MAX_BATCH_SIZE}], got {self.batch_size!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 0 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be an integer in [0, {MAX_WORKERS}], got {self.workers!r}")


@dataclasses.dataclass
class Prepared:
    """An item after preprocessing: ``prompt`` (a PreparedPrompt) or ``error``; seconds spent preparing."""

    item: CaptionItem
    text: str
    prompt: object | None
    error: str | None
    seconds: float


@dataclasses.dataclass
class CaptionSummary:
    """Counts for this process's shard. already: items with rows before this run; done / failed / skipped: rows
    written by this run; interrupted: the run stopped on Ctrl-C (what was written is kept)."""

    output: str
    total: int
    already: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def written(self) -> int:
        return self.done + self.failed + self.skipped

    @property
    def items_per_second(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        head = "interrupted" if self.interrupted else "finished"
        return (f"{head}: {self.done} done, {self.failed} failed, {self.skipped} skipped, {self.already} already "
                f"in {self.output}, {self.total - self.already - self.written} left; {self.written} items in "
                f"{self.seconds:.1f}s ({self.items_per_second:.2f} items/s)")


def error_text(e: BaseException) -> str:
    return str(e) if isinstance(e, OmnijaxError) else f"{type(e).__name__}: {e}"


# ---- preparing ---------------------------------------------------------------------------------------------------

def messages_for(item: CaptionItem, text: str, system: str | None = None) -> list[dict]:
    """The chat for one item: [system], user: [media part, text part]."""
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    content = [{"type": item.kind, item.kind: item.path}, {"type": "text", "text": text}]
    return messages + [{"role": "user", "content": content}]


def prompt_text(item: CaptionItem, options: CaptionOptions) -> str:
    return item.prompt or options.prompt or DEFAULT_PROMPTS[item.kind]


def prepare_item(pipe, item: CaptionItem, options: CaptionOptions) -> Prepared:
    """``pipe.prepare`` on the item's chat (decodes the file, runs the processor); any failure becomes ``error``."""
    start = time.perf_counter()
    text = prompt_text(item, options)
    try:
        prompt = pipe.prepare(messages_for(item, text, options.system))
        return Prepared(item, text, prompt, None, time.perf_counter() - start)
    except Exception as e:  # a corrupt file must become an error row, never stop the batch
        return Prepared(item, text, None, error_text(e), time.perf_counter() - start)


def caption_dataset(pipe, items: Sequence[CaptionItem], options: CaptionOptions) -> grain.IterDataset:
    """A grain dataset of ``Prepared`` items (in item order): items are prepared in ``options.workers`` threads,
    ahead of generation by a prefetch buffer."""
    buffer = max(2 * options.batch_size, options.workers) if options.workers else 0
    read = grain.ReadOptions(num_threads=options.workers, prefetch_buffer_size=buffer)
    return (grain.MapDataset.source(list(items))
            .map(lambda item: prepare_item(pipe, item, options))
            .to_iter_dataset(read))


# ---- generating --------------------------------------------------------------------------------------------------

def base_row(prepared: Prepared) -> dict:
    item = prepared.item
    return {"path": item.path, "kind": item.kind, "prompt": prepared.text}


def ok_row(prepared: Prepared, result) -> dict:
    return base_row(prepared) | {"status": "ok", "caption": result.text, "prompt_tokens": result.prompt_tokens,
                                 "new_tokens": len(result.token_ids), "finish_reason": result.finish_reason,
                                 "seconds": round(prepared.seconds + result.seconds, 4), "error": None}


def error_row(prepared: Prepared, error: str, seconds: float = 0.0) -> dict:
    return base_row(prepared) | {"status": "error", "caption": None, "prompt_tokens": None, "new_tokens": None,
                                 "finish_reason": None, "seconds": round(prepared.seconds + seconds, 4),
                                 "error": error}


def skipped_row(item: CaptionItem, reason: str) -> dict:
    return {"path": item.path, "kind": item.kind, "prompt": None, "status": "skipped", "caption": None,
            "prompt_tokens": None, "new_tokens": None, "finish_reason": None, "seconds": 0.0, "error": reason}


class InFlight:
    """Captions being generated: items are submitted to the pipeline's engine as they are prepared and their rows
    come back in submission order. Up to ``window`` requests are inside the engine (twice its slots), so a slot
    that finishes a caption takes the next item at once."""

    def __init__(self, pipe, options: CaptionOptions):
        self.pipe = pipe
        self.options = options
        self.window = 2 * options.batch_size
        self.items: collections.deque = collections.deque()  # (Prepared, handle or None, error row or None)

    def add(self, prepared: Prepared) -> None:
        if prepared.prompt is None:
            self.items.append((prepared, None, error_row(prepared, prepared.error)))
            return
        o, sampling = self.options, self.options.sampling
        try:
            handle = self.pipe.submit(prepared.prompt, max_new_tokens=o.max_new_tokens,
                                      temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                      seed=sampling.seed, stop=o.stop)
            self.items.append((prepared, handle, None))
        except Exception as e:  # e.g. a prompt over the context budget: an error row, the run goes on
            self.items.append((prepared, None, error_row(prepared, error_text(e))))

    @property
    def full(self) -> bool:
        return len(self.items) >= self.window

    def next_row(self) -> dict:
        """The row of the oldest item (waiting for its caption)."""
        prepared, handle, row = self.items.popleft()
        if row is not None:
            return row
        start = time.perf_counter()
        try:
            return ok_row(prepared, self.pipe.wait(handle))
        except Exception as e:
            return error_row(prepared, error_text(e), time.perf_counter() - start)

    def cancel(self) -> None:
        for _, handle, _ in self.items:
            if handle is not None:
                handle.cancel()
        self.items.clear()


# ---- writing -----------------------------------------------------------------------------------------------------

class RowWriter:
    """Appends rows to a JSONL file, one write + flush per row, so a kill loses at most the row in flight.

    Opening checks that the file is a caption file (demo/caption_output.py), reads the rows already there, cuts
    off a torn last line (text after the last newline) and removes the temporary files of a killed rewrite. Hold
    the output's lock (``OutputLock``) first. A row that cannot be written (a full disk) is cut off and raises
    CaptionInputError: the file keeps every complete row.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.existing, complete, size = read_output(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temp_files(self.path)
            if complete < size:
                os.truncate(self.path, complete)
            self._file = open(self.path, "ab", buffering=0)
        except OSError as e:
            raise CaptionInputError(f"cannot use {self.path} as the output file: {e.strerror or e}") from e

    def write(self, row: dict) -> None:
        append_row(self._file, row, self.path)

    def drop(self, paths: set[str]) -> None:
        """Rewrite the file without the rows of ``paths`` (atomically: a crash leaves the old or the new file)."""
        self._file.close()
        self.existing = [row for row in self.existing if row["path"] not in paths]
        try:
            replace_file(self.path, self.existing)
        finally:
            self._file = open(self.path, "ab", buffering=0)

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a caption output file ([] if missing); CaptionInputError if it is not one."""
    return read_output(path)[0]


# ---- the run -----------------------------------------------------------------------------------------------------

def check_fits(pipe, options: CaptionOptions) -> None:
    """CaptionInputError when ``max_new_tokens`` alone fills the model's context budget: every item would fail."""
    budget = getattr(getattr(pipe, "engine", None), "max_context", None)
    if isinstance(budget, int) and options.max_new_tokens >= budget:
        raise CaptionInputError(f"--max-new-tokens {options.max_new_tokens} leaves no room for a prompt in the "
                                f"model's context budget of {budget} tokens")


def supported(pipe, item: CaptionItem) -> bool:
    return item.kind in pipe.config.modalities


class NoRows:
    """The writer of a process that writes nothing (every process but the first of a ``spmd`` run)."""

    existing: list = []

    def write(self, row: dict) -> None:
        pass

    def drop(self, paths: set[str]) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def run_captions(pipe, items: Sequence[CaptionItem], out: str | os.PathLike,
                 options: CaptionOptions = CaptionOptions(), *, shard_index: int = 0, shard_count: int = 1,
                 log: TextIO | None = sys.stderr, inputs: Sequence[str | os.PathLike] = (),
                 spmd: bool = False) -> CaptionSummary:
    """Caption this process's shard of ``items`` into its output file, resuming what is there.

    pipe: a Pipeline, or a function returning one (called only when there is something left to caption).
    shard_index / shard_count: this process among all (default 0 of 1); with more than one, rows go to
    ``part_path(out, shard_index, shard_count)`` and items already in a merged ``out`` count as finished too.
    inputs: other input files (a manifest) the output must not be. The output is locked for the run
    (``<out>.lock``) and must be a caption file if it exists (demo/caption_output.py).
    spmd: every JAX process runs this same call and the model on one mesh spanning them (``jax.distributed``):
    process 0 reads and writes the output and decides what is left to do; the others run the same batches.
    Ctrl-C at any point stops the run cleanly: the summary has ``interrupted=True`` and every row written so far
    is kept. Returns the summary (also printed to ``log``).
    """
    leader = not spmd or jax.process_index() == 0
    if not leader:
        log = None
    shard = shard_items(list(items), shard_index, shard_count)
    path = part_path(out, shard_index, shard_count)
    every = [item.path for item in items]
    check_not_an_input(path, every, inputs)
    if path != pathlib.Path(out):
        check_not_an_input(out, every, inputs)
    start = time.perf_counter()
    with CtrlC() as ctrl_c, OutputLock(path) if leader else contextlib.nullcontext(), \
            RowWriter(path) if leader else NoRows() as writer:
        rows = writer.existing + (read_output(out)[0] if path != pathlib.Path(out) else [])
        todo = remaining(shard, finished_paths(rows, retry_errors=options.retry_errors))
        if spmd:  # every process takes the first one's list
            index = {item.path: i for i, item in enumerate(shard)}
            todo = [shard[i] for i in broadcast_from_first([index[item.path] for item in todo], len(shard))]
        retried = {item.path for item in todo} & {row["path"] for row in writer.existing}
        if retried:  # their error rows go, so that the file keeps one row per item
            with ctrl_c.shielded():
                writer.drop(retried)
        summary = CaptionSummary(str(path), total=len(shard), already=len(shard) - len(todo))
        progress = None
        iterator = None
        flight = None
        try:
            if todo and not hasattr(pipe, "prepare"):
                pipe = pipe()
                start = time.perf_counter()  # throughput counts captioning, not loading
            check_fits(pipe, options)
            progress = ProgressBar(len(todo), options.progress and log is not None, log or sys.stderr)
            runnable = []
            for item in todo:
                if supported(pipe, item):
                    runnable.append(item)
                else:
                    with ctrl_c.shielded():
                        writer.write(skipped_row(item, f"the {pipe.family} model takes no {item.kind} input"))
                        summary.skipped += 1
                    progress.update(1, summary.failed)
            if runnable and not ctrl_c.requested:
                iterator = iter(caption_dataset(pipe, runnable, options))
                flight = InFlight(pipe, options)

                def write_next():
                    row = flight.next_row()
                    with ctrl_c.shielded():
                        writer.write(row)
                        if row["status"] == "ok":
                            summary.done += 1
                        else:
                            summary.failed += 1
                    progress.update(1, summary.failed)

                for prepared in iterator:
                    if ctrl_c.requested:  # recorded while shielded, or swallowed by a library
                        break
                    flight.add(prepared)
                    while flight.full and not ctrl_c.requested:
                        write_next()
                while flight.items and not ctrl_c.requested:
                    write_next()
        except KeyboardInterrupt:
            ctrl_c.requested = True
        finally:
            with ctrl_c.shielded():
                try:
                    if flight is not None:
                        flight.cancel()
                    if iterator is not None and hasattr(iterator, "close"):
                        iterator.close()
                    if progress is not None:
                        progress.close()
                finally:
                    summary.seconds = time.perf_counter() - start
                    summary.interrupted = ctrl_c.requested
                    if log:
                        print(f"[omnijax] {printable(summary.line())}", file=log)
    return summary


# ---- merging -----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class MergeSummary:
    output: str
    parts: list[str]
    rows: int
    ok: int
    failed: int
    skipped: int

    def line(self) -> str:
        return (f"merged {len(self.parts)} part files into {self.output}: {self.rows} rows ({self.ok} ok, "
                f"{self.failed} failed, {self.skipped} skipped)")


def find_parts(out: str | os.PathLike) -> list[tuple[int, int, pathlib.Path]]:
    """(process index, process count, file) of each of ``out``'s part files, sorted."""
    out = pathlib.Path(out)
    pattern = part_pattern(out)
    if not out.parent.is_dir():
        return []
    return sorted((int(m.group(1)), int(m.group(2)), out.parent / name)
                  for name in os.listdir(out.parent) if (m := pattern.fullmatch(name)))


def merge_parts(out: str | os.PathLike, *, remove_parts: bool = False) -> MergeSummary:
    """Join ``out``'s part files (and the rows already in ``out``) into ``out``: one row per path (an ok row
    preferred over a skipped one, over an error one), parts in process order. Written to a temporary file and
    renamed into place, under ``out``'s lock. Raises CaptionInputError when there are no parts, a part is
    missing, part counts disagree, or ``out`` or a part is not a caption file."""
    out = pathlib.Path(out)
    found = find_parts(out)
    if not found:
        raise CaptionInputError(f"no part files like {part_path(out, 0, 2).name} next to {out}")
    check_parts([(index, count, path.name) for index, count, path in found])
    parts = [path for _, _, path in found]
    with OutputLock(out):
        remove_stale_temp_files(out)
        rows = read_output(out)[0]
        for part in parts:
            rows += read_output(part, what="part file")[0]
        merged = dedup_rows(rows)
        replace_file(out, merged)
    if remove_parts:
        for part in parts:
            part.unlink()
    statuses = [row_status(r) for r in merged]
    return MergeSummary(str(out), [str(p) for p in parts], len(merged), statuses.count("ok"),
                        statuses.count("error"), statuses.count("skipped"))
