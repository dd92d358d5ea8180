"""Gemma 3 image preprocessing in pillow + numpy, pixel for pixel the same as transformers' ``Gemma3ImageProcessorPil``.

The reference pipeline, per input image (``image_processing_pil_gemma3.py`` on top of ``PilBackend``):

1. ``convert_rgb`` (alpha composited onto white), then the image is held as a uint8 array [3, H, W].
2. With pan-and-scan, crops [3, h_i, w_i] are sliced from that uint8 array (:func:`pan_and_scan_crops`); the
   image is followed by its crops.
3. Each of them is resized by PIL on the uint8 data (``Image.fromarray(HWC uint8).resize((width, height),
   resample)``, no ``reducing_gap``), giving uint8 [3, height, width] (:func:`resize`).
4. Rescale in float64 then cast to float32 (``(x.astype(float64) * rescale_factor).astype(float32)``), and normalize
   in float32 with float32 mean / std (``(x - mean) / std``) (:func:`rescale_normalize`).

:func:`process_images` stacks the results into float32 [N_total, 3, height, width].
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from typing import Any

import numpy as np
import PIL.Image

from omnijax.common.config_values import (as_checkpoint_error, as_float, as_int, boolean, channel_floats, config_getter,
                                  height_width)
from omnijax.preprocess.media_limits import PROCESSOR_MAX_CROPS, PROCESSOR_MAX_PIXELS, PROCESSOR_MAX_SIDE
from omnijax.preprocess.processor_config import processor_section
from omnijax.common.errors import CheckpointError, MediaError
from omnijax.preprocess.pixels import normalization_constants, rescale_normalize, resize, to_chw_uint8


# transformers' IMAGENET_STANDARD_MEAN / IMAGENET_STANDARD_STD, the Gemma3ImageProcessorPil class defaults.
_STANDARD_MEAN = (0.5, 0.5, 0.5)
_STANDARD_STD = (0.5, 0.5, 0.5)


@dataclasses.dataclass(frozen=True)
class Gemma3ImageConfig:
    """Settings of the Gemma 3 image processor.

    Defaults are ``Gemma3ImageProcessorPil``'s class defaults, and for the four pan-and-scan settings (``None`` on
    the image processor class) the defaults ``Gemma3Processor.images_kwargs`` passes: off, 256, 4, 1.2.

    height, width: output size of every image and crop (checkpoints use 896 x 896).
    resample: PIL resampling filter as an int (``PIL.Image.Resampling``; 2 is BILINEAR).
    rescale_factor: multiplies the uint8 pixel values (1/255).
    image_mean, image_std: per-channel normalization constants, 3 each.
    do_*: which steps run.
    pan_and_scan_min_crop_size: crops narrower than this make pan-and-scan give up.
    pan_and_scan_max_num_crops: upper bound on crops per image (lower bound is 2 once activated).
    pan_and_scan_min_ratio_to_activate: long side / short side needed before any crop is taken.
    """

    height: int = 224
    width: int = 224
    resample: int = int(PIL.Image.Resampling.BILINEAR)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = _STANDARD_MEAN
    image_std: tuple[float, float, float] = _STANDARD_STD
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2

    def __post_init__(self):
        mean, std = normalization_constants(self.image_mean, self.image_std)
        if int(self.height) <= 0 or int(self.width) <= 0:
            raise ValueError(f"height and width must be positive, got {self.height} x {self.width}")
        if max(int(self.height), int(self.width)) > PROCESSOR_MAX_SIDE \
                or int(self.height) * int(self.width) > PROCESSOR_MAX_PIXELS:
            raise ValueError(f"the image size {self.height} x {self.width} is over the limit of "
                             f"{PROCESSOR_MAX_SIDE} px a side and {PROCESSOR_MAX_PIXELS / 2**20:g} MP")
        if int(self.pan_and_scan_max_num_crops) > PROCESSOR_MAX_CROPS:
            raise ValueError(f"pan_and_scan_max_num_crops is {self.pan_and_scan_max_num_crops}, over the limit of "
                             f"{PROCESSOR_MAX_CROPS}")
        if int(self.resample) not in {int(r) for r in PIL.Image.Resampling}:
            raise ValueError(f"resample must be a PIL resampling filter id, got {self.resample!r}")
        if int(self.pan_and_scan_min_crop_size) <= 0 or int(self.pan_and_scan_max_num_crops) <= 0:
            raise ValueError(
                "pan_and_scan_min_crop_size and pan_and_scan_max_num_crops must be positive, got "
                f"{self.pan_and_scan_min_crop_size} and {self.pan_and_scan_max_num_crops}"
            )
        object.__setattr__(self, "image_mean", mean)
        object.__setattr__(self, "image_std", std)
        object.__setattr__(self, "height", int(self.height))
        object.__setattr__(self, "width", int(self.width))
        object.__setattr__(self, "resample", int(self.resample))
        object.__setattr__(self, "rescale_factor", float(self.rescale_factor))
        object.__setattr__(self, "pan_and_scan_min_crop_size", int(self.pan_and_scan_min_crop_size))
        object.__setattr__(self, "pan_and_scan_max_num_crops", int(self.pan_and_scan_max_num_crops))
        object.__setattr__(
            self, "pan_and_scan_min_ratio_to_activate", float(self.pan_and_scan_min_ratio_to_activate)
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "image processor config") -> "Gemma3ImageConfig":
        """The config from an image processor dict as transformers writes it (``preprocessor_config.json``, or the
        ``"image_processor"`` section of ``processor_config.json``).

        Missing keys and ``null`` values take the defaults (see the class docstring). ``"size"`` is
        ``{"height": H, "width": W}`` (an int means a square). Unknown keys are ignored. Explicit pan-and-scan values
        are kept; note that ``Gemma3Processor.__call__`` itself passes its class defaults (pan-and-scan off, 256, 4,
        1.2) to the image processor, which override the values saved in the file unless the caller passes them.

        Raises ``CheckpointError`` mentioning ``source`` when a value has the wrong type or range.
        """
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        defaults = cls()
        kwargs: dict[str, Any] = {}

        get = config_getter(d, defaults)

        with as_checkpoint_error(source):
            kwargs["height"], kwargs["width"] = height_width(
                d.get("size"), (defaults.height, defaults.width), "{'height': H, 'width': W} for Gemma 3"
            )
            kwargs["resample"] = as_int(get("resample"), "resample")
            kwargs["rescale_factor"] = as_float(get("rescale_factor"), "rescale_factor")
            for key in ("image_mean", "image_std"):
                kwargs[key] = channel_floats(get(key), key)
            for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb", "do_pan_and_scan"):
                kwargs[key] = boolean(get(key), key)
            for key in ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops"):
                kwargs[key] = as_int(get(key), key)
            kwargs["pan_and_scan_min_ratio_to_activate"] = as_float(
                get("pan_and_scan_min_ratio_to_activate"), "pan_and_scan_min_ratio_to_activate"
            )
            return cls(**kwargs)

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "Gemma3ImageConfig":
        """The config of the checkpoint folder ``path``, found the way transformers looks for it.

        The ``"image_processor"`` section of ``processor_config.json`` wins (transformers 5 saves the image processor
        there, nested, from ``Gemma3Processor.save_pretrained``); otherwise ``preprocessor_config.json`` (what hub
        checkpoints ship). Raises ``CheckpointError`` naming the folder or file when neither is there, a file is not
        valid JSON, or a value is unusable.
        """
        settings, source = processor_section(path, ('image_processor',), 'image processor')
        return cls.from_dict(settings, source=source)


def pan_and_scan_boxes(height: int, width: int, cfg: Gemma3ImageConfig) -> list[tuple[int, int, int, int]]:
    """Crop boxes (top, left, bottom, right), row-major, that pan-and-scan takes from an H x W image.

    Empty when the aspect ratio is below ``cfg.pan_and_scan_min_ratio_to_activate`` or the crops would be smaller
    than ``cfg.pan_and_scan_min_crop_size``. The crops of one row / column share one size
    ``ceil(W / n_w) x ceil(H / n_h)``; the last one is clipped to the image, as numpy slicing does in the reference.
    Does not look at ``cfg.do_pan_and_scan``.
    """
    min_crop = cfg.pan_and_scan_min_crop_size
    max_crops = cfg.pan_and_scan_max_num_crops
    min_ratio = cfg.pan_and_scan_min_ratio_to_activate
    if width >= height:  # square or landscape
        if width / height < min_ratio:
            return []
        num_crops_w = int(math.floor(width / height + 0.5))  # round half up
        num_crops_w = min(int(math.floor(width / min_crop)), num_crops_w)
        num_crops_w = max(2, num_crops_w)
        num_crops_w = min(max_crops, num_crops_w)
        num_crops_h = 1
    else:  # portrait
        if height / width < min_ratio:
            return []
        num_crops_h = int(math.floor(height / width + 0.5))
        num_crops_h = min(int(math.floor(height / min_crop)), num_crops_h)
        num_crops_h = max(2, num_crops_h)
        num_crops_h = min(max_crops, num_crops_h)
        num_crops_w = 1

    crop_size_w = int(math.ceil(width / num_crops_w))
    crop_size_h = int(math.ceil(height / num_crops_h))
    if min(crop_size_w, crop_size_h) < min_crop:
        return []

    tops = [crop_size_h * i for i in range(num_crops_h)]
    lefts = [crop_size_w * i for i in range(num_crops_w)]
    return [
        (top, left, min(top + crop_size_h, height), min(left + crop_size_w, width))
        for top, left in itertools.product(tops, lefts)
    ]


def pan_and_scan_crops(image, cfg: Gemma3ImageConfig) -> list[np.ndarray]:
    """The pan-and-scan crops of ``image``, each [C, h_i, w_i] in the dtype of the input (views, not copies).

    ``image`` is a [C, H, W] array or a ``PIL.Image.Image`` (turned into uint8 [3, H, W] first, with
    ``convert_rgb`` when ``cfg.do_convert_rgb``). Same boxes and order as ``Gemma3ImageProcessorPil.pan_and_scan``
    (see :func:`pan_and_scan_boxes`); ``cfg.do_pan_and_scan`` is not consulted here.
    """
    if not isinstance(image, np.ndarray):
        image = to_chw_uint8(image, cfg.do_convert_rgb)
    if image.ndim != 3:
        raise MediaError(f"pan-and-scan expects a [C, H, W] array, got shape {tuple(image.shape)}")
    _, height, width = image.shape
    return [image[:, top:bottom, left:right] for top, left, bottom, right in pan_and_scan_boxes(height, width, cfg)]


def process_images(images: list[PIL.Image.Image], cfg: Gemma3ImageConfig) -> tuple[np.ndarray, list[int]]:
    """Gemma 3 pixel values for ``images``, the same as ``Gemma3ImageProcessorPil(**cfg)(images)``.

    ``images``: PIL images (other sources that :func:`preprocess.images.load_image` takes are loaded with it).
    Returns ``(pixel_values, num_crops)``:
      pixel_values: float32 [N_total, 3, cfg.height, cfg.width], each input image followed by its pan-and-scan
        crops, N_total = len(images) + sum(num_crops);
      num_crops: one int per input image (all 0 without pan-and-scan).
    With ``cfg.do_resize`` off every image and crop must already share one size.
    """
    if isinstance(images, (PIL.Image.Image, np.ndarray)):
        images = [images]
    images = list(images)
    if not images:
        raise MediaError("process_images got no images")
    processed: list[np.ndarray] = []
    num_crops: list[int] = []
    for image in images:
        chw = to_chw_uint8(image, cfg.do_convert_rgb)
        crops = pan_and_scan_crops(chw, cfg) if cfg.do_pan_and_scan else []
        num_crops.append(len(crops))
        for item in [chw, *crops]:
            if cfg.do_resize:
                item = resize(item, cfg.height, cfg.width, cfg.resample)
            processed.append(rescale_normalize(item, cfg))
    shapes = {p.shape for p in processed}
    if len(shapes) != 1:
        raise MediaError(f"images and crops differ in size with do_resize off: {sorted(shapes)}")
    return np.stack(processed).astype(np.float32, copy=False), num_crops
