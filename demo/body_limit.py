"""A cap on the size of an HTTP request body, before it is read into memory: ``BodyLimit(app, max_bytes)``, plain
ASGI middleware for gradio's app and a FastAPI app alike.

A request declaring a larger ``Content-Length`` gets a 413 JSON error at once; a body sent without one (chunked) is
counted as it arrives and cut off with a 413 once over. Paths under ``exempt`` (an upload route that streams to
disk under its own cap) are passed through.
"""

from __future__ import annotations

import json
from typing import Iterable

from omnijax.demo.openai_protocol import RequestError


class BodyTooLarge(RequestError):
    """Raised while a handler reads a body past the cap: a handler that answers refused requests itself (the HTTP
    server) answers it with its 413; otherwise the middleware does, if no response has started."""

    def __init__(self, max_bytes: int):
        super().__init__(_message(max_bytes), status=413, code="body_too_large")


def _message(max_bytes: int) -> str:
    return f"the request body is over {max_bytes} bytes"


def _error(max_bytes: int) -> bytes:
    return json.dumps({"error": {"message": _message(max_bytes), "type": "invalid_request_error",
                                 "code": "body_too_large"}}).encode()


class BodyLimit:
    def __init__(self, app, max_bytes: int, exempt: Iterable[str] = ()):
        self.app = app
        self.max_bytes = int(max_bytes)
        self.exempt = tuple(exempt)

    async def _refuse(self, send) -> None:
        body = _error(self.max_bytes)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("path", "").startswith(self.exempt):
            return await self.app(scope, receive, send)
        length = next((value for key, value in scope.get("headers") or () if key == b"content-length"), None)
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = self.max_bytes + 1
            if declared > self.max_bytes:
                return await self._refuse(send)
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked_send(message):
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)
