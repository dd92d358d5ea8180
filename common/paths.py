"""Where omnijax keeps its files: ``$OMNIJAX_HOME`` (default ``~/.cache/omnijax``)."""

from __future__ import annotations

import os
import pathlib


def omnijax_home() -> pathlib.Path:
    home = os.environ.get("OMNIJAX_HOME")
    return pathlib.Path(home).expanduser() if home else pathlib.Path.home() / ".cache" / "omnijax"
