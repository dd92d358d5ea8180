"""What the web demo's tests share: message parts, the stats line's pattern and a free loopback port."""

from __future__ import annotations

import re
import socket

STATS_RE = re.compile(r"prompt (\d+) tokens · generated (\d+) tokens · first token [\d.]+ s · [\d.]+ tokens/s")
MAX_NEW = 10  # max new tokens for the checked answers (set through the page's control in the browser tests)


def _user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def _text(t: str) -> dict:
    return {"type": "text", "text": t}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
