"""omnijax: multimodal generation from Hugging Face checkpoint folders on JAX."""

from common.errors import CheckpointError, MediaError, OmnijaxError, PromptError, SamplingError

__all__ = ["Pipeline", "GenerationResult", "OmnijaxError", "CheckpointError", "MediaError", "PromptError",
           "SamplingError"]


def __getattr__(name):
    if name in ("Pipeline", "GenerationResult"):
        from app import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
