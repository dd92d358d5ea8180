"""Media sources given as file paths: the one place that turns a path-like into a local file path."""

from __future__ import annotations

import os
import pathlib
import stat

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


def check_media_file(source: str | os.PathLike, what: str) -> pathlib.Path:
    """``source`` as a local path that names an existing regular file (not a folder, FIFO or device), checked
    without reading it: the check a command runs on its media arguments before it loads a model."""
    path = local_path(source, what)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise MediaError(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise MediaError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise MediaError(f"{what} path is not a regular file: {path}")
    if not os.access(path, os.R_OK):
        raise MediaError(f"{what} file is not readable: {path}")
    return path
