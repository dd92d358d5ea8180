"""Loading a checkpoint's tokenizer and chat template from local files only.

Bounded before anything is parsed: every tokenizer file (``tokenizer.json``, ``tokenizer.model``, vocabularies,
merges, configs) is a regular file of at most ``MAX_TOKENIZER_FILE_BYTES``, a chat template at most
``chat_template.MAX_TEMPLATE_CHARS`` characters; the vocabulary (added tokens included) at most ``MAX_VOCAB``
tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import stat

from omnijax.common.errors import CheckpointError, PromptError
from omnijax.preprocess.chat_template import MAX_TEMPLATE_CHARS, check_template_source

MAX_VOCAB = 1 << 19  # tokens of a vocabulary, added tokens included (real: up to 262208)
MAX_TOKENIZER_FILE_BYTES = 64 * 2**20  # a tokenizer.json holds up to ~35 MB (Gemma 3's: 33 MB)
# The files AutoTokenizer and the processors may read from a checkpoint folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model",
                   "chat_template.jinja", "chat_template.json", "processor_config.json", "preprocessor_config.json")


def check_tokenizer_files(folder: pathlib.Path) -> None:
    """CheckpointError naming the first of ``TOKENIZER_FILES`` in ``folder`` that is not a regular file or is over
    MAX_TOKENIZER_FILE_BYTES: checked from the file system, before any is read."""
    for name in TOKENIZER_FILES:
        try:
            info = os.stat(pathlib.Path(folder) / name)
        except OSError:
            continue  # not there: the loader decides whether it is needed
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{name} in {str(folder)!r} is not a regular file")
        if info.st_size > MAX_TOKENIZER_FILE_BYTES:
            raise CheckpointError(f"{name} in {str(folder)!r} is {info.st_size / 2**20:.0f} MB; tokenizer files of "
                                  f"at most {MAX_TOKENIZER_FILE_BYTES // 2**20} MB are read")


def check_tokenizer(tokenizer, where: str) -> None:
    """CheckpointError when the tokenizer's vocabulary is over MAX_VOCAB or its chat template over
    MAX_TEMPLATE_CHARS (``where``: the folder or file it came from)."""
    size = tokenizer_size(tokenizer)
    if size > MAX_VOCAB:
        raise CheckpointError(f"the tokenizer in {where} has {size} tokens; at most {MAX_VOCAB} are accepted")
    templates = getattr(tokenizer, "chat_template", None)
    for template in (templates.values() if isinstance(templates, dict) else [templates] if templates else []):
        try:
            check_template_source(template, where)
        except PromptError as e:
            raise CheckpointError(str(e)) from None


def tokenizer_size(tokenizer) -> int:
    """Ids the tokenizer can produce: ``len(tokenizer)`` (added tokens included), or more when an added token's id
    is past it."""
    size = len(tokenizer)
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return max(size, max(added) + 1) if added else size


def load_tokenizer(folder: pathlib.Path):
    """transformers' AutoTokenizer from ``folder`` (no hub access), with the folder's chat template attached."""
    check_tokenizer_files(folder)
    AutoTokenizer = _auto_tokenizer()

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except RecursionError:
        raise CheckpointError(f"the tokenizer in {str(folder)!r} could not be loaded: a file nests too deeply") \
            from None
    except Exception as e:
        raise CheckpointError(f"the tokenizer in {str(folder)!r} could not be loaded: {e}") from e
    if not getattr(tokenizer, "chat_template", None):
        template = chat_template_of(folder)
        if template is not None:
            tokenizer.chat_template = template
    check_tokenizer(tokenizer, repr(str(folder)))
    return tokenizer


@contextlib.contextmanager
def _no_advisory_notices():
    """Import transformers' tokenizer classes without its advisory notices (without PyTorch, importing transformers
    announces that models are unavailable: omnijax uses only its tokenizers, so the notice does not apply)."""
    saved = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"]
        else:
            os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = saved


def _auto_tokenizer():
    """transformers' AutoTokenizer (imported without its advisory notices)."""
    with _no_advisory_notices():
        from transformers import AutoTokenizer
    return AutoTokenizer


def chat_template_of(folder: pathlib.Path) -> str | None:
    """The chat template shipped in the folder (chat_template.jinja, chat_template.json or processor config)."""
    check_tokenizer_files(folder)
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        with open(jinja, encoding="utf-8", errors="replace") as f:
            text = f.read(MAX_TEMPLATE_CHARS + 1)
        if len(text) > MAX_TEMPLATE_CHARS:
            raise CheckpointError(f"{jinja} is over {MAX_TEMPLATE_CHARS} characters; a chat template is at most that")
        return text
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        file = folder / name
        if file.exists():
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except RecursionError:
                raise CheckpointError(f"{file} nests too deeply to be read as JSON") from None
            except ValueError as e:
                raise CheckpointError(f"{file} is not readable JSON: {e}") from e
            template = data.get("chat_template") if isinstance(data, dict) else None
            if template:
                return template
    return None


