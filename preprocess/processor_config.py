"""Finding and reading a checkpoint's processor settings (image processor, feature extractor) as transformers does."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from omnijax.common.errors import CheckpointError

PROCESSOR_CONFIG_NAME = "processor_config.json"
PREPROCESSOR_CONFIG_NAME = "preprocessor_config.json"


def read_json(file: pathlib.Path) -> Any:
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except RecursionError:
        raise CheckpointError(f"cannot read {file}: it nests too deeply") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from exc


def processor_section(path: str | os.PathLike, sections: tuple[str, ...], what: str) -> tuple[dict, str]:
    """(settings dict, where they came from) for one sub-processor of the checkpoint folder ``path``.

    The first of ``sections`` present in ``processor_config.json`` wins (transformers 5 nests sub-processors
    there); otherwise ``preprocessor_config.json`` (what hub checkpoints ship). Raises CheckpointError naming the
    folder or file when neither is there or a file is not valid JSON.
    """
    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder not found: {folder}")
    processor_file = folder / PROCESSOR_CONFIG_NAME
    if processor_file.is_file():
        processor_dict = read_json(processor_file)
        if isinstance(processor_dict, dict):
            for key in sections:
                if processor_dict.get(key) is not None:
                    return processor_dict[key], f"{processor_file} [{key!r}]"
    preprocessor_file = folder / PREPROCESSOR_CONFIG_NAME
    if not preprocessor_file.is_file():
        raise CheckpointError(f"no {what} config in {folder}: expected {PREPROCESSOR_CONFIG_NAME} or a "
                              f"{sections[0]!r} section in {PROCESSOR_CONFIG_NAME}")
    return read_json(preprocessor_file), str(preprocessor_file)
