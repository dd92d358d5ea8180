"""``omnijax demo``: serve the multimodal web chat (gradio) for a checkpoint folder or the embedded default
model."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys

from omnijax.app.cli import add_engine_flags, add_model_flags
from omnijax.common.errors import OmnijaxError
from omnijax.demo.chat_state import DEFAULT_MAX_UPLOAD_MB

DEFAULT_HOST = "127.0.0.1"
MAX_UPLOAD_MB = 4096
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
    if not 0 < mb <= MAX_UPLOAD_MB:
        raise argparse.ArgumentTypeError(f"the upload limit must be a number of MB in (0, {MAX_UPLOAD_MB}], got {text}")
    return mb


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``demo`` command (model flags, --host, --port, --max-upload-mb) to ``subparsers``."""

    p = subparsers.add_parser("demo", help="serve a multimodal web chat in the browser (gradio)")
    add_model_flags(p)
    add_engine_flags(p)
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 opens it to "
                        f"the network)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another host name the demo answers to (repeatable; a name in front of it, e.g. a reverse "
                        "proxy's). Requests naming other hosts are refused (DNS rebinding)")
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


class ServeError(OmnijaxError):
    """The demo cannot listen where it was asked to (port taken, address not on this machine)."""


def listen_problem(host: str, port: int, error: BaseException) -> ServeError:
    """The one-line error for a failure to listen on host:port, naming the flag that fixes it."""
    code = getattr(error, "errno", None)
    if code == errno.EADDRINUSE or "empty port" in str(error):
        return ServeError(f"port {port} on {host} is already in use: choose another with --port")
    if code in (errno.EACCES, errno.EPERM):
        return ServeError(f"no permission to listen on port {port}: choose one above 1023 with --port")
    reason = getattr(error, "strerror", None) or str(error)
    return ServeError(f"cannot listen on {host}:{port} ({reason}): check --host")


def check_listen(host: str, port: int) -> None:
    """Raise ServeError when host:port cannot be listened on now (checked before the model is loaded)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise listen_problem(host, port, e) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server itself binds
        try:
            probe.bind(address)
        except OSError as e:
            raise listen_problem(host, port, e) from None


def run_demo(args) -> int:
    """Serve until interrupted (Ctrl-C)."""
    check_listen(args.host, args.port)
    if not is_loopback(args.host):
        print(f"[omnijax] serving on {args.host}: anyone who can reach this address can use the model",
              file=sys.stderr)
    from omnijax.demo.web import serve

    serve(args)
    return 0
