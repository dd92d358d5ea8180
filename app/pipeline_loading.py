"""What ``Pipeline.from_pretrained`` checks before any work (``check_load_settings``) and how it reads a checkpoint's
weights onto the mesh (``load_weights``: through the converted-weights cache when the checkpoint needs a
conversion)."""

from __future__ import annotations

import logging
import math
import numbers
import time

import jax.numpy as jnp

from omnijax.app.checkpoint import load_params, quantizable_params
from omnijax.app.scheduler import DEFAULT_MAX_QUEUE
from omnijax.app.slots import DEFAULT_KV_CACHE_MB, DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_SLOTS
from omnijax.app.weight_cache import WeightCache, safetensors_dtype
from omnijax.common.errors import SettingError
from omnijax.preprocess.video_size import VIDEO_SIZES

log = logging.getLogger(__name__)

JAX_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MAX_AUDIO_SECONDS_SETTING = 86400.0  # max_audio_seconds: a day
MAX_BATCH = 1024  # prompts one call generates, and the engine's slots (each holds its own KV cache)


def check_load_settings(dtype, model_axis, max_context, max_audio_seconds, max_batch=DEFAULT_SLOTS,
                        max_batched_tokens=DEFAULT_MAX_BATCHED_TOKENS, max_queue=DEFAULT_MAX_QUEUE,
                        prefix_cache_mb=0.0, media_cache_mb=0.0, video_size="processor",
                        kv_cache_mb=DEFAULT_KV_CACHE_MB) -> None:
    """SettingError naming the first ``from_pretrained`` argument of the wrong type or out of range."""
    if dtype not in JAX_DTYPES:
        raise SettingError(f"unsupported dtype {dtype!r}; use one of {', '.join(sorted(JAX_DTYPES))}")
    for name, value, low in (("model_axis", model_axis, 1), ("max_context", max_context, 2)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low):
            raise SettingError(f"{name} must be None or an integer >= {low}, got {value!r}")
    for name, value, high in (("max_batch", max_batch, MAX_BATCH),
                              ("max_batched_tokens", max_batched_tokens, 1 << 16),
                              ("max_queue", max_queue, 1 << 20)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= high:
            raise SettingError(f"{name} must be an integer in [1, {high}], got {value!r}")
    for name, value in (("prefix_cache_mb", prefix_cache_mb), ("media_cache_mb", media_cache_mb)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1 << 20:
            raise SettingError(f"{name} must be a number of MB in [0, {1 << 20}], got {value!r}")
    if isinstance(kv_cache_mb, bool) or not isinstance(kv_cache_mb, numbers.Real) or not 0 < kv_cache_mb <= 1 << 20:
        raise SettingError(f"kv_cache_mb must be a number of MB in (0, {1 << 20}], got {kv_cache_mb!r}")
    if max_audio_seconds is not None and (
            isinstance(max_audio_seconds, bool) or not isinstance(max_audio_seconds, numbers.Real)
            or not math.isfinite(max_audio_seconds) or not 0 < max_audio_seconds <= MAX_AUDIO_SECONDS_SETTING):
        raise SettingError(f"max_audio_seconds must be None or a number in (0, {MAX_AUDIO_SECONDS_SETTING:g}], got "
                           f"{max_audio_seconds!r}")
    if video_size not in VIDEO_SIZES:
        raise SettingError(f"video_size must be one of {', '.join(map(repr, VIDEO_SIZES))}, got {video_size!r}")


def load_weights(ckpt, spec, cfg, skeleton, shapes, *, dtype: str, quantize: str | None, mesh) -> dict:
    """The params pytree of ``ckpt`` placed on ``mesh``: read back from the weight cache (app/weight_cache.py) when
    the checkpoint needs a conversion (a GGUF file, or ``quantize``) that was done before, else read tensor by
    tensor (``load_params``), and kept in the cache when it was a conversion."""
    start = time.perf_counter()
    weight_map = spec.weight_map(cfg)
    # quantized weights are made from float32 tensors (one at a time), the others cast to dtype as they come
    tensors = ckpt.open_tensors(spec, weight_map, "float32" if quantize else dtype)
    params, source, cache = None, ckpt.format, None
    if ckpt.format == "gguf" or quantize is not None:
        setting = {"family": spec.name, "dtype": safetensors_dtype(dtype), "quantize": quantize or "none"}
        cache = WeightCache.open(tensors.source_files(), setting, shapes)
        params = cache.read(mesh) if cache is not None else None
    if params is not None:
        tensors.close()
        source = f"{ckpt.format}, converted weights from the cache"
    else:
        writer = cache.writer() if cache is not None else None
        try:
            params = load_params(tensors, shapes, weight_map, dtype=dtype, mesh=mesh,
                                 unused_patterns=spec.unused_keys(cfg, ckpt.hf_config), quantize_mode=quantize,
                                 quant_axes=quantizable_params(skeleton) if quantize else None, cache_writer=writer)
        except BaseException:
            if writer is not None:
                writer.abandon()
            raise
    log.info("loaded %s (%s, %s) in %.1fs", ckpt.path, spec.name, source, time.perf_counter() - start)
    return params
