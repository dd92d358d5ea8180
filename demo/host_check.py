"""Only requests addressed to this server by one of its own names: the web demo's and the HTTP server's defence
against DNS rebinding (a web page on another site whose name is made to resolve to 127.0.0.1, so that a visitor's
browser drives the local model on the page's behalf).

``HostCheck(app, names)`` is plain ASGI middleware (gradio's app and a FastAPI app take it alike): an HTTP request
whose ``Host`` header is not allowed gets a 400 JSON error, a websocket is refused, and nothing reaches ``app``.
Allowed: an IP address (a page cannot rebind a literal address: its origin would be that address itself),
``localhost`` and its subdomains (they resolve to this machine only), and ``names`` (the ``--host`` name it listens
on, ``--allow-host`` names, and this machine's own names when it listens on every interface: ``allowed_names``).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import Iterable

ANY_INTERFACE = ("0.0.0.0", "::", "")


def host_name(header: str) -> str | None:
    """The name or address of a ``Host`` header value without its port, lower-cased (None: not a host)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        if end < 0 or (header[end + 1:] and not header[end + 1:].startswith(":")):
            return None
        return header[1:end]
    name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.rstrip(".") or None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def host_allowed(header: str | None, names: Iterable[str]) -> bool:
    """Whether a request with this ``Host`` header value may be served (module docstring)."""
    if not header:
        return False
    name = host_name(header)
    if name is None:
        return False
    if _is_address(name) or name == "localhost" or name.endswith(".localhost"):
        return True
    return name in {n.lower().rstrip(".") for n in names}


def allowed_names(listen_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names a server listening on ``listen_host`` answers to: that host when it is a name, ``extra``, and this
    machine's host name and fully qualified name when it listens on every interface."""
    names = {n for n in extra if n}
    if listen_host and not _is_address(listen_host):
        names.add(listen_host)
    if listen_host in ANY_INTERFACE:
        names.update({socket.gethostname(), socket.getfqdn()})
    return frozenset(n.lower().rstrip(".") for n in names if n)


class HostCheck:
    """ASGI middleware refusing requests whose ``Host`` header ``host_allowed`` does not allow."""

    def __init__(self, app, names: Iterable[str] = ()):
        self.app = app
        self.names = frozenset(names)

    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        header = next((value.decode("latin-1") for key, value in scope.get("headers") or () if key == b"host"), None)
        if host_allowed(header, self.names):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": f"Host {str(header)[:100]!r} is not a name this server answers to",
                                     "type": "invalid_request_error", "code": "host_not_allowed"}}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
