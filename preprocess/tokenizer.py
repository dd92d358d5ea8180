"""Loading a checkpoint's tokenizer and chat template from local files only."""

from __future__ import annotations

import json
import pathlib

from common.errors import CheckpointError


def load_tokenizer(folder: pathlib.Path):
    """transformers' AutoTokenizer from ``folder`` (no hub access), with the folder's chat template attached."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"the tokenizer in {str(folder)!r} could not be loaded: {e}") from e
    if not getattr(tokenizer, "chat_template", None):
        template = chat_template_of(folder)
        if template is not None:
            tokenizer.chat_template = template
    return tokenizer


def chat_template_of(folder: pathlib.Path) -> str | None:
    """The chat template shipped in the folder (chat_template.jinja, chat_template.json or processor config)."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        file = folder / name
        if file.exists():
            try:
                template = json.loads(file.read_text()).get("chat_template")
            except ValueError as e:
                raise CheckpointError(f"{file} is not readable JSON: {e}") from e
            if template:
                return template
    return None


def load_gguf_tokenizer(file: pathlib.Path, model_type: str):
    """The tokenizer a GGUF file describes in its metadata (vocabulary, merges or scores, special ids, BOS/EOS
    flags, chat template), built by transformers as ``from_pretrained(folder, gguf_file=name)`` builds it.

    model_type: the Hugging Face model type of the file's model; it picks the tokenizer class the way
    AutoTokenizer does (without AutoTokenizer's pass over the whole file to rebuild the model config).
    """
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    file = pathlib.Path(file)
    name = TOKENIZER_MAPPING_NAMES.get(model_type) or "TokenizersBackend"
    cls = tokenizer_class_from_name(name if isinstance(name, str) else name[-1])
    if cls is None:
        raise CheckpointError(f"transformers has no tokenizer class {name!r} for model type {model_type!r}")
    try:
        return cls.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"the tokenizer in GGUF file {str(file)!r} could not be built: {e}") from e
