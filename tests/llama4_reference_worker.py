"""Runs transformers' Llama 4 processors (which need torchvision) in a process of their own and saves the outputs.

Usage: ``python llama4_reference_worker.py TORCHVISION_DIR REQUESTS_JSON OUT_NPZ``. tests/llama4_reference.py starts
it; nothing else imports this file. torchvision comes from ``TORCHVISION_DIR`` (a ``pip install --no-deps
--target`` folder): its compiled operators cannot load next to the CPU build of torch, so the schema of
``torchvision::nms`` (and ``qnms``), which torchvision registers fake kernels for at import, is defined here first.
torchvision is never visible to the test session itself, whose other processors must keep their PIL backends.

Requests (a JSON object ``{"requests": [...]}``), each with a ``name`` and a ``kind``:

* ``image_processor``: ``images`` (PNG paths) through ``Llama4ImageProcessor(**settings)`` in one call ->
  ``NAME/pixel_values/I`` (float32 [n_tiles, 3, T, T], the bfloat16 values) and ``NAME/aspect_ratios`` [n, 2].
* ``chat``: the folder's ``Llama4Processor`` (``llama4_checkpoint.load_processor``); ``messages`` (image parts
  ``{"type": "image"}``) rendered with its chat template (generation prompt added), then ``processor(text=...,
  images=..., add_special_tokens=False)`` -> ``NAME/text``, ``NAME/input_ids``, ``NAME/pixel_values`` (all tiles)
  and ``NAME/aspect_ratios``.
* ``environment`` -> ``NAME/cpu_capability`` and ``NAME/torchvision``.
"""

from __future__ import annotations

import json
import sys


def _register_torchvision_schemas(torch) -> None:
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _register_torchvision_schemas.lib = lib  # keep the library (and its definitions) alive


def _open(path):
    import PIL.Image

    with PIL.Image.open(path) as image:
        return image.convert("RGB")


def main(torchvision_dir: str, requests_file: str, out_file: str) -> None:
    sys.path.insert(0, torchvision_dir)
    import numpy as np
    import torch

    _register_torchvision_schemas(torch)
    import torchvision  # noqa: F401
    from transformers.models.llama4.image_processing_llama4 import Llama4ImageProcessor

    from llama4_checkpoint import load_processor  # (this script's folder, tests/, is first on the path)

    with open(requests_file, encoding="utf-8") as f:
        spec = json.load(f)
    out: dict[str, np.ndarray] = {}
    processors: dict[str, object] = {}
    for request in spec["requests"]:
        name, kind = request["name"], request["kind"]
        if kind == "environment":
            out[f"{name}/cpu_capability"] = np.array(torch.backends.cpu.get_cpu_capability())
            out[f"{name}/torchvision"] = np.array(torchvision.__version__)
        elif kind == "image_processor":
            processor = Llama4ImageProcessor(**request.get("settings", {}))
            result = processor([_open(p) for p in request["images"]])
            for i, tiles in enumerate(result["pixel_values"]):
                out[f"{name}/pixel_values/{i}"] = tiles.float().numpy()
            out[f"{name}/aspect_ratios"] = np.asarray([[int(v) for v in r] for r in result["aspect_ratios"]])
        elif kind == "chat":
            folder = request["folder"]
            if folder not in processors:
                processors[folder] = load_processor(folder)
            processor = processors[folder]
            text = processor.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=False)
            images = [_open(p) for p in request.get("images", [])] or None
            result = processor(text=text, images=images, add_special_tokens=False, return_tensors="pt")
            out[f"{name}/text"] = np.array(text)
            out[f"{name}/input_ids"] = result["input_ids"][0].numpy()
            if images:
                out[f"{name}/pixel_values"] = result["pixel_values"].float().numpy()
                image_result = processor.image_processor(images)
                out[f"{name}/aspect_ratios"] = np.asarray(
                    [[int(v) for v in r] for r in image_result["aspect_ratios"]])
        else:
            raise ValueError(f"unknown request kind {kind!r}")
    np.savez(out_file, **out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
