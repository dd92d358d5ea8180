"""``omnijax demo``: serve the multimodal web chat (gradio) for a checkpoint folder or the embedded default
model."""

from __future__ import annotations

import argparse
import ipaddress
import sys

from app.cli import add_model_flags
from demo.chat_state import DEFAULT_MAX_UPLOAD_MB

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {port}")
    return port


def _megabytes(text: str) -> float:
    try:
        mb = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of MB: {text!r}") from None
    if not mb > 0 or mb == float("inf"):
        raise argparse.ArgumentTypeError(f"the upload limit must be a positive number of MB, got {text}")
    return mb


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``demo`` command (model flags, --host, --port, --max-upload-mb) to ``subparsers``."""

    p = subparsers.add_parser("demo", help="serve a multimodal web chat in the browser (gradio)")
    add_model_flags(p)
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 opens it to "
                        f"the network)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--max-upload-mb", type=_megabytes, default=DEFAULT_MAX_UPLOAD_MB,
                   help=f"largest accepted image / audio upload in MB (default {DEFAULT_MAX_UPLOAD_MB:g})")
    return p


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_demo(args) -> int:
    """Serve until interrupted (Ctrl-C)."""
    if not is_loopback(args.host):
        print(f"[omnijax] serving on {args.host}: anyone who can reach this address can use the model",
              file=sys.stderr)
    from demo.web import serve

    serve(args)
    return 0
