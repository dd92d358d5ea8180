"""omnijax: multimodal generation from Hugging Face checkpoint folders and GGUF files on JAX.

This folder is the root of the installed ``omnijax`` package; its sub-packages are the folders beside it
(pyproject.toml maps them): ``omnijax.common``, ``omnijax.preprocess``, ``omnijax.encoders``, ``omnijax.decoder``,
``omnijax.app`` and ``omnijax.demo``.
"""

from omnijax.common.errors import (CapabilityError, CheckpointError, MediaError, OmnijaxError, PromptError,
                                   SamplingError)

__all__ = ["Pipeline", "GenerationResult", "OmnijaxError", "CheckpointError", "MediaError", "PromptError",
           "SamplingError", "CapabilityError"]


def __getattr__(name):
    if name in ("Pipeline", "GenerationResult"):
        from omnijax.app import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
