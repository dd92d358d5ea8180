"""Errors a user can act on. Each names the problem (the file, tensor, token count, ...) in its message."""


class OmnijaxError(Exception):
    """Base class of every error omnijax raises on bad input."""


class CheckpointError(OmnijaxError):
    """A checkpoint folder is missing, unreadable, incomplete or does not match its config."""


class MediaError(OmnijaxError):
    """An image or audio input cannot be read or has unusable content."""


class PromptError(OmnijaxError):
    """A prompt is malformed, too long for the context budget, or its media do not match its placeholders."""


class UnsupportedModelError(CheckpointError):
    """The checkpoint's architecture is not one omnijax knows."""


class SamplingError(OmnijaxError, ValueError):
    """A generation setting (temperature, top_k, top_p, seed, max_new_tokens, stop strings) is out of range."""


class CapabilityError(OmnijaxError):
    """The model cannot do what was asked (e.g. answer aloud without a talker)."""
