"""Whose frame size bounds a video takes where a family's processor overrides its saved video processor's size
(Qwen3-Omni): "processor" (the processor's own default, what transformers applies when the caller names no size; the
default) or "checkpoint" (the saved video processor's ``size``)."""

VIDEO_SIZES = ("processor", "checkpoint")