def special_tokens(tokenizer) -> dict[str, int]:
    """The tokenizer's special tokens, text -> id: every added token flagged special (what ``decode`` with
    ``skip_special_tokens`` drops, and what a chat template's control markers are) plus the named special tokens
    (bos, eos, pad, ...). Cached on the tokenizer."""
    cached = getattr(tokenizer, "_omnijax_special_tokens", None)
    if cached is not None:
        return cached
    found: dict[str, int] = {}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.special and token.content:
                found[token.content] = int(token_id)
    for text, token_id in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids):
        if text and token_id is not None:
            found.setdefault(str(text), int(token_id))
    try:
        tokenizer._omnijax_special_tokens = found
    except AttributeError:
        pass
    return found


def added_tokens(tokenizer) -> dict[str, int]:
    """Every text the tokenizer turns into one token wherever it appears, text -> id: its special tokens and the
    added tokens not flagged special (Qwen3-Omni's ``<tool_call>``, ``<tool_response>``, ``<think>``: markers
    user text must not spell). Cached on the tokenizer."""
    cached = getattr(tokenizer, "_omnijax_added_tokens", None)
    if cached is not None:
        return cached
    found = dict(special_tokens(tokenizer))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.content:
                found.setdefault(token.content, int(token_id))
    try:
        tokenizer._omnijax_added_tokens = found
    except AttributeError:
        pass
    return found


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def byte_fallback_ids(tokenizer) -> frozenset[int]:
    """Ids of the byte tokens ``<0x00>`` .. ``<0xFF>`` of a tokenizer whose decoder has a ByteFallback step (empty
    otherwise). ByteFallback decodes a run of such tokens all at once: while a run may still grow, the text it
    ends up as is not known (see app/detokenize.py)."""
    cached = getattr(tokenizer, "_omnijax_byte_fallback_ids", None)
    if cached is not None:
        return cached
    backend = getattr(tokenizer, "backend_tokenizer", None)
    found = frozenset()
    if backend is not None and "ByteFallback" in repr(backend.decoder):
        found = frozenset(int(i) for token, i in tokenizer.get_vocab().items() if _BYTE_TOKEN.fullmatch(token))
    try:
        tokenizer._omnijax_byte_fallback_ids = found
    except AttributeError:
        pass
    return found


GGUF_TOKENIZER_CACHE_VERSION = "1"
# tokenizer_config.json settings of a cached GGUF tokenizer passed back to the tokenizer when it is read
_CACHED_TOKENIZER_SETTINGS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "model_max_length",
                              "chat_template", "clean_up_tokenization_spaces", "padding_side")


def gguf_tokenizer_key(file: pathlib.Path, header_bytes: int) -> str:
    """A key for the tokenizer of a GGUF file: its size, modification time and a hash of its header (the metadata,
    vocabulary included: ``header_bytes`` from the start), with the cache format and transformers' version."""
    import hashlib

    with _no_advisory_notices():
        import transformers

    stat = file.stat()
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        remaining = header_bytes
        while remaining > 0:
            block = f.read(min(remaining, 1 << 20))
            if not block:
                break
            digest.update(block)
            remaining -= len(block)
    digest.update(f"{stat.st_size}:{stat.st_mtime_ns}:{GGUF_TOKENIZER_CACHE_VERSION}:{transformers.__version__}"
                  .encode())
    return digest.hexdigest()[:32]


