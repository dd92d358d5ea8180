"""``omnijax batch``: an OpenAI batch input file answered into an output file and an error file, resumably.

    summary = run_batch(pipe, "requests.jsonl", "results.jsonl", BatchOptions(workers=4))

The input is read one line at a time (demo/batch_rows.py holds the line and row formats). Each well-formed line's
``body`` is checked and prepared exactly as ``omnijax serve`` checks and prepares a request (demo/openai_request.py),
in ``workers`` threads, and submitted to the pipeline's serving engine. Up to ``window`` lines are in flight at
once (default: twice the engine's slots plus the workers), so a slot that finishes a request takes the next at
once, and memory holds the lines in flight, not the input. A row is appended to the output (answers) or the error
file (lines that cannot be answered: bad JSON, a missing or repeated custom_id, a bad body, unreadable media, a
prompt over the context) and flushed as each request ends, in the order they end; a bad line never stops the run.

Running the same command again resumes: every custom_id already in the output or error file (and every line
refused without a custom_id of its own, by its number) is skipped, and a row torn by a kill is cut off and redone,
so each custom_id ends up in exactly one row. Requests in flight at Ctrl-C (or SIGTERM) are cancelled and left
for the next run; what was written is kept.

Files beside OUTPUT: the error file (default ``<stem>.errors<suffix>``), ``OUTPUT.progress.json`` (counts,
replaced atomically at most once a second and at the end), ``OUTPUT.lock`` (held for the run; the error file has its
own) and ``.OUTPUT.media/`` (inline media of the lines being prepared; removed at the end and at the next start).
Media in messages: ``data:`` URLs, or paths (relative ones from the media folder) and ``file:`` URLs of files inside
the media folder (default: the input's folder).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import pathlib
import queue
import shutil
import stat
import sys
import threading
import time
from typing import TextIO

from omnijax.common.errors import OmnijaxError, printable
from omnijax.common.interruptible import get_item
from omnijax.demo import openai_protocol as api
from omnijax.demo import openai_request
from omnijax.demo.batch_rows import (BatchFileError, BatchLine, BatchLineError, Finished, count_lines, error_row,
                                     ok_row, parse_line, read_lines, read_rows)
from omnijax.demo.caption_output import OutputLock, append_row
from omnijax.demo.interrupts import CtrlC
from omnijax.demo.progress_bar import ProgressBar

DEFAULT_MAX_LINE_MB = 64.0  # as the server's default body cap
MAX_LINE_MB = 1024.0
MAX_WORKERS = 64
PROGRESS_SECONDS = 1.0  # the longest the progress file lags behind


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    """media_root: the folder local media paths must lie in (None: the input's folder). model_name: the name the
    answers carry and a body's ``model`` must match when it names one (None: the checkpoint folder's). workers:
    threads preparing lines. window: lines in flight at most (None: twice the engine's slots plus the workers).
    max_line_mb: the longest input line."""

    media_root: str | os.PathLike | None = None
    model_name: str | None = None
    workers: int = 4
    window: int | None = None
    max_line_mb: float = DEFAULT_MAX_LINE_MB
    progress: bool = True

    def __post_init__(self):
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= MAX_WORKERS:
            raise BatchFileError(f"--workers must be an integer in [1, {MAX_WORKERS}], got {self.workers!r}")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise BatchFileError(f"the window must be an integer >= 1, got {self.window!r}")
        mb = self.max_line_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not math.isfinite(mb) \
                or not 0 < mb <= MAX_LINE_MB:
            raise BatchFileError(f"--max-line-mb must be a number in (0, {MAX_LINE_MB:g}], got {mb!r}")


@dataclasses.dataclass
class BatchSummary:
    """Counts of one run: ``already`` lines skipped (their rows were there), ``done`` answers and ``failed`` error
    rows written by this run; ``interrupted``: it stopped on Ctrl-C (what was written is kept)."""

    output: str
    errors: str
    already: int = 0
    done: int = 0
    failed: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def written(self) -> int:
        return self.done + self.failed

    def line(self) -> str:
        head = "interrupted" if self.interrupted else "finished"
        rate = self.written / self.seconds if self.seconds > 0 else 0.0
        return (f"{head}: {self.done} answered into {self.output}, {self.failed} error lines into {self.errors}, "
                f"{self.already} already there; {self.written} lines in {self.seconds:.1f}s ({rate:.2f} lines/s)")


@dataclasses.dataclass(frozen=True)
class BatchPaths:
    input: pathlib.Path
    output: pathlib.Path
    errors: pathlib.Path
    progress: pathlib.Path


def default_errors_path(output: str | os.PathLike) -> pathlib.Path:
    """``results.jsonl`` -> ``results.errors.jsonl``."""
    output = pathlib.Path(output)
    return output.with_name(f"{output.stem}.errors{output.suffix or '.jsonl'}")


def _same(a: pathlib.Path, b: pathlib.Path) -> bool:
    if {os.path.abspath(a), os.path.realpath(a)} & {os.path.abspath(b), os.path.realpath(b)}:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def batch_paths(input: str | os.PathLike, output: str | os.PathLike, errors: str | os.PathLike | None = None,
                progress: str | os.PathLike | None = None) -> BatchPaths:
    """The run's files, checked before anything loads: the input is a readable regular file, and the output, error
    and progress files are four different files (BatchFileError naming the clash otherwise)."""
    paths = BatchPaths(pathlib.Path(input).expanduser(), pathlib.Path(output).expanduser(),
                       pathlib.Path(errors).expanduser() if errors is not None else default_errors_path(output),
                       pathlib.Path(progress).expanduser() if progress is not None
                       else pathlib.Path(output).expanduser().with_name(pathlib.Path(output).name + ".progress.json"))
    try:
        mode = paths.input.stat().st_mode
    except FileNotFoundError:
        raise BatchFileError(f"the input file {str(paths.input)!r} does not exist") from None
    except OSError as e:
        raise BatchFileError(f"the input file {str(paths.input)!r} cannot be used: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise BatchFileError(f"the input {str(paths.input)!r} is not a regular file (a folder, device or FIFO); "
                             f"give a .jsonl file")
    try:
        with open(paths.input, "rb"):
            pass
    except OSError as e:
        raise BatchFileError(f"the input file {str(paths.input)!r} cannot be read: {e.strerror or e}") from None
    named = [("the output", paths.output), ("the error file", paths.errors), ("the progress file", paths.progress)]
    for i, (what, path) in enumerate(named):
        if _same(path, paths.input):
            raise BatchFileError(f"{what} {str(path)!r} is the input file; choose another file")
        for other, other_path in named[i + 1:]:
            if _same(path, other_path):
                raise BatchFileError(f"{what} and {other} are the same file {str(path)!r}; choose two files")
    return paths


def _media_root(options: BatchOptions, paths: BatchPaths) -> pathlib.Path:
    root = pathlib.Path(options.media_root).expanduser() if options.media_root is not None else paths.input.parent
    root = pathlib.Path(os.path.abspath(root))
    if not root.is_dir():
        raise BatchFileError(f"the media folder {str(root)!r} (--media-root) is not a folder")
    return root


def error_of(e: BaseException) -> tuple[str, str]:
    """(code, message) of the error row of a line whose request failed with ``e``."""
    if isinstance(e, api.RequestError):
        return e.code or e.type, str(e)
    if isinstance(e, OmnijaxError):
        return type(e).__name__, str(e)
    return "internal_error", f"{type(e).__name__}: {e}"


def write_json_atomically(path: pathlib.Path, value: dict) -> None:
    """``value`` as ``path``, replaced whole (a reader sees the old file or the new one)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(value, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise BatchFileError(f"cannot write the progress file {path}: {e.strerror or e}") from None


class _Pending:
    """One line on its way: prepared in a worker, then on the engine (its ``n`` choices). It is put on ``done``
    exactly once: when every choice has ended, or when it fails before (``error``)."""

    def __init__(self, line: BatchLine, done: queue.SimpleQueue):
        self.line = line
        self.request: openai_request.ApiRequest | None = None
        self.prompt = None
        self.handles: list = []
        self.error: BaseException | None = None
        self._done = done
        self._sent = False
        self._lock = threading.Lock()

    def _send(self) -> None:
        with self._lock:
            if self._sent:
                return
            self._sent = True
        self._done.put(self)

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._send()

    def notify(self) -> None:
        """The engine's listener (its thread; never blocks): sends the line once its choices have ended."""
        handles = self.handles
        if handles and all(handle.done for handle in handles):
            self._send()


class _Run:
    """The main thread's loop: read, refuse or dispatch each line, write each row as its request ends."""

    def __init__(self, pipe, paths: BatchPaths, options: BatchOptions, finished: Finished, files, ctrl_c: CtrlC,
                 summary: BatchSummary, total: int, log: TextIO | None):
        self._pipe = pipe if hasattr(pipe, "submit") else None
        self._load = None if self._pipe is not None else pipe
        self.paths, self.options, self.finished = paths, options, finished
        self.out_file, self.err_file = files
        self.ctrl_c, self.summary, self.log = ctrl_c, summary, log
        self.media_root = _media_root(options, paths)
        self.max_bytes = int(options.max_line_mb * 2**20)
        self.media_dir = paths.output.parent / f".{paths.output.name}.media"
        self.total = total
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.stopping = False
        self.live: set[_Pending] = set()  # lines whose request is on the engine
        self.in_flight = 0
        self.lines_read = 0
        self.seen: set[str] = set()  # every custom_id met so far: a later line with one of them repeats it
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.token_text = None
        self.model = options.model_name
        self.window = 0
        self.started = time.perf_counter()
        self._reported = -math.inf
        on_terminal = log is not None and getattr(log, "isatty", lambda: False)()
        self.bar = ProgressBar(max(total - finished.count, 0), options.progress and on_terminal, log or sys.stderr,
                               unit="line")

    # ---- main thread ---------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Load the pipeline (when given a function returning one) and the workers, at the first line to answer."""
        if self.executor is not None:
            return
        if self._pipe is None:
            self._pipe = self._load()
            self.started = time.perf_counter()  # the rate counts answering, not loading
        scheduler = self._pipe.scheduler
        if not getattr(scheduler, "threaded", True):
            raise BatchFileError("batch files run on a pipeline whose engine has a thread of its own (one JAX "
                                 "process)")
        self.model = self.model or self._pipe.name
        from omnijax.app.token_text import TokenText

        self.token_text = TokenText(self._pipe.processor.tokenizer)
        slots = scheduler.slots.slots
        window = self.options.window or 2 * slots + self.options.workers
        self.window = max(1, min(window, slots + scheduler.max_queue))  # never more than the engine takes
        shutil.rmtree(self.media_dir, ignore_errors=True)
        self.media_dir.mkdir()
        self.executor = concurrent.futures.ThreadPoolExecutor(self.options.workers,
                                                              thread_name_prefix="omnijax-batch")

    def run(self, lines) -> None:
        for number, raw in lines:
            if self.ctrl_c.requested:  # recorded while shielded, or swallowed by a library
                return
            self.lines_read = number
            self._take(number, raw)
            while True:  # rows of requests that have ended meanwhile
                try:
                    pending = self.done.get_nowait()
                except queue.Empty:
                    break
                self._settle(pending)
            self.report()
        while self.in_flight and not self.ctrl_c.requested:
            self._settle(get_item(self.done))

    def _take(self, number: int, raw: bytes | None) -> None:
        try:
            line, error = parse_line(number, raw, self.max_bytes), None
            custom_id = line.custom_id
        except BatchLineError as e:
            line, error, custom_id = None, e, e.custom_id
        if custom_id is not None:
            if custom_id in self.seen:
                error = BatchLineError("duplicate_custom_id", f"line {number}: the custom_id {custom_id[:200]!r} "
                                                              f"is used by an earlier line; each line needs its own")
                custom_id = None
            else:
                self.seen.add(custom_id)
        if (custom_id in self.finished.ids) if custom_id is not None else (number in self.finished.lines):
            self.summary.already += 1
            return
        if error is not None:
            self._write(error_row(custom_id, number, error.code, str(error)), ok=False)
            return
        self._start()
        while self.in_flight >= self.window:
            self._settle(get_item(self.done))
        self.in_flight += 1
        self.executor.submit(self._work, _Pending(line, self.done))

    def _settle(self, pending: _Pending) -> None:
        self.in_flight -= 1
        with self.lock:
            self.live.discard(pending)
        line = pending.line
        if pending.error is None:
            try:
                results = [handle.result() for handle in pending.handles]
            except Exception as e:  # an engine failure is this line's error row
                pending.error = e
            else:
                if any(result.finish_reason == "cancelled" for result in results):  # stopped: left for the next run
                    return
                request_id = api.new_id("chatcmpl" if line.chat else "cmpl")
                results = openai_request.read_calls(self._pipe, pending.request, results)
                body = openai_request.answer_body(request_id, self.model, results, pending.request, pending.prompt,
                                                  self.token_text)
                self._write(ok_row(line.custom_id, body), ok=True)
                return
        self._write(error_row(line.custom_id, line.number, *error_of(pending.error)), ok=False)

    def _write(self, row: dict, *, ok: bool) -> None:
        with self.ctrl_c.shielded():
            if ok:
                append_row(self.out_file, row, self.paths.output, BatchFileError)
                self.summary.done += 1
            else:
                append_row(self.err_file, row, self.paths.errors, BatchFileError)
                self.summary.failed += 1
            self.bar.update(1, self.summary.failed)

    def report(self, state: str = "running", *, force: bool = False) -> None:
        """The counts, as the progress file (at most once a PROGRESS_SECONDS unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._reported < PROGRESS_SECONDS:
            return
        self._reported = now
        s = self.summary
        write_json_atomically(self.paths.progress, {
            "state": state, "input": str(self.paths.input), "output": str(self.paths.output),
            "errors": str(self.paths.errors), "lines": self.total, "lines_read": self.lines_read,
            "already": s.already, "answered": s.done, "error_lines": s.failed, "in_flight": self.in_flight,
            "seconds": round(time.perf_counter() - self.started, 3), "updated": time.time()})

    def stop(self) -> None:
        """Cancel the requests still in flight (their lines are left for the next run) and end the workers."""
        with self.lock:
            self.stopping = True
            handles = [handle for pending in self.live for handle in pending.handles]
            self.live.clear()
        for handle in handles:
            handle.cancel()
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.media_dir, ignore_errors=True)
        self.bar.close()

    # ---- worker threads ------------------------------------------------------------------------------------
    def _work(self, pending: _Pending) -> None:
        line = pending.line
        try:
            if self.stopping:
                return
            pipe = self._pipe
            request = openai_request.read_request(line.body, chat=line.chat, model=self.model, voices=pipe.voices)
            if request.settings.stream:
                raise api.RequestError("'stream' is not supported in a batch file (answers are written whole)",
                                       param="stream")
            if request.spoken is not None:
                raise api.RequestError("spoken answers are not written to batch files (leave out 'modalities')",
                                       param="modalities")
            folder = self.media_dir / f"line-{line.number}"
            folder.mkdir(exist_ok=True)
            try:
                prompt = openai_request.prepare_prompt(pipe, request, folder, media_root=self.media_root)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            pending.request = request
            pending.prompt = prompt if request.echo is not None else None  # echo's log probabilities need it
            with self.lock:
                if self.stopping:
                    return
                pending.handles = openai_request.submit(pipe, prompt, request, listener=pending.notify)
                self.live.add(pending)
            pending.notify()  # they may have ended before the handles were set
        except Exception as e:  # a bad body, unreadable media, a prompt over the context: an error row
            pending.fail(e)


def _open_for_appending(path: pathlib.Path, complete: int):
    """``path`` opened for appending (unbuffered), created if missing, its torn last row cut off."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = open(path, "ab", buffering=0)
        if os.fstat(file.fileno()).st_size > complete:
            os.ftruncate(file.fileno(), complete)
        return file
    except OSError as e:
        raise BatchFileError(f"cannot use {path} for writing: {e.strerror or e}") from e


def run_batch(pipe, input: str | os.PathLike, output: str | os.PathLike, options: BatchOptions = BatchOptions(),
              *, errors: str | os.PathLike | None = None, progress_file: str | os.PathLike | None = None,
              log: TextIO | None = sys.stderr) -> BatchSummary:
    """Answer the batch input file ``input`` into ``output`` (and ``errors``), resuming what they hold.

    pipe: a Pipeline, or a function returning one (called at the first line left to answer). errors: the error file
    (default ``default_errors_path(output)``); progress_file: the counts (default ``OUTPUT.progress.json``).
    Ctrl-C (or SIGTERM) at any point stops the run cleanly: the summary has ``interrupted=True`` and every row
    written is kept. Returns the summary (also printed to ``log``)."""
    paths = batch_paths(input, output, errors, progress_file)
    _media_root(options, paths)  # a missing media folder fails before anything is locked
    with CtrlC() as ctrl_c, \
            OutputLock(paths.output, command="batch", flag="OUTPUT", error=BatchFileError), \
            OutputLock(paths.errors, command="batch", flag="--errors", error=BatchFileError):
        finished = Finished()
        complete = (read_rows(paths.output, finished, "the output file"),
                    read_rows(paths.errors, finished, "the error file"))
        summary = BatchSummary(str(paths.output), str(paths.errors))
        total = count_lines(paths.input)
        out_file = _open_for_appending(paths.output, complete[0])
        try:
            err_file = _open_for_appending(paths.errors, complete[1])
        except BaseException:
            out_file.close()
            raise
        run = _Run(pipe, paths, options, finished, (out_file, err_file), ctrl_c, summary, total, log)
        state = "failed"
        try:
            run.report(force=True)
            with open(paths.input, "rb") as f:
                run.run(read_lines(f, run.max_bytes))
            state = "interrupted" if ctrl_c.requested else "finished"
        except KeyboardInterrupt:
            ctrl_c.requested = True
            state = "interrupted"
        finally:
            with ctrl_c.shielded():
                try:
                    run.stop()
                finally:
                    out_file.close()
                    err_file.close()
                    summary.seconds = time.perf_counter() - run.started
                    summary.interrupted = ctrl_c.requested
                    run.report(state, force=True)
                    if log:
                        print(f"[omnijax] {printable(summary.line())}", file=log)
    return summary
