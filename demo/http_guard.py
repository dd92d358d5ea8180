"""What an HTTP request must pass before any handler runs (``omnijax serve``), as plain ASGI middleware (no
``BaseHTTPMiddleware``: handlers keep seeing client disconnects).

- **Host**: only the names the server listens on (a page served elsewhere cannot drive it through DNS
  rebinding); ``allowed_hosts`` lists them.
- **Body size**: a request body over the cap is refused with 413 while it arrives (the declared
  ``Content-Length`` first, then the bytes actually read), never read whole.
- **API key**: with a key set, every path but ``/health`` needs ``Authorization: Bearer <key>`` (401).

Refusals are OpenAI-style JSON errors.
"""

from __future__ import annotations

import hmac
import ipaddress
import json

from omnijax.demo.openai_protocol import RequestError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
OPEN_PATHS = ("/health",)


def allowed_hosts(host: str, port: int, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """Host header values (lower case, with and without the port) a server on host:port answers: the address
    itself, and for a loopback or wildcard address the loopback names; plus ``extra`` names."""
    names = {host.lower(), *(h.lower() for h in extra)}
    wildcard = host in ("0.0.0.0", "::")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback or wildcard:
        names.update(LOOPBACK_NAMES)
    out = set()
    for name in names:
        shown = f"[{name}]" if ":" in name and not name.startswith("[") else name
        out.update({shown, f"{shown}:{port}"})
    return frozenset(out)


async def send_error(send, status: int, message: str, type_: str, code: str | None = None) -> None:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(RequestError):
    """Raised while a handler reads a body past the cap: handlers answer it as any refused request (413)."""

    def __init__(self, max_body: int):
        super().__init__(f"the request body is larger than {max_body / 2**20:g} MB (--max-body-mb)", status=413,
                         code="body_too_large")


class HttpGuard:
    """ASGI middleware around ``app``: hosts (None: any), max_body bytes, api_key (None: none)."""

    def __init__(self, app, *, hosts: frozenset[str] | None, max_body: int, api_key: str | None = None):
        self.app = app
        self.hosts = hosts
        self.max_body = max_body
        self.api_key = api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "").strip().lower()
        if self.hosts is not None and host not in self.hosts:
            return await send_error(send, 400, f"host {host[:100]!r} is not served here", "invalid_request_error",
                                    "invalid_host")
        if self.api_key is not None and scope.get("path") not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            token = auth[7:] if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                return await send_error(send, 401, "a valid API key is required (Authorization: Bearer <key>)",
                                        "authentication_error", "invalid_api_key")
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                return await send_error(send, 400, "Content-Length is not a number", "invalid_request_error")
            if int(declared) > self.max_body:
                return await send_error(send, 413, self._too_large(), "invalid_request_error", "body_too_large")
        received = 0
        started = False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await send_error(send, 413, self._too_large(), "invalid_request_error", "body_too_large")

    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_body / 2**20:g} MB (--max-body-mb)"
