"""transformers' Llama 4 processors as a test reference, run in a subprocess with a torchvision of its own.

transformers has Llama 4's image processor only on its torchvision backend, and the CPU build of torch here has no
matching torchvision wheel (the wheel's compiled operators need CUDA libraries). :func:`torchvision_dir` installs the
torchvision wheel made for the installed torch (torch 2.x pairs with torchvision 0.(x+15)) with ``pip install
--no-deps --target`` into ``$OMNIJAX_HOME/torchvision/torch-<version>`` (``OMNIJAX_HOME`` defaults to
``~/.cache/omnijax``) once; :func:`run_reference` then runs tests/llama4_reference_worker.py, which puts that folder
first on its path, defines the ``torchvision::nms`` operator schema torchvision expects from its compiled library,
and imports torchvision. The transforms the image processor uses are plain torch code and run as they do with a
regular install.

The test session itself never sees that torchvision: transformers picks image-processor backends at import time,
and Gemma 3 / Qwen tests need their PIL backends.

Images are passed as PNG files written by :func:`write_images` from :func:`sample_image` (deterministic content: a
colour gradient, stripes and noise, so that a wrong resampling or tile order shows).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np

WORKER = pathlib.Path(__file__).with_name("llama4_reference_worker.py")
PIP_TIMEOUT_S = 900
WORKER_TIMEOUT_S = 600


def omnijax_home() -> pathlib.Path:
    home = os.environ.get("OMNIJAX_HOME")
    return pathlib.Path(home).expanduser() if home else pathlib.Path.home() / ".cache" / "omnijax"


def torchvision_requirement(torch_version: str) -> str:
    """The pip requirement for the torchvision release series built against ``torch_version`` ("2.13.0+cpu" ->
    "torchvision>=0.28,<0.29")."""
    major, minor = (int(v) for v in torch_version.split("+")[0].split(".")[:2])
    if major != 2:
        raise RuntimeError(f"no known torchvision pairing for torch {torch_version}")
    return f"torchvision>=0.{minor + 15},<0.{minor + 16}"


def torchvision_dir() -> pathlib.Path:
    """A folder holding the torchvision package that pairs with the installed torch, installed on first use.

    The install goes to a temporary sibling and is renamed into place, so an interrupted install is never used.
    Raises ``RuntimeError`` with pip's output when the install fails (e.g. no package registry reachable).
    """
    torch_version = importlib.metadata.version("torch")
    root = omnijax_home() / "torchvision"
    target = root / f"torch-{torch_version}"
    if (target / "torchvision" / "__init__.py").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".install-", dir=root))
    try:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check",
               "--target", str(staging), torchvision_requirement(torch_version)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if done.returncode != 0 or not (staging / "torchvision" / "__init__.py").is_file():
            raise RuntimeError(f"installing torchvision for the Llama 4 reference failed ({' '.join(cmd)}):\n"
                               f"{done.stdout}\n{done.stderr}")
        try:
            os.replace(staging, target)
        except OSError:  # another process installed it first
            if not (target / "torchvision" / "__init__.py").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def run_reference(requests: list[dict], work_dir) -> dict[str, np.ndarray]:
    """Run the worker on ``requests`` (see tests/llama4_reference_worker.py) and return its outputs by key."""
    work_dir = pathlib.Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    requests_file, out_file = work_dir / "requests.json", work_dir / "reference.npz"
    requests_file.write_text(json.dumps({"requests": requests}), encoding="utf-8")
    tv = torchvision_dir()
    done = subprocess.run([sys.executable, str(WORKER), str(tv), str(requests_file), str(out_file)],
                          capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the Llama 4 reference worker failed:\n{done.stdout}\n{done.stderr}")
    with np.load(out_file) as data:
        return {key: data[key] for key in data.files}


def sample_image(height: int, width: int, seed: int) -> np.ndarray:
    """uint8 [height, width, 3]: a colour gradient, diagonal stripes and seeded noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    red = 255 * xx / max(width - 1, 1)
    green = 255 * yy / max(height - 1, 1)
    blue = 127.5 + 127.5 * np.sin((xx + 2 * yy) / 3.0 + seed)
    image = np.stack([red, green, blue], axis=-1) + rng.normal(0, 20, (height, width, 3))
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def write_images(folder, specs: dict[str, tuple[int, int, int]]) -> dict[str, pathlib.Path]:
    """PNG files ``NAME.png`` of :func:`sample_image` (height, width, seed) for each entry of ``specs``."""
    import PIL.Image

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (height, width, seed) in specs.items():
        paths[name] = folder / f"{name}.png"
        PIL.Image.fromarray(sample_image(height, width, seed)).save(paths[name])
    return paths


def tiles_of(outputs: dict[str, np.ndarray], name: str) -> list[np.ndarray]:
    """The per-image tile arrays of an ``image_processor`` request's outputs, in order."""
    prefix = f"{name}/pixel_values/"
    found = sorted((int(k[len(prefix):]), v) for k, v in outputs.items() if k.startswith(prefix))
    return [v for _, v in found]


# ----------------------------------------------------------------------------------------------------------------
# The cases the session fixture ``llama4_reference`` runs (tests/conftest.py): one worker run serves every Llama 4
# test module.
# ----------------------------------------------------------------------------------------------------------------

