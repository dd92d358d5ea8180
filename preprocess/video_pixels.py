"""Rescale + normalize of video frames as transformers' torchvision backend does it (``TorchvisionBackend.
rescale_and_normalize``), which the video processors of every family use.

With both steps on, the rescale factor is folded into the constants (``_fuse_mean_std_and_rescale_factor``):
``mean' = float32(mean) * float32(1 / rescale_factor)``, ``std'`` likewise, and the pixels go
``(float32(x) - mean') / std'`` in float32. This differs from the PIL image processors' rescale-then-normalize in
the last bit of some values, so frames are not pushed through the image path.
"""

from __future__ import annotations

import numpy as np


def rescale_normalize_frames(frames_FCHW: np.ndarray, cfg) -> np.ndarray:
    """float32 [F, C, H, W] from uint8 frames [F, C, H, W]; ``cfg`` has ``do_rescale``, ``rescale_factor``,
    ``do_normalize``, ``image_mean`` and ``image_std``."""
    x = frames_FCHW.astype(np.float32)
    if cfg.do_normalize:
        mean = np.asarray(cfg.image_mean, np.float32)
        std = np.asarray(cfg.image_std, np.float32)
        if cfg.do_rescale:
            scale = np.float32(1.0 / cfg.rescale_factor)
            mean, std = mean * scale, std * scale
        return (x - mean[None, :, None, None]) / std[None, :, None, None]
    if cfg.do_rescale:
        return x * np.float32(cfg.rescale_factor)
    return x