def cached_gguf_tokenizer(file: pathlib.Path, model_type: str, header_bytes: int, cache_root: pathlib.Path | None,
                          read_metadata):
    """``load_gguf_tokenizer`` on ``read_metadata()`` (the file's metadata with its vocabulary; read only when the
    tokenizer is built), kept after the first time as a tokenizer folder (tokenizer.json in the tokenizers
    library's own format, with its config and chat template) under ``cache_root/<key>`` (default
    ``$OMNIJAX_HOME/gguf-tokenizers``): building it from the metadata takes seconds, loading the folder a fraction
    of one. A cache that cannot be read or written is skipped."""
    import shutil
    import tempfile

    from omnijax.common.paths import omnijax_home

    file = pathlib.Path(file)
    root = pathlib.Path(cache_root) if cache_root is not None else omnijax_home() / "gguf-tokenizers"
    folder = root / gguf_tokenizer_key(file, header_bytes)
    if (folder / "tokenizer.json").is_file():
        try:
            return load_cached_tokenizer(folder)
        except CheckpointError:
            pass  # a damaged entry is built again below
    tokenizer = load_gguf_tokenizer(read_metadata(), model_type, f"GGUF file {str(file)!r}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        try:
            tokenizer.save_pretrained(str(tmp))
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass
    return tokenizer


def load_cached_tokenizer(folder: pathlib.Path):
    """A tokenizer folder written by ``cached_gguf_tokenizer``, read straight into transformers' tokenizers-library
    tokenizer (``TokenizersBackend`` on the folder's tokenizer.json, with its config's special tokens and chat
    template). ``load_tokenizer`` (AutoTokenizer) would rebuild the model-specific class from the vocabulary and
    merges parsed in Python (a 262k-token vocabulary: ~5 s against ~1.2 s); the class adds nothing the file does not
    hold (every one a GGUF file maps to builds its pipeline from the same vocabulary and merges), and the tokens it
    gives are the same (tests/test_gguf.py)."""
    check_tokenizer_files(folder)
    try:
        with open(folder / "tokenizer_config.json", "rb") as f:
            config = json.loads(f.read(MAX_TOKENIZER_FILE_BYTES + 1))
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"the cached tokenizer in {str(folder)!r} has no readable config: {e}") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"the cached tokenizer in {str(folder)!r} has a config that is not a JSON object")
    with _no_advisory_notices():
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    settings = {k: config[k] for k in _CACHED_TOKENIZER_SETTINGS if k in config}
    try:
        tokenizer = TokenizersBackend(tokenizer_file=str(folder / "tokenizer.json"), name_or_path=str(folder),
                                      **settings)
    except Exception as e:
        raise CheckpointError(f"the cached tokenizer in {str(folder)!r} could not be loaded: {e}") from e
    if not getattr(tokenizer, "chat_template", None):
        template = chat_template_of(folder)
        if template is not None:
            tokenizer.chat_template = template
    check_tokenizer(tokenizer, repr(str(folder)))
    return tokenizer


# The GGUF metadata keys (llama.cpp's names) of the ids of the special tokens transformers' GGUF reading sets
GGUF_SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                          "pad_token": "padding_token_id"}
# The string arrays the tokenizer is built from (a GGUF reader keeps them whole; other long arrays it may skip)
GGUF_TOKENIZER_STRING_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def load_gguf_tokenizer(metadata: dict, model_type: str, where: str):
    """The tokenizer a GGUF file's metadata describes (vocabulary, merges or scores, special ids, BOS/EOS flags,
    chat template), built as transformers' ``from_pretrained(folder, gguf_file=name)`` builds it: the same keys
    (its GGUF tokenizer mapping), the same converter into a tokenizers-library tokenizer, the same class. The
    metadata comes from the caller's reader (``GGUF_TOKENIZER_STRING_ARRAYS`` read whole): transformers' own GGUF
    reader imports torch, which a user's install does not have.

    model_type: the Hugging Face model type of the file's model; it picks the tokenizer class the way
    AutoTokenizer does (without AutoTokenizer's pass over the whole file to rebuild the model config).
    """
    import numpy as np

    with _no_advisory_notices():
        from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    name = TOKENIZER_MAPPING_NAMES.get(model_type) or "TokenizersBackend"
    cls = tokenizer_class_from_name(name if isinstance(name, str) else name[-1])
    if cls is None:
        raise CheckpointError(f"transformers has no tokenizer class {name!r} for model type {model_type!r}")
    plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in metadata.items()}
    grouped = {group: {field: plain[f"tokenizer.{key}"] for key, field in renames.items()
                       if f"tokenizer.{key}" in plain} for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    vocabulary, settings = grouped["tokenizer"], grouped["tokenizer_config"]
    try:
        kind = vocabulary.get("tokenizer_type")
        if kind == "llama":  # as transformers reads it: llama.cpp adds BOS to such a vocabulary unless told not to
            settings.setdefault("add_bos_token", True)
        elif kind == "gemma4":  # the chat template writes <bos> itself
            settings["add_bos_token"] = False
        tokens = vocabulary["tokens"]
        for token, key in GGUF_SPECIAL_TOKEN_IDS.items():
            token_id = plain.get(f"tokenizer.ggml.{key}")
            settings[token] = tokens[token_id] if token_id is not None else None
        backend, extra = convert_gguf_tokenizer(plain["general.architecture"], vocabulary)
        tokenizer = cls(tokenizer_object=backend, **settings, **extra)
    except Exception as e:
        raise CheckpointError(f"the tokenizer in {where} could not be built: {e}") from e
    check_tokenizer(tokenizer, where)
    return tokenizer
