"""``omnijax serve``: the OpenAI-compatible HTTP API (demo/server.py) on uvicorn, optionally with the web demo."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from omnijax.app.cli import add_engine_flags, add_model_flags
from omnijax.demo.chat_state import DEFAULT_MAX_UPLOAD_MB
from omnijax.demo.cli_web import DEFAULT_HOST, _megabytes, _port, check_listen, is_loopback

DEFAULT_PORT = 8000
API_KEY_ENV = "OMNIJAX_API_KEY"


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible HTTP API (and optionally the web demo)")
    add_model_flags(p)
    add_engine_flags(p)
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 opens it to "
                        f"the network)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every request (default: ${API_KEY_ENV} if set)")
    p.add_argument("--served-model-name", default=None, help="the model name clients use (default: the folder's)")
    p.add_argument("--allow-host", action="append", default=[],
                   help="another host name to answer to (a name this server is reached by, e.g. behind a proxy; "
                        "repeatable; addresses and localhost are always answered)")
    p.add_argument("--allow-remote-media", action="store_true",
                   help="fetch http(s) image / audio / video URLs in requests (default: data: URLs only)")
    p.add_argument("--max-body-mb", type=_megabytes, default=64,
                   help="largest request body in MB (default 64): larger ones get 413")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting for a slot beyond which new ones get 503 (default 256)")
    p.add_argument("--warm-up", action="store_true",
                   help="compile the prompt chunk and decode programs before listening")
    p.add_argument("--max-speech-frames", type=int, default=None,
                   help="a model with a talker: the most codec frames (12.5 a second) one spoken answer may take "
                        "(default 4096)")
    p.add_argument("--ui", action="store_true", help="also serve the web demo, at /ui, on the same engine")
    p.add_argument("--max-upload-mb", type=_megabytes, default=DEFAULT_MAX_UPLOAD_MB,
                   help=f"with --ui: largest image / audio upload in MB (default {DEFAULT_MAX_UPLOAD_MB:g})")
    return p


def run_serve(args) -> int:
    """Load the model, then serve until Ctrl-C or SIGTERM."""
    from omnijax.app.cli import load_pipeline
    from omnijax.common.errors import OmnijaxError

    if args.max_queue < 1:
        raise OmnijaxError(f"--max-queue must be >= 1, got {args.max_queue}")
    from omnijax.app.sampling import check_max_speech_frames

    check_max_speech_frames(args.max_speech_frames, "--max-speech-frames")
    if args.api_key is not None and not args.api_key.strip():
        raise OmnijaxError("--api-key is empty (an unset variable?): give the key, or leave the flag out to serve "
                           "without one")
    check_listen(args.host, args.port)
    if not is_loopback(args.host):
        print(f"[omnijax] serving on {args.host}: anyone who can reach this address can use the model"
              + ("" if (args.api_key or os.environ.get(API_KEY_ENV)) else " (no --api-key set)"), file=sys.stderr)
    import uvicorn

    from omnijax.demo.host_check import allowed_names
    from omnijax.demo.remote_media import fetcher
    from omnijax.demo.server import build_app, serving

    pipe = load_pipeline(args, max_queue=args.max_queue)
    if args.warm_up:
        pipe.scheduler.warm_up()
    ui = None
    with serving(pipe, model=args.served_model_name, allow_remote_media=args.allow_remote_media,
                 max_speech_frames=args.max_speech_frames,
                 fetch=fetcher(int(args.max_body_mb * 2**20)) if args.allow_remote_media else None) as server:
        if args.ui:
            from omnijax.demo.web import build_demo

            os.environ["GRADIO_TEMP_DIR"] = str(server.upload_root / "ui")  # removed with the server's uploads
            ui = build_demo(pipe, max_upload_mb=args.max_upload_mb, max_speech_frames=args.max_speech_frames)
            ui.queue(default_concurrency_limit=None, max_size=64)
        app = build_app(server, names=allowed_names(args.host, args.allow_host),
                        max_body_mb=args.max_body_mb, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                        ui=ui)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=5)
        where = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
        print(f"[omnijax] serving {server.model} ({pipe.family}) on {where}/v1"
              + (f" and the web demo on {where}/ui" if ui is not None else "") + " (Ctrl-C stops)",
              file=sys.stderr, flush=True)
        # uvicorn stops gracefully on SIGINT / SIGTERM, then raises the signal again under the handlers it found:
        # a SIGTERM handler of ours turns that into a clean exit, so the engine and the uploads folder go too
        previous = signal.signal(signal.SIGTERM, _terminate)
        code = 0
        try:
            uvicorn.Server(config).run()
        except KeyboardInterrupt:
            code = 130
        except _Terminated:
            code = 0
        finally:
            signal.signal(signal.SIGTERM, previous)
            pipe.close()
    print("[omnijax] server stopped", file=sys.stderr)
    return code


class _Terminated(Exception):
    pass


def _terminate(signum, frame):
    raise _Terminated