# name -> (height, width, seed). With the tiny checkpoint's 36-pixel tiles and at most 6 tiles per canvas:
IMAGE_SPECS: dict[str, tuple[int, int, int]] = {
    "small": (20, 30, 0),      # 1 tile: upscaled to fit one tile
    "exact": (36, 36, 1),      # 1 tile, not resized
    "odd": (37, 36, 2),        # just over a tile: 2 x 1 + global
    "large": (100, 70, 3),     # downscaled into 3 x 2 + global
    "wide": (12, 300, 4),      # extreme aspect ratio: 1 x 6 + global
    "tall": (290, 9, 5),       # 6 x 1 + global
    "tiny": (1, 1, 6),         # a single pixel
    "photo": (480, 640, 7),    # real scale (336-pixel tiles, up to 16)
    "panorama": (150, 1700, 8),
}

# Image processor settings per request (the checkpoints' defaults otherwise: bilinear, mean = std = 0.5).
TINY_TILES = {"size": {"height": 36, "width": 36}, "max_patches": 6}
REAL_TILES = {"size": {"height": 336, "width": 336}, "max_patches": 16}

# A sweep of small sizes through 8-pixel tiles, at most 5 per canvas: every layout and many resize roundings. The
# last ones are sizes where the reference's float32 arithmetic gives another resized size than float64 would
# (41 x 41 -> 16 x 15 in a 2 x 2 canvas, not 16 x 16; 49 x 49 -> 16 x 16, not 16 x 15).
SWEEP_TILES = {"size": {"height": 8, "width": 8}, "max_patches": 5}
SWEEP_SIZES: list[tuple[int, int]] = sorted(
    {(h, w) for h in (1, 3, 7, 8, 9, 15, 16, 17, 23, 25, 40, 41) for w in (1, 5, 8, 12, 16, 24, 31, 33, 47)}
    | {(2, 60), (60, 2), (77, 13)} | {(41, 41), (41, 82), (47, 94), (49, 49), (55, 110)})

LONG_TEXT = ("The mountain village sits above the lake, where the road ends and a path climbs into the pine forest. "
             "In the morning the fishermen row out on the still water, and the baker opens the shutters of the small "
             "shop by the church.")

# Chat cases: (name, messages with image parts {"type": "image"}, names of the images in order).
CHAT_CASES: list[tuple[str, list[dict], list[str]]] = [
    ("text_only", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": "Describe the lake in one sentence."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The lake is calm and blue."}]},
        {"role": "user", "content": [{"type": "text", "text": "And the boats?"}]},
    ], []),
    ("one_small", [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]},
    ], ["small"]),
    ("one_large", [
        {"role": "user", "content": [{"type": "text", "text": "Describe the image:"}, {"type": "image"}]},
    ], ["large"]),
    ("two_images", [
        {"role": "user", "content": [
            {"type": "text", "text": "Compare the first picture"}, {"type": "image"},
            {"type": "text", "text": " with the second one"}, {"type": "image"}, {"type": "text", "text": "."}]},
    ], ["large", "wide"]),
    ("mixed_tiles", [
        {"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "Here are three pictures."}, {"type": "image"},
            {"type": "image"}, {"type": "text", "text": "What do they show?"}]},
    ], ["small", "odd", "large"]),
    # Several attention chunks (32 tokens) of text around an image whose placeholder run straddles chunk
    # boundaries; over 256 tokens, so the prompt's attention runs in blocks.
    ("long_chunks", [
        {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
        {"role": "user", "content": [
            {"type": "text", "text": LONG_TEXT}, {"type": "image"},
            {"type": "text", "text": "Compare the picture with the story. " + LONG_TEXT}]},
    ], ["odd"]),
]

TINY_IMAGES = ["small", "exact", "odd", "large", "wide", "tall", "tiny"]
REAL_IMAGES = ["photo", "panorama", "small"]


def sweep_image_specs() -> dict[str, tuple[int, int, int]]:
    return {f"sweep_{h}x{w}": (h, w, 100 + i) for i, (h, w) in enumerate(SWEEP_SIZES)}


def reference_requests(folder, paths: dict[str, pathlib.Path]) -> list[dict]:
    """Every request of the Llama 4 tests, for the checkpoint ``folder`` and the PNG ``paths`` of
    :data:`IMAGE_SPECS` and :func:`sweep_image_specs`."""
    def files(names):
        return [str(paths[n]) for n in names]

    requests = [
        {"name": "environment", "kind": "environment"},
        {"name": "tiny", "kind": "image_processor", "images": files(TINY_IMAGES), "settings": TINY_TILES},
        {"name": "real", "kind": "image_processor", "images": files(REAL_IMAGES), "settings": REAL_TILES},
        {"name": "bicubic", "kind": "image_processor", "images": files(["large", "small"]),
         "settings": {**TINY_TILES, "resample": 3}},
        {"name": "max_canvas", "kind": "image_processor", "images": files(["small", "odd", "large", "tiny"]),
         "settings": {**TINY_TILES, "resize_to_max_canvas": True}},
        {"name": "sweep", "kind": "image_processor", "images": files(sweep_image_specs()), "settings": SWEEP_TILES},
    ]
    for name, messages, images in CHAT_CASES:
        requests.append({"name": name, "kind": "chat", "folder": str(folder), "messages": messages,
                         "images": files(images)})
    return requests
