"""The embedded default model: a small Gemma 3-architecture checkpoint, trained here, shipped inside the package.

``app/checkpoints/shapes-gemma3`` is an ordinary Hugging Face checkpoint folder (config.json,
generation_config.json, model.safetensors, tokenizer, Gemma 3 chat template, processor settings) that
training/train_default_model.py trained from scratch on pictures of simple shapes (training/scenes.py): it
describes such pictures, counts their shapes and names their colours (training/dialogues.py lists its answers).
Nothing is built at first use.

The tiny random Gemma 3 checkpoints of the test suite and the benchmarks are built by tests/fixtures/tiny_gemma3.py.
"""

from __future__ import annotations

import pathlib

from omnijax.common.errors import CheckpointError

DEFAULT_MODEL_NAME = "shapes-gemma3"
_FOLDER = pathlib.Path(__file__).resolve().parent / "checkpoints" / DEFAULT_MODEL_NAME
_REQUIRED = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
             "chat_template.jinja", "processor_config.json")


def default_model_dir() -> pathlib.Path:
    """The folder of the embedded default model (shipped with the package; nothing is built or downloaded).

    Raises CheckpointError naming the missing files when the installation lacks them."""
    missing = [name for name in _REQUIRED if not (_FOLDER / name).is_file()]
    if missing:
        raise CheckpointError(f"the embedded default model at {str(_FOLDER)!r} is incomplete (missing "
                              f"{', '.join(missing)}); reinstall omnijax or pass --model")
    return _FOLDER
