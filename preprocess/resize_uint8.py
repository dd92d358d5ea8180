"""torchvision's antialiased resize of uint8 frames, in numpy: what transformers' video processors (Qwen2-VL's and
Gemma 4's, torchvision backends) do to every frame.

``torchvision.transforms.v2.functional.resize(uint8, antialias=True)`` runs PyTorch's native uint8 kernel on CPU
(aten/src/ATen/native/cpu/UpSampleKernel.cpp, ``_compute_index_ranges_int16_weights``, and the separable passes
of UpSampleKernelAVXAntialias.h), which differs from PIL's resize by 1 in a few pixels:

1. Per axis (input n -> output m, ``scale = n / m``): the filter's support is ``interp / 2 * scale`` when
   downscaling (``interp / 2`` otherwise; interp 4 for bicubic, 2 for bilinear); output i reads the inputs from
   ``xmin = max(int(center - support + 0.5), 0)`` on, ``center = scale * (i + 0.5)``, at most
   ``ceil(support) * 2 + 1`` of them, weighted by the filter at ``(j + xmin - center + 0.5) / max(scale, 1)``
   (Keys cubic with a = -0.5, or the triangle), normalized to sum 1, all in float64.
2. The weights become int16 at the largest precision p <= 22 (bits) at which the axis's largest weight, times
   2**(p + 1), stays below 2**15; each is rounded half away from zero.
3. Width first, then height (a pass only where the size changes): each output is
   ``clip((sum(w * x) + 2**(p - 1)) >> p, 0, 255)``, integer arithmetic, back to uint8 between the passes.

An unchanged size returns the frame as it is (torchvision does).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import PIL.Image

from omnijax.common.errors import CheckpointError

BICUBIC = int(PIL.Image.Resampling.BICUBIC)
BILINEAR = int(PIL.Image.Resampling.BILINEAR)


def _keys_cubic(x: np.ndarray) -> np.ndarray:
    """HelperInterpCubic::aa_filter (a = -0.5), in its operation order."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _triangle(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


_FILTERS = {BICUBIC: (4, _keys_cubic), BILINEAR: (2, _triangle)}


def axis_weights(in_size: int, out_size: int, resample: int = BICUBIC) -> tuple[np.ndarray, np.ndarray, int]:
    """(first input index [m] int64, int16-valued weights [m, taps] int64, precision) of one axis (steps 1-2)."""
    interp, filter_fn = _FILTERS[resample]
    scale = in_size / out_size
    support = interp * 0.5 * scale if scale >= 1.0 else interp * 0.5
    taps = int(math.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    center = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C++ casts truncate toward zero
    xsize = np.clip(np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin, 0, taps)
    j = np.arange(taps, dtype=np.float64)
    w = filter_fn((j[None, :] + xmin[:, None] - center[:, None] + 0.5) * invscale)
    w = np.where(j[None, :] < xsize[:, None], w, 0.0)
    total = np.zeros(out_size)
    for k in range(taps):  # left-to-right sums, as the reference accumulates
        total = total + w[:, k]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    wt_max = float(np.max(np.where(total[:, None] != 0.0, w, 0.0), initial=0.0))
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    v = w * (1 << precision)
    w16 = np.where(v < 0, np.trunc(-0.5 + v), np.trunc(0.5 + v)).astype(np.int64)
    return xmin, w16, precision


@functools.lru_cache(maxsize=64)
def _axis_matrix(in_size: int, out_size: int, resample: int):
    """(sparse [out, in] float64 matrix of one axis's int16 weights, precision): an axis's taps as a matrix, so
    a pass is one sparse product (integer sums of at most 2**31 are exact in float64)."""
    import scipy.sparse

    xmin, w16, precision = axis_weights(in_size, out_size, resample)
    rows = np.repeat(np.arange(out_size), w16.shape[1])
    cols = (xmin[:, None] + np.arange(w16.shape[1])[None, :]).reshape(-1)
    keep = (w16.reshape(-1) != 0) & (cols < in_size)
    matrix = scipy.sparse.csr_matrix((w16.reshape(-1)[keep].astype(np.float64), (rows[keep], cols[keep])),
                                     shape=(out_size, in_size))
    return matrix, precision


def _pass(image: np.ndarray, axis: int, out_size: int, resample: int) -> np.ndarray:
    """One separable pass of uint8 ``image`` [H, W, C] along ``axis`` (0: height, 1: width) to ``out_size``:
    ``clip((sum(w * x) + 2**(p - 1)) >> p, 0, 255)`` per output."""
    matrix, precision = _axis_matrix(image.shape[axis], out_size, resample)
    moved = np.moveaxis(image, axis, 0)
    rest = moved.shape[1:]
    sums = matrix @ moved.reshape(moved.shape[0], -1).astype(np.float64)
    if precision > 0:
        sums = np.floor((sums + float(1 << (precision - 1))) / float(1 << precision))  # >> precision, exactly
    out = np.clip(sums, 0, 255).astype(np.uint8).reshape((out_size,) + rest)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


def resize_uint8(image_HWC: np.ndarray, height: int, width: int, resample: int = BICUBIC) -> np.ndarray:
    """uint8 [height, width, C]: ``image_HWC`` resized as torchvision resizes uint8 tensors (module docstring)."""
    if int(resample) not in _FILTERS:
        raise CheckpointError(f"video frames can be resized bicubic ({BICUBIC}) or bilinear ({BILINEAR}), not with "
                              f"resample {resample}")
    out = image_HWC
    if out.shape[1] != width:
        out = _pass(out, 1, int(width), int(resample))
    if out.shape[0] != height:
        out = _pass(out, 0, int(height), int(resample))
    return out
