"""What ``Pipeline.from_pretrained`` reads from a checkpoint, whatever its format: a Hugging Face folder
(config.json + safetensors) or a GGUF file (or a folder holding one).

``open_checkpoint(path)`` decides which it is and returns a ``Checkpoint``: the Hugging Face config (for a GGUF
file, rebuilt from its metadata by the architecture's ``GGUFArch``), the generation end ids, keyword arguments
for the family's processor (a GGUF file's tokenizer), and ``open_tensors`` giving the tensors under Hugging
Face names.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any, Callable

from omnijax.app.checkpoint import TensorIndex, check_folder_files, numpy_dtype, read_json
from omnijax.app.config_limits import check_config_limits, check_token_ids
from omnijax.common.errors import CheckpointError

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"


@dataclasses.dataclass
class Checkpoint:
    """One checkpoint, opened.

    path: what was given (a folder or a .gguf file). folder: the folder whose tokenizer / processor files the
    family's processor reads. hf_config: config.json, or its equivalent built from GGUF metadata. eos_ids: the
    generation config's end ids (None: the model config's). processor_kwargs: extra keyword arguments for the
    family's ``make_processor`` (a tokenizer built from a GGUF file). open_tensors: (FamilySpec, weight map,
    dtype name) -> a tensor source (``keys``, ``read``, ``close``) with the weight map's keys.
    format: "safetensors" or "gguf".
    """

    path: pathlib.Path
    folder: pathlib.Path
    hf_config: dict
    eos_ids: tuple[int, ...] | None
    processor_kwargs: dict[str, Any]
    open_tensors: Callable[..., Any]
    format: str

    @property
    def name(self) -> str:
        return self.path.name


def gguf_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """The model GGUF files of a folder (llama.cpp's vision projector files, ``mmproj*``, left out)."""
    return sorted(p for p in folder.iterdir()
                  if p.suffix.lower() == GGUF_SUFFIX and p.is_file() and not p.name.lower().startswith("mmproj"))


def open_checkpoint(path, *, tokenizer_cache=None) -> Checkpoint:
    """A Hugging Face checkpoint folder, a ``.gguf`` file, or a folder holding exactly one ``.gguf`` file (and no
    config.json). CheckpointError says what is missing."""
    target = pathlib.Path(path).expanduser()
    if not target.exists():
        raise CheckpointError(f"checkpoint folder {str(target)!r} does not exist")
    if target.is_file():
        if target.suffix.lower() != GGUF_SUFFIX:
            raise CheckpointError(f"checkpoint path {str(target)!r} is not a folder or a {GGUF_SUFFIX} file")
        return open_gguf(target, tokenizer_cache)
    if not target.is_dir():
        raise CheckpointError(f"checkpoint path {str(target)!r} is not a folder")
    if not (target / "config.json").exists():
        found = gguf_files(target)
        if len(found) == 1:
            return open_gguf(found[0], tokenizer_cache)
        if len(found) > 1:
            raise CheckpointError(f"checkpoint folder {str(target)!r} holds several GGUF files "
                                  f"({', '.join(p.name for p in found)}): pass the one to load")
        raise CheckpointError(f"config.json is missing from checkpoint folder {str(target)!r} "
                              f"(and it holds no {GGUF_SUFFIX} file)")
    return open_folder(target)


def open_folder(folder: pathlib.Path) -> Checkpoint:
    check_folder_files(folder)
    hf_config = read_json(folder, "config.json")
    generation = read_json(folder, "generation_config.json", required=False) or {}
    if not isinstance(generation, dict):
        raise CheckpointError(f"generation_config.json in {str(folder)!r} must hold a JSON object")
    eos = generation.get("eos_token_id")
    check_token_ids("eos_token_id", eos, "generation_config.json")
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None and e >= 0) or None

    def open_tensors(spec, weight_map, dtype):
        return TensorIndex(folder, spec.key_aliases)

    return Checkpoint(folder, folder, hf_config, eos_ids, {}, open_tensors, "safetensors")


def open_gguf(file: pathlib.Path, tokenizer_cache=None) -> Checkpoint:
    """A GGUF file: its architecture's ``GGUFArch`` turns the metadata into a Hugging Face config; the tokenizer
    is built from the metadata (once: it is kept under ``tokenizer_cache``, default
    ``$OMNIJAX_HOME/gguf-tokenizers``, keyed by the file's size, time and header). Unsupported architectures and
    tensor types fail here, before any tensor is read."""
    from omnijax.app.families import gguf_arch_for
    from omnijax.app.gguf.arch import GGUFMetadata
    from omnijax.app.gguf.dequant import check_types
    from omnijax.app.gguf.file import GGUFFile
    from omnijax.app.gguf.limits import check_gguf_metadata
    from omnijax.app.gguf.tensors import GGUFTensors
    from omnijax.preprocess.tokenizer import GGUF_TOKENIZER_STRING_ARRAYS, cached_gguf_tokenizer

    gguf = GGUFFile(file)
    try:
        arch = gguf_arch_for(gguf.architecture, file)
        check_types(file, {name: info.ggml_type for name, info in gguf.tensors.items()})
        meta = GGUFMetadata(gguf.metadata, {name: info.shape for name, info in gguf.tensors.items()}, file)
        check_gguf_metadata(meta)  # before any value is used
        try:
            hf_config = arch.hf_config(meta)
        except (ArithmeticError, AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{file}: its metadata does not describe a usable {arch.architecture} model: "
                                  f"{e!r}") from e
        try:
            check_config_limits(hf_config)  # before the tokenizer is built from the metadata
        except CheckpointError as e:
            raise CheckpointError(f"{file}: {e} (the config its metadata describes)") from None
    except BaseException:
        gguf.close()
        raise
    tokenizer = cached_gguf_tokenizer(
        file, hf_config["model_type"], gguf.data_start, tokenizer_cache,
        lambda: GGUFFile(file, string_arrays=GGUF_TOKENIZER_STRING_ARRAYS).metadata)

    def open_tensors(spec, weight_map, dtype):
        wanted = {key for tensor in weight_map.values() for key in tensor.keys}
        return GGUFTensors(gguf, arch, hf_config, wanted, numpy_dtype(dtype))

    return Checkpoint(file, file.parent, hf_config, None, {"tokenizer": tokenizer}, open_tensors, "gguf")
