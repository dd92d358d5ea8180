"""Remote media for ``omnijax serve --allow-remote-media``: http(s) URLs fetched with a size cap and a timeout."""

from __future__ import annotations

from typing import Callable

from omnijax.demo.openai_protocol import MediaRef, RequestError

TIMEOUT_S = 30.0
MAX_REDIRECTS = 3


def fetcher(max_bytes: int) -> Callable[[MediaRef], bytes]:
    """A function fetching a MediaRef's URL (http or https only, redirects included), refusing (RequestError) a
    body over ``max_bytes``, a failed request or a status other than 200."""
    import httpx

    def fetch(ref: MediaRef) -> bytes:
        try:
            with httpx.Client(timeout=TIMEOUT_S, follow_redirects=True, max_redirects=MAX_REDIRECTS) as client:
                with client.stream("GET", ref.url) as response:
                    if response.url.scheme not in ("http", "https"):
                        raise RequestError(f"{ref.path}: redirected to a {response.url.scheme}: URL", param=ref.path)
                    if response.status_code != 200:
                        raise RequestError(f"{ref.path}: fetching the URL gave HTTP {response.status_code}",
                                           param=ref.path)
                    data = bytearray()
                    for piece in response.iter_bytes():
                        data += piece
                        if len(data) > max_bytes:
                            raise RequestError(f"{ref.path}: the {ref.kind} at the URL is larger than "
                                               f"{max_bytes / 2**20:g} MB", param=ref.path, status=413)
                    return bytes(data)
        except httpx.HTTPError as e:
            raise RequestError(f"{ref.path}: the URL could not be fetched ({type(e).__name__})",
                               param=ref.path) from None

    return fetch
