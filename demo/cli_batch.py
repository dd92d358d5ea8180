"""``omnijax batch``: answer an OpenAI batch input file (JSONL) into an output file, resumably.

    omnijax batch requests.jsonl results.jsonl --model DIR --max-batch 16
    omnijax batch requests.jsonl results.jsonl --errors bad.jsonl --media-root /data/images

The runner is demo/batch_file.py; the line and row formats demo/batch_rows.py.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from omnijax.app.cli import add_engine_flags, add_model_flags, load_pipeline
from omnijax.common.errors import CheckpointError
from omnijax.demo.batch_file import DEFAULT_MAX_LINE_MB


def add_batch_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "batch", help="answer an OpenAI batch input file (chat and completions lines) into a JSONL output file",
        description="Each input line {custom_id, method: POST, url: /v1/chat/completions or /v1/completions, body} "
                    "is answered as omnijax serve answers that request; answers go to OUTPUT and lines that cannot "
                    "be answered to the error file, one JSON line each, as requests finish. Rerunning the same "
                    "command resumes: custom_ids already in either file are skipped.")
    p.add_argument("input", metavar="INPUT.jsonl", help="the OpenAI batch input file")
    p.add_argument("output", metavar="OUTPUT.jsonl", help="the output file (appended to; its custom_ids are skipped)")
    p.add_argument("--errors", metavar="FILE", default=None,
                   help="the error file (default: OUTPUT's name with .errors before its suffix)")
    p.add_argument("--progress-file", metavar="FILE", default=None,
                   help="the counts, as JSON replaced at most once a second (default: OUTPUT.progress.json)")
    p.add_argument("--media-root", metavar="DIR", default=None,
                   help="the folder whose files image / video URLs may name as paths or file: URLs (relative paths "
                        "from it; default: the input file's folder); anything outside it is an error line")
    p.add_argument("--served-model-name", default=None,
                   help="the model name of the answers, which a body's 'model' must match when it names one "
                        "(default: the checkpoint folder's name)")
    p.add_argument("--workers", type=int, default=4, help="threads preparing lines (media, processor; default 4)")
    p.add_argument("--max-line-mb", type=float, default=DEFAULT_MAX_LINE_MB,
                   help=f"the longest input line in MB (default {DEFAULT_MAX_LINE_MB:g}); longer ones are error lines")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_flags(p)
    add_engine_flags(p)
    return p


def run_batch_command(args) -> int:
    """0 when the run finished (error lines are rows, not a failure of the run), 130 when interrupted."""
    from omnijax.app.cli import model_settings
    from omnijax.demo.batch_file import BatchOptions, batch_paths, run_batch

    options = BatchOptions(media_root=args.media_root, model_name=args.served_model_name, workers=args.workers,
                           max_line_mb=args.max_line_mb, progress=not args.no_progress)
    batch_paths(args.input, args.output, args.errors, args.progress_file)  # before the model loads
    model_settings(args)
    if args.model is not None and not pathlib.Path(args.model).expanduser().exists():
        raise CheckpointError(f"--model {args.model!r} does not exist")
    summary = run_batch(lambda: load_pipeline(args), args.input, args.output, options, errors=args.errors,
                        progress_file=args.progress_file, log=sys.stderr)
    return 130 if summary.interrupted else 0
