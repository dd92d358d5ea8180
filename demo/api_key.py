"""``omnijax serve --api-key``: every request but ``/health`` needs ``Authorization: Bearer <key>``, as plain ASGI
middleware (no ``BaseHTTPMiddleware``: handlers keep seeing client disconnects). A refusal is a 401 with OpenAI's
error JSON."""

from __future__ import annotations

import hmac
import json

OPEN_PATHS = ("/health",)


class ApiKeyCheck:
    """ASGI middleware around ``app`` requiring ``key`` (None: no key needed)."""

    def __init__(self, app, key: str | None):
        if key is not None and not key.strip():
            raise ValueError("an API key must not be empty (None: no key needed)")
        self.app = app
        self.key = key

    async def __call__(self, scope, receive, send):
        if self.key is None or scope.get("type") != "http" or scope.get("path") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        auth = next((v.decode("latin-1") for k, v in scope.get("headers") or () if k == b"authorization"), "")
        token = auth[7:] if auth[:7].lower() == "bearer " else ""
        if hmac.compare_digest(token.encode(), self.key.encode()):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": {"message": "a valid API key is required (Authorization: Bearer <key>)",
                                     "type": "authentication_error", "param": None,
                                     "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
