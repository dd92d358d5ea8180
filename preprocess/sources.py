"""Media sources given as file paths: the one place that turns a path-like into a local file path."""

from __future__ import annotations

import os
import pathlib

from omnijax.common.errors import MediaError


def local_path(source: str | os.PathLike, what: str) -> pathlib.Path:
    """``source`` (str, bytes or os.PathLike) as a ``pathlib.Path``; URLs are refused (nothing is fetched).

    ``what`` names the media kind in the error ("image", "audio")."""
    text = os.fspath(source)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if text.startswith(("http://", "https://")):
        raise MediaError(f"{what} URLs are not fetched; download the file first: {text}")
    return pathlib.Path(text)
