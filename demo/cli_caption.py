"""``omnijax caption``: caption a folder, glob or manifest of images (and audio and videos) into a JSONL file,
resumably.

    omnijax caption --model DIR --input photos/ --out captions.jsonl --batch-size 8 --workers 4
    omnijax caption --merge --out captions.jsonl          # join the part files of a multi-process run
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from omnijax.app.cli import add_model_flags, add_sampling_flags, load_pipeline
from omnijax.common.errors import OmnijaxError


def add_caption_parser(subparsers) -> argparse.ArgumentParser:

    p = subparsers.add_parser(
        "caption", help="caption every image (and audio and video file) of a folder, glob or manifest into a JSONL file",
        description="One JSON line per media item, flushed as items finish. Rerunning the same command resumes: "
                    "items already in the output are skipped. With --distributed, several JAX processes run the "
                    "model on one mesh spanning them and process 0 writes OUT. With --process-index / "
                    "--process-count, independent processes each caption their shard into OUT's part file "
                    "(captions.part-00000-of-00004.jsonl, ...); join them with --merge.")
    add_model_flags(p)
    p.add_argument("--input", help="a folder (searched recursively), a glob (quote it; ** recurses), a .jsonl/.csv "
                                   "manifest with a path column and an optional prompt column, or one media file")
    p.add_argument("--out", required=True, help="the JSONL output file (appended to; its items are skipped)")
    p.add_argument("--prompt", help="the default prompt (default: 'Describe this image.' / '... audio.' / '... video.'); "
                                    "a manifest's per-item prompt wins")
    p.add_argument("--system", help="an optional system message")
    p.add_argument("--batch-size", type=int, default=8,
                   help="items generated together (the engine's slots; a finished item's slot takes the next)")
    p.add_argument("--workers", type=int, default=4, help="threads decoding and preprocessing items (0: none)")
    p.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    p.add_argument("--path-column", default="path", help="the manifest's path column (default: path)")
    p.add_argument("--prompt-column", default="prompt", help="the manifest's prompt column (default: prompt)")
    p.add_argument("--retry-errors", action="store_true", help="redo items whose row in OUT is an error")
    p.add_argument("--allow-outside-paths", action="store_true",
                   help="let a manifest name files outside its own folder (refused by default)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--merge", action="store_true", help="join OUT's part files into OUT (one row per path) and exit")
    p.add_argument("--distributed", action="store_true",
                   help="join the other processes (jax.distributed) and run the model on one mesh spanning them; "
                        "every process runs this same command, process 0 writes OUT")
    p.add_argument("--coordinator", help="with --distributed: process 0's host:port (default: from the cluster)")
    p.add_argument("--num-processes", type=int, help="with --distributed: how many processes (default: detected)")
    p.add_argument("--process-id", type=int, help="with --distributed: this process's id (default: detected)")
    p.add_argument("--process-index", type=int, default=None,
                   help="without --distributed: this process's shard of the input; with --process-count")
    p.add_argument("--process-count", type=int, default=None,
                   help="without --distributed: how many independent processes share the input")
    add_sampling_flags(p)
    return p


def _shard_of(args) -> tuple[int, int]:
    from omnijax.demo.caption_items import CaptionInputError

    if (args.process_index is None) != (args.process_count is None):
        raise CaptionInputError("give --process-index and --process-count together")
    if args.process_index is None:
        return 0, 1
    if args.distributed:
        raise CaptionInputError("--distributed runs one model over every process: it takes no --process-index")
    if args.process_count < 1 or not 0 <= args.process_index < args.process_count:
        raise CaptionInputError(f"--process-index {args.process_index} is not in [0, --process-count "
                                f"{args.process_count})")
    return args.process_index, args.process_count


def run_caption(args) -> int:
    """0 when the run finished (failed items are rows, not a failure of the run), 130 when interrupted."""
    from omnijax.app.sampling import SamplingParams, check_max_new_tokens
    from omnijax.demo.caption import CaptionOptions, merge_parts, run_captions
    from omnijax.demo.caption_items import CaptionInputError, discover

    if args.merge:
        if args.input:
            raise CaptionInputError("--merge joins part files and takes no --input")
        print(f"[omnijax] {merge_parts(args.out).line()}", file=sys.stderr)
        return 0
    if not args.input:
        raise CaptionInputError("caption needs --input (a folder, glob or manifest), or --merge")
    shard_index, shard_count = _shard_of(args)
    if args.distributed:
        from omnijax.common.distributed import init_distributed

        init_distributed(args.coordinator, args.num_processes, args.process_id)
    try:
        options = CaptionOptions(
            prompt=args.prompt, system=args.system, max_new_tokens=args.max_new_tokens,
            sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed),
            stop=tuple(args.stop) if args.stop else None, batch_size=args.batch_size, workers=args.workers,
            retry_errors=args.retry_errors, progress=not args.no_progress)
    except ValueError as e:
        raise CaptionInputError(str(e)) from e
    check_max_new_tokens(options.max_new_tokens)  # before the model loads (SamplingError: exit 2)
    items = discover(args.input, path_column=args.path_column, prompt_column=args.prompt_column,
                     allow_outside=args.allow_outside_paths)
    inputs = [args.input] if os.path.isfile(args.input) else []  # a manifest (or the one media file)
    summary = run_captions(lambda: load_pipeline(args, max_batch=args.batch_size), items, args.out, options,
                           shard_index=shard_index,
                           shard_count=shard_count, inputs=inputs, spmd=args.distributed)
    return 130 if summary.interrupted else 0


def main(argv=None) -> int:
    """``python -m demo.cli_caption ARGS`` is ``omnijax caption ARGS``."""
    logging.basicConfig(level=logging.WARNING, format="[omnijax] %(message)s")
    top = argparse.ArgumentParser(prog="omnijax")
    add_caption_parser(top.add_subparsers(dest="command", required=True))
    args = top.parse_args(["caption", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_caption(args)
    except OmnijaxError as e:
        print(f"omnijax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the run started (discovery, loading): nothing was written
        print("omnijax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
